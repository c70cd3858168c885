package flightlock

import (
	"context"
	"errors"
	"testing"
)

// Allocation guards (issue 17): a change that makes the uncontended path or the rejection of a
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
	if _, err := m.Acquire(ctx, key, "warm", 0, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Release(ctx, key, "warm", "", 0); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() {
		_, _ = m.Acquire(ctx, key, "owner", 0, "")
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
	if _, err := m.Acquire(ctx, "lock:"+key, "warm", 0, ""); err != nil {
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
