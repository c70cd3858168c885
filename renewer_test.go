package flightlock

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

// asyncClock is the manual clock with the system clock's concurrency: the watchdog does not
// wait for the renewals a timer starts (see concurrentTimers), as in production.
type asyncClock struct{ *manualClock }

func (asyncClock) concurrentTimers() {}

// counts returns how many timers were made on c, and how many of them are armed.
func (c *manualClock) counts() (made, armed int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range c.timers {
		if t.armed {
			armed++
		}
	}
	return len(c.timers), armed
}

// refreshLog is a Store that records when each key was refreshed, on a clock.
type refreshLog struct {
	lockstore.Store
	clk clock
	mu  sync.Mutex
	at  map[string][]time.Time // guarded by mu
}

func (r *refreshLog) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	r.mu.Lock()
	r.at[key] = append(r.at[key], r.clk.Now())
	r.mu.Unlock()
	return r.Store.Refresh(ctx, key, owner, ttl)
}

// state returns the watchdog's heap length and capacity and its renewers.
func (w *watchdog) state() (pending, capacity, workers int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.heap), cap(w.heap), w.workers
}

// 2,000 held locks arm one timer on the clock between them, and each is renewed on its own
// schedule: TTL/3 after its acquisition, then TTL/3 after each renewal (issue 17: every hold
// had a timer of its own). After release the watchdog holds nothing.
func TestHoldsShareOneClockTimer(t *testing.T) {
	const n, ttl = 2000, 300 * time.Millisecond
	ctx := context.Background()
	clk := newManualClock()
	store := &refreshLog{Store: newMemStore(), clk: clk, at: make(map[string][]time.Time)}
	l := mustLocker(t, store, WithTTL(ttl), WithMaxHold(time.Hour), withClock(clk))
	start := clk.Now()
	leases := make([]*Lease, n)
	taken := make([]time.Time, n)
	for i := range leases {
		if i == n/2 {
			clk.Advance(7 * time.Millisecond) // a second group, on a schedule of its own
		}
		lease, err := l.Lock(ctx, "one-timer:"+strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		leases[i], taken[i] = lease, clk.Now()
	}
	if made, armed := clk.counts(); made != 1 || armed != 1 {
		t.Fatalf("%d held locks made %d timers, %d armed; want one", n, made, armed)
	}
	clk.Advance(2*ttl + ttl/3) // seven renewals of the first group, six of the second... and then some
	for i, lease := range leases {
		if err := context.Cause(lease.Context()); err != nil {
			t.Fatalf("%s: %v", lease.Key(), err)
		}
		got := store.at[lease.Key()]
		elapsed := clk.Now().Sub(taken[i])
		if want := int(elapsed / (ttl / 3)); len(got) != want {
			t.Fatalf("%s: %d renewals in %v, want %d", lease.Key(), len(got), elapsed, want)
		}
		for j, at := range got {
			if want := taken[i].Add(time.Duration(j+1) * ttl / 3); !at.Equal(want) {
				t.Fatalf("%s: renewal %d at %v, want %v (TTL/3 after the previous send)", lease.Key(), j+1, at.Sub(start), want.Sub(start))
			}
		}
	}
	if made, armed := clk.counts(); made != 1 || armed != 1 {
		t.Fatalf("after the renewals: %d timers made, %d armed; want one", made, armed)
	}
	for _, lease := range leases {
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	pending, capacity, _ := l.k.wd.state()
	if pending != 0 || capacity > 64 {
		t.Fatalf("after release the watchdog's heap holds %d events in an array of %d", pending, capacity)
	}
	if _, armed := clk.counts(); armed != 0 {
		t.Fatal("the watchdog's timer stays armed with nothing to do")
	}
}

// stuckRefreshStore is a Store whose refreshes hang, ignoring their context, until release is
// closed; it counts the refreshes sent and the most on the wire at once.
type stuckRefreshStore struct {
	lockstore.Store
	release  chan struct{}
	sent     atomic.Int64
	inFlight atomic.Int64
	most     atomic.Int64
}

func (s *stuckRefreshStore) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	s.sent.Add(1)
	n := s.inFlight.Add(1)
	for {
		m := s.most.Load()
		if n <= m || s.most.CompareAndSwap(m, n) {
			break
		}
	}
	<-s.release
	s.inFlight.Add(-1)
	return s.Store.Refresh(ctx, key, owner, ttl)
}

// Renewals that fall due together run on a bounded set of goroutines, never one per renewal
// (issue 17: up to 6,400 goroutines at once while holding 100,000 locks), and a renewal that
// waits for a renewer, or hangs on the wire, does not keep a lease past its loss deadline:
// TTL - TTL/10 after the send of the last successful acquire or refresh, exactly.
func TestQueuedRenewalKeepsTheLossDeadline(t *testing.T) {
	const n, ttl = 3 * maxRenewers, 300 * time.Millisecond
	ctx := context.Background()
	clk := asyncClock{newManualClock()}
	store := &stuckRefreshStore{Store: newMemStore(), release: make(chan struct{})}
	l := mustLocker(t, store, WithTTL(ttl), WithMaxHold(time.Hour), withClock(clk))
	leases := make([]*Lease, n)
	for i := range leases {
		lease, err := l.Lock(ctx, "hang:"+strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = lease
	}
	goroutines := runtime.NumGoroutine()
	clk.Advance(ttl / 3) // all renewals due: maxRenewers hang on the wire, the rest wait
	waitFor(t, 5*time.Second, "the renewers to send", func() bool { return store.inFlight.Load() == maxRenewers })
	time.Sleep(20 * time.Millisecond) // room for a renewal beyond the bound to show up
	if sent, most := store.sent.Load(), store.most.Load(); sent != maxRenewers || most != maxRenewers {
		t.Fatalf("%d renewals due together: %d sent, %d at once; want %d (the renewers' bound)", n, sent, most, maxRenewers)
	}
	if extra := runtime.NumGoroutine() - goroutines; extra > maxRenewers {
		t.Fatalf("%d renewals in flight or queued run on %d more goroutines, want at most %d", n, extra, maxRenewers)
	}

	clk.Advance(ttl - ttl/10 - ttl/3 - time.Millisecond) // 269ms
	for _, lease := range leases {
		if err := lease.Context().Err(); err != nil {
			t.Fatalf("%s: lost at 269ms, before its loss deadline: %v", lease.Key(), context.Cause(lease.Context()))
		}
	}
	clk.Advance(time.Millisecond) // 270ms = TTL - TTL/10
	for i, lease := range leases {
		if cause := context.Cause(lease.Context()); cause != ErrLost {
			state := "hanging on the wire"
			if i >= maxRenewers {
				state = "queued"
			}
			t.Fatalf("%s (renewal %s): at 270ms cause %v, want ErrLost", lease.Key(), state, cause)
		}
	}

	close(store.release)
	for _, lease := range leases {
		_ = lease.Release(ctx) // ErrNotHeld: lost
	}
	waitFor(t, 5*time.Second, "the renewers to end", func() bool {
		_, _, workers := l.k.wd.state()
		return workers == 0
	})
	if pending, _, _ := l.k.wd.state(); pending != 0 {
		t.Fatalf("after release the watchdog keeps %d events", pending)
	}
	// The queued renewals were never sent: they ran after their holds were lost.
	if sent := store.sent.Load(); sent != maxRenewers {
		t.Fatalf("%d renewals sent after their leases were lost", sent-maxRenewers)
	}
}
