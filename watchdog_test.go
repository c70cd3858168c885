package flightlock

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/flightlock/flightlock/lockstore"
)

// Locks with a short TTL, taken next to one with a long TTL through a derived Locker, are
// renewed in time: each lock follows its own TTL.
func TestWatchdogRenewsShortTTLBesideLongTTL(t *testing.T) {
	s, mr, c := miniStore(t)
	clk := newManualClock()
	ctx := context.Background()
	// TTLs long enough that a loaded machine's store calls (bound on real time) fit in them.
	long := mustLocker(t, s, WithTTL(100*time.Second), withClock(clk))
	short, err := long.With(WithTTL(3 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	a, err := long.Lock(ctx, "wd:long")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	var leases []*Lease
	for i := range 20 {
		b, err := short.Lock(ctx, "wd:short:"+strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, b)
	}
	clk.Step(mr, 12*time.Second, 100*time.Millisecond) // four TTLs of the short locks
	for _, b := range leases {
		if err := context.Cause(b.Context()); err != nil {
			t.Fatalf("%s: context ended with %v while its holder still held it", b.Key(), err)
		}
		if v := c.Get(ctx, b.Key()).Val(); !strings.HasPrefix(v, b.Owner()+" ") {
			t.Fatalf("%s: not renewed in time, Redis holds %q", b.Key(), v)
		}
		if err := b.Release(ctx); err != nil {
			t.Fatalf("%s: release: %v", b.Key(), err)
		}
	}
}

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

func (r *refreshLog) RefreshAll(ctx context.Context, batch []lockstore.Renewal) []error {
	return refreshEach(ctx, r.Refresh, batch)
}

// state returns the watchdog's heap length and capacity and its renewers.
func (w *watchdog) state() (pending, capacity, workers int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.heap), cap(w.heap), w.workers
}

// 2,000 held locks arm one timer on the clock between them, and each is renewed on its own
// schedule: TTL/3 after its acquisition, then TTL/3 after each renewal, with no timer of its
// own. After release the watchdog holds nothing.
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
	// The timer is left armed when the heap empties (watchdog.unschedule): it fires once more,
	// finds nothing due, and stays off.
	clk.Advance(ttl)
	if _, armed := clk.counts(); armed != 0 {
		t.Fatal("the watchdog's timer stays armed with nothing to do")
	}
}

// A loop of uncontended Lock + Release does not stop and re-arm the clock timer for every lock:
// arming a runtime timer earlier than the network poller's sleep wakes the poller (a system
// call and a thread wake-up), which shows as latency in scenario 1 of the benchmark (bench/).
// The timer armed for the first lock stays armed; the next locks fall due after it.
func TestUncontendedLocksDoNotRearmTheTimer(t *testing.T) {
	ctx := context.Background()
	clk := newManualClock()
	l := mustLocker(t, newMemStore(), WithTTL(300*time.Millisecond), withClock(clk))
	for i := range 100 {
		lease, err := l.Lock(ctx, "rearm:"+strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Millisecond)
	}
	clk.mu.Lock()
	changes := clk.changes
	clk.mu.Unlock()
	if changes > 2 {
		t.Fatalf("100 uncontended Lock + Release made, reset or stopped the clock timer %d times, want at most 2", changes)
	}
}

// stuckRefreshStore is a Store that refreshes many locks in one call (RefreshAll),
// whose calls hang, ignoring their context, until release is closed; it counts the calls, the
// renewals they carry, and the most calls on the wire at once.
type stuckRefreshStore struct {
	lockstore.Store
	release  chan struct{}
	calls    atomic.Int64
	sent     atomic.Int64
	inFlight atomic.Int64
	most     atomic.Int64
}

func (s *stuckRefreshStore) RefreshAll(ctx context.Context, batch []lockstore.Renewal) []error {
	s.calls.Add(1)
	s.sent.Add(int64(len(batch)))
	n := s.inFlight.Add(1)
	for {
		m := s.most.Load()
		if n <= m || s.most.CompareAndSwap(m, n) {
			break
		}
	}
	<-s.release
	s.inFlight.Add(-1)
	errs := make([]error, len(batch))
	for i, r := range batch {
		errs[i] = s.Store.Refresh(ctx, r.Key, r.Owner, r.TTL)
	}
	return errs
}

