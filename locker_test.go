package flightlock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/flightlock/flightlock/internal/testenv/childproc"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/redisstore"
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
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = l.Lock(cctx, "w")
	// The wait gives up a reserve (100ms here) before the caller's deadline, so that the busy
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

func (h *hangingStore) Acquire(ctx context.Context, _ lockstore.Request) (lockstore.Acquisition, error) {
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

func (s *busyThenHangStore) Acquire(ctx context.Context, _ lockstore.Request) (lockstore.Acquisition, error) {
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

// criticalSection is a read-sleep-write of a counter: without mutual exclusion, concurrent
// sections lose updates. inside counts holders at once; more than one is a violation.
func runSections(t *testing.T, l *Locker, goroutines, sections int, counter *int, violations *atomic.Int64) {
	t.Helper()
	var (
		inside atomic.Int64
		start  = make(chan struct{})
		wg     sync.WaitGroup
		errs   = make(chan error, goroutines)
	)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := 0; i < sections; i++ {
				err := l.Do(context.Background(), "exclusion", func(context.Context) error {
					if inside.Add(1) != 1 {
						violations.Add(1)
					}
					v := *counter
					time.Sleep(50 * time.Microsecond)
					*counter = v + 1
					inside.Add(-1)
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Do: %v", err)
	}
}

func TestMutualExclusionInProcess(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) lockstore.Store
	}{
		{"miniredis", func(t *testing.T) lockstore.Store { s, _, _ := miniStore(t); return s }},
		{"redis-server", func(t *testing.T) lockstore.Store { s, _, _ := realStore(t); return s }},
		{"redis-cluster", clusterStore},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, handoff := range []int{0, DefaultHandoff} {
				l := mustLocker(t, tc.store(t), WithWait(30*time.Second), WithHandoff(handoff, time.Minute))
				var counter int
				var violations atomic.Int64
				const goroutines, sections = 64, 5
				runSections(t, l, goroutines, sections, &counter, &violations)
				if counter != goroutines*sections || violations.Load() != 0 {
					t.Fatalf("handoff %d: counter %d, want %d; %d overlapping holders",
						handoff, counter, goroutines*sections, violations.Load())
				}
				if n := l.gateLen(); n != 0 {
					t.Fatalf("gate keeps %d entries after all locks were released", n)
				}
			}
		})
	}
}

// The cross-process test re-executes the test binary as workers; each runs goroutines that
// do read-sleep-write sections on a counter in Redis under the lock.
const (
	workerEnv       = "FLIGHTLOCK_EXCLUSION_WORKER"
	workerAddrEnv   = "FLIGHTLOCK_EXCLUSION_ADDR"
	workerGoroutine = 16
	workerSections  = 5
)

func runExclusionWorker() int {
	c := redis.NewClient(&redis.Options{Addr: os.Getenv(workerAddrEnv), DisableIdentity: true, ContextTimeoutEnabled: true})
	defer c.Close()
	store := redisstore.New(c)
	defer store.Close()
	l, err := New(store, WithWait(60*time.Second), WithTTL(5*time.Second))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var wg sync.WaitGroup
	var failed atomic.Bool
	for g := 0; g < workerGoroutine; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < workerSections; i++ {
				err := l.Do(context.Background(), "xproc", func(ctx context.Context) error {
					if n := c.Incr(ctx, "xproc:inside").Val(); n != 1 {
						c.Incr(ctx, "xproc:violations")
					}
					v, _ := c.Get(ctx, "xproc:counter").Int()
					time.Sleep(200 * time.Microsecond)
					c.Set(ctx, "xproc:counter", v+1, 0)
					c.Decr(ctx, "xproc:inside")
					return nil
				})
				if err != nil {
					fmt.Fprintln(os.Stderr, "worker:", err)
					failed.Store(true)
					return
				}
			}
		}()
	}
	wg.Wait()
	if failed.Load() {
		return 1
	}
	return 0
}

