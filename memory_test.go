package flightlock

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

// grantStore grants every acquisition and keeps nothing, so that a memory measurement sees the
// Locker's own memory only (memStore's and miniredis's maps keep their buckets too).
type grantStore struct {
	fence atomic.Int64
}

func (s *grantStore) Capabilities() lockstore.Capabilities { return lockstore.Capabilities{} }

func (s *grantStore) RefreshAll(_ context.Context, batch []lockstore.Renewal) []error {
	return make([]error, len(batch))
}

func (s *grantStore) LeaveQueue(context.Context, string, string) error { return nil }

func (s *grantStore) Acquire(context.Context, lockstore.Request) (lockstore.Acquisition, error) {
	return lockstore.Acquisition{Acquired: true, Fence: s.fence.Add(1)}, nil
}

func (s *grantStore) Reenter(context.Context, string, string, string, time.Duration) (lockstore.Acquisition, error) {
	return lockstore.Acquisition{}, nil
}

func (s *grantStore) Refresh(context.Context, string, string, time.Duration) error { return nil }

func (s *grantStore) Release(context.Context, string, string, string, int64) (int, error) {
	return 0, nil
}

func (s *grantStore) TTL(context.Context, string) (time.Duration, error) { return time.Minute, nil }

func (s *grantStore) Watch(context.Context, string) (*lockstore.Watch, error) {
	return nil, errors.New("grantStore: no release notifications")
}

// liveHeap returns the bytes of live heap objects after a full collection.
func liveHeap() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC() // a second cycle frees what the first one's finalizers let go
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// Bounds of what releasing every lock may leave behind: live heap bytes per lock that was
// held, and goroutines above the count before the locks were taken. The holds share one
// watchdog timer: a timer per hold would leave 16 B per lock more live, as the timer heap of a
// P keeps the capacity of its peak (a 16 B slot per timer) after the timers are gone.
const (
	releasedBytesPerLock  = 16
	releasedGoroutineSlop = 0
)

// heldBytesPerLock bounds the live heap of one held lock (the goal is 300 B with the
// watchdog on; the grantStore keeps nothing, so this is the Locker's own): hold 128, lease 64,
// gate entry 24, the gate map's slot about 30-45 (its load factor), the key, and the hold's
// place in the watchdog's heap, 285 B in all. A change that adds to it fails here.
const heldBytesPerLock = 292

