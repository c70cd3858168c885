package flightlock

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/redisstore"
	"github.com/redis/go-redis/v9"
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
	// the background (giveBack): the key is free once those give-backs have run.
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

// scriptCalls is a go-redis hook that counts the script calls (EVALSHA, and EVAL after a
// NOSCRIPT) a client sends, each pipeline command counted once.
type scriptCalls struct{ n atomic.Int64 }

func (h *scriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd)
		return next(ctx, cmd)
	}
}

func (h *scriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.count(cmd)
		}
		return next(ctx, cmds)
	}
}

func (h *scriptCalls) count(cmd redis.Cmder) {
	if name := cmd.Name(); name == "evalsha" || name == "eval" {
		h.n.Add(1)
	}
}

// lockResult is what a Lock call in a goroutine of a test returned. The goroutine reports
// through a channel, never through t, so that it may outlive a test that failed.
type lockResult struct {
	lease *Lease
	err   error
}

// lease returns r's lease, or fails the test with r's error.
func (r lockResult) must(t *testing.T) *Lease {
	t.Helper()
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.lease
}

// lockIn locks key with l in a goroutine of its own and reports to the returned channel.
func lockIn(l *Locker, key string) <-chan lockResult {
	got := make(chan lockResult, 1)
	go func() {
		lease, err := l.Lock(context.Background(), key)
		got <- lockResult{lease, err}
	}()
	return got
}

