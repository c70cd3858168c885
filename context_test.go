package flightlock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Goroutines that carry a lease's context (mr.MapReduce, threading.GoSafe, a job started with
// context.WithoutCancel) are the lease's owner: each re-enters at once, with the lease's fence,
// while the others are inside. All of them wait inside for each other before leaving, so the
// test only ends if they were inside together.
func TestGoroutinesSharingALeaseContextEnterTogether(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	for _, mode := range []Mode{Wait, Reject} {
		l := mustLocker(t, s, WithMode(mode), WithWait(5*time.Second))
		outer, err := l.Lock(ctx, "fan")
		if err != nil {
			t.Fatal(err)
		}
		const n = 3
		var inside sync.WaitGroup
		inside.Add(n)
		errs := make(chan error, n)
		for i := range n {
			go func() {
				lctx := outer.Context()
				if i == 0 {
					lctx = context.WithoutCancel(lctx) // a background job keeps the owner
				}
				lease, err := l.Lock(lctx, "fan")
				if err != nil {
					inside.Done()
					errs <- err
					return
				}
				if lease.Grant() != GrantReentry || lease.Fence() != outer.Fence() {
					errs <- errors.New("not a re-entry of the holder's grant")
				}
				inside.Done()
				inside.Wait() // every sibling is inside now
				errs <- lease.Release(ctx)
			}()
		}
		for range n {
			if err := <-errs; err != nil {
				t.Fatalf("mode %v: a goroutine with the holder's context: %v", mode, err)
			}
		}
		if err := outer.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// NewOwner makes a goroutine of the holder a new owner: it is refused in reject mode, waits
// behind the holder in wait mode, and takes the key with a fence of its own once the holder
// released it (a job that outlives the request, so without the lease's cancellation). A
// handed-over owner in its context is forgotten too.
func TestNewOwnerWaitsBehindTheHolder(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	l := mustLocker(t, s, WithWait(5*time.Second))
	holder, err := l.Lock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	own := NewOwner(holder.Context())
	if FromContext(own) != nil {
		t.Fatal("FromContext finds a lease in a new owner's context")
	}
	if _, err := l.TryLock(own, "job"); !errors.Is(err, ErrBusy) {
		t.Fatalf("TryLock as a new owner while the holder holds the key: %v, want ErrBusy", err)
	}
	handed := NewOwner(withOwner(ctx, holder.Key(), holder.Owner()))
	if _, err := l.TryLock(handed, "job"); !errors.Is(err, ErrBusy) {
		t.Fatalf("TryLock as a new owner with the holder's owner handed over: %v, want ErrBusy", err)
	}

	got := make(chan *Lease, 1)
	go func() {
		lease, err := l.Lock(NewOwner(context.WithoutCancel(holder.Context())), "job")
		if err != nil {
			t.Error(err)
		}
		got <- lease
	}()
	select {
	case lease := <-got:
		t.Fatalf("a new owner took the key while its holder held it (fence %d)", lease.Fence())
	case <-time.After(100 * time.Millisecond):
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lease := <-got
	if lease == nil {
		t.Fatal("no lease after the holder released")
	}
	if lease.Grant() == GrantReentry || lease.Fence() <= holder.Fence() {
		t.Fatalf("the new owner's grant is %v with fence %d, want a grant of its own above %d", lease.Grant(), lease.Fence(), holder.Fence())
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A lease that was released admits no re-entry: a goroutine that still carries its context
// locks as a new owner, behind whoever holds the key now.
func TestReleasedLeaseAdmitsNoReentry(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	l := mustLocker(t, s, WithWait(5*time.Second))
	first, err := l.Lock(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	stale := first.Context()
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next, err := l.Lock(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if lease, err := l.TryLock(context.WithoutCancel(stale), "r"); !errors.Is(err, ErrBusy) {
		if lease != nil {
			_ = lease.Release(ctx)
		}
		t.Fatalf("TryLock with a released lease's context while another request holds the key: %v, want ErrBusy", err)
	}
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lease, err := l.TryLock(context.WithoutCancel(stale), "r")
	if err != nil {
		t.Fatal(err)
	}
	if lease.Grant() == GrantReentry || lease.Fence() <= next.Fence() {
		t.Fatalf("lock with a released lease's context: %v grant, fence %d, want a grant of its own above %d", lease.Grant(), lease.Fence(), next.Fence())
	}
	_ = lease.Release(ctx)
}

// Deterministic replay of lock()'s steps: findLease sees the parent active, then the parent's
// grant ends and is handed to a local waiter W (nextGrant sets live=1), then enterSlot runs.
// The stale re-entry joins W's grant: two goroutines in the critical section, with the old fence.
func TestStaleReentryNeverJoinsTheNextGrant(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	l := mustLocker(t, s, WithWait(5*time.Second), WithHandoff(8, time.Minute))
	g1, err := l.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	wLease := make(chan *Lease, 1)
	go func() {
		lease, err := l.Lock(ctx, "k")
		if err != nil {
			t.Error(err)
		}
		wLease <- lease
	}()
	waitFor(t, 2*time.Second, "waiter queued", func() bool {
		l.k.gate.mu.Lock()
		defer l.k.gate.mu.Unlock()
		return l.k.gate.entries["lock:k"].queued() == 1
	})
	// X, a goroutine carrying g1's context (background job), is inside lock(): findLease found g1.
	parent := findLease(g1.Context(), l.k.gate, "lock:k")
	if parent != g1 {
		t.Fatal("no parent")
	}
	// Meanwhile the handler returns: g1 released, the key handed to W.
	if err := g1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	w := <-wLease
	// X continues: re-enters the lease it found.
	x, err := l.reenter(g1.Context(), parent)
	if err != nil {
		t.Logf("reenter refused (correct): %v", err)
		_ = w.Release(ctx)
		return
	}
	t.Errorf("stale re-entry granted while W holds the key: W fence %d, X fence %d (X's ctx err %v)", w.Fence(), x.Fence(), x.Context().Err())
	_ = w.Release(ctx)
	_ = x.Release(ctx)
}

// The same through the public API only: a background goroutine carrying the handler's context
// (context.WithoutCancel, as the README allows) locks the key just as the handler releases it to
// a queued request W. Only overlaps of W and the background job are counted (the handler itself
// is documented as not excluded from re-entries it starts).
func TestBackgroundReentryRacingHandoffNeverOverlaps(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	l := mustLocker(t, s, WithWait(5*time.Second), WithHandoff(1<<20, time.Hour))
	var inW, inBG, overlaps atomic.Int64
	for i := 0; i < 1500 && overlaps.Load() == 0; i++ {
		g1, err := l.Lock(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { // a queued request
			defer wg.Done()
			lease, err := l.Lock(ctx, "k")
			if err != nil {
				return
			}
			inW.Add(1)
			if inBG.Load() > 0 {
				overlaps.Add(1)
			}
			time.Sleep(50 * time.Microsecond)
			inW.Add(-1)
			_ = lease.Release(ctx)
		}()
		bg := context.WithoutCancel(g1.Context())
		go func() { // a background job of the handler
			defer wg.Done()
			lease, err := l.Lock(bg, "k")
			if err != nil {
				return
			}
			inBG.Add(1)
			if inW.Load() > 0 {
				overlaps.Add(1)
			}
			time.Sleep(50 * time.Microsecond)
			inBG.Add(-1)
			_ = lease.Release(ctx)
		}()
		time.Sleep(time.Duration(i%7) * 10 * time.Microsecond)
		_ = g1.Release(ctx)
		wg.Wait()
	}
	if n := overlaps.Load(); n > 0 {
		t.Errorf("%d overlaps of the queued request and the background job", n)
	}
}

// A handler locks k; its service layer locks k again (a nested re-entry) and fans out with
// mr.MapReduce-style goroutines that each lock k: every one of them carries the owner's
// context, so each enters at once, from the grant as from inside the re-entry.
func TestFanOutFromInsideAReentry(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	l := mustLocker(t, s, WithWait(300*time.Millisecond))
	fanOut := func(ctx context.Context) error {
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				lease, err := l.Lock(ctx, "k")
				if err != nil {
					errs[i] = err
					return
				}
				time.Sleep(time.Millisecond)
				_ = lease.Release(ctx)
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	outer, err := l.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer outer.Release(ctx)
	if err := fanOut(outer.Context()); err != nil {
		t.Fatalf("fan-out from the grant holder: %v", err)
	}
	inner, err := l.Lock(outer.Context(), "k") // nested Lock in the same goroutine
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Release(ctx)
	start := time.Now()
	if err := fanOut(inner.Context()); err != nil {
		t.Errorf("fan-out from inside a re-entry failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
	}
}