// Holding many locks and releasing them all returns the heap and the goroutine count to where
// they were: no map, heap or queue keeps the size of its peak. The gate's map is rebuilt as it
// empties (Go maps never shrink: 60 B per lock would stay live), and the holds share one
// watchdog timer (a timer per hold leaves 19 B per lock, above the bound of 16 B).
func TestReleasingEverythingReturnsToBaseline(t *testing.T) {
	const n = 20000
	ctx := context.Background()
	l := mustLocker(t, &grantStore{}, WithTTL(time.Minute), WithMaxHold(time.Hour))
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "mem:" + strconv.Itoa(i)
	}
	leases := make([]*Lease, n)
	for _, k := range keys[:64] { // warm up: first-use allocations of the Locker and the runtime
		lease, err := l.Lock(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		_ = lease.Release(ctx)
	}

	goroutines := runtime.NumGoroutine()
	base := liveHeap()
	for i, k := range keys {
		lease, err := l.Lock(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = lease
	}
	held := liveHeap()
	heldGoroutines := runtime.NumGoroutine()
	for i, lease := range leases {
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		leases[i] = nil
	}
	after := liveHeap()
	afterGoroutines := runtime.NumGoroutine()
	runtime.KeepAlive(keys)
	runtime.KeepAlive(leases)

	perHeld := float64(int64(held)-int64(base)) / n
	perLeft := float64(int64(after)-int64(base)) / n
	t.Logf("%d locks: %.0f B live heap per held lock, %d goroutines while held (%d before); after release %.1f B per lock, %d goroutines",
		n, perHeld, heldGoroutines, goroutines, perLeft, afterGoroutines)
	if perHeld > heldBytesPerLock {
		t.Errorf("%.0f B of live heap per held lock, bound %d: find what grew, or raise the bound and say why", perHeld, heldBytesPerLock)
	}
	if perLeft > releasedBytesPerLock {
		t.Errorf("after releasing %d locks, %.1f B per lock stays live (bound %d)", n, perLeft, releasedBytesPerLock)
	}
	if afterGoroutines > goroutines+releasedGoroutineSlop {
		t.Errorf("after releasing %d locks, %d goroutines run, %d before", n, afterGoroutines, goroutines)
	}
	if g := l.gateLen(); g != 0 {
		t.Errorf("gate keeps %d entries", g)
	}
}

// Allocation guards: a change that makes the uncontended path or the rejection of a
// duplicate allocate more fails here, without any timing. The store is memStore, which
// allocates nothing for a key it has seen (checked first), so the counts are the Locker's own.
// When a change lowers a count, lower its bound with it.

func measureAllocs(t *testing.T, what string, bound, boundRace float64, f func()) {
	t.Helper()
	if raceEnabled {
		bound = boundRace
	}
	got := testing.AllocsPerRun(1000, f)
	t.Logf("%s: %v allocations per run (bound %v)", what, got, bound)
	if got > bound {
		t.Errorf("%s allocates %v times per run, bound %v: find the new allocation, or raise the bound and say why", what, got, bound)
	}
}

// allocsStore is memStore with its one allocating step, storing a new key in its map, done
// before the measurement: the guards below count the Locker's allocations only.
func allocsStore(t *testing.T, key string) *memStore {
	t.Helper()
	m := newMemStore()
	ctx := context.Background()
	if _, err := m.Acquire(ctx, lockstore.Request{Key: key, Owner: "warm", TTL: 0}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Release(ctx, key, "warm", "", 0); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() {
		_, _ = m.Acquire(ctx, lockstore.Request{Key: key, Owner: "owner", TTL: 0})
		_, _ = m.Release(ctx, key, "owner", "", 0)
	}); n != 0 {
		t.Fatalf("memStore allocates %v times per lock + release of a known key: the guards would count it", n)
	}
	return m
}

// Allocation bounds for an uncontended TryLock or Lock + Release of a free key: 8 (9 under
// -race): the owner token, the gate entry, the hold, the lease and its holder slot, and the two
// boundCtx wrappers that give the acquire and release calls a shared deadline with the
// caller's values (sharedBound). Each hold had a timer of its own (timer and callback: 18, 19
// under -race) before the watchdog kept them all on one; each lease made its context
// (WithCancelCause, two) before Context was first called (16, 17 under -race); and the two
// calls had a WithDeadline context each (context, timer, cancel function: 14, 15 under -race)
// before they shared one timer per window.
const (
	allocsUncontended     = 8
	allocsUncontendedRace = 9
)

func TestAllocsUncontended(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		lock func(*Locker, context.Context, string) (*Lease, error)
	}{
		{"TryLock", (*Locker).TryLock},
		{"Lock", (*Locker).Lock},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := mustLocker(t, allocsStore(t, "lock:a"))
			measureAllocs(t, tc.name+" + Release of a free key", allocsUncontended, allocsUncontendedRace, func() {
				lease, err := tc.lock(l, ctx, "a")
				if err != nil {
					t.Fatal(err)
				}
				if err := lease.Release(ctx); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// Allocation bounds for a TryLock of a key that another goroutine of this process holds: it is
// refused by the gate, with no Redis command.
const (
	allocsDuplicate     = 2
	allocsDuplicateRace = 2
)

func TestAllocsRejectedDuplicate(t *testing.T) {
	ctx := context.Background()
	m := allocsStore(t, "lock:dup")
	l := mustLocker(t, m)
	held, err := l.Lock(ctx, "dup")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	acquires := m.size()
	measureAllocs(t, "TryLock of a held key", allocsDuplicate, allocsDuplicateRace, func() {
		if _, err := l.TryLock(ctx, "dup"); !errors.Is(err, ErrBusy) {
			t.Fatalf("TryLock of a held key: %v, want ErrBusy", err)
		}
	})
	if m.size() != acquires {
		t.Fatal("a rejected duplicate reached the store")
	}
}

// BenchmarkLockReleaseLockerOnly is an uncontended Lock + Release of a free key on memStore,
// which costs nothing for a key it has seen: the Locker's own CPU and allocations per lock and
// release, the part of an uncontended lock that is not the store's.
func BenchmarkLockReleaseLockerOnly(b *testing.B) {
	const key = "bench:locker"
	m := newMemStore()
	ctx := context.Background()
	if _, err := m.Acquire(ctx, lockstore.Request{Key: "lock:" + key, Owner: "warm", TTL: 0}); err != nil {
		b.Fatal(err)
	}
	if _, err := m.Release(ctx, "lock:"+key, "warm", "", 0); err != nil {
		b.Fatal(err)
	}
	l, err := New(m)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		lease, err := l.Lock(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// parkedLooks is a grantStore that, once park is set, holds every look at permits until open
// is closed.
type parkedLooks struct {
	grantStore
	park   atomic.Bool
	parked atomic.Int64
	open   chan struct{}
}

func (s *parkedLooks) Acquire(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	if len(req.Permits) > 0 && s.park.Load() {
		s.parked.Add(1)
		<-s.open
	}
	return s.grantStore.Acquire(ctx, req)
}

// Looks at the permits of many semaphores at once leave no map of their peak behind: the
// gate's table of looks on their way is rebuilt as it empties, as its table of keys is.
func TestManyLooksAtOnceLeaveNoMapBehind(t *testing.T) {
	const n = 4000
	ctx := context.Background()
	s := &parkedLooks{open: make(chan struct{})}
	l := mustLocker(t, s, WithTTL(time.Minute), WithMaxHold(time.Hour), WithPermits(2))
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "sem:" + strconv.Itoa(i)
	}
	for _, k := range keys[:64] { // warm up, as the test above
		lease, err := l.Lock(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		_ = lease.Release(ctx)
	}
	s.park.Store(true)
	leases := make([]*Lease, n)
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Go(func() {
			lease, err := l.Lock(ctx, k)
			if err != nil {
				t.Error(err)
				return
			}
			leases[i] = lease
		})
	}
	waitFor(t, 10*time.Second, "every look to reach the store", func() bool { return s.parked.Load() == n })
	l.k.gate.mu.Lock()
	looks := len(l.k.gate.looks)
	l.k.gate.mu.Unlock()
	if looks != n {
		t.Fatalf("%d looks on their way, want %d", looks, n)
	}
	close(s.open)
	wg.Wait()
	for _, lease := range leases {
		if lease != nil {
			_ = lease.Release(ctx)
		}
	}
	// What the table of looks keeps is what a fresh one gives back.
	g := l.k.gate
	kept := liveHeap()
	g.mu.Lock()
	left := len(g.looks)
	g.looks = make(map[string]*permitFlight)
	g.mu.Unlock()
	perLook := float64(int64(kept)-int64(liveHeap())) / n
	t.Logf("after %d looks at once, the table of looks keeps %.1f B per look (%d left in it)", n, perLook, left)
	if left != 0 || perLook > releasedBytesPerLock {
		t.Errorf("after %d looks at once, the table of looks keeps %d of them and %.1f B per look", n, left, perLook)
	}
}
