package flightlock

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/redisstore"
)

// runPermitSections has goroutines on each Locker (each a process: a gate of its own, built
// WithPermits) take a permit of "export" again and again while the others do, and reports the most holders seen
// inside at once, counting only holders whose lease was still live when they came in and left.
func runPermitSections(t *testing.T, lockers []*Locker, goroutines, sections int) (most int64, done int64) {
	t.Helper()
	var inside, peak, ran atomic.Int64
	var wg sync.WaitGroup
	for _, l := range lockers {
		for range goroutines {
			wg.Go(func() {
				for range sections {
					lease, err := l.Lock(context.Background(), "export")
					if err != nil {
						t.Errorf("Lock: %v", err)
						return
					}
					n := inside.Add(1)
					if lease.Context().Err() == nil {
						for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
						}
					}
					time.Sleep(2 * time.Millisecond)
					inside.Add(-1)
					ran.Add(1)
					if err := lease.Release(context.Background()); err != nil && !errors.Is(err, ErrNotHeld) {
						t.Errorf("Release: %v", err)
					}
				}
			})
		}
	}
	wg.Wait()
	return peak.Load(), ran.Load()
}

// Three processes share 3 permits of a key, 6 goroutines each: never more than 3 holders at
// once, all 3 used, on miniredis, a redis-server and a three-node Redis Cluster.
func TestPermitsNeverExceedTheirCount(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) lockstore.Store
	}{
		{"miniredis", func(t *testing.T) lockstore.Store { s, _, _ := miniStore(t); return s }},
		{"redis-server", func(t *testing.T) lockstore.Store { s, _, _ := realStore(t); return s }},
		{"redis-cluster", clusterStore},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const permits, goroutines, sections = 3, 6, 15
			store := tc.store(t)
			var lockers []*Locker
			for range 3 {
				lockers = append(lockers, mustLocker(t, store, WithWait(30*time.Second), WithPermits(permits)))
			}
			most, ran := runPermitSections(t, lockers, goroutines, sections)
			if most > permits || most < 2 || ran != 3*goroutines*sections {
				t.Fatalf("%d holders at once at most (want 2..%d); %d sections ran, want %d", most, permits, ran, 3*goroutines*sections)
			}
			for _, l := range lockers {
				if n := l.gateLen(); n != 0 {
					t.Errorf("gate keeps %d entries after every permit was released", n)
				}
			}
		})
	}
}

// The same with short TTLs and one process whose replies are held back by a proxy now and then:
// a permit whose holder's renewal is late is lost (its context ends) before another process can
// take it, so the live holders never exceed the count.
func TestPermitsNeverExceedTheirCountWithStalledReplies(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	lockerOn := func(addr string) *Locker {
		c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true, ContextTimeoutEnabled: true, MaxRetries: -1})
		s := redisstore.New(c, redisstore.WithWatchLinger(0))
		t.Cleanup(func() { _ = s.Close(); _ = c.Close() })
		return mustLocker(t, s, WithTTL(300*time.Millisecond), WithWait(30*time.Second), WithPermits(2))
	}
	lockers := []*Locker{lockerOn(srv.Addr), lockerOn(srv.Addr), lockerOn(proxy.Addr)}
	stop := make(chan struct{})
	var stalls sync.WaitGroup
	stalls.Go(func() {
		for {
			select {
			case <-stop:
				proxy.SetDelay(0)
				return
			case <-time.After(40 * time.Millisecond):
				proxy.SetDelay(60 * time.Millisecond)
				time.Sleep(30 * time.Millisecond)
				proxy.SetDelay(0)
			}
		}
	})
	const permits = 2
	most, ran := runPermitSections(t, lockers, 4, 10)
	close(stop)
	stalls.Wait()
	if most > permits || ran != 3*4*10 {
		t.Fatalf("%d live holders at once at most, want at most %d; %d sections ran", most, permits, ran)
	}
}

