package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	"github.com/flightlock/flightlock/internal/testenv/poll"
	"github.com/flightlock/flightlock/lockstore"
)

// An acquisition times out on the client while its transaction is still on its way (a slow
// link, a proposal applied after the caller gave up): the caller gives it back at once, as the
// Locker does (giveBack), and that release finds nothing yet. When the transaction then
// commits, the key is on the store's session lease, which the store keeps alive for as long as
// it lives: nobody holds it, yet nobody else may ever take it. The store must still release it
// (its holder's guarantee was one TTL at most).
func TestLateAppliedAcquireIsNotHeldForever(t *testing.T) {
	c := etcdtest.Start(t)
	// The request is on the wire; the caller's deadline runs out first.
	lt := newLateTxns(t, 300*time.Millisecond)
	cli := faultyClient(t, c, lt.intercept, nil)
	ctx := bg(t)
	s, other := newStore(t, cli), newStore(t, cli)
	const ttl = time.Second
	// The session lease exists (another lock of the same TTL), as in a running process.
	if got, err := s.Acquire(ctx, lockstore.Request{Key: "lock:busy", Owner: ownerB, TTL: ttl}); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	lt.arm("lock:late")
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:late", Owner: ownerA, TTL: ttl}); err == nil {
		t.Fatal("the acquisition did not time out")
	}
	// The Locker gives the acquisition back (keeper.giveBack): nothing is there yet.
	_, _ = s.Release(ctx, "lock:late", ownerA, "", 0)
	lt.wg.Wait()
	if get(t, cli, "lock:late") == nil {
		t.Skip("the late transaction did not commit")
	}
	// Nobody holds it; its would-be holder was promised one TTL at most.
	deadline := time.Now().Add(ttl + 4*time.Second)
	for get(t, cli, "lock:late") != nil {
		if time.Now().After(deadline) {
			got, err := other.Acquire(ctx, lockstore.Request{Key: "lock:late", Owner: ownerB, TTL: ttl})
			t.Fatalf("the late-applied acquisition is still held %v after its TTL, by nobody (store entries %d); another owner's acquire = %+v, %v",
				ttl+4*time.Second, s.Held(), got, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// faultyClient returns a client on c whose unary calls and streams go through unary and stream
// first (nil: straight through), closed when t ends.
func faultyClient(t *testing.T, c *etcdtest.Cluster, unary grpc.UnaryClientInterceptor, stream grpc.StreamClientInterceptor) *clientv3.Client {
	t.Helper()
	var opts []grpc.DialOption
	if unary != nil {
		opts = append(opts, grpc.WithUnaryInterceptor(unary))
	}
	if stream != nil {
		opts = append(opts, grpc.WithStreamInterceptor(stream))
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: c.Endpoints(), DialTimeout: 2 * time.Second, Logger: zap.NewNop(), DialOptions: opts,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// txnKey is the key of a transaction's first compare: the lock key of an acquisition.
func txnKey(req any) string {
	if r, ok := req.(*pb.TxnRequest); ok && len(r.Compare) > 0 {
		return string(r.Compare[0].Key)
	}
	return ""
}

// lateTxns makes the acquisitions of the keys it is armed for time out on the client while
// their transactions go to etcd later (after delay), or never (delay 0).
type lateTxns struct {
	delay time.Duration
	mu    sync.Mutex
	keys  map[string]bool // guarded by mu: keys whose next acquisition is late
	wg    sync.WaitGroup  // the late transactions on their way
}

func newLateTxns(t *testing.T, delay time.Duration) *lateTxns {
	lt := &lateTxns{delay: delay, keys: make(map[string]bool)}
	t.Cleanup(lt.wg.Wait) // no late transaction outlives the test
	return lt
}

func (lt *lateTxns) arm(keys ...string) {
	lt.mu.Lock()
	for _, k := range keys {
		lt.keys[k] = true
	}
	lt.mu.Unlock()
}

func (lt *lateTxns) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if method == "/etcdserverpb.KV/Txn" {
		lt.mu.Lock()
		late := lt.keys[txnKey(req)]
		delete(lt.keys, txnKey(req))
		lt.mu.Unlock()
		if late {
			if lt.delay > 0 {
				lt.wg.Go(func() {
					time.Sleep(lt.delay)
					_ = invoker(context.Background(), method, req, reply, cc, opts...)
				})
			}
			return context.DeadlineExceeded
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// leaseCount is how many leases the cluster has.
func leaseCount(t *testing.T, cli *clientv3.Client) int {
	t.Helper()
	resp, err := cli.Leases(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.Leases)
}

// leaseAlive reports whether etcd still has lease id.
func leaseAlive(t *testing.T, cli *clientv3.Client, id int64) bool {
	t.Helper()
	resp, err := cli.TimeToLive(context.Background(), clientv3.LeaseID(id))
	if err != nil {
		t.Fatal(err)
	}
	return resp.TTL > 0
}

// A lock on a lease that an unknown outcome retired keeps every guarantee while it is held: the
// lease is kept alive (refreshes succeed for several of its TTLs), new grants go on a new
// lease, and the retired lease is revoked, with the late key on it, when that lock is released.
func TestRetiredLeaseKeepsItsLocks(t *testing.T) {
	c := etcdtest.Start(t)
	lt := newLateTxns(t, 300*time.Millisecond)
	cli := faultyClient(t, c, lt.intercept, nil)
	ctx := bg(t)
	s := newStore(t, cli)
	const ttl = time.Second // a lease of 2s
	if got, err := s.Acquire(ctx, lockstore.Request{Key: "lock:keep", Owner: ownerB, TTL: ttl}); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	old := get(t, cli, "lock:keep").Lease
	lt.arm("lock:late")
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:late", Owner: ownerA, TTL: ttl}); err == nil {
		t.Fatal("the acquisition did not time out")
	}
	_, _ = s.Release(ctx, "lock:late", ownerA, "", 0)
	lt.wg.Wait()
	if kv := get(t, cli, "lock:late"); kv != nil && kv.Lease != old {
		t.Fatalf("the late commit is on lease %x, not the one it was sent with (%x)", kv.Lease, old)
	}
	if got, err := s.Acquire(ctx, lockstore.Request{Key: "lock:new", Owner: ownerB, TTL: ttl}); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	if get(t, cli, "lock:new").Lease == old {
		t.Fatal("a new grant went on the lease an unknown outcome retired")
	}
	// Twice the lease's TTL: only keep-alives of the retired lease keep lock:keep.
	for range 8 {
		errs := s.RefreshAll(ctx, []lockstore.Renewal{
			{Key: "lock:keep", Owner: ownerB, TTL: ttl}, {Key: "lock:new", Owner: ownerB, TTL: ttl}})
		if errs[0] != nil || errs[1] != nil {
			t.Fatalf("refresh of the locks on the retired lease and the new one: %v", errs)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if kv := get(t, cli, "lock:keep"); kv == nil || kv.Lease != old {
		t.Fatalf("the lock on the retired lease did not stay on it: %v", kv)
	}
	checkLeaseEntries(t, s)
	if _, err := s.Release(ctx, "lock:keep", ownerB, "", 0); err != nil {
		t.Fatal(err)
	}
	// The lock on the new lease is kept meanwhile: revoking the retired one must not touch it.
	waitFor(t, 5*time.Second, "the retired lease revoked", func() bool {
		if err := s.Refresh(ctx, "lock:new", ownerB, ttl); err != nil {
			t.Fatalf("the lock on the new lease: %v", err)
		}
		return !leaseAlive(t, cli, old)
	})
	if get(t, cli, "lock:late") != nil {
		t.Fatal("the late commit outlived its lease")
	}
	if n := leaseCount(t, cli); n != 1 {
		t.Fatalf("%d leases, want the new one only", n)
	}
}

// Unknown outcomes in a row retire one lease each; every retired lease is revoked once nothing
// uses it, and no late commit stays: with locks held on the retired leases, and without (the
// lease is revoked at the give-back, before the late commit, which etcd then refuses). AcquireAll
// retires its lease as Acquire does.
func TestUnknownOutcomesDoNotPileUpLeases(t *testing.T) {
	c := etcdtest.Start(t)
	lt := newLateTxns(t, 200*time.Millisecond)
	cli := faultyClient(t, c, lt.intercept, nil)
	ctx := bg(t)
	s := newStore(t, cli)
	const ttl, rounds = 2 * time.Second, 4 // leases of 3s
	var lateKeys, heldKeys []string
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:base", Owner: ownerB, TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	heldKeys = append(heldKeys, "lock:base")
	// Each round retires the lease of the lock taken in the round before, which stays held.
	for i := range rounds {
		k := fmt.Sprintf("lock:late%d", i)
		lateKeys = append(lateKeys, k)
		lt.arm(k)
		if _, err := s.Acquire(ctx, lockstore.Request{Key: k, Owner: ownerA, TTL: ttl}); err == nil {
			t.Fatalf("round %d: the acquisition did not time out", i)
		}
		_, _ = s.Release(ctx, k, ownerA, "", 0)
		h := fmt.Sprintf("lock:held%d", i)
		heldKeys = append(heldKeys, h)
		if got, err := s.Acquire(ctx, lockstore.Request{Key: h, Owner: ownerB, TTL: ttl}); err != nil || !got.Acquired {
			t.Fatal(got, err)
		}
	}
	lt.wg.Wait()
	checkLeaseEntries(t, s)
	if n := leaseCount(t, cli); n != rounds+1 {
		t.Fatalf("%d leases while a lock is held on each, want %d", n, rounds+1)
	}
	for _, k := range heldKeys {
		if _, err := s.Release(ctx, k, ownerB, "", 0); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 5*time.Second, "the retired leases revoked", func() bool { return leaseCount(t, cli) == 1 })
	// Nothing is held on the retired leases now: each unknown outcome's lease goes at the
	// give-back.
	for i := range rounds {
		k := fmt.Sprintf("lock:lost%d", i)
		keys := []string{k}
		lt.arm(k)
		var err error
		if i%2 == 0 {
			_, err = s.Acquire(ctx, lockstore.Request{Key: k, Owner: ownerA, TTL: ttl})
		} else {
			keys = append(keys, k+"b")
			_, err = s.AcquireAll(ctx, keys, ownerA, ttl, "")
		}
		if err == nil {
			t.Fatalf("round %d: the acquisition did not time out", i)
		}
		lateKeys = append(lateKeys, keys...)
		for _, k := range keys {
			_, _ = s.Release(ctx, k, ownerA, "", 0)
		}
		waitFor(t, 5*time.Second, "the lease revoked at the give-back", func() bool { return leaseCount(t, cli) == 0 })
	}
	lt.wg.Wait()
	for _, k := range lateKeys {
		if get(t, cli, k) != nil {
			t.Fatalf("%s: a late commit is still held", k)
		}
	}
	if n := leaseCount(t, cli); n != 0 {
		t.Fatalf("%d leases left", n)
	}
	if s.Held() != 0 {
		t.Fatalf("%d entries left", s.Held())
	}
	checkLeaseEntries(t, s)
}

// An acquisition whose transaction committed on a lease but whose reply is still on its way
// when another acquisition's unknown outcome retires that lease and is given back: the lease
// must not be revoked under the key that the store is about to report acquired.
func TestRevocationWaitsForAcquisitionsInFlight(t *testing.T) {
	c := etcdtest.Start(t)
	committed, proceed := make(chan struct{}), make(chan struct{})
	var slow, lost atomic.Bool
	slow.Store(true)
	cli := faultyClient(t, c, func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == "/etcdserverpb.KV/Txn" {
			switch key := txnKey(req); {
			case key == "lock:a" && slow.CompareAndSwap(true, false):
				err := invoker(ctx, method, req, reply, cc, opts...)
				close(committed)
				<-proceed // the reply, slow on its way back
				return err
			case key == "lock:b" && lost.CompareAndSwap(true, false):
				return context.DeadlineExceeded
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}, nil)
	ctx := bg(t)
	s := newStore(t, cli)
	const ttl = time.Second
	var (
		wg  sync.WaitGroup
		got lockstore.Acquisition
		err error
	)
	wg.Go(func() { got, err = s.Acquire(ctx, lockstore.Request{Key: "lock:a", Owner: ownerA, TTL: ttl}) })
	<-committed
	lease := get(t, cli, "lock:a").Lease
	lost.Store(true)
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:b", Owner: ownerB, TTL: ttl}); err == nil {
		t.Fatal("the acquisition did not time out")
	}
	if _, err := s.Release(ctx, "lock:b", ownerB, "", 0); err != nil {
		t.Fatalf("give-back of the lost acquisition: %v, want nil (carried out in the background)", err)
	}
	waitFor(t, 5*time.Second, "the give-back carried out", func() bool {
		_, ok := s.entry("lock:b", ownerB)
		return !ok
	})
	time.Sleep(200 * time.Millisecond) // a revocation, if one were started, has happened
	close(proceed)
	wg.Wait()
	if err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	if kv := get(t, cli, "lock:a"); kv == nil || kv.Lease != lease || !leaseAlive(t, cli, lease) {
		t.Fatalf("the lock reported acquired is gone with its retired lease: %v", kv)
	}
	if err := s.Refresh(ctx, "lock:a", ownerA, ttl); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, "lock:a", ownerA, "", 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the retired lease revoked once released", func() bool { return !leaseAlive(t, cli, lease) })
}

// Close revokes a retired lease whose revocation it cuts short, and leaves one that a lock is
// still on to run out with it.
func TestCloseRevokesUnusedRetiredLeases(t *testing.T) {
	c := etcdtest.Start(t)
	lt := newLateTxns(t, 0)
	var stall atomic.Bool
	revoking := make(chan struct{})
	cli := faultyClient(t, c, func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == "/etcdserverpb.Lease/LeaseRevoke" && stall.CompareAndSwap(true, false) {
			close(revoking)
			<-ctx.Done() // the cluster does not answer in time
			return ctx.Err()
		}
		return lt.intercept(ctx, method, req, reply, cc, invoker, opts...)
	}, nil)
	ctx := bg(t)
	s, err := New(cli)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// A retired lease with a lock on it (TTL 3s), and one that nothing uses (TTL 2s), whose
	// revocation stalls.
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:keep", Owner: ownerB, TTL: 3 * time.Second}); err != nil {
		t.Fatal(err)
	}
	lt.arm("lock:lost1")
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:lost1", Owner: ownerA, TTL: 3 * time.Second}); err == nil {
		t.Fatal("the acquisition did not time out")
	}
	_, _ = s.Release(ctx, "lock:lost1", ownerA, "", 0)
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:two", Owner: ownerB, TTL: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, "lock:two", ownerB, "", 0); err != nil {
		t.Fatal(err)
	}
	if n := leaseCount(t, cli); n != 2 {
		t.Fatalf("%d leases, want the retired one and that of TTL 2s", n)
	}
	stall.Store(true)
	lt.arm("lock:lost2")
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:lost2", Owner: ownerA, TTL: 2 * time.Second}); err == nil {
		t.Fatal("the acquisition did not time out")
	}
	_, _ = s.Release(ctx, "lock:lost2", ownerA, "", 0)
	select {
	case <-revoking: // it stalls for a second
	case <-time.After(5 * time.Second):
		t.Fatal("the unused retired lease was not revoked")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if n := leaseCount(t, cli); n != 1 {
		t.Fatalf("%d leases after Close, want only the retired one under lock:keep", n)
	}
	if get(t, cli, "lock:keep") == nil {
		t.Fatal("Close freed lock:keep, held on its retired lease")
	}
}

// The keep-alives of a retired lease fail for a while, then etcd reports the lease gone: a
// refresh of the lock on it fails meanwhile (it promises nothing it cannot keep), succeeds once
// keep-alives do again, and answers ErrNotHeld once the lease is gone, which the store forgets
// with the lock; the current lease and its lock are untouched.
func TestRetiredLeaseKeepAliveFailsThenGone(t *testing.T) {
	c := etcdtest.Start(t)
	lt := newLateTxns(t, 0)
	var block atomic.Pointer[chan struct{}]
	cli := faultyClient(t, c, lt.intercept, func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn,
		method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if ch := block.Load(); ch != nil && method == "/etcdserverpb.Lease/LeaseKeepAlive" {
			select {
			case <-ctx.Done(): // the cluster does not answer
				return nil, ctx.Err()
			case <-*ch:
			}
		}
		return streamer(ctx, desc, cc, method, opts...)
	})
	ctx := bg(t)
	s := newStore(t, cli)
	const ttl = 2 * time.Second
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:keep", Owner: ownerB, TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	old := get(t, cli, "lock:keep").Lease
	lt.arm("lock:lost")
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:lost", Owner: ownerA, TTL: ttl}); err == nil {
		t.Fatal("the acquisition did not time out")
	}
	_, _ = s.Release(ctx, "lock:lost", ownerA, "", 0)
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:new", Owner: ownerB, TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	if get(t, cli, "lock:new").Lease == old {
		t.Fatal("a new grant went on the retired lease")
	}

	// A refresh keeps the lease alive with a keep-alive sent after it started: it cannot.
	unblock := make(chan struct{})
	block.Store(&unblock)
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := s.Refresh(rctx, "lock:keep", ownerB, ttl)
	cancel()
	if err == nil || errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("refresh while the retired lease cannot be kept alive: %v, want a store error", err)
	}
	block.Store(nil)
	close(unblock)
	errs := s.RefreshAll(ctx, []lockstore.Renewal{
		{Key: "lock:keep", Owner: ownerB, TTL: ttl}, {Key: "lock:new", Owner: ownerB, TTL: ttl}})
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("refresh once keep-alives work again: %v", errs)
	}
	if kv := get(t, cli, "lock:keep"); kv == nil || kv.Lease != old {
		t.Fatalf("the lock on the retired lease: %v", kv)
	}

	if _, err := cli.Revoke(ctx, clientv3.LeaseID(old)); err != nil {
		t.Fatal(err)
	}
	if err := s.Refresh(ctx, "lock:keep", ownerB, ttl); !errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("refresh after the retired lease was revoked elsewhere: %v, want ErrNotHeld", err)
	}
	waitFor(t, 2*time.Second, "the gone lease and its lock forgotten", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.byID[clientv3.LeaseID(old)] == nil && len(s.held) == 1
	})
	if err := s.Refresh(ctx, "lock:new", ownerB, ttl); err != nil {
		t.Fatalf("the lock on the current lease: %v", err)
	}
	if n := leaseCount(t, cli); n != 1 {
		t.Fatalf("%d leases, want the current one only", n)
	}
}

