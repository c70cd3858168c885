package flightlock

import (
	"context"
	"errors"
	"sync"
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