func TestMutualExclusionAcrossProcesses(t *testing.T) {
	_, srv, c := realStore(t)
	const processes = 4
	var wg sync.WaitGroup
	outs := make([][]byte, processes)
	errs := make([]error, processes)
	for p := 0; p < processes; p++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), workerEnv+"=1", workerAddrEnv+"="+srv.Addr)
		childproc.Tie(cmd)
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[p], errs[p] = cmd.CombinedOutput()
		}()
	}
	wg.Wait()
	for p := range errs {
		if errs[p] != nil {
			t.Fatalf("worker %d: %v\n%s", p, errs[p], outs[p])
		}
	}
	ctx := context.Background()
	got, _ := c.Get(ctx, "xproc:counter").Int()
	violations, _ := c.Get(ctx, "xproc:violations").Int()
	if want := processes * workerGoroutine * workerSections; got != want || violations != 0 {
		t.Fatalf("counter %d, want %d; %d overlapping holders", got, want, violations)
	}
	if n, _ := c.Exists(ctx, "lock:xproc").Result(); n != 0 {
		t.Fatal("lock key left behind after every worker released")
	}
}

func TestRejectCostsNoRedisCommands(t *testing.T) {
	ctx := context.Background()
	check := func(t *testing.T, s lockstore.Store, commands func() int64, probeCost int64) {
		l := mustLocker(t, s, WithTTL(time.Minute), WithMode(Reject))
		lease, err := l.Lock(ctx, "hot")
		if err != nil {
			t.Fatal(err)
		}
		defer lease.Release(ctx)
		before := commands()
		var wg sync.WaitGroup
		var busy atomic.Int64
		start := make(chan struct{})
		for g := 0; g < 100; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for i := 0; i < 100; i++ {
					if _, err := l.TryLock(ctx, "hot"); errors.Is(err, ErrBusy) {
						busy.Add(1)
					}
				}
			}()
		}
		close(start)
		wg.Wait()
		if busy.Load() != 10000 {
			t.Fatalf("%d of 10000 TryLocks were busy", busy.Load())
		}
		if d := commands() - before - probeCost; d != 0 {
			t.Fatalf("10000 rejected TryLocks cost %d Redis commands, want 0", d)
		}
	}
	t.Run("miniredis", func(t *testing.T) {
		s, mr, _ := miniStore(t)
		check(t, s, func() int64 { return int64(mr.CommandCount()) }, 0)
	})
	t.Run("redis-server", func(t *testing.T) {
		s, srv, c := realStore(t)
		// INFO counts itself: measure the cost of the probe and subtract it.
		a := srv.CommandCount(ctx, c)
		probe := srv.CommandCount(ctx, c) - a
		check(t, s, func() int64 { return srv.CommandCount(ctx, c) }, probe)
	})
}

// A core Locker built with no options writes its holder's host and pid beside the owner token
// (DefaultMetadata), so that `flightlock show` names the process of a job's lock too; the core
// reads no trace (the go-zero layer adds it); WithMetadata(nil) stores nothing.
func TestCoreLocksCarryHostAndPid(t *testing.T) {
	store, _, client := miniStore(t)
	inspect := redisstore.NewInspector(client, "lock:")
	traceID := trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36}
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: traceID, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled}))
	host, _ := os.Hostname()

	lease, err := mustLocker(t, store).Lock(ctx, "job:interest")
	if err != nil {
		t.Fatal(err)
	}
	info, err := inspect.Lookup(context.Background(), "job:interest")
	if err != nil {
		t.Fatal(err)
	}
	if info.Host != host || info.Pid != strconv.Itoa(os.Getpid()) || info.Trace != "" {
		t.Errorf("holder host=%q pid=%q trace=%q, want %q %d and no trace", info.Host, info.Pid, info.Trace, host, os.Getpid())
	}
	_ = lease.Release(context.Background())

	lease, err = mustLocker(t, store, WithMetadata(nil)).Lock(context.Background(), "job:quiet")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	if info, err := inspect.Lookup(context.Background(), "job:quiet"); err != nil || info.Host != "" || info.Pid != "" {
		t.Errorf("WithMetadata(nil): holder %+v, %v; want no host or pid", info, err)
	}
}

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

// A lease that was released admits no re-entry: its context ends at the release, and a goroutine
// that carries it detached (context.WithoutCancel) locks as a new owner, behind whoever holds the
// key now.
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

type valueKey struct{}