// checkLeaseEntries fails t unless each lease of s counts exactly the entries of held on it.
func checkLeaseEntries(t *testing.T, s *Store) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, l := range s.byID {
		n := 0
		for _, e := range s.held {
			if e.lease == id {
				n++
			}
		}
		if l.entries != n || l.inflight != 0 {
			t.Errorf("lease %x counts %d entries and %d calls in flight; held has %d entries on it and no call runs",
				int64(id), l.entries, l.inflight, n)
		}
	}
}

// An acquisition whose transactions etcd may have applied although it answered with an error
// (a leader change answers codes.Unavailable for a proposal that may still commit) is reported
// with lockstore.ErrOutcomeUnknown, or the caller's context error: the caller then gives back by
// that owner and asks again as another. Were the owner asked again, the store's give-back of
// the unknown outcome (its reaper, once the entry is due) could end the new grant.
func TestAcquireThatMayHaveRunSaysSo(t *testing.T) {
	c := etcdtest.Start(t)
	var armed atomic.Bool
	cli := faultyClient(t, c, func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if method == "/etcdserverpb.KV/Txn" && txnKey(req) == "lock:unsure" && armed.Load() {
			return status.Error(codes.Unavailable, "etcdserver: leader changed") // applied all the same
		}
		return err
	}, nil)
	s := newStore(t, cli)
	armed.Store(true)
	ctx, cancel := context.WithTimeout(bg(t), 1500*time.Millisecond)
	defer cancel()
	_, err := s.Acquire(ctx, lockstore.Request{Key: "lock:unsure", Owner: ownerA, TTL: 2 * time.Second})
	if !errors.Is(err, lockstore.ErrOutcomeUnknown) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire whose transactions may have run = %v, want an error wrapping ErrOutcomeUnknown (or the deadline)", err)
	}
	t.Logf("Acquire whose transactions may have run: %v", err)
}

