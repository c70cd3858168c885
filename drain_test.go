package flightlock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

// Drain refuses new locks at once, lets the holders finish (re-entries included), answers
// ErrClosed to a caller that was queued for the key, and returns when the last lock of the
// process was released, which frees the key in Redis for the other processes.
func TestDrainWaitsForHoldersAndRefusesNewLocks(t *testing.T) {
	s, _, c := miniStore(t)
	ctx := context.Background()
	l := mustLocker(t, s, WithWait(5*time.Second))
	derived, err := l.With(WithMode(Reject))
	if err != nil {
		t.Fatal(err)
	}
	held, err := l.Lock(ctx, "d")
	if err != nil {
		t.Fatal(err)
	}
	queued := make(chan error, 1)
	go func() {
		lease, err := l.Lock(ctx, "d")
		if err == nil {
			_ = lease.Release(ctx)
		}
		queued <- err
	}()
	waitFor(t, 2*time.Second, "a queued waiter", func() bool {
		l.k.gate.mu.Lock()
		defer l.k.gate.mu.Unlock()
		return l.k.gate.entries["lock:d"].queued() == 1
	})

	drained := make(chan error, 1)
	go func() { drained <- l.Drain(ctx) }()
	waitFor(t, 2*time.Second, "the drain to start", l.k.gate.closed.Load)
	// A waiter queued here is answered at once, while the key is still held: it takes no lock,
	// and a LockAll holds none of its keys meanwhile.
	select {
	case err := <-queued:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("the queued waiter got %v, want ErrClosed", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the queued waiter still waits after the drain began")
	}

	for _, lk := range []*Locker{l, derived} {
		if _, err := lk.Lock(ctx, "other"); !errors.Is(err, ErrClosed) {
			t.Fatalf("Lock of a new key while draining: %v, want ErrClosed", err)
		}
	}
	// The holder finishes its work, nested locks included.
	in, err := l.Lock(held.Context(), "d")
	if err != nil {
		t.Fatalf("re-entry while draining: %v", err)
	}
	if err := in.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-drained:
		t.Fatalf("Drain returned (%v) while a lock was held", err)
	case <-time.After(20 * time.Millisecond):
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-drained:
		if err != nil {
			t.Fatalf("Drain: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Drain did not return after the last release")
	}
	if n := c.Exists(ctx, "lock:d").Val(); n != 0 {
		t.Fatal("the key is still in Redis after the drain")
	}
	if n := l.gateLen(); n != 0 {
		t.Fatalf("gate keeps %d entries", n)
	}
}

// When its grace period ends, Drain cancels the contexts of the leases still held (cause
// ErrClosed), reports them, and leaves their locks alone: they are released by their holders,
// never under them.
func TestDrainGraceEndsByCancellingHolders(t *testing.T) {
	s, _, c := miniStore(t)
	ctx := context.Background()
	l := mustLocker(t, s)
	a, err := l.Lock(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	// A re-entry of another process's lock counts too (it has no gate entry).
	upstream := mustLocker(t, s)
	up, err := upstream.Lock(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Release(ctx)
	b, err := l.Lock(withOwner(ctx, up.Key(), up.Owner()), "b")
	if err != nil {
		t.Fatal(err)
	}
	if b.Grant() != GrantBorrowed {
		t.Fatalf("grant %v, want borrowed", b.Grant())
	}

	grace, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	err = l.Drain(grace)
	if err == nil || !errors.Is(err, ErrClosed) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Drain past its grace: %v, want an error wrapping ErrClosed and DeadlineExceeded", err)
	}
	for _, lease := range []*Lease{a, b} {
		if cause := context.Cause(lease.Context()); cause != ErrClosed {
			t.Fatalf("%s: context cause %v, want ErrClosed", lease.Key(), cause)
		}
	}
	if v := c.Get(ctx, "lock:a").Val(); v == "" {
		t.Fatal("Drain released a lock whose holder may still run")
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := l.Drain(ctx); err != nil {
			t.Errorf("second Drain: %v", err)
		}
	}()
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if c.Exists(ctx, "lock:a").Val() != 0 {
		t.Fatal("lock:a still in Redis after its holder released it")
	}
}

// A Locker that holds nothing drains at once.
func TestDrainIdle(t *testing.T) {
	s, _, _ := miniStore(t)
	l := mustLocker(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // an ended context must not matter when there is nothing to wait for
	if err := l.Drain(ctx); err != nil {
		t.Fatalf("Drain of an idle Locker: %v", err)
	}
	if _, err := l.TryLock(context.Background(), "x"); !errors.Is(err, ErrClosed) {
		t.Fatalf("TryLock after Drain: %v, want ErrClosed", err)
	}
}

// stallReenter is a store whose Reenter, once it has run, waits until the test lets its reply
// go: a re-entry whose reply is on its way back while the process drains.
type stallReenter struct {
	lockstore.Store
	ran     chan struct{}
	release chan struct{}
}

func (s *stallReenter) Reenter(ctx context.Context, key, owner, hold string, ttl time.Duration) (lockstore.Acquisition, error) {
	a, err := s.Store.Reenter(ctx, key, owner, hold, ttl)
	close(s.ran)
	<-s.release
	return a, err
}

// Drain returns only when the process holds no lock. A re-entry of another process's lock
// through a handed-over owner (a borrowed hold) that was taken in Redis when Drain looked is
// held by the process, but the gate only counted it once the reply came (addBorrowed then):
// Drain returns nil in between, and a process that exits then leaves the hold in Redis, which
// keeps the upstream's lock from its peers for a TTL after the upstream released it.
func TestDrainWaitsForABorrowedHoldOnTheWire(t *testing.T) {
	s, mr, _ := miniStore(t)
	ctx := context.Background()
	upstream := mustLocker(t, s)
	up, err := upstream.Lock(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Release(ctx)
	owner := up.Owner()

	st := &stallReenter{Store: s, ran: make(chan struct{}), release: make(chan struct{})}
	l := mustLocker(t, st)
	got := make(chan lockResult, 1)
	go func() {
		lease, err := l.Lock(withOwner(ctx, up.Key(), owner), "b")
		got <- lockResult{lease, err}
	}()
	<-st.ran // the hold is listed in Redis; its reply has not come back

	dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	derr := l.Drain(dctx)
	cancel()
	close(st.release)
	r := <-got
	if r.err != nil {
		t.Fatalf("borrowed re-entry: %v", r.err)
	}
	if derr == nil {
		t.Errorf("Drain returned nil while the process held a re-entry of %q in Redis (value %q), granted %v",
			up.Key(), mustGet(mr, up.Key()), r.lease.Grant())
	}
	_ = r.lease.Release(ctx)
}

// A caller that waits for a key held by another process waits in acquire's retry loop, not in
// the gate's queue. Drain tells queued callers ErrClosed, but this one keeps retrying: Drain
// waits for it as for a held lock (and reports it as held when its grace ends) though the
// process holds nothing, and once the other process releases, the caller gets the lock after
// the drain, with a context that the drain never cancels.
func TestDrainAnswersACallerRetryingInRedis(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	other := mustLocker(t, s)
	held, err := other.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	l := mustLocker(t, s, WithWait(10*time.Second))
	got := lockIn(l, "k")
	waitFor(t, 5*time.Second, "the caller to own the gate slot", func() bool { return l.gateLen() == 1 })
	time.Sleep(20 * time.Millisecond) // it is retrying in Redis

	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	derr := l.Drain(dctx)
	cancel()
	if derr != nil {
		t.Errorf("Drain while the process holds nothing (one caller retrying in Redis): %v", derr)
	}
	_ = held.Release(ctx)
	select {
	case r := <-got:
		if r.err == nil {
			t.Errorf("the caller got the lock after the drain (grant %v), context cause %v",
				r.lease.Grant(), context.Cause(r.lease.Context()))
			_ = r.lease.Release(ctx)
		} else if !errors.Is(r.err, ErrClosed) {
			t.Errorf("the caller: %v, want ErrClosed", r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the caller did not return")
	}
}