// The shared bound keeps each call's deadline within [limit - span/16, limit], shares one
// context between calls of the same window, keeps the caller's values, and ends with
// DeadlineExceeded as a context of its own would.
func TestSharedBoundDeadlines(t *testing.T) {
	const span = 160 * time.Millisecond
	b := &sharedBound{span: span}
	caller := context.WithValue(context.Background(), valueKey{}, "span-1")

	now := time.Now()
	first := b.bound(caller, now, now.Add(span))
	second := b.bound(context.Background(), now, now.Add(span+span/32)) // same window
	third := b.bound(context.Background(), now, now.Add(span+span/8))   // too far: a new window

	for i, tc := range []struct {
		ctx   context.Context
		limit time.Time
	}{{first, now.Add(span)}, {second, now.Add(span + span/32)}, {third, now.Add(span + span/8)}} {
		d, ok := tc.ctx.Deadline()
		if !ok {
			t.Fatalf("call %d: no deadline", i)
		}
		if d.After(tc.limit) || tc.limit.Sub(d) > span/16 {
			t.Errorf("call %d: deadline %v before its limit, want within [0, %v]", i, tc.limit.Sub(d), span/16)
		}
	}
	if first.(*boundCtx).Context != second.(*boundCtx).Context {
		t.Error("two calls of one window got two timer contexts")
	}
	if second.(*boundCtx).Context == third.(*boundCtx).Context {
		t.Error("a call whose limit is span/8 later shares the earlier window: it would end too soon")
	}
	// Near the end of a wait budget, a call keeps nearly all of what is left: 60ms left, and a
	// window that ends 50ms before its limit is not shared with it.
	wait := &sharedBound{span: 2 * time.Second}
	start := time.Now()
	early := wait.bound(context.Background(), start, start.Add(2*time.Second))
	late := wait.bound(context.Background(), start.Add(1990*time.Millisecond), start.Add(2050*time.Millisecond))
	if early.(*boundCtx).Context == late.(*boundCtx).Context {
		t.Error("a call with 60ms left shares a window that ends 50ms before its limit")
	}
	if d, _ := late.Deadline(); !d.Equal(start.Add(2050 * time.Millisecond)) {
		t.Errorf("late call's deadline %v after start, want its limit 2.05s", d.Sub(start))
	}

	if got := first.Value(valueKey{}); got != "span-1" {
		t.Errorf("caller's value lost: got %v", got)
	}
	if got := second.Value(valueKey{}); got != nil {
		t.Errorf("a value leaked between calls sharing a window: got %v", got)
	}

	// A context derived from it is cancelled with it (found through Value, not a goroutine).
	derived, cancel := context.WithCancel(first)
	defer cancel()
	select {
	case <-first.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the shared context never ended")
	}
	select {
	case <-derived.Done():
	case <-time.After(time.Second):
		t.Fatal("a context derived from a bound call was not cancelled with it")
	}
	if !errors.Is(first.Err(), context.DeadlineExceeded) || !errors.Is(context.Cause(first), context.DeadlineExceeded) {
		t.Errorf("Err %v, Cause %v: want DeadlineExceeded", first.Err(), context.Cause(first))
	}
}

// Releases are bounded by one TTL even when the caller's context was cancelled (go-zero's
// timeout handler): the release context has the caller's values, a deadline no later than one
// TTL, and is not done.
func TestReleaseContextOutlivesTheRequest(t *testing.T) {
	k := &keeper{ttl: time.Second, ttlBound: &sharedBound{span: time.Second}}
	req, cancel := context.WithCancel(context.WithValue(context.Background(), valueKey{}, "trace"))
	cancel()
	before := time.Now()
	rctx := k.releaseContext(req)
	if rctx.Err() != nil {
		t.Fatalf("release context of a cancelled request is done: %v", rctx.Err())
	}
	d, ok := rctx.Deadline()
	if !ok || d.After(time.Now().Add(time.Second)) || d.Before(before.Add(time.Second-time.Second/16)) {
		t.Errorf("deadline %v from now, want within one TTL and no earlier than 15/16 of it", time.Until(d))
	}
	if rctx.Value(valueKey{}) != "trace" {
		t.Error("the request's values are lost in the release")
	}
}

// lostReplyStore runs every Acquire in the store and then answers with err, as a client whose
// call reached the server but whose caller's context ended before the reply came back (go-redis
// with ContextTimeoutEnabled, etcd's client): the lock is taken, and the caller does not know.
type lostReplyStore struct {
	lockstore.Store
	err error
}

func (s *lostReplyStore) Acquire(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	_, _ = s.Store.Acquire(context.WithoutCancel(ctx), req)
	return lockstore.Acquisition{}, s.err
}