// An acquisition etcd refused before applying any of it is no unknown outcome: nothing is
// recorded to give back. A refusal that lasts (a request the user may not make) ends a waiting
// Lock at once with etcd's error, instead of asking again as a new owner until the wait runs
// out; too many requests in flight is resent until etcd takes it.
func TestAcquireEtcdRefusedIsNoUnknownOutcome(t *testing.T) {
	c := etcdtest.Start(t)
	for _, tc := range []struct {
		name    string
		refusal error
		times   int32 // how many transactions are refused
		granted bool
	}{
		{"permission denied", rpctypes.ErrGRPCPermissionDenied, 1 << 30, false},
		{"too many requests", rpctypes.ErrGRPCRequestTooManyRequests, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var txns atomic.Int32
			cli := faultyClient(t, c, func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
				invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if method == "/etcdserverpb.KV/Txn" && txnKey(req) == "lock:refused" && txns.Add(1) <= tc.times {
					return tc.refusal // etcd applied nothing
				}
				return invoker(ctx, method, req, reply, cc, opts...)
			}, nil)
			s := newStore(t, cli)
			l, err := flightlock.New(s, flightlock.WithWait(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			lease, err := l.Lock(bg(t), "refused")
			switch {
			case tc.granted && err != nil:
				t.Fatalf("Lock through %d refusals of %s = %v, want granted on the resend", tc.times, tc.name, err)
			case tc.granted:
				if n := txns.Load(); n < tc.times+1 {
					t.Errorf("%d transactions sent, want at least %d", n, tc.times+1)
				}
				if err := lease.Release(bg(t)); err != nil {
					t.Fatal(err)
				}
			case err == nil || errors.Is(err, lockstore.ErrOutcomeUnknown) || errors.Is(err, flightlock.ErrBusy):
				t.Fatalf("Lock that etcd refused = %v, want the store's error, not an unknown outcome", err)
			case txns.Load() != 1:
				t.Errorf("%d transactions sent for a Lock etcd refused, want 1", txns.Load())
			}
			s.mu.Lock()
			records := len(s.held)
			s.mu.Unlock()
			if records != 0 {
				t.Errorf("%d records kept after a refusal that took nothing and a release, want 0", records)
			}
		})
	}
}

