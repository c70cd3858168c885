package flightlock

// Regression tests for the nine findings of issue 8 ("Exclusion that holds on every path").
// Each one failed on 2294b23; the finding it answers is named in its comment.

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/embedded"
)

// Finding 2: a handed-over owner that holds nothing must not take a free key, and two callers
// with one made-up token must not both get in.
func TestHandedOverOwnerNeverTakesAFreeKey(t *testing.T) {
	s, _, c := miniStore(t)
	ctx := context.Background()
	downstream := mustLocker(t, s, WithMode(Reject))
	forged := withOwner(ctx, "lock:free", "made-up-token")

	first, err := downstream.Lock(forged, "free")
	if err != nil {
		t.Fatalf("a made-up token on a free key should lock as a new owner: %v", err)
	}
	defer first.Release(ctx)
	if first.Owner() == "made-up-token" {
		t.Fatal("the made-up token became the lock's owner")
	}
	if v := c.Get(ctx, "lock:free").Val(); len(v) >= 14 && v[:14] == "made-up-token " {
		t.Fatalf("Redis holds the lock for the made-up token: %q", v)
	}
	// Another process with the same made-up token: the key is busy for it.
	other := mustLocker(t, s, WithMode(Reject))
	if lease, err := other.Lock(forged, "free"); !errors.Is(err, ErrBusy) {
		if lease != nil {
			_ = lease.Release(ctx)
		}
		t.Fatalf("second caller with the same made-up token: %v, want ErrBusy", err)
	}
	// And the same process: it must not join a hold its token does not own.
	if lease, err := downstream.Lock(forged, "free"); !errors.Is(err, ErrBusy) {
		if lease != nil {
			_ = lease.Release(ctx)
		}
		t.Fatalf("same process, same made-up token: %v, want ErrBusy", err)
	}
}