// A context that holds a permit takes the same permit again, not a second one: with 2 permits,
// a holder that re-enters leaves the other permit free for another owner.
func TestPermitHolderReentersItsPermit(t *testing.T) {
	s, _, _ := miniStore(t)
	l := mustLocker(t, s, WithMode(Reject), WithPermits(2))
	ctx := context.Background()
	a, err := l.Lock(ctx, "export")
	if err != nil {
		t.Fatal(err)
	}
	again, err := l.Lock(a.Context(), "export")
	if err != nil || again.Key() != a.Key() || again.Grant() != GrantReentry {
		t.Fatalf("re-entry: %v, key %q grant %v; want the same permit %q re-entered", err, again.Key(), again.Grant(), a.Key())
	}
	b, err := l.Lock(ctx, "export")
	if err != nil || b.Key() == a.Key() {
		t.Fatalf("another owner: %v (key %q), want the other permit", err, b.Key())
	}
	_ = again.Release(ctx)
	_ = a.Release(ctx)
	_ = b.Release(ctx)
}

// With every permit taken a taker in Reject mode is told busy at once, with the time the
// holders have left; one permit released, the next taker gets it.
func TestAllPermitsTakenIsBusy(t *testing.T) {
	s, _, _ := miniStore(t)
	holder, taker := mustLocker(t, s, WithPermits(3)), mustLocker(t, s, WithMode(Reject), WithPermits(3))
	ctx := context.Background()
	var held []*Lease
	for range 3 {
		x, err := holder.Lock(ctx, "export")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, x)
	}
	_, err := taker.Lock(ctx, "export")
	if d, ok := RetryAfter(err); !errors.Is(err, ErrBusy) || !ok || d <= 0 {
		t.Fatalf("a fourth taker of 3 permits: %v (retry after %v, %v), want ErrBusy with the holders' time left", err, d, ok)
	}
	if err := held[1].Release(ctx); err != nil {
		t.Fatal(err)
	}
	x, err := taker.Lock(ctx, "export")
	if err != nil || x.Key() != held[1].Key() {
		t.Fatalf("after one release: %v (key %q), want the released permit %q", err, x.Key(), held[1].Key())
	}
	for _, l := range append(held, x) {
		_ = l.Release(ctx)
	}
}

// A holder that dies (no renewal, no release) gives its permit back once its TTL has run out.
func TestDeadHoldersPermitComesBackAfterItsTTL(t *testing.T) {
	s, mr, _ := miniStore(t)
	const ttl = 2 * time.Second
	dead, live := mustLocker(t, s, WithTTL(ttl), WithPermits(2)), mustLocker(t, s, WithMode(Reject), WithPermits(2))
	ctx := context.Background()
	x, err := dead.Lock(ctx, "export")
	if err != nil {
		t.Fatal(err)
	}
	other, err := live.Lock(ctx, "export")
	if err != nil {
		t.Fatal(err)
	}
	x.h.stop() // the process is gone: nothing renews the permit
	if _, err := live.Lock(ctx, "export"); !errors.Is(err, ErrBusy) {
		t.Fatalf("while the dead holder's TTL runs: %v, want ErrBusy", err)
	}
	mr.FastForward(ttl + time.Millisecond)
	y, err := live.Lock(ctx, "export")
	if err != nil || y.Key() != x.Key() || y.Fence() <= x.Fence() {
		t.Fatalf("after the TTL: %v (key %q fence %d), want permit %q with a fence above %d", err, y.Key(), y.Fence(), x.Key(), x.Fence())
	}
	_ = y.Release(ctx)
	_ = other.Release(ctx)
}

