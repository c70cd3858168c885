package flightlock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

// A lease makes its context only when Context is first called (issue 17: a lease held without
// it costs no cancelable context). Whatever ended the lease before that call (loss, release,
// drain, the caller's context) ends the context it then gets, with the same cause.
func TestLeaseContextMadeLateCarriesItsEnd(t *testing.T) {
	ctx := context.Background()
	const ttl = 300 * time.Millisecond

	t.Run("lost", func(t *testing.T) {
		clk := newManualClock()
		fs := &faultStore{Store: newMemStore()}
		l := mustLocker(t, fs, WithTTL(ttl), withClock(clk))
		lease, err := l.Lock(ctx, "late:lost")
		if err != nil {
			t.Fatal(err)
		}
		refused := lockstore.ErrNotHeld
		fs.failRefresh.Store(&refused)
		clk.Advance(ttl / 3)
		if cause := context.Cause(lease.Context()); cause != ErrLost {
			t.Fatalf("context asked for after the loss: cause %v, want ErrLost", cause)
		}
		_ = lease.Release(ctx)
	})

	t.Run("released", func(t *testing.T) {
		l := mustLocker(t, newMemStore())
		lease, err := l.Lock(ctx, "late:released")
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := lease.Context().Err(); !errors.Is(err, context.Canceled) {
			t.Fatalf("context asked for after release: %v, want context.Canceled", err)
		}
	})

	t.Run("drained", func(t *testing.T) {
		l := mustLocker(t, newMemStore())
		lease, err := l.Lock(ctx, "late:drained")
		if err != nil {
			t.Fatal(err)
		}
		dctx, cancel := context.WithCancel(ctx)
		cancel()
		if err := l.Drain(dctx); err == nil {
			t.Fatal("drain with a lock held and an ended context reported nothing left")
		}
		if cause := context.Cause(lease.Context()); cause != ErrClosed {
			t.Fatalf("context asked for after drain interrupted the lease: cause %v, want ErrClosed", cause)
		}
		_ = lease.Release(ctx)
	})

	t.Run("parent", func(t *testing.T) {
		l := mustLocker(t, newMemStore())
		pctx, cancel := context.WithCancelCause(ctx)
		lease, err := l.Lock(pctx, "late:parent")
		if err != nil {
			t.Fatal(err)
		}
		stop := errors.New("caller gave up")
		cancel(stop)
		if cause := context.Cause(lease.Context()); cause != stop {
			t.Fatalf("context asked for after its parent ended: cause %v, want the parent's", cause)
		}
		if FromContext(lease.Context()) != lease {
			t.Fatal("the late context does not carry its lease")
		}
		_ = lease.Release(ctx)
	})

	// The first end wins, as with a context made by Lock: the lease's own end before its
	// parent's, the parent's before the lease's.
	t.Run("order", func(t *testing.T) {
		l := mustLocker(t, newMemStore())
		stop := errors.New("caller gave up")

		pctx, cancel := context.WithCancelCause(ctx)
		first, err := l.Lock(pctx, "late:order:1")
		if err != nil {
			t.Fatal(err)
		}
		_ = first.Release(ctx)
		cancel(stop)
		if cause := context.Cause(first.Context()); cause != context.Canceled {
			t.Fatalf("released, then the parent ended: cause %v, want context.Canceled", cause)
		}

		pctx, cancel = context.WithCancelCause(ctx)
		second, err := l.Lock(pctx, "late:order:2")
		if err != nil {
			t.Fatal(err)
		}
		cancel(stop)
		_ = second.Release(ctx)
		if cause := context.Cause(second.Context()); cause != stop {
			t.Fatalf("the parent ended, then released: cause %v, want the parent's", cause)
		}
	})

	// Goroutines asking for the context while the lease is lost all get the one context,
	// ended with ErrLost (run with -race).
	t.Run("concurrent", func(t *testing.T) {
		clk := asyncClock{newManualClock()}
		fs := &faultStore{Store: newMemStore()}
		l := mustLocker(t, fs, WithTTL(ttl), withClock(clk))
		lease, err := l.Lock(ctx, "late:concurrent")
		if err != nil {
			t.Fatal(err)
		}
		refused := lockstore.ErrNotHeld
		fs.failRefresh.Store(&refused)
		var wg sync.WaitGroup
		got := make([]context.Context, 8)
		for i := range got {
			wg.Go(func() { got[i] = lease.Context() })
		}
		clk.Advance(ttl / 3)
		wg.Wait()
		waitFor(t, 5*time.Second, "the refused renewal to lose the lease", func() bool {
			return context.Cause(lease.Context()) == ErrLost
		})
		for _, c := range got {
			if c != lease.Context() {
				t.Fatal("two contexts for one lease")
			}
		}
		_ = lease.Release(ctx)
	})
}