// Renewals that fall due together go to a batching store together, maxBatch to a call, on a
// bounded set of goroutines, never one per renewal (that would be up to 6,400 goroutines at
// once while holding 100,000 locks), and a renewal that hangs on the wire does not keep a
// lease past its loss deadline: TTL - TTL/10 after the send of the last successful acquire or
// refresh, exactly.
func TestQueuedRenewalKeepsTheLossDeadline(t *testing.T) {
	const n, ttl = 2*maxBatch + 10, 300 * time.Millisecond
	const calls = 3 // ceil(n / maxBatch)
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
	clk.Advance(ttl / 3) // all renewals due, in three calls that hang
	waitFor(t, 5*time.Second, "the renewers to send", func() bool { return store.sent.Load() == n })
	time.Sleep(20 * time.Millisecond) // room for a call beyond the batches to show up
	if c, most := store.calls.Load(), store.most.Load(); c != calls || most != calls {
		t.Fatalf("%d renewals due together: %d calls, %d at once; want %d (batches of %d)", n, c, most, calls, maxBatch)
	}
	// One goroutine per call; a few more may come and go beside the test (timers, the runtime),
	// while one per renewal would be hundreds.
	if extra := runtime.NumGoroutine() - goroutines; extra > calls+8 {
		t.Fatalf("%d renewals in flight run on %d more goroutines, want about %d", n, extra, calls)
	}

	clk.Advance(ttl - ttl/10 - ttl/3 - time.Millisecond) // 269ms
	for _, lease := range leases {
		if err := lease.Context().Err(); err != nil {
			t.Fatalf("%s: lost at 269ms, before its loss deadline: %v", lease.Key(), context.Cause(lease.Context()))
		}
	}
	clk.Advance(time.Millisecond) // 270ms = TTL - TTL/10
	for _, lease := range leases {
		if cause := context.Cause(lease.Context()); cause != ErrLost {
			t.Fatalf("%s (renewal hanging on the wire): at 270ms cause %v, want ErrLost", lease.Key(), cause)
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
	// The replies that came after the loss did not revive a lease.
	for _, lease := range leases {
		if cause := context.Cause(lease.Context()); cause != ErrLost {
			t.Fatalf("%s: cause %v after the late replies, want ErrLost", lease.Key(), cause)
		}
	}
}

// slowStore delays every refresh by delay (honouring its context, as a go-redis client with
// ContextTimeoutEnabled does), and never answers the refreshes of keys with "bad:" in them before
// their context ends (an unreachable node, a stalled connection). With batch, it refreshes many
// locks per call (RefreshAll), with the same delay per call.
type slowStore struct {
	lockstore.Store
	delay    time.Duration
	sent     atomic.Int64
	inFlight atomic.Int64
}

func (s *slowStore) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	s.sent.Add(1)
	s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	if strings.Contains(key, "bad:") {
		<-ctx.Done()
		return ctx.Err()
	}
	t := time.NewTimer(s.delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.Store.Refresh(ctx, key, owner, ttl)
}

func (s *slowStore) RefreshAll(ctx context.Context, batch []lockstore.Renewal) []error {
	return refreshEach(ctx, s.Refresh, batch)
}

type slowBatchStore struct{ *slowStore }

func (s slowBatchStore) RefreshAll(ctx context.Context, batch []lockstore.Renewal) []error {
	s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	errs := make([]error, len(batch))
	for i, r := range batch {
		if strings.Contains(r.Key, "bad:") {
			<-ctx.Done()
			errs[i] = ctx.Err()
		}
	}
	t := time.NewTimer(s.delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	for i, r := range batch {
		s.sent.Add(1)
		if errs[i] == nil {
			errs[i] = s.Store.Refresh(ctx, r.Key, r.Owner, r.TTL)
		}
	}
	return errs
}

// A lock whose refreshes the store answers at once is not lost because other locks' refreshes
// hang: 32 (maxRenewers) locks of a Locker derived with With (TTL 3s) hang on the wire from 1s
// on, and a lock of the parent Locker (TTL 300ms), taken at 1.05s, must be renewed and kept.
// With the first single watchdog, every renewer was taken by a hung refresh and the healthy
// lock was lost at its loss deadline (found in review). On the system clock, as in production.
func TestHungRefreshesDoNotStarveOtherRenewals(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(map[bool]string{false: "Refresh", true: "RefreshAll"}[batch], func(t *testing.T) {
			const ttl, slowTTL = 300 * time.Millisecond, 3 * time.Second
			ctx := context.Background()
			slow := &slowStore{Store: newMemStore()}
			var store lockstore.Store = slow
			if batch {
				store = slowBatchStore{slow}
			}
			l := mustLocker(t, store, WithTTL(ttl), WithMaxHold(time.Hour))
			long, err := l.With(WithTTL(slowTTL))
			if err != nil {
				t.Fatal(err)
			}
			var bad []*Lease
			for i := range maxRenewers {
				lease, err := long.Lock(ctx, "bad:"+strconv.Itoa(i))
				if err != nil {
					t.Fatal(err)
				}
				bad = append(bad, lease)
			}
			defer func() {
				for _, lease := range bad {
					_ = lease.Release(ctx)
				}
				// The hung refreshes end at their context's deadline: leave no goroutine behind.
				waitFor(t, 5*time.Second, "the hung refreshes to give up", func() bool { return slow.inFlight.Load() == 0 })
			}()
			time.Sleep(slowTTL/3 + 50*time.Millisecond) // the slow renewals are on the wire
			good, err := l.Lock(ctx, "good")
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(ttl) // past the healthy lock's first loss deadline (TTL - TTL/10)
			cause := context.Cause(good.Context())
			_ = good.Release(ctx)
			if cause != nil {
				t.Fatalf("a lock whose refreshes succeed at once was lost (cause %v) while %d other locks' refreshes hung", cause, maxRenewers)
			}
		})
	}
}

// Renewal throughput has no cap of maxRenewers per round trip: 1,000 held locks (TTL 900ms)
// whose every RefreshAll succeeds after 30ms all stay held over two TTLs. A renewer that sent
// one refresh at a time would take 1,000 x 30ms / 32 = 937ms a round, more than the 510ms
// between a renewal's due time and its loss deadline, and lose about half of them; batches
// leave room for a loaded machine's scheduling.
func TestRenewalThroughputKeepsEveryLock(t *testing.T) {
	const n, ttl = 1000, 900 * time.Millisecond
	ctx := context.Background()
	slow := &slowStore{Store: newMemStore(), delay: 30 * time.Millisecond}
	l := mustLocker(t, slowBatchStore{slow}, WithTTL(ttl), WithMaxHold(time.Hour))
	leases := make([]*Lease, n)
	for i := range leases {
		lease, err := l.Lock(ctx, "many:"+strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = lease
	}
	time.Sleep(2 * ttl)
	lost := 0
	for _, lease := range leases {
		if context.Cause(lease.Context()) != nil {
			lost++
		}
	}
	for _, lease := range leases {
		_ = lease.Release(ctx)
	}
	if lost > 0 {
		t.Fatalf("%d of %d held locks lost within 2 TTLs; every RefreshAll succeeded after 30ms", lost, n)
	}
}

// manualClock is a clock that moves only when a test advances it. Timers fire in due order
// inside Advance, on the test's goroutine, so that every renewal and expiry a step causes has
// happened when Advance returns.
type manualClock struct {
	mu      sync.Mutex
	now     time.Time      // guarded by mu
	timers  []*manualTimer // guarded by mu: every timer made, armed or not
	changes int            // guarded by mu: timers made, reset and stopped
}

type manualTimer struct {
	c     *manualClock
	due   time.Time // guarded by c.mu
	armed bool      // guarded by c.mu
	f     func()
}

func newManualClock() *manualClock { return &manualClock{now: time.Now()} }

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

func (c *manualClock) AfterFunc(d time.Duration, f func()) clockTimer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &manualTimer{c: c, due: c.now.Add(d), armed: true, f: f}
	c.timers = append(c.timers, t)
	c.changes++
	return t
}

func (t *manualTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.armed
	t.due, t.armed = t.c.now.Add(d), true
	t.c.changes++
	return was
}

func (t *manualTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.armed
	t.armed = false
	t.c.changes++
	return was
}

// Advance moves the clock by d, firing each timer that falls due on the way at its due time.
func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	target := c.now.Add(d)
	for {
		var next *manualTimer
		for _, t := range c.timers {
			if t.armed && !t.due.After(target) && (next == nil || t.due.Before(next.due)) {
				next = t
			}
		}
		if next == nil {
			c.now = target
			c.mu.Unlock()
			return
		}
		if next.due.After(c.now) {
			c.now = next.due
		}
		next.armed = false
		c.mu.Unlock()
		next.f() // may Reset timers and read the clock
		c.mu.Lock()
	}
}

// Step advances the clock and miniredis's key expiry together, by d in increments of at most
// tick, so that a renewal due inside the step reaches Redis before a key it would keep expires.
func (c *manualClock) Step(mr *miniredis.Miniredis, d, tick time.Duration) {
	for d > 0 {
		s := min(d, tick)
		c.Advance(s)
		if mr != nil {
			mr.FastForward(s)
		}
		d -= s
	}
}

// The manual clock fires timers in due order, re-armed ones included, and never early.
func TestManualClock(t *testing.T) {
	c := newManualClock()
	start := c.Now()
	var fired []time.Duration
	var rearm clockTimer
	rearm = c.AfterFunc(10*time.Millisecond, func() {
		fired = append(fired, c.Now().Sub(start))
		if len(fired) < 3 {
			rearm.Reset(10 * time.Millisecond)
		}
	})
	stopped := c.AfterFunc(5*time.Millisecond, func() { t.Error("a stopped timer fired") })
	if !stopped.Stop() {
		t.Fatal("Stop of an armed timer reported it idle")
	}
	c.Advance(9 * time.Millisecond)
	if len(fired) != 0 {
		t.Fatalf("fired early: %v", fired)
	}
	c.Advance(time.Second)
	want := []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 30 * time.Millisecond}
	if len(fired) != len(want) {
		t.Fatalf("fired at %v, want %v", fired, want)
	}
	for i := range want {
		if fired[i] != want[i] {
			t.Fatalf("fired at %v, want %v", fired, want)
		}
	}
	if got := c.Now().Sub(start); got != 9*time.Millisecond+time.Second {
		t.Fatalf("clock at %v after advancing 1.009s", got)
	}
}