// A permit released in this process goes to the goroutine of this process queued for it without
// a round trip (a handoff), as a lock does.
func TestReleasedPermitIsHandedToALocalWaiter(t *testing.T) {
	s, _, _ := miniStore(t)
	// A window of an hour: the default 20 ms, counted from the permit's acquisition, can pass
	// on a loaded machine before the taker has queued, and the permit then goes by the store.
	// A retry delay of a minute keeps the taker queued on the local permit until the release
	// (it leaves the queue to look again at each delay's end).
	l := mustLocker(t, s, WithWait(10*time.Second), WithPermits(2), WithHandoff(DefaultHandoff, time.Hour),
		WithRetry(LinearRetry(time.Minute)))
	ctx := context.Background()
	x, err := l.Lock(ctx, "export")
	if err != nil {
		t.Fatal(err)
	}
	x2, err := l.Lock(ctx, "export")
	if err != nil {
		t.Fatal(err)
	}
	defer x2.Release(ctx)
	got := make(chan *Lease, 1)
	go func() {
		y, err := l.Lock(ctx, "export")
		if err != nil {
			t.Error(err)
		}
		got <- y
	}()
	waitFor(t, 5*time.Second, "the taker to queue on a permit", func() bool {
		return queuedOn(l, x.Key()[len("lock:"):])+queuedOn(l, x2.Key()[len("lock:"):]) == 1
	})
	if queuedOn(l, x.Key()[len("lock:"):]) == 0 { // it queued on the other: swap the roles
		x, x2 = x2, x
	}
	if err := x.Release(ctx); err != nil {
		t.Fatal(err)
	}
	y := <-got
	if y == nil || y.Grant() != GrantHandoff {
		t.Fatalf("the queued taker's grant: %v, want a handoff", y.Grant())
	}
	_ = y.Release(ctx)
}

// Bad counts and keys are refused before anything is sent.
func TestBadPermitCountsAreRefused(t *testing.T) {
	s, _, _ := miniStore(t)
	for _, n := range []int{-1, MaxPermits + 1} {
		if _, err := New(s, WithPermits(n)); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "WithPermits") {
			t.Errorf("%d permits: %v, want ErrConfig naming WithPermits", n, err)
		}
	}
	if _, err := mustLocker(t, s, WithPermits(2)).Lock(context.Background(), ""); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("empty key: %v, want ErrInvalidKey", err)
	}
}