// An acquisition whose reply is lost because its caller's context ended, by deadline or by
// cancellation (an HTTP client that went away, a gRPC call cancelled upstream), gives back the
// lock it may have taken: nothing else will release it, and the key would stay refused for the
// whole TTL (the same user's retry answered 409 for 10 s). It was given back for a deadline
// only, not for a cancellation.
func TestLostAcquireReplyGivesTheLockBack(t *testing.T) {
	for _, cause := range []error{context.Canceled, context.DeadlineExceeded} {
		t.Run(cause.Error(), func(t *testing.T) {
			s, _, _ := miniStore(t)
			ctx := context.Background()
			l := mustLocker(t, &lostReplyStore{Store: s, err: cause}, WithTTL(10*time.Second), WithMode(Reject))
			if _, err := l.Lock(ctx, "k"); !errors.Is(err, cause) {
				t.Fatalf("Lock with a lost reply: %v, want %v", err, cause)
			}
			// Given back in the background: Lock does not wait for the store once more.
			waitFor(t, time.Second, "the lock taken by the lost acquisition given back", func() bool {
				_, err := s.TTL(ctx, "lock:k")
				return errors.Is(err, ErrNotHeld)
			})
			other := mustLocker(t, s, WithMode(Reject))
			lease, err := other.Lock(ctx, "k")
			if err != nil {
				t.Fatalf("another owner after the lost acquisition: %v", err)
			}
			_ = lease.Release(ctx)
		})
	}
}

// overtakenStore loses the reply of every Acquire when its caller's context ends, and lets the
// call land only after the caller's give-back has reached the store: the give-back overtook
// it (a stalled server that reads the give-back's connection first; miniredis under load).
type overtakenStore struct {
	lockstore.Store
	releaseSeen chan struct{} // closed by the first Release
	once        sync.Once
	landed      chan struct{}
	took        bool // written before landed is closed: the late acquisition took the key
}

func (s *overtakenStore) Acquire(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	<-ctx.Done()
	go func() {
		defer close(s.landed)
		<-s.releaseSeen
		res, err := s.Store.Acquire(context.Background(), req)
		s.took = err == nil && res.Acquired
	}()
	return lockstore.Acquisition{}, ctx.Err()
}

func (s *overtakenStore) Release(ctx context.Context, key, owner, hold string, lastFence int64) (int, error) {
	n, err := s.Store.Release(ctx, key, owner, hold, lastFence)
	s.once.Do(func() { close(s.releaseSeen) })
	return n, err
}

// A give-back that reaches the store before the timed-out acquisition it undoes finds nothing
// to release; the acquisition then takes the key for nobody. The give-back asks again, so the
// key is free again well within the TTL instead of refused for all of it.
func TestGiveBackOvertakingItsAcquisitionStillFreesTheKey(t *testing.T) {
	s, _, _ := miniStore(t)
	os := &overtakenStore{Store: s, releaseSeen: make(chan struct{}), landed: make(chan struct{})}
	l := mustLocker(t, os, WithTTL(time.Minute), WithMode(Reject))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := l.Lock(ctx, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock whose reply was lost: %v, want context.DeadlineExceeded", err)
	}
	<-os.landed
	if !os.took {
		t.Fatal("the late acquisition did not take the key: the test proves nothing")
	}
	waitFor(t, 5*time.Second, "the late acquisition given back", func() bool {
		_, err := s.TTL(context.Background(), "lock:k")
		return errors.Is(err, ErrNotHeld)
	})
}

// lateStore answers the first Acquire busy and lets the second run past its call's deadline:
// that one lands in the store late, after its caller gave it back and tried again, and its
// store then gives back what it took for the caller that left (as the Redis store's late-reply
// hook and the ZooKeeper store's do), by owner.
type lateStore struct {
	lockstore.Store
	calls  atomic.Int64
	landed chan struct{}
}

func (s *lateStore) Acquire(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	switch s.calls.Add(1) {
	case 1:
		return lockstore.Acquisition{HolderTTL: time.Millisecond}, nil
	case 2:
		<-ctx.Done()
		go func() {
			defer close(s.landed)
			time.Sleep(50 * time.Millisecond) // the retry has its grant by now
			bg := context.Background()
			if res, err := s.Store.Acquire(bg, req); err == nil && res.Acquired {
				_, _ = s.Store.Release(bg, req.Key, req.Owner, "", 0)
			}
		}()
		return lockstore.Acquisition{}, ctx.Err()
	}
	return s.Store.Acquire(ctx, req)
}

