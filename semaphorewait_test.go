package flightlock

// How a semaphore taker waits: each test states the behaviour a plain lock has and a permit
// keeps.

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

// A look at the permits is bounded by the wait budget, as a plain lock's first attempt is: a
// store that answers slowly (here: one permit's acquisition takes 3s) must not hold a taker
// with a 100ms wait and no deadline of its own for seconds; unbounded, n permits on a hung
// store would hold the caller up to n TTLs.
func TestPermitLookIsBoundedByTheWaitBudget(t *testing.T) {
	const budget, slow = 100 * time.Millisecond, 3 * time.Second
	ctx := context.Background()

	// The plain lock, for comparison: its attempt is cut at the wait budget.
	s0, _, _ := miniStore(t)
	f0 := &faultStore{Store: s0, slowBy: slow}
	k0 := "lock:plain"
	f0.slowKey.Store(&k0)
	start := time.Now()
	if lease, err := mustLocker(t, f0, WithWait(budget)).Lock(ctx, "plain"); err == nil {
		_ = lease.Release(ctx)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("premise: the plain Lock took %v with a %v wait", took, budget)
	}

	s, _, _ := miniStore(t)
	f := &faultStore{Store: s, slowBy: slow}
	k := "lock:" + PermitKey("export", 1)
	f.slowKey.Store(&k)
	// Permit 2 is another process's.
	if got, err := s.Acquire(ctx, "lock:"+PermitKey("export", 2), "someone-else", time.Minute, ""); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	l := mustLocker(t, f, WithWait(budget), WithPermits(2))
	start = time.Now()
	lease, err := l.Lock(ctx, "export")
	took := time.Since(start)
	if err == nil {
		defer lease.Release(ctx)
	}
	if took > time.Second {
		t.Errorf("Lock with a %v wait returned after %v (err %v, got a lease: %v): the look at the permits is not "+
			"bounded by the wait budget", budget, took.Round(time.Millisecond), err, lease != nil)
	}
}

// A capped retry strategy (LimitRetry, the middleware's Retry.Attempts) counts the looks at
// the permits as a plain lock counts its attempts: LimitRetry(r, 1) is a single look, busy at
// once; LimitRetry(r, 2) two. One look more would cost n more round trips.
func TestCappedAttemptsBoundPermitLooks(t *testing.T) {
	ctx := context.Background()
	for _, attempts := range []int{1, 2} {
		m := newMemStore() // no release notifications: the retry delays alone pace the looks
		for i := 1; i <= 2; i++ {
			if got, err := m.Acquire(ctx, "lock:"+PermitKey("export", i), "someone-else", time.Minute, ""); err != nil || !got.Acquired {
				t.Fatal(got, err)
			}
		}
		f := &faultStore{Store: m}
		l := mustLocker(t, f, WithWait(5*time.Second), WithPermits(2),
			WithRetry(LimitRetry(LinearRetry(20*time.Millisecond), attempts)))
		_, err := l.Lock(ctx, "export")
		if !errors.Is(err, ErrBusy) {
			t.Fatalf("Attempts %d: %v, want ErrBusy", attempts, err)
		}
		if got, want := f.acquires.Load(), int64(2*attempts); got != want {
			t.Errorf("Attempts %d: %d acquisitions for 2 permits, want %d (%d looks); a plain lock makes %d attempts",
				attempts, got, want, attempts, attempts)
		}
	}
}

// An upstream owner handed over for permit 1 that holds nothing (its request released it
// already) grants nothing, and the taker locks as a new owner, as for a plain lock: it takes
// any free permit (here permit 2), rather than waiting for permit 1 alone.
func TestHandedOverPermitThatHoldsNothingTakesAFreePermit(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	if got, err := s.Acquire(ctx, "lock:"+PermitKey("export", 1), "someone-else", time.Minute, ""); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	l := mustLocker(t, s, WithWait(300*time.Millisecond), WithPermits(2))
	hctx := withOwner(ctx, "lock:"+PermitKey("export", 1), newOwnerToken()) // holds nothing
	lease, err := l.Lock(hctx, "export")
	if err != nil {
		t.Fatalf("Lock with a stale handed-over owner of permit 1: %v; permit 2 was free", err)
	}
	_ = lease.Release(ctx)
}