// A key's lock is permit 1 of its semaphore: processes that lock a key with Permits 1 (a lock)
// and with Permits n (a rolling deploy that changes the count, or two rules of one key) never
// admit more than n holders between them.
func TestLockAndPermitOneAreOneKey(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	lock := mustLocker(t, s, WithMode(Reject))
	sem := mustLocker(t, s, WithMode(Reject), WithPermits(3))
	held, err := lock.Lock(ctx, "export")
	if err != nil {
		t.Fatal(err)
	}
	var permits []*Lease
	for {
		p, err := sem.Lock(NewOwner(ctx), "export")
		if errors.Is(err, ErrBusy) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		permits = append(permits, p)
		if len(permits) > 3 {
			break
		}
	}
	if len(permits) != 2 {
		t.Fatalf("beside a lock of the key, a semaphore of 3 admitted %d holders, want 2 (3 in all)", len(permits))
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	third, err := sem.Lock(NewOwner(ctx), "export")
	if err != nil {
		t.Fatalf("the lock's release freed permit 1: %v", err)
	}
	if _, err := lock.Lock(NewOwner(ctx), "export"); !errors.Is(err, ErrBusy) {
		t.Fatalf("a lock of a key whose 3 permits are held: %v, want ErrBusy", err)
	}
	for _, p := range append(permits, third) {
		_ = p.Release(ctx)
	}
}

// No key's lock takes a permit of another key, whatever the key contains: "#" is doubled in
// store keys, and a permit's key ends in a single "#" and its number.
func TestPlainKeyNeverTakesAnotherKeysPermit(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	lock := mustLocker(t, s, WithMode(Reject))
	sem := mustLocker(t, s, WithMode(Reject), WithPermits(2))
	for _, k := range []string{"job:5#2", "job:5#1", "job:5##2"} {
		l, err := lock.Lock(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(ctx)
	}
	// A semaphore whose key ends in "#" is no other key either.
	odd, err := sem.Lock(ctx, "job:5#")
	if err != nil {
		t.Fatal(err)
	}
	defer odd.Release(ctx)
	for i := range 2 {
		p, err := sem.Lock(NewOwner(ctx), "job:5")
		if err != nil {
			t.Fatalf("permit %d of job:5 beside locks of look-alike keys: %v", i+1, err)
		}
		defer p.Release(ctx)
	}
}

// How a semaphore taker waits: each test states the behaviour a plain lock has and a permit
// keeps.

// A look at the permits is bounded by the wait budget, as a plain lock's first attempt is: a
// store that answers slowly (here: one permit's acquisition takes 3s) must not hold a taker
// with a 100ms wait and no deadline of its own for seconds; unbounded, n permits on a hung
// store would hold the caller up to n TTLs.
func TestPermitLookIsBoundedByTheWaitBudget(t *testing.T) {
	const budget, slow = 100 * time.Millisecond, 3 * time.Second
	ctx := context.Background()

	// The plain lock, for comparison: its attempt is cut at the wait budget.
	s0, _, _ := miniStore(t)
	f0 := &faultStore{Store: s0, slowBy: slow}
	k0 := "lock:plain"
	f0.slowKey.Store(&k0)
	start := time.Now()
	if lease, err := mustLocker(t, f0, WithWait(budget)).Lock(ctx, "plain"); err == nil {
		_ = lease.Release(ctx)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("premise: the plain Lock took %v with a %v wait", took, budget)
	}

	s, _, _ := miniStore(t)
	f := &faultStore{Store: s, slowBy: slow}
	k := PermitKey("lock:", "export", 1)
	f.slowKey.Store(&k)
	// Permit 2 is another process's.
	if got, err := s.Acquire(ctx, lockstore.Request{Key: PermitKey("lock:", "export", 2), Owner: "someone-else", TTL: time.Minute}); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	l := mustLocker(t, f, WithWait(budget), WithPermits(2))
	start = time.Now()
	lease, err := l.Lock(ctx, "export")
	took := time.Since(start)
	if err == nil {
		defer lease.Release(ctx)
	}
	if took > time.Second {
		t.Errorf("Lock with a %v wait returned after %v (err %v, got a lease: %v): the look at the permits is not "+
			"bounded by the wait budget", budget, took.Round(time.Millisecond), err, lease != nil)
	}
}

// A capped retry strategy (LimitRetry, the middleware's Retry.Attempts) counts the looks at
// the permits as a plain lock counts its attempts: LimitRetry(r, 1) is a single look, busy at
// once; LimitRetry(r, 2) two. A look is one store request, whatever the count.
func TestCappedAttemptsBoundPermitLooks(t *testing.T) {
	ctx := context.Background()
	for _, attempts := range []int{1, 2} {
		m := newMemStore() // no release notifications: the retry delays alone pace the looks
		for i := 1; i <= 2; i++ {
			if got, err := m.Acquire(ctx, lockstore.Request{Key: PermitKey("lock:", "export", i), Owner: "someone-else", TTL: time.Minute}); err != nil || !got.Acquired {
				t.Fatal(got, err)
			}
		}
		f := &faultStore{Store: m}
		l := mustLocker(t, f, WithWait(5*time.Second), WithPermits(2),
			WithRetry(LimitRetry(LinearRetry(20*time.Millisecond), attempts)))
		_, err := l.Lock(ctx, "export")
		if !errors.Is(err, ErrBusy) {
			t.Fatalf("Attempts %d: %v, want ErrBusy", attempts, err)
		}
		if got, want := f.acquires.Load(), int64(attempts); got != want {
			t.Errorf("Attempts %d: %d store requests for 2 permits, want %d (one per look); a plain lock makes %d attempts",
				attempts, got, want, attempts)
		}
	}
}

// An upstream owner handed over for permit 1 that holds nothing (its request released it
// already) grants nothing, and the taker locks as a new owner, as for a plain lock: it takes
// any free permit (here permit 2), rather than waiting for permit 1 alone.
func TestHandedOverPermitThatHoldsNothingTakesAFreePermit(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	if got, err := s.Acquire(ctx, lockstore.Request{Key: PermitKey("lock:", "export", 1), Owner: "someone-else", TTL: time.Minute}); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	l := mustLocker(t, s, WithWait(300*time.Millisecond), WithPermits(2))
	hctx := withOwner(ctx, PermitKey("lock:", "export", 1), newOwnerToken()) // holds nothing
	lease, err := l.Lock(hctx, "export")
	if err != nil {
		t.Fatalf("Lock with a stale handed-over owner of permit 1: %v; permit 2 was free", err)
	}
	_ = lease.Release(ctx)
}

// A taker that waits while one permit is held in its process and one elsewhere hears the
// release of the one held elsewhere at once, not at the end of its retry delay (here 3s).
func TestParkedPermitTakerHearsARemoteRelease(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	l := mustLocker(t, s, WithWait(10*time.Second), WithPermits(2), WithRetry(LinearRetry(3*time.Second)))
	other := mustLocker(t, s, WithPermits(2)) // another process
	local, err := l.Lock(ctx, "export")
	if err != nil {
		t.Fatal(err)
	}
	defer local.Release(ctx)
	remote, err := other.Lock(ctx, "export")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan lockResult, 1)
	go func() {
		lease, err := l.Lock(ctx, "export")
		got <- lockResult{lease, err}
	}()
	time.Sleep(100 * time.Millisecond) // the taker has looked and waits
	select {
	case r := <-got:
		t.Fatalf("the taker did not wait with both permits held: %v", r.err)
	default:
	}
	released := time.Now()
	if err := remote.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	took := time.Since(released)
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.lease.Release(ctx)
	if took > time.Second {
		t.Errorf("the taker got the permit released elsewhere %v after its release (key %q): it slept to the end "+
			"of its turn on the local permit", took.Round(time.Millisecond), r.lease.Key())
	}
}

// watchCounter is a store that counts Watch calls; it does not share watches
// (Capabilities.SharedWatch), as the etcd store does not.
type watchCounter struct {
	lockstore.Store
	watches atomic.Int32
}

func (w *watchCounter) Capabilities() lockstore.Capabilities {
	caps := w.Store.Capabilities()
	caps.SharedWatch = false
	return caps
}

func (w *watchCounter) Watch(ctx context.Context, key string) (*lockstore.Watch, error) {
	w.watches.Add(1)
	return w.Store.Watch(ctx, key)
}

// On a store whose watches are not shared, a waiting taker opens no watch per permit (a watch
// and a goroutine each, for every waiter): it looks again at the retry delays, and gets a
// permit once one is released.
func TestPermitTakersWatchOnlyWhereWatchesAreShared(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	other := mustLocker(t, s, WithPermits(2)) // another process holds both permits
	var held []*Lease
	for range 2 {
		x, err := other.Lock(ctx, "export")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, x)
	}
	counted := &watchCounter{Store: s}
	l := mustLocker(t, counted, WithWait(10*time.Second), WithPermits(2), WithRetry(LinearRetry(10*time.Millisecond)))
	got := make(chan lockResult, 1)
	go func() {
		lease, err := l.Lock(ctx, "export")
		got <- lockResult{lease, err}
	}()
	time.Sleep(50 * time.Millisecond)
	_ = held[0].Release(ctx)
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	_ = r.lease.Release(ctx)
	_ = held[1].Release(ctx)
	if n := counted.watches.Load(); n != 0 {
		t.Errorf("%d watches opened on a store that does not share them, want 0", n)
	}
}

