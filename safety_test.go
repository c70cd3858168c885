package flightlock

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/flightlock/flightlock/internal/testenv/childproc"
	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/embedded"
	"github.com/flightlock/flightlock/lockstore/redisstore"
)

// Exclusion holds on every path: each test below covers one path by which two callers could
// otherwise hold one key at once, or one fence be handed out twice.

// A handed-over owner that holds nothing must not take a free key, and two callers
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

// A refresh never shortens a lock.
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

func (s *slowAcquireStore) Acquire(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	res, err := s.Store.Acquire(ctx, req)
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

// Fences keep increasing when the fence counter goes back (restart from a
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

// Every grant, by Redis or by in-process handoff, has a fence above every earlier
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

// A lease that joined a hold in this process keeps the key held until it ends;
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

// Across processes, the upstream's release does not free the key while a
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

// MaxHold bounds a grant: re-entering over and over does not keep the lock past it (no
// re-entry restarts the MaxHold clock).
func TestReentriesDoNotExtendMaxHold(t *testing.T) {
	s, mr, _ := miniStore(t)
	clk := newManualClock()
	ctx := context.Background()
	// A TTL long enough that a loaded machine's first store call fits in it: the store call's
	// bound runs on real time, the lock's life on the manual clock.
	const ttl, maxHold = 900 * time.Millisecond, 2 * time.Second
	l := mustLocker(t, s, WithTTL(ttl), WithMaxHold(maxHold), withClock(clk))
	lease, err := l.Lock(ctx, "mh")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	// Re-enter every 200ms. The grant's last renewal is at 1.8s at the latest (TTL/3 steps
	// within MaxHold), so the lease must be lost by 1.8s + TTL - TTL/10 = 2.61s.
	for elapsed := time.Duration(0); elapsed <= maxHold+ttl; elapsed += 200 * time.Millisecond {
		if lease.Context().Err() != nil {
			break
		}
		if in, err := l.Lock(lease.Context(), "mh"); err == nil {
			_ = in.Release(ctx)
		}
		clk.Step(mr, 200*time.Millisecond, 10*time.Millisecond)
	}
	if context.Cause(lease.Context()) != ErrLost {
		t.Fatalf("re-entries kept the lock past MaxHold + TTL: cause %v, want ErrLost", context.Cause(lease.Context()))
	}
}

// TestStressExclusionAndFences (exclusion that holds on every path) runs worker
// processes (the test binary re-executed, as in TestMutualExclusionAcrossProcesses), each with
// goroutines that lock a few hot keys through a fault proxy of their own (delayed replies,
// stalled and cut connections, on a seeded random schedule), and a checker that decides on a
// direct connection to Redis, one Lua script per step, whether every critical section was
// entered as the library promises:
//
//   - a new grant (Lock on a context that did not hold the key) finds the key free, and its
//     fence is strictly larger than every fence recorded for the key before;
//   - a re-entry (Lock on a context that holds the key: down the call chain, or from
//     goroutines the holder started) carries the holder's fence, and re-entries of one hold
//     are inside one at a time (a re-entry down a re-entry's own chain nests in it);
//   - the lease's Locker holds the key in Redis when a section starts (each Locker stores a tag
//     of its own as lock metadata; a Locker's gate lets one grant at a time hold the lock),
//     unless the worker itself took longer than the lease's safety margin (TTL/10) between
//     seeing the lease's context alive and the checker's step: then the step is "late" and
//     judges nothing, but the lease's context must still end within two TTLs (and a second).
//
// The checker never calls Lease.Owner: giving the owner token out marks a lock as shared,
// which turns off the in-process handoff this test exercises.
//
// Holders leave at once when the lease's context ends. The library cancels it at least TTL/10
// before Redis may expire the key, which is the slack the checker relies on: TTLs stay at or
// above 300ms so that the scheduling of a 2-core machine under -race fits in it.
//
// Size: FLIGHTLOCK_STRESS_DURATION (default 45s, 8s with -short), FLIGHTLOCK_STRESS_PROCS (3),
// FLIGHTLOCK_STRESS_GOROUTINES (12, 8 with -short). FLIGHTLOCK_STRESS_SEED replays a schedule:
// the choices each goroutine and each fault schedule makes come from it (the interleaving
// does not).
func TestStressExclusionAndFences(t *testing.T) {
	set := stressSettings(t)
	t.Logf("seed %d: %d processes x %d goroutines for %v (replay with %s=%d)",
		set.seed, set.procs, set.goroutines, set.duration, stressSeedEnv, set.seed)
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()

	type worker struct {
		stdout, stderr bytes.Buffer
		err            error
	}
	workers := make([]*worker, set.procs)
	runCtx, cancel := context.WithTimeout(ctx, set.duration+2*time.Minute)
	defer cancel()
	started := time.Now()
	var wg sync.WaitGroup
	for p := range workers {
		w := &worker{}
		workers[p] = w
		cfg, _ := json.Marshal(stressConfig{Proc: p, Addr: srv.Addr, Seed: set.seed, Duration: set.duration, Goroutines: set.goroutines})
		cmd := exec.CommandContext(runCtx, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), stressWorkerEnv+"="+string(cfg))
		cmd.Stdout, cmd.Stderr = &w.stdout, &w.stderr
		cmd.WaitDelay = 5 * time.Second
		childproc.Tie(cmd)
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.err = cmd.Run()
		}()
	}
	wg.Wait()
	t.Logf("workers ran for %v", time.Since(started).Round(time.Millisecond))

	// Locks left behind (a release lost to a cut connection) must expire within their TTL.
	leftover, err := c.Keys(ctx, DefaultPrefix+"stress:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range leftover {
		if d := c.PTTL(ctx, k).Val(); d > stressMaxTTL || d == -1*time.Nanosecond {
			t.Errorf("%s left with PTTL %v, more than the longest TTL %v", k, d, stressMaxTTL)
		}
	}

	var total stressResult
	for p, w := range workers {
		if s := strings.TrimSpace(w.stderr.String()); s != "" {
			if len(s) > 4000 {
				s = s[:4000] + "\n..."
			}
			t.Logf("p%d stderr:\n%s", p, s)
		}
		if w.err != nil {
			t.Errorf("p%d: worker failed: %v\n%s", p, w.err, w.stdout.String())
			continue
		}
		res, ok := parseStressResult(w.stdout.Bytes())
		if !ok {
			t.Errorf("p%d: no result line in the worker's output:\n%s", p, w.stdout.String())
			continue
		}
		t.Logf("p%d: %s", p, res)
		if res.Counts[stressCounterNames[cGrants]] == 0 {
			t.Errorf("p%d: no lock granted in %v", p, set.duration)
		}
		if n := res.Counts[stressCounterNames[cCheckerErrors]]; n > 0 {
			t.Errorf("p%d: %d checker calls failed on the direct connection: the run proves nothing", p, n)
		}
		total.add(res)
	}
	t.Logf("all: %s", total)
	// A grant's steps are a chain re-entry three times in ten, a fan-out twice: over 50
	// grants, both happen.
	if grants := total.Counts[stressCounterNames[cGrants]]; grants > 50 {
		if total.Counts[stressCounterNames[cChain]] == 0 {
			t.Errorf("no re-entry down a call chain succeeded in %d grants", grants)
		}
		if total.Counts[stressCounterNames[cFanout]]+total.Counts[stressCounterNames[cFanoutBusy]] == 0 {
			t.Errorf("no re-entry from another goroutine was tried in %d grants", grants)
		}
	}

	// Every section was left: nothing is occupied in the checker.
	for _, key := range stressKeys {
		st := c.HGetAll(ctx, stressStateKey(key)).Val()
		if st["occ"] == "1" || (st["in"] != "" && st["in"] != "0") {
			t.Errorf("%s: section still occupied after every worker ended: %v", key, st)
		}
	}

	kinds := c.HGetAll(ctx, stressKindsKey).Val()
	if len(kinds) > 0 {
		details := c.LRange(ctx, stressViolationsKey, 0, 59).Val()
		t.Errorf("violations by kind: %v; the first %d:\n%s", kinds, len(details), strings.Join(details, "\n"))
	}

	if len(leftover) > 0 {
		time.Sleep(stressMaxTTL + 250*time.Millisecond)
		if left := c.Keys(ctx, DefaultPrefix+"stress:*").Val(); len(left) > 0 {
			t.Errorf("locks still in Redis one TTL after every worker ended: %v", left)
		}
	}
}