// Finding 4: a refresh never shortens a lock.
func TestRefreshNeverShortensTheLock(t *testing.T) {
	s, _, c := miniStore(t)
	ctx := context.Background()
	upstream := mustLocker(t, s, WithTTL(9*time.Second))
	lease, err := upstream.Lock(ctx, "ttl")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	downstream := mustLocker(t, s, WithTTL(200*time.Millisecond))
	inner, err := downstream.Lock(withOwner(ctx, lease.Key(), lease.Owner()), "ttl")
	if err != nil {
		t.Fatal(err)
	}
	if err := inner.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if d := c.PTTL(ctx, "lock:ttl").Val(); d < 8*time.Second {
		t.Fatalf("the downstream's refresh cut the lock's TTL to %v", d)
	}
	if err := s.Refresh(ctx, "lock:ttl", lease.Owner(), 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if d := c.PTTL(ctx, "lock:ttl").Val(); d < 8*time.Second {
		t.Fatalf("a refresh with a shorter TTL cut the lock's TTL to %v", d)
	}
	_ = inner.Release(ctx)
}

// slowAcquireStore delays every Acquire reply: the call reaches Redis at once, the reply
// comes back late.
type slowAcquireStore struct {
	lockstore.Store
	delay time.Duration
}

func (s *slowAcquireStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration, meta string) (lockstore.Acquisition, error) {
	res, err := s.Store.Acquire(ctx, key, owner, ttl, meta)
	time.Sleep(s.delay)
	return res, err
}

// A reply that comes back late must not give a lease that outlives its key.
func TestLateAcquireReplyNeverOutlivesTheKey(t *testing.T) {
	s, err := embedded.New() // a clock that moves in real time
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	const ttl = 600 * time.Millisecond
	for _, delay := range []time.Duration{552 * time.Millisecond, 300 * time.Millisecond} {
		t.Run(delay.String(), func(t *testing.T) {
			key := "late" + strconv.Itoa(int(delay.Milliseconds()))
			l := mustLocker(t, &slowAcquireStore{Store: s, delay: delay}, WithTTL(ttl), WithMode(Reject))
			sent := time.Now()
			lease, err := l.Lock(ctx, key)
			if err != nil {
				// Too late to be safe: the lock must have been given back (in the background,
				// so that Lock returns without waiting for the store once more).
				waitFor(t, time.Second, "the late lock given back", func() bool {
					_, terr := s.TTL(ctx, "lock:"+key)
					return errors.Is(terr, ErrNotHeld)
				})
				return
			}
			defer lease.Release(ctx)
			// Watch the key until well past the TTL counted from the send: whenever Redis no
			// longer has it, the lease's context must already be cancelled.
			for time.Since(sent) < ttl+300*time.Millisecond {
				live := lease.Context().Err() == nil
				if _, err := s.TTL(ctx, "lock:"+key); errors.Is(err, ErrNotHeld) && live {
					t.Fatalf("key expired %v after the send while the lease's context was live", time.Since(sent))
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}

// Finding 6: fences keep increasing when the fence counter goes back (restart from a
// snapshot, lost writes, a lagging replica promoted).
func TestFencesSurviveACounterRollback(t *testing.T) {
	s, mr, c := miniStore(t)
	ctx := context.Background()
	l := mustLocker(t, s)
	first, err := l.Lock(ctx, "rb")
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	counters := c.Keys(ctx, lockstore.FenceKeyPrefix+"*").Val()
	if len(counters) != 1 {
		t.Fatalf("fence counters %v", counters)
	}
	// The counter goes back to what an older snapshot had.
	mr.Set(counters[0], strconv.FormatInt(first.Fence()/2, 10))
	second, err := l.Lock(ctx, "rb")
	if err != nil {
		t.Fatal(err)
	}
	defer second.Release(ctx)
	if second.Fence() <= first.Fence() {
		t.Fatalf("fence %d after a rollback, not above the earlier %d", second.Fence(), first.Fence())
	}
	// And the counter gone altogether, as after FLUSHDB.
	mr.Del(counters[0])
	third, err := mustLocker(t, s).Lock(ctx, "rb2")
	if err != nil {
		t.Fatal(err)
	}
	defer third.Release(ctx)
	if third.Fence() <= second.Fence() {
		t.Fatalf("fence %d after the counter was lost, not above the earlier %d", third.Fence(), second.Fence())
	}
}

// Finding 7: every grant, by Redis or by in-process handoff, has a fence above every earlier
// grant of the key.
func TestEveryHandoffGrantHasItsOwnFence(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	l := mustLocker(t, s, WithWait(5*time.Second), WithHandoff(8, time.Minute))
	other := mustLocker(t, s, WithWait(5*time.Second)) // another process, after the handoffs
	first, err := l.Lock(ctx, "hf")
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 5
	var (
		mu     sync.Mutex
		fences = []int64{first.Fence()}
	)
	var wg sync.WaitGroup
	for range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lease, err := l.Lock(ctx, "hf")
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			fences = append(fences, lease.Fence()) // in grant order: the lock is held
			mu.Unlock()
			_ = lease.Release(ctx)
		}()
	}
	waitFor(t, 2*time.Second, "waiters to queue", func() bool {
		l.k.gate.mu.Lock()
		defer l.k.gate.mu.Unlock()
		return l.k.gate.entries["lock:hf"].queued() == waiters
	})
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	next, err := other.Lock(ctx, "hf")
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(ctx)
	fences = append(fences, next.Fence())
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("grant %d has fence %d, not above the previous grant's %d (all: %v)", i, fences[i], fences[i-1], fences)
		}
	}
}

// Finding 8: a lease that joined a hold in this process keeps the key held until it ends;
// the key is not granted to anyone else while it is live.
func TestJoinedLeaseKeepsTheKeyUntilItEnds(t *testing.T) {
	s, _, c := miniStore(t)
	ctx := context.Background()
	l := mustLocker(t, s, WithMode(Reject))
	other := mustLocker(t, s, WithMode(Reject))
	lease, err := l.Lock(ctx, "j")
	if err != nil {
		t.Fatal(err)
	}
	joined, err := l.Lock(withOwner(ctx, lease.Key(), lease.Owner()), "j")
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if joined.Context().Err() == nil {
		if x, err := other.Lock(ctx, "j"); err == nil {
			_ = x.Release(ctx)
			t.Fatal("another owner got the key while the joined lease was live")
		}
	}
	if err := joined.Release(ctx); err != nil && joined.Context().Err() == nil {
		t.Fatal(err)
	}
	if c.Exists(ctx, "lock:j").Val() != 0 {
		t.Fatal("the key outlived every lease on it")
	}
}

// Finding 8, across processes: the upstream's release does not free the key while a
// downstream that re-entered it with the handed-over owner still runs, and a borrowed lease
// whose lock went to another owner reports ErrNotHeld.
func TestBorrowedLeaseKeepsTheKeyUntilItEnds(t *testing.T) {
	s, mr, _ := miniStore(t)
	ctx := context.Background()
	upstream := mustLocker(t, s, WithMode(Reject), WithTTL(time.Minute))
	downstream := mustLocker(t, s, WithMode(Reject), WithTTL(time.Minute))
	third := mustLocker(t, s, WithMode(Reject), WithTTL(time.Minute))
	lease, err := upstream.Lock(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	borrowed, err := downstream.Lock(withOwner(ctx, lease.Key(), lease.Owner()), "b")
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if borrowed.Context().Err() == nil {
		if x, err := third.Lock(ctx, "b"); err == nil {
			_ = x.Release(ctx)
			t.Fatal("a third owner got the key while the borrowed lease was live")
		}
	}
	if err := borrowed.Release(ctx); err != nil {
		t.Fatal(err)
	}
	x, err := third.Lock(ctx, "b")
	if err != nil {
		t.Fatalf("the key stayed held after every lease on it ended: %v", err)
	}
	defer x.Release(ctx)

	// A borrowed lease that outlives its lock (the key expired and went to another owner)
	// must not report a successful release.
	up2, err := upstream.Lock(ctx, "b2")
	if err != nil {
		t.Fatal(err)
	}
	defer up2.Release(ctx)
	b2, err := downstream.Lock(withOwner(ctx, up2.Key(), up2.Owner()), "b2")
	if err != nil {
		t.Fatal(err)
	}
	up2.h.stop()
	b2.h.stop() // both stall: no renewals
	mr.FastForward(2 * time.Minute)
	y, err := third.Lock(ctx, "b2")
	if err != nil {
		t.Fatal(err)
	}
	defer y.Release(ctx)
	if err := b2.Release(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("release of a borrowed lease whose lock is another owner's: %v, want ErrNotHeld", err)
	}
}

// MaxHold bounds a grant: re-entering over and over does not keep the lock past it (found by
// the review of the issue 8 fixes: every re-entry restarted the MaxHold clock).
func TestReentriesDoNotExtendMaxHold(t *testing.T) {
	s, mr, _ := miniStore(t)
	clk := newManualClock()
	ctx := context.Background()
	const ttl, maxHold = 90 * time.Millisecond, 200 * time.Millisecond
	l := mustLocker(t, s, WithTTL(ttl), WithMaxHold(maxHold), withClock(clk))
	lease, err := l.Lock(ctx, "mh")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	// Re-enter every 20ms. The grant's last renewal is at 180ms at the latest (TTL/3 steps
	// within MaxHold), so the lease must be lost by 180ms + TTL - TTL/10 = 261ms.
	for elapsed := time.Duration(0); elapsed <= maxHold+ttl; elapsed += 20 * time.Millisecond {
		if lease.Context().Err() != nil {
			break
		}
		if in, err := l.Lock(lease.Context(), "mh"); err == nil {
			_ = in.Release(ctx)
		}
		clk.Step(mr, 20*time.Millisecond, time.Millisecond)
	}
	if context.Cause(lease.Context()) != ErrLost {
		t.Fatalf("re-entries kept the lock past MaxHold + TTL: cause %v, want ErrLost", context.Cause(lease.Context()))
	}
}