// An attempt that timed out while the wait went on, and landed late, is given back by owner:
// the next attempt must not share its owner token, or that give-back releases the new grant
// under its holder (who would learn it only at its next renewal, with someone else inside).
func TestLateAttemptsGiveBackDoesNotReleaseTheRetrysGrant(t *testing.T) {
	s, _, _ := miniStore(t)
	ls := &lateStore{Store: s, landed: make(chan struct{})}
	const ttl = 300 * time.Millisecond
	l := mustLocker(t, ls, WithTTL(ttl), WithWait(10*time.Second))
	ctx := context.Background()
	lease, err := l.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	<-ls.landed
	if _, err := mustLocker(t, s, WithMode(Reject)).Lock(ctx, "k"); !errors.Is(err, ErrBusy) {
		t.Fatalf("another owner while the retry's grant is held: %v, want ErrBusy", err)
	}
}

// lateOnceStore answers its first acquisition too late to be held: the keeper's clock moves a
// whole TTL while the call is on its way, as during a store's leader election.
type lateOnceStore struct {
	*memStore
	clk   *manualClock
	ttl   time.Duration
	calls atomic.Int64
}

func (s *lateOnceStore) Acquire(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	if s.calls.Add(1) == 1 {
		s.clk.Advance(s.ttl)
	}
	return s.memStore.Acquire(ctx, req)
}

// A grant whose reply came too late to be held is a passing condition of the store (an
// election, a stall), not the end of a wait: a waiter gives it back and tries again within its
// budget, and gets the key, instead of failing with the late reply.
func TestWaiterRetriesAGrantThatCameTooLate(t *testing.T) {
	clk := newManualClock()
	const ttl = 3 * time.Second
	s := &lateOnceStore{memStore: newMemStore(), clk: clk, ttl: ttl}
	l := mustLocker(t, s, WithTTL(ttl), WithWait(10*time.Second), withClock(clk))
	lease, err := l.Lock(context.Background(), "k")
	if err != nil {
		t.Fatalf("a waiter whose first grant came too late: %v, want the key on a later attempt", err)
	}
	if n := s.calls.Load(); n < 2 {
		t.Fatalf("%d acquisitions, want the late one and another", n)
	}
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Reject mode has no budget to retry in: the late reply is its answer.
	s2 := &lateOnceStore{memStore: newMemStore(), clk: clk, ttl: ttl}
	r := mustLocker(t, s2, WithTTL(ttl), WithMode(Reject), withClock(clk))
	if _, err := r.Lock(context.Background(), "k"); !errors.Is(err, errLateReply) {
		t.Fatalf("TryLock whose grant came too late: %v, want the late reply", err)
	}
}

// The extra attempt that the Locker makes right after a fresh Watch (locker.go acquire,
// "continue") is not one of the retry strategy's attempts, does not skip the wait between
// attempts, and is not made once the gate is closing.
//
//   - TestCappedAttemptsStillWait: with a capped strategy (LimitRetry, the middleware's
//     Retry.Attempts), Attempts: 2 means "one more attempt after a wait, woken by the
//     release": the waiter gets the key released 100ms later, well within its 2s wait, and
//     does not answer busy a round trip after its first attempt.
//   - TestDrainWhileSubscribingAnswersErrClosed: a waiter that is between attempts when
//     Drain starts must answer ErrClosed (Locker.Drain's contract); the extra attempt after
//     the fresh watch does not go to the store and take the key during the drain.

func TestCappedAttemptsStillWait(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	holder := mustLocker(t, s, WithTTL(5*time.Second))
	lease, err := holder.TryLock(ctx, "capped")
	if err != nil {
		t.Fatal(err)
	}
	// Another process: a Locker of its own (its own gate).
	waiter := mustLocker(t, s, WithTTL(5*time.Second), WithWait(2*time.Second),
		WithRetry(LimitRetry(LinearRetry(time.Second), 2)))
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = lease.Release(ctx)
	}()
	start := time.Now()
	got, err := waiter.Lock(ctx, "capped")
	if err != nil {
		t.Fatalf("Lock = %v after %v; the key was released 100ms in, within the 2s wait and the one "+
			"retry (Attempts 2) the strategy allows: the extra attempt after the fresh watch used it up",
			err, time.Since(start).Round(time.Millisecond))
	}
	_ = got.Release(ctx)
}

// drainGapStore starts a drain of l while the waiter subscribes, then frees the key.
type drainGapStore struct {
	*memStore
	key, other string
	l          *Locker
	drained    chan error
}