// TestStressCheckerCatchesViolations drives the checker's scripts by hand through every kind
// of violation they know, so that a clean stress run means something.
func TestStressCheckerCatchesViolations(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	const (
		key    = "stress:a"
		safety = 50 * time.Millisecond
	)
	lockKey := DefaultPrefix + key
	lock := func(tag string, fence int64) {
		// The value as acquire.lua writes it: owner, fence, holds, metadata.
		c.Set(ctx, lockKey, fmt.Sprintf("%032d %d 1 %s", fence, fence, tag), time.Minute)
	}
	enter := func(wantState, wantKinds, token string, fence int64, tag string, ago time.Duration, holder string) {
		t.Helper()
		state, kinds, err := stressEnter(c, key, lockKey, token, fence, tag, time.Now().Add(-ago), safety, holder)
		if err != nil {
			t.Fatal(err)
		}
		if state != wantState || kinds != wantKinds {
			t.Fatalf("%s: checker answered %q %q, want %q %q", token, state, kinds, wantState, wantKinds)
		}
	}
	exit := func(kind, token, holder string) {
		t.Helper()
		if err := stressExit(c, key, kind, token, holder); err != nil {
			t.Fatal(err)
		}
	}

	lock("tagA", 10)
	enter("entered", "", "a", 10, "tagA", 0, "")
	enter("entered", "", "a.r1", 10, "tagA", 0, "a")   // a re-entry
	enter("entered", "", "a.r1.c", 10, "tagA", 0, "a") // down its chain
	exit("reentry", "a.r1.c", "a")
	enter("entered", "", "a.r2", 10, "tagA", 0, "a") // a sibling while a.r1 is inside: one owner
	exit("reentry", "a.r2", "a")
	exit("reentry", "a.r1", "a")
	enter("entered", "reentry-fence", "a.r3", 11, "tagA", 0, "a")
	exit("reentry", "a.r3", "a")
	enter("gone", "", "x.r", 10, "tagA", 0, "x") // x is not inside
	lock("tagB", 20)                             // a's lock expired and B took it; a is still inside
	enter("entered", "overlap", "b", 20, "tagB", 0, "")
	exit("grant", "a", "") // replaced by b: changes nothing
	exit("grant", "b", "")
	enter("entered", "fence-kept-by-handoff", "b2", 20, "tagB", 0, "")
	exit("grant", "b2", "")
	enter("handoff", "", "b3", 21, "tagB", 0, "") // a handoff with a fence of its own
	exit("grant", "b3", "")
	enter("handoff", "fence-not-increasing", "b4", 19, "tagB", 0, "")
	exit("grant", "b4", "")
	enter("entered", "entered-unheld", "c", 30, "tagC", 0, "") // B holds the lock, not C
	exit("grant", "c", "")
	enter("late", "", "d", 40, "tagC", time.Second, "") // too slow to blame the library
	lock("tagE", 50)
	enter("entered", "", "e", 50, "tagE", 0, "")
	enter("entered", "", "e.r", 50, "tagE", 0, "e")
	exit("grant", "e", "") // leaves while its re-entry is inside (after a loss)
	lock("tagF", 60)
	enter("entered", "reentry-left-inside", "f", 60, "tagF", 0, "")
	exit("reentry", "e.r", "e") // after f's grant: changes nothing of f's
	exit("grant", "f", "")
	if st := c.HGetAll(ctx, stressStateKey(key)).Val(); st["in"] != "0" {
		t.Errorf("the checker's state after every section left: %v, want in=0", st)
	}

	got := c.HGetAll(ctx, stressKindsKey).Val()
	want := []string{"reentry-fence", "overlap", "fence-kept-by-handoff",
		"fence-not-increasing", "entered-unheld", "reentry-left-inside"}
	for _, k := range want {
		if got[k] != "1" {
			t.Errorf("violation count of %s is %q, want 1 (all: %v)", k, got[k], got)
		}
	}
	if n := c.LLen(ctx, stressViolationsKey).Val(); n != int64(len(want)) {
		t.Errorf("%d violations listed, want %d", n, len(want))
	}
	if st := c.HGetAll(ctx, stressStateKey(key)).Val(); st["occ"] != "0" || st["last"] != "60" {
		t.Errorf("final state %v, want occ 0 and last fence 60", st)
	}
}

const (
	stressWorkerEnv     = "FLIGHTLOCK_STRESS_WORKER" // JSON stressConfig: run as a worker
	stressDurationEnv   = "FLIGHTLOCK_STRESS_DURATION"
	stressProcsEnv      = "FLIGHTLOCK_STRESS_PROCS"
	stressGoroutinesEnv = "FLIGHTLOCK_STRESS_GOROUTINES"
	stressSeedEnv       = "FLIGHTLOCK_STRESS_SEED"
	stressResultPrefix  = "flightlock-stress-result "

	stressMinTTL = 300 * time.Millisecond
	stressMaxTTL = time.Second

	stressViolationsKey = "stresscheck:violations" // list of descriptions, the first 500
	stressKindsKey      = "stresscheck:kinds"      // hash: violation kind -> count
)

// stressKeys are the hot keys; the first is picked most often.
var stressKeys = []string{"stress:a", "stress:b", "stress:c"}

func stressStateKey(key string) string { return "stresscheck:state:" + key }

type stressSetup struct {
	duration          time.Duration
	procs, goroutines int
	seed              uint64
}