// A taker that waits while one permit is held in its process and one elsewhere queues on the
// local one, and gets it by handoff, without a round trip, when its holder releases it: a hot
// semaphore keeps its permits in their processes within the handoff bounds, as a lock does.
func TestPermitTakerQueuesOnALocalPermitWhileAnotherIsHeldElsewhere(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	// A handoff window of an hour: the default 20 ms can pass on a loaded machine first.
	l := mustLocker(t, s, WithWait(10*time.Second), WithPermits(2), WithHandoff(DefaultHandoff, time.Hour))
	other := mustLocker(t, s, WithPermits(2)) // another process
	remote, err := other.Lock(ctx, "export")
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Release(ctx)
	local, err := l.Lock(ctx, "export")
	if err != nil {
		t.Fatal(err)
	}
	// The taker's turn on the local permit lasts remoteTurn, then it looks at the store again:
	// a release that a loaded machine delays past the turn goes by the store, and the taker
	// takes it from there. Each round below releases while the taker is queued as far as the
	// test can tell; one round of three must see the handoff.
	for round := 1; ; round++ {
		got := make(chan lockResult, 1)
		go func() {
			lease, err := l.Lock(ctx, "export")
			got <- lockResult{lease, err}
		}()
		waitFor(t, 5*time.Second, "the taker to queue on the local permit", func() bool {
			return queuedOn(l, local.Key()[len("lock:"):]) == 1
		})
		if err := local.Release(ctx); err != nil {
			t.Fatal(err)
		}
		r := <-got
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.lease.Key() != local.Key() {
			t.Fatalf("the taker got %q, want the local permit %q", r.lease.Key(), local.Key())
		}
		if r.lease.Grant() == GrantHandoff {
			_ = r.lease.Release(ctx)
			return
		}
		if round == 3 {
			t.Fatalf("the taker got the local permit by %v in 3 rounds, want it handed over", r.lease.Grant())
		}
		t.Logf("round %d: the release came after the taker's turn (grant %v); again", round, r.lease.Grant())
		local = r.lease // the next taker queues on it
	}
}