// holdWithTwoQueued takes key with l and queues two goroutines behind it, in order: w first,
// then x.
func holdWithTwoQueued(t *testing.T, l *Locker, key string) (held *Lease, w, x <-chan lockResult) {
	t.Helper()
	held, err := l.Lock(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	w = lockIn(l, key)
	waitFor(t, 5*time.Second, "the first waiter to queue", func() bool { return queuedOn(l, key) == 1 })
	x = lockIn(l, key)
	waitFor(t, 5*time.Second, "the second waiter to queue", func() bool { return queuedOn(l, key) == 2 })
	return held, w, x
}

// queueHolders makes n goroutines wait for key behind its holder and returns the channel on
// which each reports its Lock, in grant order.
func queueHolders(t *testing.T, l *Locker, key string, n int) <-chan lockResult {
	t.Helper()
	got := make(chan lockResult, n)
	for i := 0; i < n; i++ {
		go func() {
			lease, err := l.Lock(context.Background(), key)
			got <- lockResult{lease, err}
		}()
	}
	waitFor(t, 5*time.Second, "waiters to queue", func() bool { return queuedOn(l, key) == n })
	return got
}

// When a turn of the lock ends at the handoff bound with goroutines of this process still
// queued and nobody elsewhere refused, the lock stays with the process: one round trip gives it
// a new fence for the next local holder, not two (a release and a fresh acquisition).
func TestTurnEndKeepsTheLockWhenNobodyElseWaits(t *testing.T) {
	ms, mr, c := miniStore(t)
	ctx := context.Background()
	if err := ms.Preload(ctx); err != nil { // no NOSCRIPT round trips in the count
		t.Fatal(err)
	}
	calls := &scriptCalls{}
	c.AddHook(calls)
	l := mustLocker(t, ms, WithWait(10*time.Second), WithHandoff(2, time.Minute))
	first, err := l.Lock(ctx, "turn")
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 6
	got := queueHolders(t, l, "turn", waiters)
	fences := []int64{first.Fence()}
	cur := first
	for i := 0; i < waiters; i++ {
		if err := cur.Release(ctx); err != nil {
			t.Fatal(err)
		}
		cur = (<-got).must(t)
		prev := fences[len(fences)-1]
		if cur.Fence() <= prev {
			t.Fatalf("fence did not go up: %d after %d (fences %v)", cur.Fence(), prev, fences)
		}
		fences = append(fences, cur.Fence())
		// Holders 1, 4 and 7 start a turn: Redis must know their fence, so that a release by
		// a holder that dies later still lifts the counter above the handoffs' fences.
		want := GrantHandoff
		if len(fences)%3 == 1 {
			want = GrantPass
		}
		if g := cur.Grant(); g != want {
			t.Fatalf("holder %d: grant %v, want %v", len(fences), g, want)
		}
		if len(fences)%3 == 1 {
			v, err := mr.Get(l.cfg.prefix + "turn")
			if err != nil {
				t.Fatalf("holder %d: the lock is not in Redis: %v", len(fences), err)
			}
			if f := strings.Fields(v); len(f) < 3 || f[1] != strconv.FormatInt(cur.Fence(), 10) {
				t.Fatalf("holder %d has fence %d, Redis has %q", len(fences), cur.Fence(), v)
			}
		}
	}
	if err := cur.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Handoff bound 2, seven holders: 1 acquires; 2 and 3 by handoff; 3's release ends the turn
	// with 4-7 queued: one round trip keeps the lock for 4; 5 and 6 by handoff; 6's release
	// keeps it for 7; 7 releases with nobody queued. 1 + 2 + 1 script calls.
	if n := calls.n.Load(); n != 4 {
		t.Fatalf("%d script calls for 7 holders with handoff bound 2 and nobody elsewhere, want 4 (fences %v)", n, fences)
	}
	if mr.Exists(l.cfg.prefix + "turn") {
		t.Fatal("the last release left the lock in Redis")
	}
	if n := l.gateLen(); n != 0 {
		t.Fatalf("gate keeps %d entries", n)
	}
}

// A turn that ends while a waiter of another process was refused (the lock is marked) gives
// the lock up, so that the other process gets its turn: keeping it in process must never starve
// other processes.
func TestTurnEndYieldsToAnotherProcess(t *testing.T) {
	ms, mr, _ := miniStore(t)
	// The other process has a client and a store of its own: with one store, both processes'
	// watches would hear the same notification.
	oc := redis.NewClient(&redis.Options{Addr: mr.Addr(), Protocol: 2, DisableIdentity: true, ContextTimeoutEnabled: true})
	otherStore := redisstore.New(oc, redisstore.WithWatchLinger(0))
	t.Cleanup(func() { _ = otherStore.Close(); _ = oc.Close() })
	// A local owner that follows a release which notified others lets them go first: it
	// waits for a notification or its first retry delay, here a second, so that the other
	// process, woken at once, is not raced.
	here := mustLocker(t, ms, WithWait(10*time.Second), WithHandoff(2, time.Minute), WithRetry(LinearRetry(time.Second)))
	there := mustLocker(t, otherStore, WithWait(10*time.Second))
	ctx := context.Background()
	first, err := here.Lock(ctx, "yield")
	if err != nil {
		t.Fatal(err)
	}
	got := queueHolders(t, here, "yield", 4)
	other := lockIn(there, "yield")
	// The other process was refused once the lock carries the waiters mark, and listens for
	// the release once it subscribed (it subscribes after its refusal; a release before that
	// would notify nobody, and the next local owner would not yield).
	c := ms.Client().(*redis.Client)
	waitFor(t, 5*time.Second, "the other process to be refused and to listen", func() bool {
		v, _ := c.Get(ctx, "lock:yield").Result()
		subs, _ := c.PubSubNumSub(ctx, redisstore.DefaultChannelPrefix+"lock:yield").Result()
		return strings.HasSuffix(v, " ~") && subs[redisstore.DefaultChannelPrefix+"lock:yield"] > 0
	})
	cur := first
	for i := 0; i < 2; i++ { // holders 2 and 3 by handoff
		if err := cur.Release(ctx); err != nil {
			t.Fatal(err)
		}
		cur = (<-got).must(t)
	}
	last := cur.Fence()
	if err := cur.Release(ctx); err != nil { // the turn ends
		t.Fatal(err)
	}
	var theirs *Lease
	select {
	case r := <-other:
		theirs = r.must(t)
	case r := <-got:
		t.Fatalf("the process kept the lock (%+v) although another process waited", r)
	case <-time.After(5 * time.Second):
		t.Fatal("the other process did not get the lock within 5s of the turn's end")
	}
	if theirs.Fence() <= last {
		t.Fatalf("the other process's fence %d is not above the turn's last %d", theirs.Fence(), last)
	}
	if err := theirs.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ { // the remaining local holders
		l := (<-got).must(t)
		if l.Fence() <= theirs.Fence() {
			t.Fatalf("local fence %d after the other process's %d", l.Fence(), theirs.Fence())
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// The pass asks Redis for the TTL that the hold counts its life with, also when the grant is
// ended by a Locker derived with another TTL (a waiter of it that gives the slot back as its
// budget ends, locker.go): otherwise the lease would count on more life than Redis gives the
// key. Found by review: with a pass at the derived Locker's 100 ms, Redis kept the key 2.1 s
// and the lease counted on 3 s.
func TestPassCountsTheHoldsOwnTTL(t *testing.T) {
	ms, mr, _ := miniStore(t)
	ctx := context.Background()
	a := mustLocker(t, ms, WithTTL(3*time.Second), WithWait(10*time.Second), WithHandoff(512, time.Millisecond))
	b, err := a.With(WithTTL(100 * time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	first, err := a.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	got := queueHolders(t, a, "k", 1)
	time.Sleep(5 * time.Millisecond)       // past the handoff window: the release ends the turn
	mr.FastForward(900 * time.Millisecond) // Redis's view: 2.1 s of the lock's 3 s left
	// End the grant as a waiter of b does when it is handed the slot as its budget ends.
	h := first.h
	if last, _, err := h.release(first); err != nil || !last {
		t.Fatalf("the first lease's release: last %v, err %v; want its grant's last", last, err)
	}
	if err := b.k.endGrantBy(ctx, h); err != nil {
		t.Fatal(err)
	}
	next := (<-got).must(t)
	defer next.Release(ctx)
	if next.Grant() != GrantPass {
		t.Fatalf("grant %v, want pass", next.Grant())
	}
	h.mu.Lock()
	local := h.k.untilInstant(h.validUntil)
	h.mu.Unlock()
	if kept := mr.TTL(next.Key()); local > kept {
		t.Fatalf("the lease counts on %v, Redis expires the key in %v", local, kept)
	}
}

// A released lease gives out no owner token: a handoff or a pass keeps the token for the next
// grant of another goroutine, which the token would let anyone re-enter.
func TestReleasedLeaseGivesNoOwner(t *testing.T) {
	ms, _, _ := miniStore(t)
	l := mustLocker(t, ms)
	ctx := context.Background()
	lease, err := l.Lock(ctx, "o")
	if err != nil {
		t.Fatal(err)
	}
	if lease.Owner() == "" {
		t.Fatal("a live lease has no owner token")
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if o := lease.Owner(); o != "" {
		t.Fatalf("a released lease gave out its owner token %q", o)
	}
}

// goroutineBlockedIn reports whether some goroutine's stack holds fn and waits for a mutex.
func goroutineBlockedIn(fn string) bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, fn) && strings.Contains(g, "Mutex).Lock") {
			return true
		}
	}
	return false
}

// A release whose handoff checked the hold (handable) and then waits for the gate's mutex
// while the watchdog loses the hold and, at its expiry, finds the grant already ended (live 0,
// abandonLocked does nothing and schedules nothing more) hands a lost hold to the next waiter
// (nextGrant sets live to 1 on it). Nothing is left to end that grant if its lease is never
// released: the waiters behind it stay queued while the key is free in Redis.
func TestHandoffOfAHoldLostMeanwhileReleasesIt(t *testing.T) {
	s, mr, _ := miniStore(t)
	ctx := context.Background()
	clk := newManualClock()
	const ttl = 3 * time.Second
	l := mustLocker(t, s, WithTTL(ttl), WithWait(time.Minute), WithHandoff(8, time.Hour), withClock(clk))

	a, w, x := holdWithTwoQueued(t, l, "k")

	// The releasing goroutine is held up between its handable check and the gate's mutex.
	l.k.gate.mu.Lock()
	released := make(chan error, 1)
	go func() { released <- a.Release(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for !goroutineBlockedIn("(*gate).handoff") {
		if time.Now().After(deadline) {
			l.k.gate.mu.Unlock()
			t.Fatal("the release did not reach the handoff")
		}
		time.Sleep(time.Millisecond)
	}
	// Meanwhile the lock goes away in Redis: the next renewal is refused, the hold is lost, and
	// at its expiry the watchdog finds no live lease.
	mr.Del(l.cfg.prefix + "k")
	clk.Advance(ttl + time.Millisecond)
	l.k.gate.mu.Unlock()
	if err := <-released; err != nil && !errors.Is(err, ErrNotHeld) {
		t.Fatalf("release: %v", err) // ErrNotHeld: the lock vanished in Redis
	}

	var wl *Lease
	select {
	case r := <-w:
		wl = r.must(t)
	case <-time.After(5 * time.Second):
		t.Fatal("the first waiter was not granted")
	}
	defer func() { _ = wl.Release(ctx) }()
	if cause := context.Cause(wl.Context()); !errors.Is(cause, ErrLost) {
		t.Logf("the first waiter got a live lease (grant %v): fine", wl.Grant())
		return
	}
	t.Logf("the first waiter got a lease lost at birth (grant %v); it is never released", wl.Grant())

	// Its holder was told to stop but never releases (a forgotten Release): once the lock may
	// have expired, the grant must end and the next waiter get the key, free in Redis.
	clk.Advance(2 * ttl)
	select {
	case r := <-x:
		xl := r.must(t)
		_ = xl.Release(ctx)
	case <-time.After(2 * time.Second):
		t.Errorf("the second waiter is stranded: the key is free in Redis (exists %v), the lost grant never ends (live %d, abandoned %v, in heap %v)",
			mr.Exists(l.cfg.prefix+"k"), liveOf(wl.h), abandonedOf(wl.h), wl.h.slot != 0)
		_ = wl.Release(ctx)
		select {
		case r := <-x:
			if r.lease != nil {
				_ = r.lease.Release(ctx)
			}
		case <-time.After(5 * time.Second):
		}
	}
}

func liveOf(h *hold) int32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.live
}

func abandonedOf(h *hold) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.has(holdAbandoned)
}

// limitedStore is a store whose fences leave room for few handoffs (Capabilities.MaxHandoffs).
type limitedStore struct {
	*memStore
	max int
}

func (s limitedStore) Capabilities() lockstore.Capabilities {
	return lockstore.Capabilities{MaxHandoffs: s.max}
}

// A handoff bound above what the store's fences allow is refused by New and With: a holder that
// died after that many handoffs could see the next grant repeat one of its fences.
func TestHandoffBoundMustFitTheStore(t *testing.T) {
	store := limitedStore{memStore: newMemStore(), max: 10}
	if _, err := New(store, WithHandoff(11, time.Second)); !errors.Is(err, ErrConfig) {
		t.Fatalf("New with 11 handoffs on a store that allows 10: err %v, want ErrConfig", err)
	}
	l, err := New(store, WithHandoff(10, time.Second))
	if err != nil {
		t.Fatalf("New with the store's own bound: %v", err)
	}
	if _, err := l.With(WithHandoff(64, time.Second)); !errors.Is(err, ErrConfig) {
		t.Fatalf("With raising the bound past the store's: err %v, want ErrConfig", err)
	}
	if _, err := New(store); !errors.Is(err, ErrConfig) {
		t.Fatalf("New with the default bound (%d) on a store that allows 10: err %v, want ErrConfig", DefaultHandoff, err)
	}
	if _, err := New(newMemStore(), WithHandoff(1<<30, time.Second)); err != nil {
		t.Fatalf("a store without a limit takes any bound: %v", err)
	}
}

// Fewer handoffs in a row than the TTL has microseconds: the next grant after a holder that
// died comes a TTL later at a fence of at least the server time in microseconds, which must
// stay above the fences the dead holder handed out (docs/guarantees.md, Fences). A TTL of a
// millisecond cannot have the default 1,024.
func TestHandoffBoundStaysBelowTheTTLInMicroseconds(t *testing.T) {
	for _, tc := range []struct {
		ttl  time.Duration
		want int
	}{
		{time.Millisecond, 999},
		{500 * time.Microsecond, 499},
		{time.Microsecond, 0},
		{10 * time.Second, DefaultHandoff},
	} {
		l, err := New(newMemStore(), WithTTL(tc.ttl))
		if err != nil {
			t.Fatal(err)
		}
		if l.k.handoff != tc.want {
			t.Errorf("TTL %v: %d handoffs in a row, want %d", tc.ttl, l.k.handoff, tc.want)
		}
	}
}