func stressSettings(t *testing.T) stressSetup {
	s := stressSetup{duration: 45 * time.Second, procs: 3, goroutines: 12, seed: uint64(time.Now().UnixNano())}
	if testing.Short() {
		s.duration, s.goroutines = 8*time.Second, 8
	}
	if v := os.Getenv(stressDurationEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive duration", stressDurationEnv, v)
		}
		s.duration = d
	}
	for _, x := range []struct {
		env string
		n   *int
	}{{stressProcsEnv, &s.procs}, {stressGoroutinesEnv, &s.goroutines}} {
		if v := os.Getenv(x.env); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				t.Fatalf("%s=%q: want a positive number", x.env, v)
			}
			*x.n = n
		}
	}
	if v := os.Getenv(stressSeedEnv); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", stressSeedEnv, v, err)
		}
		s.seed = seed
	}
	return s
}

// stressConfig is what the parent tells a worker, as JSON in stressWorkerEnv.
type stressConfig struct {
	Proc       int
	Addr       string // redis-server; the worker puts its own proxy in front of it
	Seed       uint64
	Duration   time.Duration
	Goroutines int
}

// The worker's counters. Names are in stressCounterNames.
const (
	cGrants          = iota // sections entered as new grants
	cHandoffs               // ... of which by handoff (a fence other than the Redis acquisition's)
	cChain                  // re-entries down the call chain, entered
	cFanout                 // re-entries from goroutines the holder started, entered
	cFanoutBusy             // such re-entries refused with ErrBusy
	cSlowChain              // chain re-entries that took more than 50ms to return
	cBusy                   // Lock/TryLock refused with ErrBusy
	cStoreErrors            // Lock/TryLock failed otherwise (Redis unreachable through the proxy)
	cReentryErrors          // re-entries from goroutines that failed otherwise, holder still alive
	cLost                   // holders that left their section because the context ended with ErrLost
	cEndedOther             // ... ended with another cause
	cCancelledBefore        // leases whose context had ended before the section began
	cLate                   // steps the checker did not judge: the worker was slower than TTL/10
	cReleaseNotHeld         // Release answered ErrNotHeld (expired meanwhile)
	cReleaseErrors          // Release failed otherwise
	cViolations             // violations found (also listed in Redis)
	cCheckerErrors          // checker calls that failed on the direct connection
	cDelays                 // fault schedule: phases of delayed replies
	cStalls                 // fault schedule: stalled connections (one or all)
	cCuts                   // fault schedule: every connection cut
	nStressCounters
)

var stressCounterNames = [nStressCounters]string{
	"grants", "handoffs", "chain", "fanout", "fanoutBusy", "slowChain", "busy", "storeErrors", "reentryErrors",
	"lost", "endedOther", "cancelledBefore", "late", "releaseNotHeld", "releaseErrors",
	"violations", "checkerErrors", "delays", "stalls", "cuts",
}

// stressResult is a worker's report, one JSON line on stdout after stressResultPrefix.
type stressResult struct {
	TTLs            []time.Duration
	Counts          map[string]int64
	MaxChain        time.Duration // longest chain re-entry
	FirstStoreErr   string
	FirstReentryErr string
}

func (r *stressResult) add(o stressResult) {
	if r.Counts == nil {
		r.Counts = make(map[string]int64)
	}
	for k, v := range o.Counts {
		r.Counts[k] += v
	}
	r.MaxChain = max(r.MaxChain, o.MaxChain)
}

func (r stressResult) String() string {
	var b strings.Builder
	if len(r.TTLs) > 0 {
		fmt.Fprintf(&b, "TTLs %v; ", r.TTLs)
	}
	for _, name := range stressCounterNames {
		fmt.Fprintf(&b, "%s %d, ", name, r.Counts[name])
	}
	fmt.Fprintf(&b, "max chain re-entry %v", r.MaxChain)
	if r.FirstStoreErr != "" {
		fmt.Fprintf(&b, "; first store error: %s", r.FirstStoreErr)
	}
	if r.FirstReentryErr != "" {
		fmt.Fprintf(&b, "; first re-entry error: %s", r.FirstReentryErr)
	}
	return b.String()
}

func parseStressResult(out []byte) (stressResult, bool) {
	var res stressResult
	found := false
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), stressResultPrefix); ok {
			found = json.Unmarshal([]byte(line), &res) == nil
		}
	}
	return res, found
}

// The checker's scripts. The state of a key (stressStateKey) is a hash:
//
//	occ        "1" while a holder is inside its section (a new grant), "0" after
//	token      that holder's section token; fence, owner: its lease's; since: entry, µs
//	last       the largest fence any grant of the key entered with; lastBy, lastOwner: whose
//	in         how many re-entries of that holder's grant are inside their sections now
//
// Fences are compared with tonumber (exact: they stay below 2^53) and stored as the strings
// they came in. A lock's value in Redis is "<owner> <fence> ... <tag> ...": the tag is the
// metadata of the Locker that acquired it.
const stressEnterHead = `
-- KEYS[1] the key's checker state; KEYS[2] violation list; KEYS[3] violation counts by kind
-- KEYS[4] the lock's Redis key
-- ARGV[1] this section's token (unique); ARGV[2] lease fence; ARGV[3] the lease's Locker's tag
-- ARGV[4] µs (Unix) when the worker saw the lease's context alive, just before this call
-- ARGV[5] the lease's safety margin (TTL/10), µs
-- Replies {state, kinds}: state "entered", or "late" (not judged, not entered: the worker was
-- slower than the margin); kinds: the violations found, comma-separated, or "".
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local token, fence, tag = ARGV[1], ARGV[2], ARGV[3]
local gap = now - tonumber(ARGV[4])
local lock = redis.call('GET', KEYS[4])
local function tagged(v, x)
  if not v then return false end
  local i = string.find(v, ' ' .. x, 1, true)
  if not i then return false end
  local after = string.sub(v, i + 1 + #x, i + 1 + #x)
  return after == '' or after == ' '
end
local held = tagged(lock, tag)
if not held and gap >= tonumber(ARGV[5]) then
  return {'late', ''}
end
local state = 'entered'
local found = {}
local function violation(kind, detail)
  redis.call('HINCRBY', KEYS[3], kind, 1)
  if redis.call('LLEN', KEYS[2]) < 500 then
    redis.call('RPUSH', KEYS[2], kind .. ' on ' .. KEYS[4] .. ': ' .. detail)
  end
  found[#found + 1] = kind
end
local me = string.format('%s (fence %s, context seen alive %dus before, lock %s)',
  token, fence, gap, held and 'held' or ('NOT held: ' .. tostring(lock)))
local s = redis.call('HMGET', KEYS[1], 'occ', 'token', 'fence', 'tag', 'since', 'last', 'lastBy', 'lastTag', 'in')
`

