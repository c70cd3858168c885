package etcdstore

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	"github.com/flightlock/flightlock/lockstore"
)

// What a leader change in the middle of an acquisition leaves: the store resends a transaction
// etcd answered with codes.Unavailable, and its record of the failed attempt must neither turn
// a busy answer into an error nor be lost.

// failFirstTxn returns a Locker store on a client whose next transaction on key (once armed)
// fails with codes.Unavailable after etcd ran nothing (the resend is then answered busy).
func failFirstTxn(t *testing.T, c *etcdtest.Cluster, key string, fail *atomic.Bool) *Store {
	cli := faultyClient(t, c, func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == "/etcdserverpb.KV/Txn" && (key == "" || txnKey(req) == key) && fail.CompareAndSwap(true, false) {
			return status.Error(codes.Unavailable, "etcdserver: leader changed")
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}, nil)
	return newStore(t, cli)
}

// A key held elsewhere stays busy for TryLock across a leader change that the store rides
// out: the store answered that the key is held.
func TestTryLockOfABusyKeyStaysBusyAcrossALeaderChange(t *testing.T) {
	c := etcdtest.Start(t)
	ctx := bg(t)
	holder, _ := flightlock.New(newStore(t, c.Client(t)))
	hl, err := holder.Lock(ctx, "fo")
	if err != nil {
		t.Fatal(err)
	}
	defer hl.Release(ctx)
	for _, failOpen := range []bool{false, true} {
		var fail atomic.Bool
		l, err := flightlock.New(failFirstTxn(t, c, "lock:fo", &fail), flightlock.WithFailOpen(failOpen))
		if err != nil {
			t.Fatal(err)
		}
		fail.Store(true)
		lease, err := l.TryLock(ctx, "fo")
		if lease != nil {
			t.Errorf("failOpen=%v: TryLock of a key held elsewhere granted (degraded=%v) while the store answered busy", failOpen, lease.Degraded())
			_ = lease.Release(ctx)
			continue
		}
		if !errors.Is(err, flightlock.ErrBusy) {
			t.Errorf("failOpen=%v: TryLock of a key held elsewhere = %v, want ErrBusy", failOpen, err)
		}
	}
}

// A waiter whose last attempt, late in its wait, hits a leader change that etcd's resend rides
// out (answered busy) ends its wait busy, as the store answered: not with the store's error.
func TestWaitEndsBusyAfterALeaderChangeLateInTheWait(t *testing.T) {
	c := etcdtest.Start(t)
	ctx := bg(t)
	holder, _ := flightlock.New(newStore(t, c.Client(t)))
	hl, err := holder.Lock(ctx, "we")
	if err != nil {
		t.Fatal(err)
	}
	defer hl.Release(ctx)
	var fail atomic.Bool
	every := func(int) (time.Duration, bool) { return 600 * time.Millisecond, true }
	l, err := flightlock.New(failFirstTxn(t, c, "lock:we", &fail), flightlock.WithWait(1500*time.Millisecond), flightlock.WithRetry(every))
	if err != nil {
		t.Fatal(err)
	}
	go func() { time.Sleep(time.Second); fail.Store(true) }()
	start := time.Now()
	_, err = l.Lock(ctx, "we")
	t.Logf("after %v: %v", time.Since(start).Round(time.Millisecond), err)
	if !errors.Is(err, flightlock.ErrBusy) {
		t.Errorf("Lock of a key held elsewhere whose wait ended = %v, want ErrBusy (409), not a store error (503)", err)
	}
}

// Permits held elsewhere stay busy for a fail-open TryLock across a leader change.
func TestPermitsHeldElsewhereStayBusyAcrossALeaderChange(t *testing.T) {
	c := etcdtest.Start(t)
	ctx := bg(t)
	holder, _ := flightlock.New(newStore(t, c.Client(t)), flightlock.WithPermits(2))
	for range 2 {
		hl, err := holder.Lock(ctx, "pf")
		if err != nil {
			t.Fatal(err)
		}
		defer hl.Release(ctx)
	}
	for _, failOpen := range []bool{false, true} {
		var fail atomic.Bool
		l, err := flightlock.New(failFirstTxn(t, c, "", &fail), flightlock.WithPermits(2), flightlock.WithFailOpen(failOpen))
		if err != nil {
			t.Fatal(err)
		}
		fail.Store(true)
		lease, err := l.TryLock(ctx, "pf")
		if lease != nil {
			t.Errorf("failOpen=%v: TryLock of permits held elsewhere granted (degraded=%v)", failOpen, lease.Degraded())
			_ = lease.Release(ctx)
			continue
		}
		if !errors.Is(err, flightlock.ErrBusy) {
			t.Errorf("failOpen=%v: TryLock of permits held elsewhere = %v, want ErrBusy", failOpen, err)
		}
	}
}