// slowPlainStore holds a plain (one-key) acquisition of key until release is closed.
type slowPlainStore struct {
	lockstore.Store
	key     string
	asked   chan struct{} // closed when the plain acquisition arrived
	release chan struct{}
}

func (s *slowPlainStore) Acquire(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	if req.Permits == nil && req.Key == s.key {
		close(s.asked)
		<-s.release
	}
	return s.Store.Acquire(ctx, req)
}

// A look never asks for a permit whose gate slot a goroutine of the process owns while it asks
// the store for that key alone (the slot has one owner): the look is busy, nothing of that key
// is taken, and the goroutine that owns the slot gets the lock.
func TestLookSkipsAPermitWhoseSlotIsOwnedHere(t *testing.T) {
	ctx := context.Background()
	m := newMemStore()
	if got, err := m.Acquire(ctx, lockstore.Request{Key: PermitKey("lock:", "export", 2), Owner: "someone-else", TTL: time.Minute}); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	s := &slowPlainStore{Store: m, key: "lock:export", asked: make(chan struct{}), release: make(chan struct{})}
	sem := mustLocker(t, s, WithPermits(2))
	plain, err := sem.With(WithPermits(1), WithWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	plainDone := make(chan error, 1)
	go func() {
		lease, err := plain.Lock(ctx, "export")
		if err == nil {
			err = lease.Release(ctx)
		}
		plainDone <- err
	}()
	<-s.asked
	if lease, err := sem.TryLock(ctx, "export"); !errors.Is(err, ErrBusy) {
		t.Fatalf("TryLock of a semaphore whose free permit's slot is owned here: %v, %v; want ErrBusy", lease, err)
	}
	// Nothing was taken, so the goroutine that owns the slot takes the lock.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		m.mu.Lock()
		_, held := m.locks["lock:export"]
		m.mu.Unlock()
		if !held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the look took the permit whose slot was owned here")
		}
	}
	close(s.release)
	if err := <-plainDone; err != nil {
		t.Fatalf("the slot's owner could not take the lock after the look's grant went back: %v", err)
	}
}

