package etcdstore

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	"github.com/flightlock/flightlock/lockstore"
)

// rwProcess is one process of a read-write test: a store on a client of its own, a Locker of
// write locks and one of read locks sharing its gate.
type rwProcess struct {
	store       *Store
	write, read *flightlock.Locker
}

func newRWProcess(t *testing.T, c *etcdtest.Cluster, wait time.Duration) rwProcess {
	t.Helper()
	s := newStore(t, c.Client(t))
	w, err := flightlock.New(s, flightlock.WithTTL(2*time.Second), flightlock.WithWait(wait))
	if err != nil {
		t.Fatal(err)
	}
	r, err := w.With(flightlock.WithRead())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Drain(context.Background()) })
	return rwProcess{store: s, write: w, read: r}
}

// Two processes, each with three readers and two writers on one key: a write never runs beside
// a read or another write, reads do run together, write fences strictly increase, and each
// read's fence is at least the fence of the write before it and below the fence of the next.
func TestReadWriteLocksExcludeAcrossProcesses(t *testing.T) {
	c := etcdtest.Start(t)
	procs := []rwProcess{newRWProcess(t, c, 20*time.Second), newRWProcess(t, c, 20*time.Second)}
	var (
		readers, writers, peakReaders atomic.Int64
		reads, writes                 atomic.Int64
		fenceMu                       sync.Mutex
		lastWrite, lastRead           int64 // guarded by fenceMu
		wg                            sync.WaitGroup
	)
	stop := time.Now().Add(4 * time.Second)
	for _, p := range procs {
		for range 3 {
			wg.Go(func() {
				for time.Now().Before(stop) {
					err := p.read.Do(context.Background(), "doc", func(ctx context.Context) error {
						n := readers.Add(1)
						defer readers.Add(-1)
						for m := peakReaders.Load(); n > m && !peakReaders.CompareAndSwap(m, n); m = peakReaders.Load() {
						}
						if w := writers.Load(); w != 0 {
							t.Errorf("a read ran beside %d writes", w)
						}
						f := flightlock.FromContext(ctx).Fence()
						fenceMu.Lock()
						if f < lastWrite {
							t.Errorf("read fence %d below the fence %d of the write it follows", f, lastWrite)
						}
						lastRead = max(lastRead, f)
						fenceMu.Unlock()
						time.Sleep(3 * time.Millisecond)
						reads.Add(1)
						return nil
					})
					if err != nil {
						t.Errorf("read: %v", err)
						return
					}
				}
			})
		}
		for range 2 {
			wg.Go(func() {
				for time.Now().Before(stop) {
					err := p.write.Do(context.Background(), "doc", func(ctx context.Context) error {
						if n := writers.Add(1); n != 1 {
							t.Errorf("%d writes at once", n)
						}
						defer writers.Add(-1)
						if r := readers.Load(); r != 0 {
							t.Errorf("a write ran beside %d reads", r)
						}
						f := flightlock.FromContext(ctx).Fence()
						fenceMu.Lock()
						if f <= lastWrite || f <= lastRead {
							t.Errorf("write fence %d not above the last write's %d and the last read's %d", f, lastWrite, lastRead)
						}
						lastWrite = f
						fenceMu.Unlock()
						time.Sleep(time.Millisecond)
						writes.Add(1)
						return nil
					})
					if err != nil {
						t.Errorf("write: %v", err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	t.Logf("%d reads (at most %d at once), %d writes", reads.Load(), peakReaders.Load(), writes.Load())
	if reads.Load() == 0 || writes.Load() == 0 {
		t.Fatal("a side never ran")
	}
	if peakReaders.Load() < 2 {
		t.Fatal("reads never ran together: read locks must share")
	}
}

// Readers keep arriving, each holding its read lock while the next ones come, so that the key
// is never free of readers; a writer in another process still gets in well within its wait:
// its refusal marks the key, and new readers wait for it.
func TestReaderStreamDoesNotStarveAWriter(t *testing.T) {
	c := etcdtest.Start(t)
	readers := newRWProcess(t, c, 20*time.Second)
	writer := newRWProcess(t, c, 6*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		wg      sync.WaitGroup
		reading atomic.Int64
	)
	for i := range 8 {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * 25 * time.Millisecond) // staggered: the holds overlap
			for ctx.Err() == nil {
				err := readers.read.Do(ctx, "report", func(context.Context) error {
					reading.Add(1)
					defer reading.Add(-1)
					time.Sleep(200 * time.Millisecond)
					return nil
				})
				if err != nil && ctx.Err() == nil {
					t.Errorf("read: %v", err)
					return
				}
			}
		})
	}
	waitFor(t, 5*time.Second, "the reader stream flowing", func() bool { return reading.Load() >= 4 })
	start := time.Now()
	err := writer.write.Do(context.Background(), "report", func(context.Context) error {
		if r := reading.Load(); r != 0 {
			t.Errorf("the write ran beside %d reads", r)
		}
		return nil
	})
	took := time.Since(start)
	cancel()
	wg.Wait()
	if err != nil {
		t.Fatalf("the writer starved: %v after %v", err, took)
	}
	t.Logf("the writer got in after %v", took)
	if took > 3*time.Second {
		t.Fatalf("the writer waited %v behind a reader stream; readers must wait for a marked writer", took)
	}
}

// The read hold of a holder that died (taken through the store, never refreshed nor released)
// runs out on its own about a TTL later, and a writer waiting for it gets in then.
func TestDeadReadHoldRunsOutAfterItsTTL(t *testing.T) {
	c := etcdtest.Start(t)
	dead := newStore(t, c.Client(t))
	ctx := bg(t)
	got, err := dead.Acquire(ctx, lockstore.Request{Key: "lock:cache", Owner: lockstore.ReadOwner(ownerA), TTL: 2 * time.Second})
	if err != nil || !got.Acquired {
		t.Fatalf("read acquire = %+v, %v", got, err)
	}
	writer := newRWProcess(t, c, 10*time.Second)
	start := time.Now()
	lease, err := writer.write.Lock(ctx, "cache")
	took := time.Since(start)
	if err != nil {
		t.Fatalf("the writer never got in: %v", err)
	}
	defer lease.Release(ctx)
	t.Logf("the writer got in %v after a dead reader's hold of TTL 2s", took)
	if took < 1500*time.Millisecond || took > 4500*time.Millisecond {
		t.Fatalf("the writer got in after %v, want about the reader's TTL (2s, at most its lease's 3s and a reap)", took)
	}
	if lease.Fence() <= got.Fence {
		t.Fatalf("write fence %d not above the dead read's %d", lease.Fence(), got.Fence)
	}
}

// The store-level contract of a read-write key, step by step: reads share and re-enter, a write
// is refused by them and marks the key, a new read is then refused, the end of the last read
// wakes the writer's Watch and reports the waiting writer, the writer's fence exceeds the
// reads', and a read after it gets a fence at least the write's and below the next write's.
func TestReadHoldsAndAWaitingWriter(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	a, b := newStore(t, cli), newStore(t, cli)
	ra, rc := lockstore.ReadOwner(ownerA), lockstore.ReadOwner("cccccccccccccccccccccccccccccccc")
	const k, ttl = "lock:k", 2 * time.Second

	first, err := a.Acquire(ctx, lockstore.Request{Key: k, Owner: ra, TTL: ttl, Meta: "host=r"})
	if err != nil || !first.Acquired || first.Reentered || first.Fence <= 0 {
		t.Fatalf("read = %+v, %v", first, err)
	}
	if get(t, cli, k) != nil {
		t.Fatal("a read hold wrote the lock key itself")
	}
	if again, err := a.Acquire(ctx, lockstore.Request{Key: k, Owner: ra, TTL: ttl}); err != nil || !again.Reentered || again.Fence != first.Fence {
		t.Fatalf("read re-entry = %+v, %v; want reentered with fence %d", again, err, first.Fence)
	}
	shared, err := b.Acquire(ctx, lockstore.Request{Key: k, Owner: rc, TTL: ttl})
	if err != nil || !shared.Acquired {
		t.Fatalf("a second read = %+v, %v; want shared", shared, err)
	}
	if r, err := b.Reenter(ctx, k, ra, "h1", ttl); err != nil || r.Acquired {
		t.Fatalf("Reenter of a read owner = %+v, %v; want nothing granted", r, err)
	}
	if err := a.Refresh(ctx, k, ra, ttl); err != nil {
		t.Fatalf("refresh of a read hold: %v", err)
	}
	if err := a.Refresh(ctx, k, lockstore.ReadOwner(ownerB), ttl); !errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("refresh of a read hold never taken: %v", err)
	}

	w, err := b.Acquire(ctx, lockstore.Request{Key: k, Owner: ownerB, TTL: ttl, Meta: "host=w"})
	if err != nil || w.Acquired || w.HolderTTL != 3*time.Second || !strings.HasPrefix(w.Holder, "host=") {
		t.Fatalf("write beside reads = %+v, %v; want busy with a reader's lease TTL and metadata", w, err)
	}
	if get(t, cli, writerKey(k)) == nil {
		t.Fatal("a writer refused by reads left no writer mark")
	}
	late := lockstore.ReadOwner("dddddddddddddddddddddddddddddddd")
	if r, err := a.Acquire(ctx, lockstore.Request{Key: k, Owner: late, TTL: ttl}); err != nil || r.Acquired || r.HolderTTL <= 0 || r.Holder != "" {
		t.Fatalf("a new read while a writer waits = %+v, %v; want busy, naming no holder", r, err)
	}
	if r, err := a.Acquire(ctx, lockstore.Request{Key: k, Owner: ra, TTL: ttl}); err != nil || !r.Reentered {
		t.Fatalf("re-entry of a read hold while a writer waits = %+v, %v; want reentered", r, err)
	}

	watch, err := b.Watch(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	if n, err := a.Release(ctx, k, ra, "", 0); err != nil || n != 0 {
		t.Fatalf("release of a read hold that is not the last = %d, %v", n, err)
	}
	if n, err := a.Release(ctx, k, ra, "", 0); !errors.Is(err, lockstore.ErrNotHeld) || n != 0 {
		t.Fatalf("second release of a read hold = %d, %v; want ErrNotHeld", n, err)
	}
	if n, err := b.Release(ctx, k, rc, "", 0); err != nil || n != 1 {
		t.Fatalf("release of the last read hold = %d, %v; want the waiting writer notified", n, err)
	}
	select {
	case <-watch.C():
	case <-time.After(2 * time.Second):
		t.Fatal("the end of the last read hold did not wake the writer's watch")
	}

	wrote, err := b.Acquire(ctx, lockstore.Request{Key: k, Owner: ownerB, TTL: ttl})
	if err != nil || !wrote.Acquired || wrote.Fence <= max(first.Fence, shared.Fence) {
		t.Fatalf("write after the reads = %+v, %v; want a fence above %d", wrote, err, max(first.Fence, shared.Fence))
	}
	if get(t, cli, writerKey(k)) != nil {
		t.Fatal("the write grant left the writer mark")
	}
	if r, err := a.Acquire(ctx, lockstore.Request{Key: k, Owner: late, TTL: ttl}); err != nil || r.Acquired || r.HolderTTL != 3*time.Second {
		t.Fatalf("read while a writer holds = %+v, %v; want busy", r, err)
	}
	if _, err := b.Release(ctx, k, ownerB, "", 0); err != nil {
		t.Fatal(err)
	}
	after, err := a.Acquire(ctx, lockstore.Request{Key: k, Owner: late, TTL: ttl})
	if err != nil || !after.Acquired || after.Fence < wrote.Fence {
		t.Fatalf("read after the write = %+v, %v; want a fence of at least %d", after, err, wrote.Fence)
	}
	if _, err := a.Release(ctx, k, late, "", 0); err != nil {
		t.Fatal(err)
	}
	next, err := b.Acquire(ctx, lockstore.Request{Key: k, Owner: ownerA, TTL: ttl})
	if err != nil || !next.Acquired || next.Fence <= after.Fence {
		t.Fatalf("the next write = %+v, %v; want a fence above the read's %d", next, err, after.Fence)
	}
	if _, err := b.Release(ctx, k, ownerA, "", 0); err != nil {
		t.Fatal(err)
	}
	if a.Held() != 0 || b.Held() != 0 {
		t.Fatalf("entries left: %d, %d", a.Held(), b.Held())
	}
}

// A writer that was refused by reads and then stopped asking (it gave up) holds new readers
// off only until its mark's deadline, one lease TTL of its own.
func TestWriterMarkEndsWithItsDeadline(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	s := newStore(t, cli)
	const k, ttl = "lock:k", 2 * time.Second
	if r, err := s.Acquire(ctx, lockstore.Request{Key: k, Owner: lockstore.ReadOwner(ownerA), TTL: ttl}); err != nil || !r.Acquired {
		t.Fatalf("read = %+v, %v", r, err)
	}
	if r, err := s.Acquire(ctx, lockstore.Request{Key: k, Owner: ownerB, TTL: ttl}); err != nil || r.Acquired {
		t.Fatalf("write beside a read = %+v, %v", r, err)
	}
	marked := time.Now()
	late := lockstore.ReadOwner(ownerB)
	if r, err := s.Acquire(ctx, lockstore.Request{Key: k, Owner: late, TTL: ttl}); err != nil || r.Acquired {
		t.Fatalf("read while the writer waits = %+v, %v; want busy", r, err)
	}
	waitFor(t, 5*time.Second, "a read after the gone writer's deadline", func() bool {
		r, err := s.Acquire(ctx, lockstore.Request{Key: k, Owner: late, TTL: ttl})
		return err == nil && r.Acquired
	})
	if took := time.Since(marked); took < 2500*time.Millisecond {
		t.Fatalf("the mark held readers off only %v, want its lease TTL (3s)", took)
	}
	if get(t, cli, writerKey(k)) != nil {
		t.Fatal("the read that found the mark past its deadline left it")
	}
}

// The side keys of a lock key (read holds, places in line) are in a directory that belongs to
// that key alone, whatever bytes keys and owners contain, and read back to their parts.
func TestSideKeysBelongToOneLockKey(t *testing.T) {
	keys := []string{"orders", "orders/0", "orders/", "a:b", "x/r/y", "6:orders", "orders/r/~o"}
	for _, k := range keys {
		for _, o := range []string{"~o", "~a/b", "o"} {
			for _, kind := range []byte{sideRead, sidePlace} {
				full := readKey(k, o)
				if kind == sidePlace {
					full = placeKey(k, o)
				}
				gk, gkind, gowner, ok := parseSideKey(full)
				if !ok || gk != k || gkind != kind || gowner != o {
					t.Errorf("parseSideKey(%q) = %q %c %q %v", full, gk, gkind, gowner, ok)
				}
				for _, other := range keys {
					if other != k && strings.HasPrefix(full, sideDir(other)) {
						t.Errorf("%q (of %q) lies in the directory of %q", full, k, other)
					}
				}
			}
		}
	}
	for _, bad := range []string{sidePrefix, sidePrefix + "x:y/r/o", sidePrefix + "3:ab/r/o", sidePrefix + "2:ab/z/o", "lock:k"} {
		if _, _, _, ok := parseSideKey(bad); ok {
			t.Errorf("parseSideKey(%q) read a side key", bad)
		}
	}
}