var stressEnterGrant = redis.NewScript(stressEnterHead + `
-- State "handoff" (entered): a grant whose fence is not the one its lock was acquired with in
-- Redis, so it came by handoff.
if held and string.match(lock, '^%S+ (%d+)') ~= fence then state = 'handoff' end
if not held then violation('entered-unheld', me) end
if s[1] == '1' then
  local prevHeld = tagged(lock, s[4])
  violation('overlap', string.format('%s entered while %s (fence %s) was inside for %dus, its lock %s',
    me, s[2], s[3], now - tonumber(s[5]), prevHeld and 'held' or 'not held'))
end
if tonumber(s[9] or '0') > 0 then
  violation('reentry-left-inside', string.format('%s entered while %s re-entries of %s were still inside', me, s[9], s[2]))
end
if s[6] and tonumber(fence) <= tonumber(s[6]) then
  local kind = 'fence-not-increasing'
  if fence == s[6] and tag == s[8] then kind = 'fence-kept-by-handoff' end
  violation(kind, string.format('%s after %s entered with fence %s', me, s[7], s[6]))
end
if not s[6] or tonumber(fence) > tonumber(s[6]) then
  redis.call('HSET', KEYS[1], 'last', fence, 'lastBy', token, 'lastTag', tag)
end
redis.call('HSET', KEYS[1], 'occ', '1', 'token', token, 'fence', fence, 'tag', tag,
  'since', string.format('%d', now), 'in', '0')
return {state, table.concat(found, ',')}
`)

var stressEnterReentry = redis.NewScript(stressEnterHead + `
-- ARGV[6] the holder's section token. Re-entries of one grant may be inside together: they
-- are one owner. State "gone" (not entered): the holder has left its section.
if s[1] ~= '1' or s[2] ~= ARGV[6] then
  return {'gone', ''}
end
if not held then violation('entered-unheld', me) end
if s[3] ~= fence then
  violation('reentry-fence', string.format('%s re-entered the hold of %s, whose fence is %s', me, s[2], s[3]))
end
redis.call('HINCRBY', KEYS[1], 'in', 1)
return {state, table.concat(found, ',')}
`)

// stressLeave ends a section, if it is still the one the state records (an overlapping entry
// replaced it and was counted then).
var stressLeave = redis.NewScript(`
-- KEYS[1] the key's checker state
-- ARGV[1] "grant" or "reentry"; ARGV[2] the section's token; ARGV[3] (re-entry) the token of
-- the holder whose grant it re-entered
local holder = redis.call('HGET', KEYS[1], 'token')
if ARGV[1] == 'grant' then
  if holder == ARGV[2] then
    redis.call('HSET', KEYS[1], 'occ', '0')
  end
elseif holder == ARGV[3] and tonumber(redis.call('HGET', KEYS[1], 'in') or '0') > 0 then
  redis.call('HINCRBY', KEYS[1], 'in', -1)
end
return 1
`)

// stressReport records a violation that the worker saw itself.
var stressReport = redis.NewScript(`
-- KEYS[1] violation list; KEYS[2] counts by kind; ARGV[1] kind; ARGV[2] description
redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
if redis.call('LLEN', KEYS[1]) < 500 then
  redis.call('RPUSH', KEYS[1], ARGV[1] .. ': ' .. ARGV[2])
end
return 1
`)

// stressLocker is one Locker of a worker with its own client, through the worker's proxy.
type stressLocker struct {
	l      *Locker
	ttl    time.Duration
	mode   Mode
	tag    string // lock metadata in Redis: which Locker holds the lock
	client *redis.Client
	store  *redisstore.RedisStore
}

type stressWorker struct {
	cfg     stressConfig
	proxy   *redistest.Proxy
	direct  *redis.Client // to redis-server, not through the proxy: the checker's
	lockers []*stressLocker

	counts   [nStressCounters]atomic.Int64
	maxChain atomic.Int64 // ns
	ids      atomic.Int64
	printed  atomic.Int64 // violations written to stderr

	mu            sync.Mutex
	firstStoreErr string // guarded by mu
	firstReentry  string // guarded by mu
}

// runStressWorker is a worker process of TestStressExclusionAndFences; TestMain runs it when
// stressWorkerEnv is set. It exits 0 after printing its result, also when it found
// violations (they are in Redis for the parent); non-zero when it could not run or left a
// goroutine behind.
func runStressWorker() int {
	var cfg stressConfig
	if err := json.Unmarshal([]byte(os.Getenv(stressWorkerEnv)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "stress worker: bad config:", err)
		return 2
	}
	w := &stressWorker{cfg: cfg}
	proxy, err := redistest.NewProxy(cfg.Addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "stress worker:", err)
		return 2
	}
	w.proxy = proxy
	w.direct = redis.NewClient(&redis.Options{Addr: cfg.Addr, DisableIdentity: true, ContextTimeoutEnabled: true, PoolSize: 64})
	// Two Lockers (two gates, two clients) per process: one in wait mode, one in reject mode,
	// with TTLs between stressMinTTL and stressMaxTTL.
	setup := rand.New(rand.NewPCG(cfg.Seed, uint64(cfg.Proc)<<16|0xffff))
	for i, mode := range []Mode{Wait, Reject} {
		ttl := stressMinTTL + time.Duration(setup.Int64N(int64(stressMaxTTL-stressMinTTL)/int64(10*time.Millisecond)+1))*10*time.Millisecond
		tag := fmt.Sprintf("stress-p%d-l%d", cfg.Proc, i)
		client := redis.NewClient(&redis.Options{Addr: proxy.Addr, DisableIdentity: true, ContextTimeoutEnabled: true})
		store := redisstore.New(client)
		l, err := New(store, WithTTL(ttl), WithWait(2*ttl), WithMode(mode),
			WithMetadata(func(context.Context) string { return tag }))
		if err != nil {
			fmt.Fprintln(os.Stderr, "stress worker:", err)
			return 2
		}
		w.lockers = append(w.lockers, &stressLocker{l: l, ttl: ttl, mode: mode, tag: tag, client: client, store: store})
	}

	stop := make(chan struct{})
	var faults sync.WaitGroup
	faults.Add(1)
	go func() {
		defer faults.Done()
		w.faults(setup, stop)
	}()
	deadline := time.Now().Add(cfg.Duration)
	var wg sync.WaitGroup
	for g := range cfg.Goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.loop(g, deadline)
		}()
	}
	wg.Wait()
	close(stop)
	faults.Wait()

	res := stressResult{Counts: make(map[string]int64), MaxChain: time.Duration(w.maxChain.Load())}
	for i, name := range stressCounterNames {
		res.Counts[name] = w.counts[i].Load()
	}
	for _, sl := range w.lockers {
		res.TTLs = append(res.TTLs, sl.ttl)
		_ = sl.store.Close()
		_ = sl.client.Close()
	}
	res.FirstStoreErr, res.FirstReentryErr = w.firstStoreErr, w.firstReentry
	_ = proxy.Close()
	_ = w.direct.Close()
	line, _ := json.Marshal(res)
	fmt.Printf("%s%s\n", stressResultPrefix, line)
	if err := goleak.Find(); err != nil {
		fmt.Fprintln(os.Stderr, "stress worker: goroutines left behind:", err)
		return 1
	}
	return 0
}

