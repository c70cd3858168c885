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
	l := mustLocker(t, s, WithWait(10*time.Second), WithPermits(2), WithHandoff(DefaultHandoff, time.Hour))
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
		return queuedOn(l, PermitKey("export", 1))+queuedOn(l, PermitKey("export", 2)) == 1
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