func (g *drainGapStore) Watch(context.Context, string) (*lockstore.Watch, error) {
	go func() { g.drained <- g.l.Drain(context.Background()) }()
	for !g.l.k.gate.closed.Load() {
		time.Sleep(time.Millisecond)
	}
	_, _ = g.memStore.Release(context.Background(), g.key, g.other, "", 0)
	return lockstore.NewFreshWatch(make(chan struct{}), func() {}), nil
}

func TestDrainWhileSubscribingAnswersErrClosed(t *testing.T) {
	ctx := context.Background()
	s := &drainGapStore{memStore: newMemStore(), key: "lock:drain", other: "someone-else", drained: make(chan error, 1)}
	if got, err := s.Acquire(ctx, lockstore.Request{Key: s.key, Owner: s.other, TTL: time.Minute}); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	l := mustLocker(t, s, WithWait(2*time.Second), WithRetry(LinearRetry(10*time.Millisecond)))
	s.l = l
	lease, err := l.Lock(ctx, "drain")
	if err == nil {
		_ = lease.Release(ctx)
		<-s.drained
		t.Fatal("Lock took the key after Drain had started (the extra attempt after a fresh watch); want ErrClosed, " +
			"as a waiter between attempts is told")
	}
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("Lock = %v, want ErrClosed", err)
	}
	<-s.drained
}

// gapStore releases the other owner's lock while a waiter subscribes, and never notifies: the
// release comes between the waiter's busy reply and its subscription, and is published to
// nobody (the Locker's part of a lost wake-up).
type gapStore struct {
	*memStore
	key, other string
}

func (g *gapStore) Watch(context.Context, string) (*lockstore.Watch, error) {
	_, _ = g.memStore.Release(context.Background(), g.key, g.other, "", 0)
	return lockstore.NewFreshWatch(make(chan struct{}), func() {}), nil
}

// A waiter that was refused, then subscribed afresh (Watch.Fresh), tries once more before it sleeps: a release in
// between would otherwise leave it asleep with the key free until its retry delay (here
// longer than its whole wait, so it would answer busy for a free key).
func TestWaiterTriesAgainOnceItListens(t *testing.T) {
	ctx := context.Background()
	s := &gapStore{memStore: newMemStore(), key: "lock:gap", other: "someone-else"}
	if got, err := s.Acquire(ctx, lockstore.Request{Key: s.key, Owner: s.other, TTL: time.Minute}); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	l := mustLocker(t, s, WithWait(500*time.Millisecond), WithRetry(LinearRetry(10*time.Second)))
	lease, err := l.Lock(ctx, "gap")
	if errors.Is(err, ErrBusy) {
		t.Fatalf("Lock = %v for a key released while the waiter subscribed, want the lock", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	_ = lease.Release(ctx)
}

func TestRetryStrategies(t *testing.T) {
	if _, ok := NoRetry()(1); ok {
		t.Fatal("NoRetry retried")
	}
	lin := LinearRetry(10 * time.Millisecond)
	for n := 1; n <= 5; n++ {
		if d, ok := lin(n); !ok || d != time.Duration(n)*10*time.Millisecond {
			t.Fatalf("linear(%d) = %v, %v", n, d, ok)
		}
	}
	exp := ExponentialRetry(4*time.Millisecond, 100*time.Millisecond)
	for n := 1; n <= 80; n++ {
		step := min(4*time.Millisecond<<min(n-1, 30), 100*time.Millisecond)
		d, ok := exp(n)
		if !ok || d < step/2 || d > step {
			t.Fatalf("exponential(%d) = %v, want within [%v, %v]", n, d, step/2, step)
		}
	}
	lim := LimitRetry(lin, 3)
	if _, ok := lim(2); !ok {
		t.Fatal("limit stopped early")
	}
	if _, ok := lim(3); ok {
		t.Fatal("limit of 3 attempts allowed a fourth")
	}
}

// A strategy shared by many goroutines gives each the same answers: it keeps no state.
func TestRetryIsStateless(t *testing.T) {
	lin := LimitRetry(LinearRetry(time.Millisecond), 5)
	var wg sync.WaitGroup
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 1; n < 5; n++ {
				if d, ok := lin(n); !ok || d != time.Duration(n)*time.Millisecond {
					t.Errorf("attempt %d: %v %v", n, d, ok)
				}
			}
		}()
	}
	wg.Wait()
}

