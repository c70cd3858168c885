package flightlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/flightlock/flightlock/lockstore"
	"go.uber.org/goleak"
)

func TestReentryByContext(t *testing.T) {
	s, _, c := miniStore(t)
	l := mustLocker(t, s)
	ctx := context.Background()
	outer, err := l.Lock(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	inner, err := l.Lock(outer.Context(), "r")
	if err != nil || inner == outer || inner.Fence() != outer.Fence() || inner.Owner() != outer.Owner() {
		t.Fatalf("nested Lock = %p, %v; want a lease of its own on the outer lease's lock", inner, err)
	}
	if FromContext(outer.Context()) != outer || FromContext(inner.Context()) != inner {
		t.Fatal("FromContext does not return the lease")
	}
	if err := inner.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := c.Exists(ctx, "lock:r").Val(); n != 1 {
		t.Fatal("inner Release freed the key")
	}
	if err := outer.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := c.Exists(ctx, "lock:r").Val(); n != 0 {
		t.Fatal("outermost Release did not free the key")
	}
	if err := outer.Release(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("extra Release: %v, want ErrNotHeld", err)
	}
	if err := inner.Release(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("extra Release of the re-entry: %v, want ErrNotHeld", err)
	}
	if context.Cause(outer.Context()) == ErrLost {
		t.Fatal("a released lease reports ErrLost")
	}
}

func TestStaleAndDoubleReleaseKeepNextOwner(t *testing.T) {
	s, mr, c := miniStore(t)
	ctx := context.Background()
	// Two lockers on one store stand for two processes.
	p1 := mustLocker(t, s, WithTTL(time.Minute))
	p2 := mustLocker(t, s, WithTTL(time.Minute))
	a, err := p1.Lock(ctx, "stale")
	if err != nil {
		t.Fatal(err)
	}
	a.h.stop() // the holder stalls: no renewal
	mr.FastForward(2 * time.Minute)
	b, err := p2.Lock(ctx, "stale")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	if b.Fence() <= a.Fence() {
		t.Fatalf("next owner's fence %d not above the stale one %d", b.Fence(), a.Fence())
	}
	if err := a.Release(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("stale Release: %v, want ErrNotHeld", err)
	}
	if err := a.Release(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("double Release: %v, want ErrNotHeld", err)
	}
	if err := a.Refresh(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("stale Refresh: %v, want ErrNotHeld", err)
	}
	if v, want := c.Get(ctx, "lock:stale").Val(), fmt.Sprintf("%s %d 1 %s kind=lock", b.Owner(), b.Fence(), processHolder); v != want {
		t.Fatalf("next owner's lock was touched: value %q, want %q", v, want)
	}
}

func TestFencesOfSuccessiveOwnersIncrease(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	lockers := []*Locker{mustLocker(t, s), mustLocker(t, s), mustLocker(t, s)}
	var last int64
	for i := 0; i < 30; i++ {
		lease, err := lockers[i%3].Lock(ctx, "fenced")
		if err != nil {
			t.Fatal(err)
		}
		if lease.Fence() <= last {
			t.Fatalf("owner %d got fence %d after %d", i, lease.Fence(), last)
		}
		last = lease.Fence()
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func TestHandoffSkipsRedisAndRaisesFence(t *testing.T) {
	ms, _, _ := miniStore(t)
	fs := &faultStore{Store: ms}
	l := mustLocker(t, fs, WithWait(5*time.Second), WithHandoff(2, time.Minute))
	ctx := context.Background()
	first, err := l.Lock(ctx, "h")
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 4
	got := make(chan *Lease, waiters)
	for i := 0; i < waiters; i++ {
		go func() {
			lease, err := l.Lock(ctx, "h")
			if err != nil {
				t.Error(err)
				got <- nil
				return
			}
			got <- lease
		}()
	}
	waitFor(t, 2*time.Second, "waiters to queue", func() bool {
		l.k.gate.mu.Lock()
		defer l.k.gate.mu.Unlock()
		return l.k.gate.entries["lock:h"].queued() == waiters
	})
	fences := []int64{first.Fence()}
	cur := first
	for i := 0; i < waiters; i++ {
		if err := cur.Release(ctx); err != nil {
			t.Fatal(err)
		}
		cur = <-got
		if cur == nil {
			t.FailNow()
		}
		if cur.Fence() <= fences[len(fences)-1] {
			t.Fatalf("fence did not go up: %d after %d", cur.Fence(), fences[len(fences)-1])
		}
		fences = append(fences, cur.Fence())
	}
	if err := cur.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Handoff bound 2: holders 2 and 3 get the lock by handoff; then it is released in Redis,
	// holder 4 acquires afresh and hands it to holder 5.
	if a := fs.acquires.Load(); a != 2 {
		t.Fatalf("%d Redis acquisitions for 5 holders with handoff bound 2, want 2 (fences %v)", a, fences)
	}
	if !(fences[1] == fences[0]+1 && fences[2] == fences[1]+1 && fences[3] > fences[2] && fences[4] == fences[3]+1) {
		t.Fatalf("fences %v: each handoff takes the next fence, a fresh acquisition counts on above them", fences)
	}
	if n := l.gateLen(); n != 0 {
		t.Fatalf("gate keeps %d entries", n)
	}
}

func TestRenewalFailureCancelsBeforeTTL(t *testing.T) {
	ms, mr, _ := miniStore(t)
	ctx := context.Background()
	const ttl = 300 * time.Millisecond

	t.Run("refused", func(t *testing.T) {
		clk := newManualClock()
		fs := &faultStore{Store: ms}
		l := mustLocker(t, fs, WithTTL(ttl), withClock(clk))
		lease, err := l.Lock(ctx, "refused")
		if err != nil {
			t.Fatal(err)
		}
		refused := lockstore.ErrNotHeld
		fs.failRefresh.Store(&refused)
		clk.Step(mr, ttl/3-time.Millisecond, time.Millisecond)
		if err := lease.Context().Err(); err != nil {
			t.Fatalf("lease ended before its first renewal was due: %v", context.Cause(lease.Context()))
		}
		clk.Step(mr, time.Millisecond, time.Millisecond)
		if cause := context.Cause(lease.Context()); cause != ErrLost {
			t.Fatalf("after the first renewal was refused, cause %v, want ErrLost", cause)
		}
		if err := lease.Release(ctx); !errors.Is(err, ErrNotHeld) && err != nil {
			t.Fatal(err)
		}
	})

	t.Run("unreachable", func(t *testing.T) {
		clk := newManualClock()
		fs := &faultStore{Store: ms}
		l := mustLocker(t, fs, WithTTL(ttl), withClock(clk))
		acquired := clk.Now()
		lease, err := l.Lock(ctx, "unreachable")
		if err != nil {
			t.Fatal(err)
		}
		down := errors.New("connection refused")
		fs.failRefresh.Store(&down)
		// Lost exactly when the safety margin before the TTL begins, not a step later.
		limit := ttl - ttl/10
		for lease.Context().Err() == nil && clk.Now().Sub(acquired) < 2*ttl {
			clk.Step(nil, time.Millisecond, time.Millisecond)
		}
		lostAt := clk.Now().Sub(acquired)
		if cause := context.Cause(lease.Context()); cause != ErrLost {
			t.Fatalf("cause %v, want ErrLost", cause)
		}
		if lostAt > limit {
			t.Fatalf("lease declared lost %v after acquisition, after the %v its holder may trust (TTL %v)", lostAt, limit, ttl)
		}
		if fs.refreshes.Load() < 2 {
			t.Fatalf("only %d renewal attempts before giving up", fs.refreshes.Load())
		}
		_ = lease.Release(ctx)
	})
}

func TestWatchdogKeepsLockAndStopsAtMaxHold(t *testing.T) {
	s, mr, c := miniStore(t)
	clk := newManualClock()
	ctx := context.Background()
	const ttl, maxHold = 90 * time.Millisecond, 250 * time.Millisecond
	l := mustLocker(t, s, WithTTL(ttl), WithMaxHold(maxHold), withClock(clk))
	lease, err := l.Lock(ctx, "wd")
	if err != nil {
		t.Fatal(err)
	}
	// Renewals every TTL/3 (30ms) keep the key through MaxHold: the last one, at 240ms, makes
	// it live until 330ms, so the lease must stay valid until the safety margin before that
	// (321ms) and end exactly there.
	clk.Step(mr, 320*time.Millisecond, time.Millisecond)
	if err := lease.Context().Err(); err != nil {
		t.Fatalf("lease ended at 320ms: %v", context.Cause(lease.Context()))
	}
	if c.Exists(ctx, "lock:wd").Val() != 1 {
		t.Fatal("key gone from Redis while the lease was still valid: renewals missed")
	}
	clk.Step(mr, time.Millisecond, time.Millisecond)
	if context.Cause(lease.Context()) != ErrLost {
		t.Fatalf("at 321ms (MaxHold %v, TTL %v): cause %v, want ErrLost", maxHold, ttl, context.Cause(lease.Context()))
	}
	if c.Exists(ctx, "lock:wd").Val() != 1 {
		t.Fatal("the watchdog deleted the key instead of letting it expire")
	}
	clk.Step(mr, 10*time.Millisecond, time.Millisecond)
	if c.Exists(ctx, "lock:wd").Val() != 0 {
		t.Fatal("renewed past MaxHold: the key outlived its last renewal's TTL")
	}
	_ = lease.Release(ctx)
}

func TestWaitModeBudgetAndContext(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	other := mustLocker(t, s, WithTTL(time.Minute))
	held, err := other.Lock(ctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)

	l := mustLocker(t, s, WithWait(60*time.Millisecond))
	_, err = l.Lock(ctx, "w")
	if !errors.Is(err, ErrBusy) {
		t.Fatalf("wait budget spent: %v, want ErrBusy", err)
	}
	if ra, ok := RetryAfter(err); !ok || ra <= 0 || ra > time.Minute {
		t.Fatalf("RetryAfter = %v, %v; want the holder's TTL", ra, ok)
	}

	l = mustLocker(t, s, WithWait(time.Minute))
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = l.Lock(cctx, "w")
	// Issue 18: the wait gives up a reserve before the caller's deadline, so that the busy
	// answer reaches the caller in time: ErrBusy with the holder's TTL, before the deadline.
	if !errors.Is(err, ErrBusy) || errors.Is(err, context.DeadlineExceeded) || cctx.Err() != nil {
		t.Fatalf("a wait bounded by the caller's deadline: %v (context %v), want ErrBusy before the deadline", err, cctx.Err())
	}
	if _, ok := RetryAfter(err); !ok {
		t.Errorf("the busy answer before the deadline has no RetryAfter: %v", err)
	}
	if n := l.gateLen(); n != 0 {
		t.Fatalf("gate keeps %d entries", n)
	}
}

func TestWaiterWakesOnRelease(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	other := mustLocker(t, s, WithTTL(time.Minute))
	held, err := other.Lock(ctx, "wake")
	if err != nil {
		t.Fatal(err)
	}
	// A retry delay far longer than the test: only the release notification can wake it.
	l := mustLocker(t, s, WithWait(time.Minute), WithRetry(LinearRetry(time.Hour)))
	done := make(chan error, 1)
	go func() {
		lease, err := l.Lock(ctx, "wake")
		if err == nil {
			err = lease.Release(ctx)
		}
		done <- err
	}()
	// Release repeatedly until the waiter (whose subscription is asynchronous) gets it.
	deadline := time.After(10 * time.Second)
	for {
		time.Sleep(20 * time.Millisecond)
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			return
		case <-time.After(200 * time.Millisecond):
		case <-deadline:
			t.Fatal("waiter never woke on a release notification")
		}
		if held, err = other.Lock(ctx, "wake"); err != nil {
			// The waiter took it between our release and this lock: fine, it will finish.
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			return
		}
	}
}

func TestHandedOverOwnerReenters(t *testing.T) {
	s, _, c := miniStore(t)
	ctx := context.Background()
	upstream := mustLocker(t, s, WithMode(Reject))
	downstream := mustLocker(t, s, WithMode(Reject)) // another process
	lease, err := upstream.Lock(ctx, "acct:1")
	if err != nil {
		t.Fatal(err)
	}
	// Without the owner the downstream is refused: it would deadlock waiting for its caller.
	if _, err := downstream.Lock(ctx, "acct:1"); !errors.Is(err, ErrBusy) {
		t.Fatalf("downstream without owner: %v, want ErrBusy", err)
	}
	dctx := withOwner(ctx, lease.Key(), lease.Owner())
	inner, err := downstream.Lock(dctx, "acct:1")
	if err != nil {
		t.Fatalf("downstream with the handed-over owner: %v", err)
	}
	if inner.Fence() != lease.Fence() {
		t.Fatalf("re-entered fence %d, holder's %d", inner.Fence(), lease.Fence())
	}
	if err := inner.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if c.Exists(ctx, "lock:acct:1").Val() != 1 {
		t.Fatal("releasing the re-entered lease deleted the upstream's lock")
	}
	// The same process joins its own hold instead of waiting for itself.
	joined, err := upstream.Lock(withOwner(ctx, lease.Key(), lease.Owner()), "acct:1")
	if err != nil {
		t.Fatalf("same-process handover: %v", err)
	}
	if err := joined.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if c.Exists(ctx, "lock:acct:1").Val() != 1 {
		t.Fatal("releasing the joined lease deleted the lock")
	}
	// A forged owner is just another owner.
	if _, err := downstream.Lock(withOwner(ctx, lease.Key(), "forged"), "acct:1"); !errors.Is(err, ErrBusy) {
		t.Fatalf("forged owner: %v, want ErrBusy", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestDoReleasesOnPanicAndError(t *testing.T) {
	s, _, c := miniStore(t)
	l := mustLocker(t, s)
	ctx := context.Background()
	func() {
		defer func() {
			if recover() != "boom" {
				t.Fatal("panic not re-raised")
			}
		}()
		_ = l.Do(ctx, "p", func(context.Context) error { panic("boom") })
	}()
	if c.Exists(ctx, "lock:p").Val() != 0 || l.gateLen() != 0 {
		t.Fatal("lock kept after a panic")
	}
	want := errors.New("handler failed")
	if err := l.Do(ctx, "p", func(context.Context) error { return want }); err != want {
		t.Fatalf("Do returned %v, want the handler's error", err)
	}
	if c.Exists(ctx, "lock:p").Val() != 0 {
		t.Fatal("lock kept after an error")
	}
}

func TestLockAllIsAllOrNothing(t *testing.T) {
	s, _, c := miniStore(t)
	ctx := context.Background()
	other := mustLocker(t, s)
	held, err := other.Lock(ctx, "acct:b")
	if err != nil {
		t.Fatal(err)
	}
	l := mustLocker(t, s, WithMode(Reject))
	if _, err := l.LockAll(ctx, "acct:b", "acct:a"); !errors.Is(err, ErrBusy) {
		t.Fatalf("LockAll with one key busy: %v, want ErrBusy", err)
	}
	if c.Exists(ctx, "lock:acct:a").Val() != 0 {
		t.Fatal("LockAll kept acct:a after failing on acct:b")
	}
	_ = held.Release(ctx)
	g, err := l.LockAll(ctx, "acct:b", "acct:a", "acct:b")
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Leases()) != 2 || g.Leases()[0].Key() != "lock:acct:a" {
		t.Fatalf("leases %v: want two, in sorted order", g.Leases())
	}
	if got := len(AllFromContext(g.Context())); got != 2 {
		t.Fatalf("group context carries %d leases", got)
	}
	if err := g.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if c.Exists(ctx, "lock:acct:a", "lock:acct:b").Val() != 0 {
		t.Fatal("group release left keys")
	}
}

func TestConcurrentTransfersDoNotDeadlock(t *testing.T) {
	s, _, _ := miniStore(t)
	l := mustLocker(t, s, WithWait(20*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			from, to := fmt.Sprintf("acct:%d", i%3), fmt.Sprintf("acct:%d", (i+1)%3)
			g, err := l.LockAll(ctx, from, to)
			if err != nil {
				t.Error(err)
				return
			}
			_ = g.Release(ctx)
		}()
	}
	wg.Wait()
}

func TestBadInput(t *testing.T) {
	s, mr, c := miniStore(t)
	ctx := context.Background()
	l := mustLocker(t, s, WithMode(Reject))
	cancelled, cancel := context.WithCancel(ctx)
	cancel()

	for _, tc := range []struct {
		name    string
		ctx     context.Context
		key     string
		wantErr error // nil: a correct lock
	}{
		{"empty", ctx, "", ErrInvalidKey},
		{"1MB", ctx, strings.Repeat("x", 1<<20), ErrInvalidKey},
		{"just over the bound", ctx, strings.Repeat("x", MaxKeyLen-len(DefaultPrefix)+1), ErrInvalidKey},
		{"at the bound", ctx, strings.Repeat("x", MaxKeyLen-len(DefaultPrefix)), nil},
		{"binary", ctx, "\x00\x01\xfe\xff", nil},
		{"newline", ctx, "order:\n42\r\n", nil},
		{"unicode", ctx, "заказ:🔒:42", nil},
		{"braces", ctx, "a}b{", nil},
		{"cancelled context", cancelled, "ok", context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := mr.CommandCount()
			lease, err := l.Lock(tc.ctx, tc.key)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err %v, want %v", err, tc.wantErr)
				}
				if mr.CommandCount() != before {
					t.Fatal("a refused request reached Redis")
				}
				return
			}
			if err != nil {
				t.Fatalf("err %v, want a lock", err)
			}
			if ttl := c.PTTL(ctx, lease.Key()).Val(); ttl <= 0 || ttl > DefaultTTL {
				t.Fatalf("lock written with PTTL %v: must expire", ttl)
			}
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if c.Exists(ctx, lease.Key()).Val() != 0 {
				t.Fatal("not released")
			}
		})
	}

	for _, ttl := range []time.Duration{0, -time.Second} {
		if _, err := New(s, WithTTL(ttl)); !errors.Is(err, ErrConfig) || errors.Is(err, ErrInvalidKey) {
			t.Fatalf("TTL %v: %v, want ErrConfig", ttl, err)
		}
		if _, err := l.With(WithTTL(ttl)); !errors.Is(err, ErrConfig) || errors.Is(err, ErrInvalidKey) {
			t.Fatalf("With TTL %v: %v, want ErrConfig", ttl, err)
		}
	}
	for name, opt := range map[string]Option{
		"negative wait": WithWait(-1), "zero max hold": WithMaxHold(0), "nil retry": WithRetry(nil),
		"bad mode": WithMode(Mode(7)), "negative handoff": WithHandoff(-1, 0),
		"huge prefix": WithPrefix(strings.Repeat("p", MaxKeyLen)),
	} {
		if _, err := New(s, opt); !errors.Is(err, ErrConfig) || errors.Is(err, ErrInvalidKey) {
			t.Fatalf("%s: %v, want ErrConfig", name, err)
		}
	}
	if _, err := New(nil); err == nil {
		t.Fatal("nil store accepted")
	}
}

func TestMillionKeysLeaveGateEmpty(t *testing.T) {
	if testing.Short() {
		t.Skip("a million keys: skipped in -short")
	}
	s := newMemStore()
	l := mustLocker(t, s, WithMode(Reject), WithTTL(time.Minute))
	ctx := context.Background()
	const workers, perWorker = 8, 125_000
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 0, 32)
			for i := 0; i < perWorker; i++ {
				buf = fmt.Appendf(buf[:0], "k:%d:%d", w, i)
				lease, err := l.Lock(ctx, string(buf))
				if err == nil {
					err = lease.Release(ctx)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := l.gateLen(); n != 0 {
		t.Fatalf("gate keeps %d entries after 1,000,000 keys", n)
	}
	if n := s.size(); n != 0 {
		t.Fatalf("store keeps %d locks", n)
	}
}

func TestRedisRestart(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	s, srv, c := realStore(t)
	ctx := context.Background()
	const ttl = 600 * time.Millisecond
	l := mustLocker(t, s, WithTTL(ttl), WithWait(200*time.Millisecond))
	held, err := l.Lock(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()

	// Calls fail within their deadline: no hang on a dead Redis.
	for _, mode := range []Mode{Reject, Wait} {
		lm, _ := l.With(WithMode(mode))
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		start := time.Now()
		_, err := lm.Lock(cctx, "r2")
		cancel()
		if err == nil {
			t.Fatalf("%v: Lock on a stopped Redis succeeded", mode)
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("%v: Lock took %v on a stopped Redis with a 300ms deadline", mode, d)
		}
	}
	// The holder learns that its lock can no longer be trusted.
	select {
	case <-held.Context().Done():
		if context.Cause(held.Context()) != ErrLost {
			t.Fatalf("cause %v, want ErrLost", context.Cause(held.Context()))
		}
	case <-time.After(3 * ttl):
		t.Fatal("holder not told while Redis was down")
	}
	_ = held.Release(ctx) // fails: Redis is down; must not hang or panic

	srv.Restart()
	waitFor(t, 5*time.Second, "locking to work again", func() bool {
		lease, err := l.Lock(ctx, "r3")
		if err != nil {
			return false
		}
		return lease.Release(ctx) == nil
	})
	_ = c
	if n := l.gateLen(); n != 0 {
		t.Fatalf("gate keeps %d entries", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
}

// A redis-server that hangs (SIGSTOP: connections stay open, nothing answers) must fail every
// Lock within its caller's deadline, also when 64 callers at once push the store past its
// lanes into batches, and locking works again once the server resumes.
func TestFrozenRedisFailsWithinDeadlines(t *testing.T) {
	s, srv, _ := realStore(t)
	ctx := context.Background()
	l := mustLocker(t, s, WithTTL(2*time.Second), WithWait(100*time.Millisecond))
	if err := s.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(srv.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(srv.Pid(), syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)

	const callers = 64
	const deadline = 300 * time.Millisecond
	var wg sync.WaitGroup
	slowest := make([]time.Duration, callers)
	errs := make([]error, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, deadline)
			defer cancel()
			start := time.Now()
			lease, err := l.Lock(cctx, "frozen:"+strconv.Itoa(i))
			slowest[i] = time.Since(start)
			if err == nil {
				err = errors.New("Lock on a frozen Redis succeeded")
				_ = lease.Release(ctx)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i := range callers {
		if errs[i] == nil || errors.Is(errs[i], ErrBusy) {
			t.Fatalf("caller %d: %v, want a store error", i, errs[i])
		}
		// Generous slack for a loaded CI machine; go-redis's own pipeliner took 35 s here.
		if slowest[i] > deadline+2*time.Second {
			t.Fatalf("caller %d returned after %v with a %v deadline", i, slowest[i], deadline)
		}
	}

	resume()
	waitFor(t, 10*time.Second, "locking to work again after the server resumed", func() bool {
		lease, err := l.Lock(ctx, "after-freeze")
		if err != nil {
			return false
		}
		return lease.Release(ctx) == nil
	})
}

func TestHungRedisIsAStoreErrorNotBusy(t *testing.T) {
	s, _, _ := miniStore(t)
	hung := &hangingStore{Store: s}
	l := mustLocker(t, hung, WithWait(50*time.Millisecond))
	_, err := l.Lock(context.Background(), "hung")
	if err == nil || errors.Is(err, ErrBusy) {
		t.Fatalf("Lock on a Redis that never answers: %v, want a store error, not ErrBusy", err)
	}
	if l.gateLen() != 0 {
		t.Fatal("gate entry left behind")
	}
}

// hangingStore's Acquire blocks until its context ends, like a Redis that accepted the
// connection and never answers.
type hangingStore struct{ lockstore.Store }

func (h *hangingStore) Acquire(ctx context.Context, _, _ string, _ time.Duration, _ string) (lockstore.Acquisition, error) {
	<-ctx.Done()
	return lockstore.Acquisition{}, fmt.Errorf("acquire: %w", ctx.Err())
}

func TestAllFromContextSkipsReleasedLeases(t *testing.T) {
	s, _, _ := miniStore(t)
	l := mustLocker(t, s)
	ctx := context.Background()
	a, err := l.Lock(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.Lock(a.Context(), "b")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(AllFromContext(b.Context())); n != 2 {
		t.Fatalf("%d leases, want 2", n)
	}
	_ = b.Release(ctx)
	if got := AllFromContext(b.Context()); len(got) != 1 || got[0] != a {
		t.Fatalf("after releasing b: %v, want only a", got)
	}
	_ = a.Release(ctx)
}

// Past the handoff window a lock goes back to Redis even when the count would allow more.
func TestHandoffWindowEndsHandoff(t *testing.T) {
	ms, _, _ := miniStore(t)
	fs := &faultStore{Store: ms}
	clk := newManualClock()
	l := mustLocker(t, fs, WithWait(5*time.Second), WithHandoff(100, 30*time.Millisecond), withClock(clk))
	ctx := context.Background()
	first, err := l.Lock(ctx, "win")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *Lease, 1)
	go func() {
		lease, err := l.Lock(ctx, "win")
		if err != nil {
			t.Error(err)
		}
		got <- lease
	}()
	waitFor(t, 2*time.Second, "a waiter", func() bool {
		l.k.gate.mu.Lock()
		defer l.k.gate.mu.Unlock()
		return l.k.gate.entries["lock:win"].queued() == 1
	})
	clk.Advance(40 * time.Millisecond) // past the window
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second := <-got
	if second == nil {
		t.FailNow()
	}
	defer second.Release(ctx)
	if fs.acquires.Load() != 2 || second.Fence() <= first.Fence() {
		t.Fatalf("%d acquisitions, fences %d then %d: want a fresh Redis acquisition past the window",
			fs.acquires.Load(), first.Fence(), second.Fence())
	}
}

// With WithFailOpen an unreachable Redis yields degraded leases that still exclude the
// goroutines of this process; without it, the store error.
func TestFailOpenKeepsTheLocalGate(t *testing.T) {
	s, mr, _ := miniStore(t)
	ctx := context.Background()
	mr.Close()
	closed := mustLocker(t, s, WithMode(Reject), WithTTL(time.Second))
	if _, err := closed.Lock(ctx, "down"); err == nil || errors.Is(err, ErrBusy) {
		t.Fatalf("fail closed: %v, want the store error", err)
	}
	open := mustLocker(t, s, WithMode(Reject), WithTTL(time.Second), WithFailOpen(true))
	lease, err := open.Lock(ctx, "down")
	if err != nil || !lease.Degraded() || lease.Fence() != 0 {
		t.Fatalf("fail open: %v, degraded %v, fence %d", err, lease != nil && lease.Degraded(), lease.Fence())
	}
	if _, err := open.TryLock(ctx, "down"); !errors.Is(err, ErrBusy) {
		t.Fatalf("second local holder: %v, want ErrBusy from the gate", err)
	}
	if err := lease.Refresh(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Refresh of a degraded lease: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release of a degraded lease: %v", err)
	}
	if err := mr.Restart(); err != nil {
		t.Fatal(err)
	}
	lease, err = open.Lock(ctx, "down")
	if err != nil || lease.Degraded() || lease.Fence() == 0 {
		t.Fatalf("after Redis is back: %v, degraded %v", err, lease.Degraded())
	}
	_ = lease.Release(ctx)
	if open.gateLen() != 0 {
		t.Fatal("gate entry left behind")
	}
}

// busyThenHangStore answers the first Acquire with a holder that has ttl left, then hangs each
// later call until its context ends: a wait that runs out during a retry.
type busyThenHangStore struct {
	lockstore.Store
	ttl   time.Duration
	calls atomic.Int32
}

func (s *busyThenHangStore) Acquire(ctx context.Context, _, _ string, _ time.Duration, _ string) (lockstore.Acquisition, error) {
	if s.calls.Add(1) == 1 {
		return lockstore.Acquisition{HolderTTL: s.ttl}, nil
	}
	<-ctx.Done()
	return lockstore.Acquisition{}, ctx.Err()
}

// A wait that runs out while a retry is on the wire still answers busy with the holder's
// remaining TTL, so the 409 carries a Retry-After (it had none, and a loaded CI machine showed
// TestWaitModeBudgetAndContext failing on it).
func TestBusyDuringARetryKeepsRetryAfter(t *testing.T) {
	s, _, _ := miniStore(t)
	l := mustLocker(t, &busyThenHangStore{Store: s, ttl: 5 * time.Second},
		WithWait(60*time.Millisecond), WithRetry(LinearRetry(time.Millisecond)))
	_, err := l.Lock(context.Background(), "r")
	if !errors.Is(err, ErrBusy) {
		t.Fatalf("Lock = %v, want ErrBusy", err)
	}
	if ra, ok := RetryAfter(err); !ok || ra < 4*time.Second || ra > 5*time.Second {
		t.Fatalf("RetryAfter = %v, %v; want the holder's remaining TTL", ra, ok)
	}
}

// A key that would fall among the fence counters (Prefix "flightlock:", key "fence:{1}") is
// refused: the next grant in its slot would overwrite it.
func TestKeyAmongTheFenceCountersIsRefused(t *testing.T) {
	s, _, _ := miniStore(t)
	l := mustLocker(t, s, WithPrefix("flightlock:"))
	if _, err := l.TryLock(context.Background(), "fence:{1}"); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("a key among the fence counters: %v, want ErrInvalidKey", err)
	}
	if lease, err := l.TryLock(context.Background(), "order:1"); err != nil {
		t.Fatal(err)
	} else {
		_ = lease.Release(context.Background())
	}
}

// A wait spent before the store could answer is busy, not a store outage: when the first key
// of a pair takes most of the wait, the second key's first attempt meets the deadline while
// the store is healthy but slower than the time left. It is answered ErrBusy (409 / Aborted),
// never as an unreachable store, whose alert it would fire. A store that does not answer a
// first attempt given the whole wait stays a store error.
func TestSpentWaitIsBusyNotAStoreError(t *testing.T) {
	ms, _, _ := miniStore(t)
	fs := &faultStore{Store: ms, slowBy: 3 * time.Second}
	slow := "lock:b"
	fs.slowKey.Store(&slow)
	other := mustLocker(t, ms) // another process
	l := mustLocker(t, fs, WithWait(5*time.Second), WithRetry(LinearRetry(10*time.Millisecond)))
	bg := context.Background()

	a, err := other.Lock(bg, "a")
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(700*time.Millisecond, func() { _ = a.Release(bg) })
	ctx, cancel := context.WithTimeout(bg, time.Second) // the request's deadline
	defer cancel()
	g, err := l.LockAll(ctx, "a", "b")
	if err == nil {
		_ = g.Release(bg)
		t.Fatal("LockAll took both keys, though b's store call outlasts the request")
	}
	if !errors.Is(err, ErrBusy) {
		t.Fatalf("a wait spent on the first key, then on a slow second: %v, want ErrBusy", err)
	}

	// The whole wait for one call that the store does not answer: the store's error.
	ctx2, cancel2 := context.WithTimeout(bg, time.Second)
	defer cancel2()
	_, err = l.Lock(ctx2, "b")
	if err == nil || errors.Is(err, ErrBusy) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a store that did not answer a first attempt given the whole wait: %v, want its deadline error", err)
	}
}

// A waiter that meets a transient store error (a failover, a restart) keeps waiting within its
// budget instead of ending its wait on the first error: it gets the key once the store is back
// and the holder released. A store still down when the budget runs out ends the wait with the
// store's error.
func TestQueuedWaiterRidesOutATransientStoreError(t *testing.T) {
	ms, _, _ := miniStore(t)
	fs := &faultStore{Store: ms}
	other := mustLocker(t, ms) // another process
	l := mustLocker(t, fs, WithWait(5*time.Second), WithRetry(LinearRetry(20*time.Millisecond)))
	bg := context.Background()
	down := errors.New("connection refused")

	holder, err := other.Lock(bg, "k")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		lease, err := l.Lock(bg, "k")
		if err == nil {
			err = lease.Release(bg)
		}
		got <- err
	}()
	// A second attempt means the first one was answered busy: the caller is a waiter now.
	waitFor(t, 2*time.Second, "the waiter saw the key held", func() bool { return fs.acquires.Load() >= 2 })
	fs.failAcquire.Store(&down)
	n := fs.acquires.Load()
	waitFor(t, 2*time.Second, "the waiter met the outage", func() bool { return fs.acquires.Load() >= n+2 })
	fs.failAcquire.Store(nil)
	if err := holder.Release(bg); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("a waiter through a transient store error: %v, want the lock", err)
	}

	// Down for longer than the wait: the store's error, not busy.
	holder, err = other.Lock(bg, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(bg)
	short := mustLocker(t, fs, WithWait(300*time.Millisecond), WithRetry(LinearRetry(20*time.Millisecond)))
	go func() {
		_, err := short.Lock(bg, "k")
		got <- err
	}()
	n = fs.acquires.Load()
	waitFor(t, 2*time.Second, "the second waiter saw the key held", func() bool { return fs.acquires.Load() >= n+2 })
	fs.failAcquire.Store(&down)
	defer fs.failAcquire.Store(nil)
	if err := <-got; !errors.Is(err, down) {
		t.Fatalf("a store down for the rest of the wait: %v, want its error", err)
	}
}

// A Lock whose store call timed out returns by its context's deadline: the give-back of what
// the call may have taken unseen goes on in the background (bounded, owner-checked), not on
// the caller's time, however long the store takes to answer it.
func TestLockReturnsByItsDeadlineWhileTheStoreHangs(t *testing.T) {
	ms, _, _ := miniStore(t)
	fs := &faultStore{Store: ms, slowBy: time.Minute}
	frozen := "lock:k"
	fs.slowKey.Store(&frozen)
	fs.hangRelease.Store(true)
	l := mustLocker(t, fs, WithWait(5*time.Second))
	const deadline = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	_, err := l.Lock(ctx, "k")
	took := time.Since(start)
	if err == nil {
		t.Fatal("Lock on a frozen store succeeded")
	}
	if took > deadline+250*time.Millisecond {
		t.Fatalf("Lock on a frozen store returned %v after it began, its deadline was %v (%v)", took, deadline, err)
	}
	waitFor(t, 2*time.Second, "the give-back was sent", func() bool { return fs.releases.Load() >= 1 })
}