// faults drives the proxy: calm phases between phases of delayed replies (up to the longest
// TTL of the process), stalls of one or all connections, and cuts of every connection.
func (w *stressWorker) faults(rng *rand.Rand, stop <-chan struct{}) {
	ref := w.lockers[0].ttl
	for _, sl := range w.lockers {
		ref = max(ref, sl.ttl)
	}
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo)+1)) }
	sleep := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-stop:
			return false
		}
	}
	for {
		var d time.Duration
		switch r := rng.IntN(100); {
		case r < 45:
			d = between(100*time.Millisecond, 500*time.Millisecond)
		case r < 67:
			w.proxy.SetDelay(between(0, ref))
			w.counts[cDelays].Add(1)
			ok := sleep(between(100*time.Millisecond, 400*time.Millisecond))
			w.proxy.SetDelay(0)
			if !ok {
				return
			}
			continue
		case r < 82:
			if w.proxy.StallConn(rng.IntN(1024), between(ref/2, ref*3/2)) {
				w.counts[cStalls].Add(1)
			}
			d = between(50*time.Millisecond, 300*time.Millisecond)
		case r < 93:
			d = between(ref/4, ref)
			w.proxy.Stall(d)
			w.counts[cStalls].Add(1)
		default:
			w.proxy.Cut()
			w.counts[cCuts].Add(1)
			d = between(50*time.Millisecond, 300*time.Millisecond)
		}
		if !sleep(d) {
			return
		}
	}
}

// loop is one goroutine: lock a hot key, run a held section, release, until the deadline.
// Even goroutines use the wait-mode Locker, odd ones the reject-mode one, so each Locker's
// gate sees several goroutines on one key (in-process handoff).
func (w *stressWorker) loop(g int, deadline time.Time) {
	rng := rand.New(rand.NewPCG(w.cfg.Seed, uint64(w.cfg.Proc)<<16|uint64(g)))
	sl := w.lockers[g%len(w.lockers)]
	for i := 0; time.Now().Before(deadline); i++ {
		key := stressKeys[0]
		if r := rng.IntN(10); r >= 5 {
			key = stressKeys[1+r%2]
		}
		var (
			lease *Lease
			err   error
		)
		if sl.mode == Reject || rng.IntN(4) == 0 {
			lease, err = sl.l.TryLock(context.Background(), key)
		} else {
			lease, err = sl.l.Lock(context.Background(), key)
		}
		if err != nil {
			if errors.Is(err, ErrBusy) {
				w.counts[cBusy].Add(1)
			} else {
				w.counts[cStoreErrors].Add(1)
				w.noteFirst(&w.firstStoreErr, err)
			}
			time.Sleep(2*time.Millisecond + time.Duration(rng.Int64N(int64(18*time.Millisecond))))
			continue
		}
		w.hold(rng, sl, key, lease, fmt.Sprintf("p%d.g%d.%d", w.cfg.Proc, g, i))
		if rng.IntN(4) == 0 {
			time.Sleep(time.Duration(rng.Int64N(int64(2 * time.Millisecond))))
		}
	}
}

// hold runs the section of a new grant: one to three steps of work, re-entry down the chain,
// or re-entries from goroutines it starts; it leaves at once when the lease's context ends,
// then waits for its goroutines and releases.
func (w *stressWorker) hold(rng *rand.Rand, sl *stressLocker, key string, lease *Lease, token string) {
	var kids sync.WaitGroup
	defer w.release(lease)
	defer kids.Wait()
	if !w.enter(sl, key, lease, token, "") {
		return
	}
	w.counts[cGrants].Add(1)
	defer w.leave(key, "grant", token, "")
	ctx := lease.Context()
	for range 1 + rng.IntN(3) {
		switch r := rng.IntN(10); {
		case r < 5:
			w.work(ctx, rng, sl.ttl, true)
		case r < 8:
			w.chain(rng, sl, key, lease, token, 0)
		default:
			w.fanOut(rng, sl, key, lease, token, &kids)
		}
		if ctx.Err() != nil {
			if context.Cause(ctx) == ErrLost {
				w.counts[cLost].Add(1)
			} else {
				w.counts[cEndedOther].Add(1)
			}
			return
		}
	}
}