// Any key is either refused with ErrInvalidKey (empty, too long) or locked under exactly
// prefix+key and released without leaving anything behind.
func FuzzLockKey(f *testing.F) {
	for _, k := range []string{"", "a", "order:42", "\x00\xff", "a\nb", "ключ:🔒", "{x}", strings.Repeat("k", MaxKeyLen)} {
		f.Add(k)
	}
	s := newMemStore()
	l := MustNew(s, WithMode(Reject))
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, key string) {
		lease, err := l.Lock(ctx, key)
		valid := key != "" && len(DefaultPrefix)+len(key) <= MaxKeyLen
		if err != nil {
			if !errors.Is(err, ErrInvalidKey) || valid {
				t.Fatalf("Lock(%q) = %v", key, err)
			}
			return
		}
		if !valid {
			t.Fatalf("Lock(%q) accepted an invalid key", key)
		}
		if lease.Key() != DefaultPrefix+key {
			t.Fatalf("locked %q for key %q", lease.Key(), key)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if s.size() != 0 || l.gateLen() != 0 {
			t.Fatalf("key %q left %d locks and %d gate entries", key, s.size(), l.gateLen())
		}
	})
}

// spentOwnerStore fails every Release while failing is set, and records each (owner, hold)
// whose Release failed: such a release may still go through late, or by a retry of the store's
// own, so the store contract lets a caller send that owner and hold no more. sent reports every
// later Acquire or Reenter that names one.
type spentOwnerStore struct {
	lockstore.Store
	failing atomic.Bool
	mu      sync.Mutex
	spent   map[[2]string]bool // guarded by mu: {owner, hold} of a failed Release
	sent    []string           // guarded by mu: the calls that named a spent owner and hold
}

var errReleaseFailed = errors.New("test: the store failed the release")

func (s *spentOwnerStore) Release(ctx context.Context, key, owner, hold string, lastFence int64) (int, error) {
	if s.failing.Load() {
		s.mu.Lock()
		s.spent[[2]string{owner, hold}] = true
		s.mu.Unlock()
		return 0, errReleaseFailed
	}
	return s.Store.Release(ctx, key, owner, hold, lastFence)
}

func (s *spentOwnerStore) check(call, key, owner, hold string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.spent[[2]string{owner, hold}] {
		s.sent = append(s.sent, fmt.Sprintf("%s %q as owner %q hold %q", call, key, owner, hold))
	}
}

func (s *spentOwnerStore) Acquire(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	s.check("Acquire", req.Key, req.Owner, "")
	return s.Store.Acquire(ctx, req)
}

func (s *spentOwnerStore) Reenter(ctx context.Context, key, owner, hold string, ttl time.Duration) (lockstore.Acquisition, error) {
	s.check("Reenter", key, owner, hold)
	return s.Store.Reenter(ctx, key, owner, hold, ttl)
}

func (s *spentOwnerStore) RefreshAll(ctx context.Context, batch []lockstore.Renewal) []error {
	return refreshEach(ctx, s.Store.Refresh, batch)
}

// After a Release fails, the Locker never sends its owner and hold to the store again, on any
// primitive, for a new Lock of the key in the same context, a LockAll over it, or a handed-over
// re-entry of it: each grant is a new owner and each re-entry a new hold. The store contract
// relies on it (Store.Release): a failed release may still go through, and a re-sent request of
// that owner would be told it holds a key the release then frees.
func TestLockerSendsNoOwnerWhoseReleaseFailed(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
	}{
		{"lock", nil},
		{"permits", []Option{WithPermits(2)}},
		{"read", []Option{WithRead()}},
		{"fair", []Option{WithFair()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inner, mr, _ := miniStore(t)
			s := &spentOwnerStore{Store: inner, spent: map[[2]string]bool{}}
			opts := append([]Option{WithTTL(time.Second), WithWait(200 * time.Millisecond)}, tc.opts...)
			l := mustLocker(t, s, opts...)
			downstream := mustLocker(t, s, opts...) // another process
			ctx := context.Background()
			for round := range 3 {
				lease, err := l.Lock(ctx, "k")
				if err != nil {
					t.Fatalf("round %d: Lock: %v", round, err)
				}
				var handed *Lease // a read lease hands no owner over
				if !lease.reads() {
					if handed, err = downstream.Lock(withOwner(ctx, lease.Key(), lease.Owner()), "k"); err != nil {
						t.Fatalf("round %d: handed-over Lock: %v", round, err)
					}
				}
				s.failing.Store(true)
				if handed != nil {
					if err := handed.Release(ctx); err == nil {
						t.Fatalf("round %d: handed-over release with the store failing: no error", round)
					}
				}
				if err := lease.Release(ctx); err == nil {
					t.Fatalf("round %d: release with the store failing: no error", round)
				}
				s.failing.Store(false)
				// Both holds stay in the store until their TTL: each call below is refused, waits
				// or (reads) shares the key, as a new owner or with a new hold.
				if again, err := l.Lock(ctx, "k"); err == nil {
					_ = again.Release(ctx)
				}
				if all, err := l.LockAll(ctx, "k", "other"); err == nil {
					_ = all.Release(ctx)
				}
				if handed != nil {
					if again, err := downstream.Lock(withOwner(ctx, lease.Key(), lease.Owner()), "k"); err == nil {
						_ = again.Release(ctx)
					}
				}
				mr.FastForward(2 * time.Second) // the failed holds expire
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if len(s.spent) == 0 {
				t.Fatal("no Release failed: the test proves nothing")
			}
			if len(s.sent) > 0 {
				t.Fatalf("sent again after their Release failed: %q", s.sent)
			}
		})
	}
}

