package flightlock

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock/lockstore/redisstore"
	"github.com/redis/go-redis/v9"
)

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
// a new fence for the next local holder. It used to cost two, a release and a fresh acquisition
// (issue 17: release -> next grant with 1,000 waiters took two round trips).
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
	if err := b.k.endGrant(ctx, h); err != nil {
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