// etcd applies the transaction that crosses its quota, then answers it NOSPACE: that answer
// leaves the outcome unknown, and what the transaction took is given back.
func TestNoSpaceAfterTheTransactionAppliedIsGivenBack(t *testing.T) {
	c := etcdtest.Start(t)
	var armed atomic.Bool
	armed.Store(true)
	cli := faultyClient(t, c, func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if method == "/etcdserverpb.KV/Txn" && txnKey(req) == "lock:fill" && armed.CompareAndSwap(true, false) {
			return rpctypes.ErrGRPCNoSpace // applied, then answered NOSPACE
		}
		return err
	}, nil)
	s := newStore(t, cli)
	l, err := flightlock.New(s)
	if err != nil {
		t.Fatal(err)
	}
	if lease, err := l.TryLock(bg(t), "fill"); err == nil || !errors.Is(err, lockstore.ErrOutcomeUnknown) {
		if lease != nil {
			_ = lease.Release(bg(t))
		}
		t.Fatalf("TryLock answered NOSPACE after it applied = %v, want an unknown outcome", err)
	}
	other, err := flightlock.New(newStore(t, c.Client(t)))
	if err != nil {
		t.Fatal(err)
	}
	// The TTL is 10 s: the key is given back well before it could run out.
	poll.Until(t, 5*time.Second, 50*time.Millisecond, "another process takes the key", func() bool {
		lease, err := other.TryLock(bg(t), "fill")
		if err == nil {
			_ = lease.Release(bg(t))
		}
		return err == nil
	})
}