// unknownOnceStore runs the first Acquire and then reports its outcome unknown, as a store
// does when the reply was lost or the server answered an error for a request it may apply.
type unknownOnceStore struct {
	lockstore.Store
	mu       sync.Mutex
	owners   []string // guarded by mu: the owner of each Acquire, in order
	released []string // guarded by mu: the owner of each Release
}

func (s *unknownOnceStore) Acquire(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	s.mu.Lock()
	s.owners = append(s.owners, req.Owner)
	first := len(s.owners) == 1
	s.mu.Unlock()
	a, err := s.Store.Acquire(ctx, req)
	if first && err == nil {
		return lockstore.Acquisition{}, fmt.Errorf("test: connection closed (%w)", lockstore.ErrOutcomeUnknown)
	}
	return a, err
}

func (s *unknownOnceStore) Release(ctx context.Context, key, owner, hold string, lastFence int64) (int, error) {
	s.mu.Lock()
	s.released = append(s.released, owner)
	s.mu.Unlock()
	return s.Store.Release(ctx, key, owner, hold, lastFence)
}

func (s *unknownOnceStore) RefreshAll(ctx context.Context, batch []lockstore.Renewal) []error {
	return refreshEach(ctx, s.Store.Refresh, batch)
}

// An acquisition whose outcome the store reports unknown (lockstore.ErrOutcomeUnknown) is given
// back by its owner. A TryLock fails with the store's error, and the key is free at once, not
// after a TTL; a waiting Lock asks again as another owner (the store is reachable), which the
// give-back cannot touch.
func TestOutcomeUnknownIsGivenBack(t *testing.T) {
	for _, wait := range []bool{false, true} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			inner, _, _ := miniStore(t)
			s := &unknownOnceStore{Store: inner}
			l := mustLocker(t, s, WithTTL(time.Minute))
			ctx := context.Background()
			var lease *Lease
			var err error
			if wait {
				lease, err = l.Lock(ctx, "unknown")
			} else {
				lease, err = l.TryLock(ctx, "unknown")
			}
			s.mu.Lock()
			first := s.owners[0]
			s.mu.Unlock()
			switch {
			case !wait && !errors.Is(err, lockstore.ErrOutcomeUnknown):
				t.Fatalf("TryLock whose outcome is unknown = %v, want the store's error", err)
			case wait && err != nil:
				t.Fatalf("Lock after an unknown outcome: %v, want a grant as another owner", err)
			case wait && lease.Owner() == first:
				t.Fatalf("the lease's owner is the one whose outcome was unknown (%q)", first)
			}
			deadline := time.Now().Add(5 * time.Second)
			for !func() bool {
				s.mu.Lock()
				defer s.mu.Unlock()
				for _, o := range s.released {
					if o == first {
						return true
					}
				}
				return false
			}() {
				if time.Now().After(deadline) {
					t.Fatal("the unknown outcome was not given back by its owner")
				}
				time.Sleep(5 * time.Millisecond)
			}
			other, err := mustLocker(t, inner, WithMode(Reject)).Lock(ctx, "unknown")
			if wait {
				if !errors.Is(err, ErrBusy) {
					t.Fatalf("another owner while the waiter holds the key: %v, want ErrBusy", err)
				}
				if err := lease.Release(ctx); err != nil {
					t.Fatal(err)
				}
				return
			}
			if err != nil {
				t.Fatalf("another owner once the unknown outcome was given back: %v", err)
			}
			_ = other.Release(ctx)
		})
	}
}