// An Acquire whose transaction fails with codes.Unavailable (outcome unknown), and whose
// resend cannot get a new lease (the grant fails likewise) before the caller's deadline, must
// still say that its outcome is unknown: the failed attempt is recorded, to be given back by
// owner once due.
func TestUnknownOutcomeIsNotLostToALaterError(t *testing.T) {
	c := etcdtest.Start(t)
	var armed, failTxn atomic.Bool
	cli := faultyClient(t, c, func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if armed.Load() {
			if method == "/etcdserverpb.KV/Txn" && txnKey(req) == "lock:lg" && failTxn.CompareAndSwap(true, false) {
				return status.Error(codes.Unavailable, "etcdserver: leader changed")
			}
			if method == "/etcdserverpb.Lease/LeaseGrant" {
				return status.Error(codes.Unavailable, "etcdserver: no leader")
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}, nil)
	s := newStore(t, cli)
	ctx := bg(t)
	owner := "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:warm", Owner: owner, TTL: 3 * time.Second}); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	failTxn.Store(true)
	cctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	_, err := s.Acquire(cctx, lockstore.Request{Key: "lock:lg", Owner: owner, TTL: 3 * time.Second})
	t.Logf("err = %v", err)
	if !errors.Is(err, lockstore.ErrOutcomeUnknown) && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire after an unknown attempt = %v: neither unknown nor the deadline, so the Locker keeps the owner", err)
	}
}

// A waiter's first transaction fails with codes.Unavailable (a leader change) and the store's
// resend of it is answered busy. The store gives the failed attempt back, by owner, once it
// falls due, one TTL after the Acquire began, so the waiter must not be granted the key later
// under that owner: the give-back would end the grant as the waiter is told of it (its reply
// is slow here, as after an election). The waiter goes on waiting as another owner, and
// nobody else is granted the key while it holds it.
func TestWaiterWhoseFailedAttemptWasAnsweredBusyKeepsItsGrant(t *testing.T) {
	waiterKeepsItsGrant(t, "masked", func(ctx context.Context, invoke func(context.Context) error) error {
		_ = invoke(ctx) // etcd runs it (and refuses it: the key is held) but answers an error
		return status.Error(codes.Unavailable, "etcdserver: leader changed")
	})
}

// As above, with the first attempt cut by the store's own resend bound (etcd silent across the
// election, the common case) rather than answered codes.Unavailable: that too is an attempt
// that may have run, settled by the busy resend.
func TestWaiterWhoseCutAttemptWasAnsweredBusyKeepsItsGrant(t *testing.T) {
	waiterKeepsItsGrant(t, "cut", func(ctx context.Context, _ func(context.Context) error) error {
		<-ctx.Done() // etcd silent: the store's resend bound cuts the attempt
		return status.Error(codes.DeadlineExceeded, ctx.Err().Error())
	})
}

// waiterKeepsItsGrant has a waiter (Wait 15s, TTL 3s) queue behind a holder while its first
// transaction on lock:name goes through first, and the waiter's granting reply come 700 ms
// late once the holder releases just before one TTL: no other owner may then be granted the
// key while the waiter holds it.
func waiterKeepsItsGrant(t *testing.T, name string, first func(ctx context.Context, invoke func(context.Context) error) error) {
	c := etcdtest.Start(t)
	var fail, delay atomic.Bool
	key := "lock:" + name
	cli := faultyClient(t, c, func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		invoke := func(ctx context.Context) error { return invoker(ctx, method, req, reply, cc, opts...) }
		if method != "/etcdserverpb.KV/Txn" || txnKey(req) != key {
			return invoke(ctx)
		}
		if fail.CompareAndSwap(true, false) {
			return first(ctx, invoke)
		}
		err := invoke(ctx)
		if err == nil && delay.Load() {
			if r, ok := reply.(interface{ GetSucceeded() bool }); ok && r.GetSucceeded() {
				delay.Store(false)
				time.Sleep(700 * time.Millisecond) // the grant's reply is slow after the election
			}
		}
		return err
	}, nil)
	const ttl = 3 * time.Second
	holderStore, thirdStore := newStore(t, c.Client(t)), newStore(t, c.Client(t))
	holder, err := flightlock.New(holderStore, flightlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	waiter, err := flightlock.New(newStore(t, cli), flightlock.WithTTL(ttl), flightlock.WithWait(15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := bg(t)
	hl, err := holder.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	fail.Store(true)
	start := time.Now()
	got := make(chan *flightlock.Lease, 1)
	go func() {
		l, err := waiter.Lock(ctx, name)
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
		got <- l
	}()
	time.Sleep(time.Until(start.Add(ttl - 250*time.Millisecond)))
	delay.Store(true)
	if err := hl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wl := <-got
	if wl == nil {
		return
	}
	t.Logf("waiter granted %v after it began (fence %d)", time.Since(start).Round(time.Millisecond), wl.Fence())
	for i := range 20 {
		a, err := thirdStore.Acquire(ctx, lockstore.Request{Key: key, Owner: "cccccccccccccccccccccccccccccccc", TTL: ttl})
		if err == nil && a.Acquired {
			t.Fatalf("another owner granted the key %v after the waiter was told it holds it (try %d; waiter lost=%v)",
				time.Since(start).Round(time.Millisecond), i, wl.Lost())
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = wl.Release(ctx)
}