// work sleeps inside a section until a random time passes or ctx ends: mostly a few
// milliseconds, sometimes (long) past the TTL, so that the watchdog must renew.
func (w *stressWorker) work(ctx context.Context, rng *rand.Rand, ttl time.Duration, long bool) {
	var d time.Duration
	switch r := rng.IntN(40); {
	case long && r < 2:
		d = ttl/2 + time.Duration(rng.Int64N(int64(ttl)))
	case r < 8:
		d = 3*time.Millisecond + time.Duration(rng.Int64N(int64(30*time.Millisecond)))
	default:
		d = time.Duration(rng.Int64N(int64(3 * time.Millisecond)))
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// chain re-enters key down the call chain of outer (a holder's or a re-entry's lease): it
// must succeed at once, with TryLock as well as Lock.
func (w *stressWorker) chain(rng *rand.Rand, sl *stressLocker, key string, outer *Lease, holder string, depth int) {
	octx := outer.Context()
	start := time.Now()
	var (
		inner *Lease
		err   error
	)
	if rng.IntN(2) == 0 {
		inner, err = sl.l.TryLock(octx, key)
	} else {
		inner, err = sl.l.Lock(octx, key)
	}
	took := time.Since(start)
	if err != nil {
		if octx.Err() == nil {
			w.violation("chain-reentry-failed", fmt.Sprintf("%s: Lock(%s) on its own lease's context failed after %v: %v", holder, key, took, err))
		}
		return
	}
	defer w.release(inner)
	for {
		cur := w.maxChain.Load()
		if int64(took) <= cur || w.maxChain.CompareAndSwap(cur, int64(took)) {
			break
		}
	}
	if took > 50*time.Millisecond {
		w.counts[cSlowChain].Add(1)
	}
	id := fmt.Sprintf("%s.c%d", holder, w.ids.Add(1))
	if !w.enter(sl, key, inner, id, holder) {
		return
	}
	w.counts[cChain].Add(1)
	defer w.leave(key, "reentry", id, holder)
	ictx := inner.Context()
	w.work(ictx, rng, sl.ttl, false)
	if depth < 1 && ictx.Err() == nil && rng.IntN(3) == 0 {
		w.chain(rng, sl, key, inner, holder, depth+1)
	}
}

// fanOut starts two or three goroutines that re-enter key with the holder's context, and
// waits for them, or for the holder's context to end (the holder then leaves at once, and
// waits for them before it releases).
func (w *stressWorker) fanOut(rng *rand.Rand, sl *stressLocker, key string, lease *Lease, holder string, kids *sync.WaitGroup) {
	n := 2 + rng.IntN(2)
	finished := make(chan struct{}, n)
	for range n {
		crng := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
		kids.Add(1)
		go func() {
			defer kids.Done()
			defer func() { finished <- struct{}{} }()
			w.child(crng, sl, key, lease, holder)
		}()
	}
	ctx := lease.Context()
	for range n {
		select {
		case <-finished:
		case <-ctx.Done():
			return
		}
	}
}

// child is a goroutine of the holder: it re-enters key with the holder's context, at once, as
// its siblings do (they are one owner), works, maybe re-enters down its own chain.
func (w *stressWorker) child(rng *rand.Rand, sl *stressLocker, key string, holderLease *Lease, holder string) {
	hctx := holderLease.Context()
	var (
		lease *Lease
		err   error
	)
	if rng.IntN(2) == 0 {
		lease, err = sl.l.TryLock(hctx, key)
	} else {
		lease, err = sl.l.Lock(hctx, key)
	}
	if err != nil {
		switch {
		case hctx.Err() != nil:
		case errors.Is(err, ErrBusy):
			w.counts[cFanoutBusy].Add(1)
			w.violation("fanout-reentry-refused", fmt.Sprintf("%s: a goroutine with the holder's live context was refused: %v", holder, err))
		default:
			w.counts[cReentryErrors].Add(1)
			w.noteFirst(&w.firstReentry, err)
		}
		return
	}
	defer w.release(lease)
	id := fmt.Sprintf("%s.f%d", holder, w.ids.Add(1))
	if !w.enter(sl, key, lease, id, holder) {
		return
	}
	w.counts[cFanout].Add(1)
	defer w.leave(key, "reentry", id, holder)
	ctx := lease.Context()
	w.work(ctx, rng, sl.ttl, false)
	if ctx.Err() == nil && rng.IntN(3) == 0 {
		w.chain(rng, sl, key, lease, holder, 1)
	}
}

// enter asks the checker to let a section begin: a new grant when holder is "", else a
// re-entry of holder's hold. It reports whether the
// section began (with or without violations).
func (w *stressWorker) enter(sl *stressLocker, key string, lease *Lease, token, holder string) bool {
	checked := time.Now()
	if lease.Context().Err() != nil {
		w.counts[cCancelledBefore].Add(1)
		return false
	}
	state, kinds, err := stressEnter(w.direct, key, lease.Key(), token, lease.Fence(), sl.tag, checked, sl.ttl/10, holder)
	if err != nil {
		w.counts[cCheckerErrors].Add(1)
		fmt.Fprintf(os.Stderr, "checker: enter %s: %v\n", token, err)
		return false
	}
	if state == "handoff" {
		w.counts[cHandoffs].Add(1)
	}
	switch {
	case state == "late":
		// Redis no longer has the lock; we were too slow to blame the library for entering,
		// but the lease must find out and end its context within two TTLs.
		w.counts[cLate].Add(1)
		w.awaitEnd(lease, 2*sl.ttl+time.Second, "unheld-lease-not-cancelled",
			fmt.Sprintf("%s: Redis no longer held %s for %s", token, lease.Key(), sl.tag))
		return false
	case state == "gone":
		// The holder left its section because its context ended; this re-entry's context
		// comes from it and must have ended too.
		w.counts[cCancelledBefore].Add(1)
		w.awaitEnd(lease, time.Second, "reentry-outlived-holder",
			fmt.Sprintf("%s: the holder %s left its section, this re-entry's context stayed alive", token, holder))
		return false
	case kinds != "":
		w.counts[cViolations].Add(int64(strings.Count(kinds, ",") + 1))
		if w.printed.Add(1) <= 10 {
			fmt.Fprintf(os.Stderr, "p%d violation %s: %s (fence %d)\n", w.cfg.Proc, kinds, token, lease.Fence())
		}
	}
	return true
}

// awaitEnd waits up to within for lease's context to end, and records a violation if it
// does not.
func (w *stressWorker) awaitEnd(lease *Lease, within time.Duration, kind, detail string) {
	t := time.NewTimer(within)
	defer t.Stop()
	select {
	case <-lease.Context().Done():
	case <-t.C:
		w.violation(kind, fmt.Sprintf("%s (after %v)", detail, within))
	}
}

// stressEnter runs the checker's step for a section that begins: a new grant when holder is
// "", else a re-entry of holder's section. lockKey is
// the lock's Redis key, tag the metadata of the lease's Locker, checked when the lease's
// context was last seen alive, safety the lease's TTL/10. It returns the reply's state and
// violation kinds (see stressEnterHead).
func stressEnter(c *redis.Client, key, lockKey, token string, fence int64, tag string, checked time.Time, safety time.Duration, holder string) (state, kinds string, err error) {
	keys := []string{stressStateKey(key), stressViolationsKey, stressKindsKey, lockKey}
	args := []any{token, strconv.FormatInt(fence, 10), tag, checked.UnixMicro(), safety.Microseconds()}
	script := stressEnterGrant
	if holder != "" {
		script, args = stressEnterReentry, append(args, holder)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reply, err := script.Run(ctx, c, keys, args...).StringSlice()
	if err == nil && len(reply) != 2 {
		err = fmt.Errorf("unexpected reply %q", reply)
	}
	if err != nil {
		return "", "", err
	}
	return reply[0], reply[1], nil
}

// stressExit runs the checker's step for a section that ends: kind "grant" or "reentry";
// holder is the grant a re-entry re-entered.
func stressExit(c *redis.Client, key, kind, token, holder string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return stressLeave.Run(ctx, c, []string{stressStateKey(key)}, kind, token, holder).Err()
}

func (w *stressWorker) leave(key, kind, token, holder string) {
	if err := stressExit(w.direct, key, kind, token, holder); err != nil {
		w.counts[cCheckerErrors].Add(1)
		fmt.Fprintf(os.Stderr, "checker: leave %s: %v\n", token, err)
	}
}

func (w *stressWorker) violation(kind, detail string) {
	w.counts[cViolations].Add(1)
	detail = fmt.Sprintf("p%d %s", w.cfg.Proc, detail)
	if w.printed.Add(1) <= 10 {
		fmt.Fprintf(os.Stderr, "violation %s: %s\n", kind, detail)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := stressReport.Run(ctx, w.direct, []string{stressViolationsKey, stressKindsKey}, kind, detail).Err(); err != nil {
		w.counts[cCheckerErrors].Add(1)
		fmt.Fprintf(os.Stderr, "checker: report %s: %v\n", kind, err)
	}
}

func (w *stressWorker) release(lease *Lease) {
	switch err := lease.Release(context.Background()); {
	case err == nil:
	case errors.Is(err, ErrNotHeld):
		w.counts[cReleaseNotHeld].Add(1)
	default:
		w.counts[cReleaseErrors].Add(1)
	}
}

func (w *stressWorker) noteFirst(dst *string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if *dst == "" {
		*dst = err.Error()
	}
}

// An acquisition whose reply comes back late (0.57 x TTL after the send, a cold
// Cluster client) is renewed in time, counted from the send, never declared lost while its key
// is valid, on a real redis-server. The first renewal is due TTL/3 after the send, so here it
// goes out as soon as the reply arrives.
func TestSlowAcquireReplyIsRenewedInTime(t *testing.T) {
	s, _, c := realStore(t)
	ctx := context.Background()
	const ttl = time.Second
	l := mustLocker(t, &slowAcquireStore{Store: s, delay: 570 * time.Millisecond}, WithTTL(ttl))
	lease, err := l.Lock(ctx, "slow")
	if err != nil {
		t.Fatalf("a reply 0.57 x TTL late must still give a lease (0.33 x TTL is left to renew): %v", err)
	}
	defer lease.Release(ctx)
	// Three TTLs later the lease and its key are still there: the renewals kept up.
	end := time.Now().Add(3 * ttl)
	for time.Now().Before(end) {
		if err := lease.Context().Err(); err != nil {
			t.Fatalf("lease cancelled (%v) while its key was valid: %d ms left in Redis", context.Cause(lease.Context()),
				c.PTTL(ctx, "lock:slow").Val().Milliseconds())
		}
		if owner := strings.Fields(c.Get(ctx, "lock:slow").Val()); len(owner) == 0 || owner[0] != lease.Owner() {
			t.Fatalf("the key is no longer this lease's: %v", owner)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// migration moves one slot from its master to another in steps, as redis-cli --cluster
// reshard does, so a test can act between the steps.
type migration struct {
	t        *testing.T
	slot     int64
	from, to *redis.Client
	toAddr   string
	fromID   string
	toID     string
	all      []*redis.Client
}

func startMigration(t *testing.T, cluster *redistest.Cluster, key string) *migration {
	t.Helper()
	ctx := context.Background()
	m := &migration{t: t}
	for _, addr := range cluster.Addrs {
		c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
		t.Cleanup(func() { _ = c.Close() })
		m.all = append(m.all, c)
	}
	m.slot = m.all[0].ClusterKeySlot(ctx, key).Val()
	for i, c := range m.all {
		id := c.ClusterMyID(ctx).Val()
		owner := nodeOfSlot(t, c, m.slot)
		if owner == id {
			m.from, m.fromID = c, id
		} else if m.to == nil {
			m.to, m.toID, m.toAddr = c, id, cluster.Addrs[i]
		}
	}
	if m.from == nil || m.to == nil {
		t.Fatalf("slot %d: no source or target node", m.slot)
	}
	must(t, m.to.Do(ctx, "CLUSTER", "SETSLOT", m.slot, "IMPORTING", m.fromID).Err())
	must(t, m.from.Do(ctx, "CLUSTER", "SETSLOT", m.slot, "MIGRATING", m.toID).Err())
	return m
}

// nodeOfSlot is the id of the master that c believes serves slot.
func nodeOfSlot(t *testing.T, c *redis.Client, slot int64) string {
	t.Helper()
	ranges, err := c.ClusterSlots(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range ranges {
		if int64(r.Start) <= slot && slot <= int64(r.End) {
			return r.Nodes[0].ID
		}
	}
	t.Fatalf("no node serves slot %d", slot)
	return ""
}

// move migrates keys (they must be in the slot) to the target.
func (m *migration) move(keys ...string) {
	m.t.Helper()
	host, port, _ := strings.Cut(m.toAddr, ":")
	args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
	for _, k := range keys {
		args = append(args, k)
	}
	must(m.t, m.from.Do(context.Background(), args...).Err())
}

// finish moves the slot's remaining keys and gives the slot to the target on every node.
func (m *migration) finish() {
	m.t.Helper()
	ctx := context.Background()
	for {
		keys := m.from.ClusterGetKeysInSlot(ctx, int(m.slot), 100).Val()
		if len(keys) == 0 {
			break
		}
		m.move(keys...)
	}
	for _, c := range m.all {
		must(m.t, c.Do(ctx, "CLUSTER", "SETSLOT", m.slot, "NODE", m.toID).Err())
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// While a slot migrates, its lock and fence counter can be on two nodes and a script
// that touches both gets TRYAGAIN. No TRYAGAIN reaches a caller: a rejecting Lock is answered
// busy, a waiting Lock waits and gets the lock once the migration is done, and a release during
// the migration is sent again until it goes through.
func TestSlotMigrationIsInvisible(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node Redis Cluster")
	}
	cluster := redistest.StartCluster(t, 3)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs, DisableIdentity: true, ContextTimeoutEnabled: true})
	s := redisstore.New(client, redisstore.WithOnClose(client.Close))
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	reject := mustLocker(t, s, WithMode(Reject))
	wait := mustLocker(t, s, WithWait(20*time.Second))

	// Two keys of one slot ({mig}); the first grant creates the slot's fence counter.
	held, err := wait.Lock(ctx, "{mig}held")
	if err != nil {
		t.Fatal(err)
	}
	fence0 := held.Fence()
	m := startMigration(t, cluster, "lock:{mig}free")
	// The counter goes first; the held lock stays on the source: the two are split.
	m.move(lockstore.FenceKey("lock:{mig}free"))

	if _, err := reject.Lock(ctx, "{mig}free"); !errors.Is(err, ErrBusy) {
		t.Fatalf("a rejecting Lock during the migration: %v, want ErrBusy", err)
	}
	type result struct {
		lease *Lease
		err   error
	}
	waited := make(chan result, 1)
	go func() {
		lease, err := wait.Lock(ctx, "{mig}free")
		waited <- result{lease, err}
	}()
	released := make(chan error, 1)
	go func() { released <- held.Release(ctx) }()

	time.Sleep(300 * time.Millisecond) // both retry against the split slot meanwhile
	select {
	case r := <-waited:
		t.Fatalf("the waiting Lock returned during the migration: %v %v", r.lease, r.err)
	case err := <-released:
		t.Fatalf("the release returned during the migration: %v", err)
	default:
	}
	m.finish()

	if err := <-released; err != nil {
		t.Errorf("release across the migration: %v", err)
	}
	r := <-waited
	if r.err != nil {
		t.Fatalf("the waiting Lock across the migration: %v", r.err)
	}
	if r.lease.Fence() <= fence0 {
		t.Errorf("fence %d after the migration is not above %d before it", r.lease.Fence(), fence0)
	}
	if err := r.lease.Release(ctx); err != nil {
		t.Errorf("release after the migration: %v", err)
	}
	// The slot now lives on the target, which answers for both keys.
	if n := nodeOfSlot(t, m.to, m.slot); n != m.toID {
		t.Errorf("slot %d is on %s after the migration, want %s", m.slot, n, m.toID)
	}
}

// clusterLocker is a Locker of its own (its own Cluster client, as another process would
// have) on c, with replica acknowledgement when replicas > 0.
func clusterLocker(t *testing.T, c *redistest.ReplicatedCluster, replicas int) *Locker {
	t.Helper()
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Seeds(), DisableIdentity: true, ContextTimeoutEnabled: true})
	var opts []redisstore.Option
	if replicas > 0 {
		opts = append(opts, redisstore.WithReplicas(replicas, 200*time.Millisecond))
	}
	s := redisstore.New(client, append(opts, redisstore.WithOnClose(client.Close))...)
	t.Cleanup(func() { _ = s.Close() })
	return mustLocker(t, s, WithTTL(30*time.Second))
}

// retryStoreErrors calls f until it returns nil, ErrBusy or ErrNotHeld (store errors are
// expected while clients find the promoted replica), for up to 20s.
func retryStoreErrors(t *testing.T, f func() error) error {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := f()
		if err == nil || errors.Is(err, ErrBusy) || errors.Is(err, ErrNotHeld) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The hole without replica acknowledgement: on a real Cluster (3 masters, 3 replicas), a lock
// taken while its master's replica receives nothing is lost when the master is killed and the
// replica promoted, and a second holder is granted while the first still holds its lease.
// Asserting the hole keeps the test below honest. The fence still increases (server-time clock).
func TestClusterFailoverWithoutReplicaAckGrantsASecondHolder(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a six-node Redis Cluster")
	}
	c := redistest.StartReplicatedCluster(t, 3)
	ctx := context.Background()
	i := c.MasterOf("lock:acct:1")
	if n := c.Proxies[i].Stall(time.Minute); n == 0 {
		t.Fatalf("no replication link to stall through the proxy of master %d", i)
	}
	first := clusterLocker(t, c, 0) // its connections are new: not stalled
	lease1, err := first.Lock(ctx, "acct:1")
	if err != nil {
		t.Fatal(err)
	}
	c.Masters[i].Stop() // SIGKILL
	c.WaitPromoted(i, 30*time.Second)

	second := clusterLocker(t, c, 0)
	var lease2 *Lease
	if err := retryStoreErrors(t, func() (err error) { lease2, err = second.TryLock(ctx, "acct:1"); return err }); err != nil {
		t.Fatalf("after the promotion the second locker got %v; the promoted replica was expected to have lost the grant", err)
	}
	if lease1.Context().Err() != nil {
		t.Fatalf("the first holder already knew it lost its lock (%v): not a double grant", context.Cause(lease1.Context()))
	}
	t.Logf("double grant: first holder fence %d still valid, second holder fence %d", lease1.Fence(), lease2.Fence())
	if lease2.Fence() <= lease1.Fence() {
		t.Errorf("the second grant's fence %d is not above the first's %d", lease2.Fence(), lease1.Fence())
	}
	_ = lease2.Release(ctx)
	_ = lease1.Release(ctx)
}

// With Replicas: 1 on a real Cluster: a lock its master's replica cannot receive is
// refused; one it acknowledged survives the master's death: the other locker finds it held,
// never granted; the holder's renewals reach the promoted replica (the store reloads the slot
// map on connection errors) within a measured time; fences increase across the promotion; and a
// lock over keys on all three masters is all or nothing.
func TestClusterFailoverWithReplicaAckKeepsOneHolder(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a six-node Redis Cluster")
	}
	c := redistest.StartReplicatedCluster(t, 3)
	ctx := context.Background()
	i := c.MasterOf("lock:acct:1")
	first, second := clusterLocker(t, c, 1), clusterLocker(t, c, 1)

	c.Proxies[i].Stall(2 * time.Second)
	if _, err := first.Lock(ctx, "acct:1"); !errors.Is(err, redisstore.ErrNotReplicated) {
		t.Fatalf("Lock while the replica receives nothing: %v, want ErrNotReplicated", err)
	}
	var lease1 *Lease
	if err := retryStoreErrors(t, func() (err error) { lease1, err = first.Lock(ctx, "acct:1"); return err }); err != nil {
		t.Fatalf("Lock once the replica receives again: %v", err)
	}

	killed := time.Now()
	c.Masters[i].Stop() // SIGKILL
	promoted := c.WaitPromoted(i, 30*time.Second)
	t.Logf("replica promoted %v after the master was killed", promoted.Sub(killed))
	// The holder renews explicitly until a renewal reaches the promoted replica. It runs there
	// but cannot be acknowledged (the new master has no replica yet), so it does not extend
	// the lease: ErrNotReplicated is the answer that shows it arrived.
	if err := retryStoreErrors(t, func() error {
		if err := lease1.Refresh(ctx); !errors.Is(err, redisstore.ErrNotReplicated) {
			return err
		}
		return nil
	}); err != nil {
		t.Fatalf("the holder's renewal after the promotion: %v", err)
	}
	recovered := time.Since(promoted)
	// The dead master comes back, empty, and the cluster makes it the new master's replica.
	c.Masters[i].Restart()
	c.WaitHealthy(30 * time.Second)
	if err := retryStoreErrors(t, func() error { return lease1.Refresh(ctx) }); err != nil {
		t.Fatalf("renewal once the new master has a replica again: %v", err)
	}
	t.Logf("renewal reached the promoted replica %v after the promotion (cluster-node-timeout %v)", recovered, c.NodeTimeout)
	if recovered > 10*c.NodeTimeout {
		t.Errorf("renewals took %v after the promotion to reach the new master: the slot map was not reloaded", recovered)
	}
	if err := retryStoreErrors(t, func() error {
		lease2, err := second.TryLock(ctx, "acct:1")
		if err == nil {
			_ = lease2.Release(ctx)
			t.Fatalf("a second holder (fence %d) while the first (fence %d) holds the lock", lease2.Fence(), lease1.Fence())
		}
		return err
	}); !errors.Is(err, ErrBusy) {
		t.Fatalf("second TryLock after the promotion: %v, want busy", err)
	}
	if lease1.Context().Err() != nil {
		t.Fatalf("the first holder lost its lock in the failover: %v", context.Cause(lease1.Context()))
	}
	if err := retryStoreErrors(t, func() error { return lease1.Release(ctx) }); err != nil {
		t.Fatalf("release on the promoted replica: %v", err)
	}
	var lease2 *Lease
	if err := retryStoreErrors(t, func() (err error) { lease2, err = second.Lock(ctx, "acct:1"); return err }); err != nil {
		t.Fatalf("second Lock after the release: %v", err)
	}
	if lease2.Fence() <= lease1.Fence() {
		t.Errorf("fence %d after the promotion is not above %d before it", lease2.Fence(), lease1.Fence())
	}
	_ = lease2.Release(ctx)

	// All or nothing across masters: keys on the three masters.
	var keys []string
	seen := map[string]bool{}
	for n := 0; len(keys) < 3 && n < 1000; n++ {
		k := "multi:" + strconv.Itoa(n)
		if m := c.NodeOf("lock:" + k); !seen[m] {
			seen[m] = true
			keys = append(keys, k)
		}
	}
	all, err := first.LockAll(ctx, keys[0], keys[1])
	if err != nil {
		t.Fatalf("LockAll over two masters: %v", err)
	}
	if _, err := second.LockAll(ctx, keys[1], keys[2]); !errors.Is(err, ErrBusy) {
		t.Fatalf("LockAll with one key held: %v, want busy", err)
	}
	probe, err := second.TryLock(ctx, keys[2])
	if err != nil {
		t.Fatalf("the free key of a refused LockAll was left taken: %v", err)
	}
	_ = probe.Release(ctx)
	_ = all.Release(ctx)
}
