package flightlock

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Queued waiters share one timer per key for their wait budgets (gateQueue): a waiter with a
// shorter budget behind one with a longer budget must still leave on time, and the one with
// the longer budget must still be served.
func TestQueuedBudgetsEndInTheirOwnOrder(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	l := mustLocker(t, s, WithWait(time.Minute))
	held, err := l.Lock(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	long := lockIn(l, "b") // queued first, a minute of budget
	waitFor(t, 5*time.Second, "the first waiter", func() bool { return queuedOn(l, "b") == 1 })
	short, err := l.With(WithWait(40 * time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = short.Lock(ctx, "b") // queued behind it, 40 ms of budget
	if !errors.Is(err, ErrBusy) {
		t.Fatalf("a short budget behind a long one: %v, want ErrBusy", err)
	}
	if waited := time.Since(start); waited < 40*time.Millisecond || waited > 5*time.Second {
		t.Fatalf("the short budget ended after %v, want 40ms", waited)
	}
	if ra, ok := RetryAfter(err); !ok || ra <= 0 {
		t.Fatalf("RetryAfter = %v, %v; want the holder's remaining TTL", ra, ok)
	}
	if n := queuedOn(l, "b"); n != 1 {
		t.Fatalf("%d waiters queued after the short one left, want the long one", n)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next := (<-long).must(t)
	if next.Fence() <= held.Fence() {
		t.Fatalf("fence %d after %d", next.Fence(), held.Fence())
	}
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := l.gateLen(); n != 0 {
		t.Fatalf("gate keeps %d entries", n)
	}
}

// A waiter whose context ends leaves the queue at once, whatever the shared timer is set for.
func TestQueuedWaiterLeavesWhenItsContextEnds(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	l := mustLocker(t, s, WithWait(time.Minute))
	held, err := l.Lock(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := l.Lock(cctx, "c")
		done <- err
	}()
	waitFor(t, 5*time.Second, "the waiter", func() bool { return queuedOn(l, "c") == 1 })
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, ErrBusy) || !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled waiter: %v, want ErrBusy and context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a cancelled waiter stayed queued")
	}
	if n := queuedOn(l, "c"); n != 0 {
		t.Fatalf("%d waiters queued after the cancelled one left", n)
	}
}

// Budgets that run out while the lock moves from holder to holder: every call either holds
// the lock alone or is told busy (or, when its budget ended in the Redis call, fails), no grant is lost (a waiter granted as its budget ends passes
// the lock on), and the gate is empty afterwards.
func TestBudgetsRunningOutWhileTheLockMoves(t *testing.T) {
	s, _, _ := miniStore(t)
	l := mustLocker(t, s)
	// One lock and release first, with the default budget: the first acquisition loads the
	// script into the store and opens connections, which under -race on a loaded machine takes
	// longer than any budget below, and then no call would hold the lock at all.
	if lease, err := l.Lock(context.Background(), "m"); err != nil {
		t.Fatal(err)
	} else if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	const goroutines, rounds = 32, 30
	var inside, overlaps, held, busy atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Go(func() {
			for r := 0; r < rounds; r++ {
				// Mostly budgets of a few milliseconds, which run out at every step of a wait;
				// one call in eight gets a long one, so that some calls hold the lock however
				// slow the machine is.
				wait := time.Duration(rand.IntN(5000)) * time.Microsecond
				if rand.IntN(8) == 0 {
					wait = 2 * time.Second
				}
				short, err := l.With(WithWait(wait))
				if err != nil {
					t.Error(err)
					return
				}
				lease, err := short.Lock(context.Background(), "m")
				if err != nil {
					// A budget that ends during the Redis call of a waiter that became the
					// gate's owner is a store error (a slow Redis answers 503, not 409): the
					// context's deadline, or the connection's read timeout set from it.
					if !errors.Is(err, ErrBusy) && !mayHaveRun(err) {
						t.Error(err)
						return
					}
					busy.Add(1)
					continue
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				held.Add(1)
				time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
				inside.Add(-1)
				if err := lease.Release(context.Background()); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if overlaps.Load() != 0 {
		t.Fatalf("%d overlapping holders", overlaps.Load())
	}
	if held.Load()+busy.Load() != goroutines*rounds || held.Load() == 0 || busy.Load() == 0 {
		t.Fatalf("%d held, %d busy of %d calls: want every call answered, both kinds seen", held.Load(), busy.Load(), goroutines*rounds)
	}
	if n := l.gateLen(); n != 0 {
		t.Fatalf("gate keeps %d entries", n)
	}
	// A call whose budget ended while its acquisition was on the wire gives the lock back in
	// the background (giveBackLater): the key is free once those give-backs have run.
	waitFor(t, 5*time.Second, "the key to be free afterwards", func() bool {
		lease, err := l.TryLock(context.Background(), "m")
		if err != nil {
			return false
		}
		_ = lease.Release(context.Background())
		return true
	})
}

// queuedOn is the number of goroutines queued in l's gate for key.
func queuedOn(l *Locker, key string) int {
	l.k.gate.mu.Lock()
	defer l.k.gate.mu.Unlock()
	if e := l.k.gate.entries[l.cfg.prefix+key]; e != nil {
		return e.queued()
	}
	return 0
}