// heldLooks holds each permit look at the store until it is let go (one receive per look).
type heldLooks struct {
	lockstore.Store
	arrived chan lockstore.Request // each permit look, as it arrives
	letGo   chan struct{}
}

func newHeldLooks(s lockstore.Store) *heldLooks {
	return &heldLooks{Store: s, arrived: make(chan lockstore.Request, 16), letGo: make(chan struct{})}
}

func (h *heldLooks) Acquire(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	if req.Permits != nil {
		h.arrived <- req
		<-h.letGo
	}
	return h.Store.Acquire(ctx, req)
}

// lookWaiters is how many takers of this process wait for the look at key's permits.
func (l *Locker) lookWaiters(key string) int {
	l.k.gate.mu.Lock()
	defer l.k.gate.mu.Unlock()
	if f := l.k.gate.looks[PermitKey(l.cfg.prefix, key, 1)]; f != nil {
		return len(f.waiters)
	}
	return 0
}

// The takers of a process that come while a look at a key's permits is on its way ask the store
// nothing: the next look asks for a permit for each of them, in one request, and hands them out.
// A taker that gives up meanwhile is left out, and a permit granted for one that left after the
// look was sent goes back.
func TestTakersOfAProcessShareALookAtThePermits(t *testing.T) {
	ctx := context.Background()
	m := newMemStore()
	h := newHeldLooks(wantStore{m})
	l := mustLocker(t, h, WithPermits(8), WithWait(10*time.Second))
	type got struct {
		lease *Lease
		err   error
	}
	results := make(chan got, 8)
	take := func(ctx context.Context) {
		lease, err := l.Lock(ctx, "export")
		results <- got{lease, err}
	}
	go take(ctx)
	first := <-h.arrived // the first look is on its way, for one permit
	if first.Want != 1 {
		t.Fatalf("the first look asked for %d permits, want 1", first.Want)
	}
	leaving, leave := context.WithCancel(ctx)
	go take(leaving) // gives up before the first look's outcome
	waitFor(t, 5*time.Second, "the first waiter", func() bool { return l.lookWaiters("export") == 1 })
	for range 3 {
		go take(ctx)
	}
	waitFor(t, 5*time.Second, "four waiters", func() bool { return l.lookWaiters("export") == 4 })
	counted, cancelCounted := context.WithCancel(ctx)
	go take(counted) // counted in the next look, then gives up before its outcome
	waitFor(t, 5*time.Second, "five waiters", func() bool { return l.lookWaiters("export") == 5 })
	leave()
	if r := <-results; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("a taker that gave up while it waited for a look: %v, %v", r.lease, r.err)
	}
	h.letGo <- struct{}{}
	var leases []*Lease
	if r := <-results; r.err != nil {
		t.Fatal(r.err)
	} else {
		leases = append(leases, r.lease)
	}
	next := <-h.arrived // led by the first of the four left, for all of them
	if next.Want != 4 {
		t.Fatalf("the next look asked for %d permits, want 4", next.Want)
	}
	cancelCounted()
	if r := <-results; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("a taker that gave up while the look counted for it was on its way: %v, %v", r.lease, r.err)
	}
	h.letGo <- struct{}{}
	for range 3 {
		r := <-results
		if r.err != nil {
			t.Fatal(r.err)
		}
		leases = append(leases, r.lease)
	}
	seen := map[string]bool{}
	for _, lease := range leases {
		if seen[lease.Key()] {
			t.Fatalf("two takers hold %q", lease.Key())
		}
		seen[lease.Key()] = true
	}
	// The permit of the taker that left goes back beside the look's leader.
	waitFor(t, 5*time.Second, "4 permits held in the store for 4 leases (the permit of the taker that left back)", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.locks) == 4
	})
	for _, lease := range leases {
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 5*time.Second, "every permit back", func() bool { m.mu.Lock(); defer m.mu.Unlock(); return len(m.locks) == 0 })
}