// A taker that waits while one permit is held in its process and one elsewhere hears the
// release of the one held elsewhere at once, not at the end of its retry delay (here 3s).
func TestParkedPermitTakerHearsARemoteRelease(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	l := mustLocker(t, s, WithWait(10*time.Second), WithPermits(2), WithRetry(LinearRetry(3*time.Second)))
	other := mustLocker(t, s, WithPermits(2)) // another process
	local, err := l.Lock(ctx, "export")
	if err != nil {
		t.Fatal(err)
	}
	defer local.Release(ctx)
	remote, err := other.Lock(ctx, "export")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan lockResult, 1)
	go func() {
		lease, err := l.Lock(ctx, "export")
		got <- lockResult{lease, err}
	}()
	time.Sleep(100 * time.Millisecond) // the taker has looked and waits
	select {
	case r := <-got:
		t.Fatalf("the taker did not wait with both permits held: %v", r.err)
	default:
	}
	released := time.Now()
	if err := remote.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	took := time.Since(released)
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.lease.Release(ctx)
	if took > time.Second {
		t.Errorf("the taker got the permit released elsewhere %v after its release (key %q): it slept to the end "+
			"of its turn on the local permit", took.Round(time.Millisecond), r.lease.Key())
	}
}

// watchCounter is a store that counts Watch calls; it does not share watches
// (lockstore.SharedWatcher), as the etcd store does not.
type watchCounter struct {
	lockstore.Store
	watches atomic.Int32
}

func (w *watchCounter) Watch(ctx context.Context, key string) (*lockstore.Watch, error) {
	w.watches.Add(1)
	return w.Store.Watch(ctx, key)
}

// On a store whose watches are not shared, a waiting taker opens no watch per permit (a watch
// and a goroutine each, for every waiter): it looks again at the retry delays, and gets a
// permit once one is released.
func TestPermitTakersWatchOnlyWhereWatchesAreShared(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	other := mustLocker(t, s, WithPermits(2)) // another process holds both permits
	var held []*Lease
	for range 2 {
		x, err := other.Lock(ctx, "export")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, x)
	}
	counted := &watchCounter{Store: s}
	l := mustLocker(t, counted, WithWait(10*time.Second), WithPermits(2), WithRetry(LinearRetry(10*time.Millisecond)))
	got := make(chan lockResult, 1)
	go func() {
		lease, err := l.Lock(ctx, "export")
		got <- lockResult{lease, err}
	}()
	time.Sleep(50 * time.Millisecond)
	_ = held[0].Release(ctx)
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	_ = r.lease.Release(ctx)
	_ = held[1].Release(ctx)
	if n := counted.watches.Load(); n != 0 {
		t.Errorf("%d watches opened on a store that does not share them, want 0", n)
	}
}

// A taker that waits while one permit is held in its process and one elsewhere queues on the
// local one, and gets it by handoff, without a round trip, when its holder releases it: a hot
// semaphore keeps its permits in their processes within the handoff bounds, as a lock does.
func TestPermitTakerQueuesOnALocalPermitWhileAnotherIsHeldElsewhere(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	// A handoff window of an hour: the default 20 ms can pass on a loaded machine first.
	l := mustLocker(t, s, WithWait(10*time.Second), WithPermits(2), WithHandoff(DefaultHandoff, time.Hour))
	other := mustLocker(t, s, WithPermits(2)) // another process
	local, err := l.Lock(ctx, "export")
	if err != nil {
		t.Fatal(err)
	}
	remote, err := other.Lock(ctx, "export")
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Release(ctx)
	got := make(chan lockResult, 1)
	go func() {
		lease, err := l.Lock(ctx, "export")
		got <- lockResult{lease, err}
	}()
	waitFor(t, 5*time.Second, "the taker to queue on the local permit", func() bool {
		return queuedOn(l, local.Key()[len("lock:"):]) == 1
	})
	if err := local.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.lease.Release(ctx)
	if r.lease.Key() != local.Key() || r.lease.Grant() != GrantHandoff {
		t.Fatalf("the taker got %q by %v, want %q handed over", r.lease.Key(), r.lease.Grant(), local.Key())
	}
}