// A permit request whose permits fail in different ways says that it may have run when one of
// them may have (an unknown outcome, or one its caller's context cut short): a refusal of an
// earlier permit must not hide it, or the caller would ask again as the same owner.
func TestPermitRefusalDoesNotHideAnotherPermitThatMayHaveRun(t *testing.T) {
	c := etcdtest.Start(t)
	holder := newStore(t, c.Client(t))
	for _, tc := range []struct {
		name string
		fail func(ctx context.Context, run func(context.Context) error) error // the last permit's
	}{
		{"unknown outcome", func(ctx context.Context, run func(context.Context) error) error {
			_ = run(ctx)
			return status.Error(codes.Unavailable, "etcdserver: leader changed") // applied all the same
		}},
		{"cut by the caller's context", func(ctx context.Context, run func(context.Context) error) error {
			<-ctx.Done()
			_ = run(context.WithoutCancel(ctx)) // committed after the caller left
			return ctx.Err()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys := []string{"lock:pm#0", "lock:pm#1", "lock:pm#2"}
			for i := range keys {
				keys[i] = strings.ReplaceAll(keys[i], "pm", "pm-"+strings.ReplaceAll(tc.name, " ", "-"))
			}
			var failed atomic.Bool
			cli := faultyClient(t, c, func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
				invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if method == "/etcdserverpb.KV/Txn" {
					switch txnKey(req) {
					case keys[1]:
						return rpctypes.ErrGRPCPermissionDenied // refused: nothing applied
					case keys[2]:
						if failed.CompareAndSwap(false, true) {
							return tc.fail(ctx, func(ctx context.Context) error { return invoker(ctx, method, req, reply, cc, opts...) })
						}
					}
				}
				return invoker(ctx, method, req, reply, cc, opts...)
			}, nil)
			ctx := bg(t)
			if res, err := holder.Acquire(ctx, lockstore.Request{Key: keys[0], Owner: ownerB, TTL: 5 * time.Second}); err != nil || !res.Acquired {
				t.Fatalf("holder: %+v, %v", res, err)
			}
			s := newStore(t, cli)
			actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			res, err := s.Acquire(actx, lockstore.Request{Key: "lock:pm", Owner: ownerA, TTL: 5 * time.Second, Permits: keys, Want: 2})
			t.Logf("permit request: %+v, %v", res, err)
			if err != nil && !errors.Is(err, lockstore.ErrOutcomeUnknown) && !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("permit request with one permit refused and another that may have run = %v, want an error that says it may have run (or a grant)", err)
			}
			if !failed.Load() {
				t.Fatal("the permit that may have run was never asked for: the test proves nothing")
			}
		})
	}
}