// wantStore grants up to Want of a request's Permits, one key at a time, as a store that asks
// for several at once does.
type wantStore struct{ *memStore }

func (w wantStore) Acquire(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	if req.Permits == nil {
		return w.memStore.Acquire(ctx, req)
	}
	var out lockstore.Acquisition
	for i, k := range req.Permits {
		one := req
		one.Key, one.Permits = k, nil
		a, err := w.memStore.Acquire(ctx, one)
		if err != nil {
			return out, err
		}
		switch {
		case !a.Acquired:
		case !out.Acquired:
			out, out.Permit = a, i
		default:
			out.More = append(out.More, lockstore.PermitGrant{Permit: i, Fence: a.Fence})
		}
		if out.Acquired && 1+len(out.More) == max(req.Want, 1) {
			break
		}
	}
	if !out.Acquired {
		out.HolderTTL = time.Second
	}
	return out, nil
}

// slowReleases holds each Release, once hold is set, until letGo is closed or its context ends.
type slowReleases struct {
	lockstore.Store
	hold  atomic.Bool
	letGo chan struct{}
}

func (s *slowReleases) Release(ctx context.Context, key, owner, hold string, lastFence int64) (int, error) {
	if s.hold.Load() {
		select {
		case <-s.letGo:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return s.Store.Release(ctx, key, owner, hold, lastFence)
}

// The taker that leads a look returns with its permit at once when the look also granted a
// permit to a taker that left meanwhile: that permit goes back beside it, however long the
// store takes to release it.
func TestLookLeaderDoesNotWaitForThePermitOfATakerThatLeft(t *testing.T) {
	ctx := context.Background()
	m := newMemStore()
	f := &slowReleases{Store: wantStore{m}, letGo: make(chan struct{})}
	h := newHeldLooks(f)
	l := mustLocker(t, h, WithPermits(8), WithWait(10*time.Second), WithTTL(time.Minute))
	type got struct {
		lease *Lease
		err   error
	}
	results := make(chan got, 4)
	take := func(ctx context.Context) {
		lease, err := l.Lock(ctx, "export")
		results <- got{lease, err}
	}
	go take(ctx)
	<-h.arrived  // the first look is on its way
	go take(ctx) // leads the next look
	waitFor(t, 5*time.Second, "the next look's leader", func() bool { return l.lookWaiters("export") == 1 })
	counted, leave := context.WithCancel(ctx)
	go take(counted) // counted in the next look, then gives up before its outcome
	waitFor(t, 5*time.Second, "two waiters", func() bool { return l.lookWaiters("export") == 2 })
	h.letGo <- struct{}{}
	first := <-results
	if first.err != nil {
		t.Fatal(first.err)
	}
	if next := <-h.arrived; next.Want != 2 {
		t.Fatalf("the next look asked for %d permits, want 2", next.Want)
	}
	leave()
	if r := <-results; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("a taker that gave up while its look was on its way: %v, %v", r.lease, r.err)
	}
	f.hold.Store(true) // the store takes its time over releases from now on
	h.letGo <- struct{}{}
	var leader got
	select {
	case leader = <-results:
	case <-time.After(10 * time.Second):
		close(f.letGo)
		t.Fatal("the look's leader waits for the release of the permit granted to a taker that left")
	}
	close(f.letGo)
	if leader.err != nil {
		t.Fatal(leader.err)
	}
	waitFor(t, 5*time.Second, "the permit of the taker that left back", func() bool { return m.size() == 2 })
	for _, lease := range []*Lease{first.lease, leader.lease} {
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
