package flightlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
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

// rwCounts watches the inside of a read-write lock: readers and writers in it now, and what was
// seen at worst. Only holders whose lease was live when they came in count (a lost lease's
// holder is told to stop; exclusion is promised to live leases).
type rwCounts struct {
	readers, writers           atomic.Int64
	mostReaders                atomic.Int64
	writeBesideRead, twoWrites atomic.Int64
	reads, writes              atomic.Int64
}

func (c *rwCounts) enter(lease *Lease, write bool) {
	if lease.Context().Err() != nil {
		return
	}
	if write {
		if c.writers.Add(1) > 1 {
			c.twoWrites.Add(1)
		}
		if c.readers.Load() > 0 {
			c.writeBesideRead.Add(1)
		}
		return
	}
	n := c.readers.Add(1)
	if c.writers.Load() > 0 {
		c.writeBesideRead.Add(1)
	}
	for p := c.mostReaders.Load(); n > p && !c.mostReaders.CompareAndSwap(p, n); p = c.mostReaders.Load() {
	}
}

// runReadWrite has, on each process (a Locker pair with a gate of its own), goroutines that read
// "order" and goroutines that write it, sections times each.
func runReadWrite(t *testing.T, procs [][2]*Locker, readers, writers, sections int, hold time.Duration) *rwCounts {
	t.Helper()
	c := &rwCounts{}
	var wg sync.WaitGroup
	for _, p := range procs {
		for i := range readers + writers {
			write := i >= readers
			l := p[0]
			if write {
				l = p[1]
			}
			wg.Go(func() {
				for range sections {
					lease, err := l.Lock(context.Background(), "order")
					if err != nil {
						t.Errorf("Lock (write %v): %v", write, err)
						return
					}
					live := lease.Context().Err() == nil
					c.enter(lease, write)
					time.Sleep(hold)
					if live {
						if write {
							c.writers.Add(-1)
							c.writes.Add(1)
						} else {
							c.readers.Add(-1)
							c.reads.Add(1)
						}
					}
					if err := lease.Release(context.Background()); err != nil && !errors.Is(err, ErrNotHeld) {
						t.Errorf("Release: %v", err)
					}
				}
			})
		}
	}
	wg.Wait()
	return c
}

// Reads of a key run together and a write excludes reads and writes, across three processes
// with readers and writers each, on miniredis, a redis-server and a three-node Redis Cluster.
func TestReadsShareAndAWriteExcludesEveryone(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) lockstore.Store
	}{
		{"miniredis", func(t *testing.T) lockstore.Store { s, _, _ := miniStore(t); return s }},
		{"redis-server", func(t *testing.T) lockstore.Store { s, _, _ := realStore(t); return s }},
		{"redis-cluster", clusterStore},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := tc.store(t)
			var procs [][2]*Locker
			for range 3 {
				w := mustLocker(t, store, WithWait(30*time.Second))
				r, err := w.With(WithRead())
				if err != nil {
					t.Fatal(err)
				}
				procs = append(procs, [2]*Locker{r, w})
			}
			c := runReadWrite(t, procs, 4, 2, 12, 2*time.Millisecond)
			if c.writeBesideRead.Load() > 0 || c.twoWrites.Load() > 0 {
				t.Fatalf("a write beside a read %d times, two writes at once %d times", c.writeBesideRead.Load(), c.twoWrites.Load())
			}
			if c.mostReaders.Load() < 2 {
				t.Fatalf("at most %d readers at once: reads did not share", c.mostReaders.Load())
			}
			if c.reads.Load() != 3*4*12 || c.writes.Load() != 3*2*12 {
				t.Fatalf("%d reads and %d writes ran, want %d and %d", c.reads.Load(), c.writes.Load(), 3*4*12, 3*2*12)
			}
		})
	}
}

// The same with short TTLs and one process whose replies a proxy holds back now and then: a
// hold whose renewal comes late is lost (its context ends) before the other side can get in.
func TestReadWriteExclusionHoldsWithStalledReplies(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	procOn := func(addr string) [2]*Locker {
		c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true, ContextTimeoutEnabled: true, MaxRetries: -1})
		s := redisstore.New(c, redisstore.WithWatchLinger(0))
		t.Cleanup(func() { _ = s.Close(); _ = c.Close() })
		w := mustLocker(t, s, WithTTL(300*time.Millisecond), WithWait(30*time.Second))
		r, err := w.With(WithRead())
		if err != nil {
			t.Fatal(err)
		}
		return [2]*Locker{r, w}
	}
	procs := [][2]*Locker{procOn(srv.Addr), procOn(srv.Addr), procOn(proxy.Addr)}
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
	c := runReadWrite(t, procs, 3, 2, 8, 3*time.Millisecond)
	close(stop)
	stalls.Wait()
	if c.writeBesideRead.Load() > 0 || c.twoWrites.Load() > 0 {
		t.Fatalf("a live write beside a live read %d times, two live writes %d times", c.writeBesideRead.Load(), c.twoWrites.Load())
	}
}

// Readers that keep coming, always overlapping, do not keep a waiting writer out: once it was
// refused, new readers wait for it.
func TestAStreamOfReadersDoesNotStarveAWaitingWriter(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) lockstore.Store
	}{
		{"miniredis", func(t *testing.T) lockstore.Store { s, _, _ := miniStore(t); return s }},
		{"redis-server", func(t *testing.T) lockstore.Store { s, _, _ := realStore(t); return s }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := tc.store(t)
			readers := mustLocker(t, store, WithRead(), WithWait(30*time.Second))
			writer := mustLocker(t, store, WithWait(3*time.Second))
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			var reads atomic.Int64
			for range 6 {
				wg.Go(func() {
					for ctx.Err() == nil {
						lease, err := readers.Lock(ctx, "order")
						if err != nil {
							continue
						}
						reads.Add(1)
						time.Sleep(15 * time.Millisecond)
						_ = lease.Release(context.Background())
					}
				})
			}
			waitFor(t, 5*time.Second, "the readers to run", func() bool { return reads.Load() > 12 })
			lease, err := writer.Lock(context.Background(), "order")
			cancel()
			wg.Wait()
			if err != nil {
				t.Fatalf("the writer waited 3s beside a stream of readers: %v", err)
			}
			_ = lease.Release(context.Background())
		})
	}
}

// Every write's fence is above every earlier grant's; a read carries a fence at least the last
// write's and below the next write's.
func TestWriteFencesIncreaseAndReadsCarryTheLastWrites(t *testing.T) {
	s, _, _ := realStore(t)
	w := mustLocker(t, s, WithMode(Reject))
	r := mustLocker(t, s, WithMode(Reject), WithRead())
	ctx := context.Background()
	var lastWrite int64
	for i := range 5 {
		x, err := w.Lock(ctx, "order")
		if err != nil {
			t.Fatal(err)
		}
		if x.Fence() <= lastWrite {
			t.Fatalf("write %d: fence %d, not above the last write's %d", i, x.Fence(), lastWrite)
		}
		lastWrite = x.Fence()
		_ = x.Release(ctx)
		a, err := r.Lock(ctx, "order")
		if err != nil {
			t.Fatal(err)
		}
		b, err := r.Lock(ctx, "order")
		if err != nil {
			t.Fatalf("a second reader beside the first: %v", err)
		}
		if a.Fence() < lastWrite || b.Fence() != a.Fence() {
			t.Fatalf("reads after the write with fence %d: fences %d and %d", lastWrite, a.Fence(), b.Fence())
		}
		_ = a.Release(ctx)
		_ = b.Release(ctx)
		if x, err = w.Lock(ctx, "order"); err != nil || x.Fence() <= a.Fence() {
			t.Fatalf("the write after the reads: %v, fence %d, want above the reads' %d", err, x.Fence(), a.Fence())
		}
		lastWrite = x.Fence()
		_ = x.Release(ctx)
	}
}

// A reader that dies (no renewal, no release) keeps writers out until its TTL runs out, and no
// longer.
func TestDeadReadersHoldRunsOutAfterItsTTL(t *testing.T) {
	s, mr, _ := miniStore(t)
	const ttl = 2 * time.Second
	r := mustLocker(t, s, WithRead(), WithTTL(ttl))
	w := mustLocker(t, s, WithMode(Reject))
	ctx := context.Background()
	x, err := r.Lock(ctx, "order")
	if err != nil {
		t.Fatal(err)
	}
	x.h.stop() // the process is gone
	if _, err := w.Lock(ctx, "order"); !errors.Is(err, ErrBusy) {
		t.Fatalf("a write while the dead reader's TTL runs: %v, want ErrBusy", err)
	}
	mr.FastForward(ttl + time.Millisecond)
	y, err := w.Lock(ctx, "order")
	if err != nil {
		t.Fatalf("a write after the dead reader's TTL: %v", err)
	}
	_ = y.Release(ctx)
}

// A context that holds the write lock reads under it; one that holds a read lock cannot take the
// write lock, which would wait for its own read; a read lease hands no owner downstream.
func TestReadUnderWriteReentersAndWriteUnderReadIsRefused(t *testing.T) {
	s, _, _ := miniStore(t)
	w := mustLocker(t, s, WithMode(Reject))
	r, err := w.With(WithRead())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	x, err := w.Lock(ctx, "order")
	if err != nil {
		t.Fatal(err)
	}
	in, err := r.Lock(x.Context(), "order")
	if err != nil || in.Grant() != GrantReentry || in.Fence() != x.Fence() {
		t.Fatalf("a read under the write: %v, grant %v; want a re-entry of the write", err, in.Grant())
	}
	_ = in.Release(ctx)
	_ = x.Release(ctx)

	y, err := r.Lock(ctx, "order")
	if err != nil {
		t.Fatal(err)
	}
	if owner := y.Owner(); owner != "" {
		t.Fatalf("a read lease's Owner = %q, want none: read locks are not handed over", owner)
	}
	if _, err := w.Lock(y.Context(), "order"); !errors.Is(err, ErrUpgrade) || !errors.Is(err, ErrConfig) {
		t.Fatalf("a write under the read: %v, want ErrUpgrade (an ErrConfig)", err)
	}
	// The message names the key first and then what to do, so that it does not read as if the
	// key were a bad setting.
	if _, err := w.Lock(y.Context(), "order"); !strings.Contains(err.Error(), `would wait for it: "lock:order" (release the read lease first`) {
		t.Fatalf("a write under the read says %q, want the key and what to do", err)
	}
	again, err := r.Lock(y.Context(), "order")
	if err != nil || again.Grant() != GrantReentry {
		t.Fatalf("a read under the read: %v, want a re-entry", err)
	}
	_ = again.Release(ctx)
	// The mistake is told whatever the context: also once it ended.
	ended, cancel := context.WithCancel(y.Context())
	cancel()
	if _, err := w.Lock(ended, "order"); !errors.Is(err, ErrUpgrade) {
		t.Fatalf("a write under the read in an ended context: %v, want ErrUpgrade", err)
	}
	_ = y.Release(ctx)
}

// Options that cannot go together are refused.
func TestReadAndFairOptionsThatCannotGoTogetherAreRefused(t *testing.T) {
	s, _, _ := miniStore(t)
	for name, opts := range map[string][]Option{
		"read+fair":     {WithRead(), WithFair()},
		"read+permits":  {WithRead(), WithPermits(2)},
		"fair+permits":  {WithFair(), WithPermits(2)},
		"read+failopen": {WithRead(), WithFailOpen(true)},
	} {
		if _, err := New(s, opts...); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
}

// fairRun starts waiters for "order" while a holder keeps it, one at a time a few milliseconds
// apart, spread round-robin over lockers (processes), and returns the order they asked in and
// the order they were granted the key in.
func fairRun(t *testing.T, holder *Locker, lockers []*Locker, waiters int) (asked, granted []int) {
	t.Helper()
	ctx := context.Background()
	h, err := holder.Lock(ctx, "order")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	// The store's line says when a waiter has asked: the next one starts only then, so that
	// the order of asking is the order of i on a loaded machine too (a sleep between the starts
	// does not make a goroutine run).
	rdb := holder.Store().(*redisstore.RedisStore).Client().(redis.UniversalClient)
	line := lockstore.SideKey("line", holder.Prefix()+"order")
	for i := range waiters {
		l := lockers[i%len(lockers)]
		asked = append(asked, i)
		wg.Go(func() {
			lease, err := l.Lock(ctx, "order")
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			mu.Lock()
			granted = append(granted, i)
			mu.Unlock()
			time.Sleep(time.Millisecond)
			_ = lease.Release(ctx)
		})
		waitFor(t, 10*time.Second, fmt.Sprintf("waiter %d in the store's line", i), func() bool {
			n, err := rdb.ZCard(ctx, line).Result()
			return err == nil && n == int64(i+1)
		})
	}
	_ = h.Release(ctx)
	wg.Wait()
	return asked, granted
}

// Fair locks grant the key in request order across four processes, with several waiters in
// each: grant order equals the order the Locks began in.
func TestFairLocksGrantInRequestOrderAcrossProcesses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) lockstore.Store
	}{
		{"miniredis", func(t *testing.T) lockstore.Store { s, _, _ := miniStore(t); return s }},
		{"redis-server", func(t *testing.T) lockstore.Store { s, _, _ := realStore(t); return s }},
		{"redis-cluster", clusterStore},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := tc.store(t)
			var lockers []*Locker
			for range 4 {
				lockers = append(lockers, mustLocker(t, store, WithFair(), WithWait(30*time.Second)))
			}
			asked, granted := fairRun(t, mustLocker(t, store, WithFair()), lockers, 16)
			if !slices.Equal(asked, granted) {
				t.Fatalf("granted in order %v, asked in %v", granted, asked)
			}
		})
	}
}

// A fair waiter that gives up leaves the line at once: the one behind it is not held up for
// FairQueueTTL (its wait budget is shorter).
func TestFairWaiterThatGivesUpLeavesTheLine(t *testing.T) {
	s, _, _ := realStore(t)
	holder := mustLocker(t, s, WithFair())
	quitter := mustLocker(t, s, WithFair(), WithWait(30*time.Second))
	next := mustLocker(t, s, WithFair(), WithWait(FairQueueTTL/2))
	ctx := context.Background()
	h, err := holder.Lock(ctx, "order")
	if err != nil {
		t.Fatal(err)
	}
	qctx, quit := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	go func() { _, err := quitter.Lock(qctx, "order"); gaveUp <- err }()
	waitFor(t, 5*time.Second, "the first waiter in line", func() bool {
		n, _ := s.Client().(*redis.Client).ZCard(ctx, lockstore.SideKey("line", "lock:order")).Result()
		return n == 1
	})
	got := make(chan error, 1)
	go func() {
		x, err := next.Lock(ctx, "order")
		if err == nil {
			_ = x.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(20 * time.Millisecond) // the second waiter takes its place behind the first
	quit()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("the first waiter: %v, want its context's end", err)
	}
	_ = h.Release(ctx)
	if err := <-got; err != nil {
		t.Fatalf("the waiter behind one that gave up: %v", err)
	}
}

// A fair waiter whose process died (it stops looking) leaves the line by itself after its
// place's time; TryLock takes no place and is refused while others are in line.
func TestDeadFairWaiterLeavesTheLineAfterItsTime(t *testing.T) {
	s, _, _ := realStore(t)
	ctx := context.Background()
	holder := mustLocker(t, s, WithFair())
	h, err := holder.Lock(ctx, "order")
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Acquire(ctx, lockstore.Request{Key: "lock:order", Owner: "dead-waiter", TTL: 10 * time.Second, Asked: time.Now(), Queue: 300 * time.Millisecond})
	if err != nil || res.Acquired {
		t.Fatalf("the dead waiter's place: %+v, %v", res, err)
	}
	_ = h.Release(ctx)
	if _, err := mustLocker(t, s, WithFair()).TryLock(ctx, "order"); !errors.Is(err, ErrBusy) {
		t.Fatalf("TryLock with a waiter in line: %v, want ErrBusy", err)
	}
	x, err := mustLocker(t, s, WithFair(), WithWait(FairQueueTTL)).Lock(ctx, "order")
	if err != nil {
		t.Fatalf("a waiter behind a dead one: %v", err)
	}
	_ = x.Release(ctx)
}

// fairLooks records a store's fair acquisitions: when each was sent and by whom.
type fairLooks struct {
	*redisstore.RedisStore
	mu    sync.Mutex
	looks []fairLook
}

type fairLook struct {
	at    time.Time
	owner string
}

func (f *fairLooks) Acquire(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	if !req.Asked.IsZero() {
		f.mu.Lock()
		f.looks = append(f.looks, fairLook{time.Now(), req.Owner})
		f.mu.Unlock()
	}
	return f.RedisStore.Acquire(ctx, req)
}

// lookers counts the owners that looked in [from, to].
func (f *fairLooks) lookers(from, to time.Time) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	owners := map[string]bool{}
	for _, l := range f.looks {
		if !l.at.Before(from) && !l.at.After(to) {
			owners[l.owner] = true
		}
	}
	return len(owners)
}

// A release wakes one fair waiter per process, not all of them: the others of the process keep
// their places (a look every FairLookEvery) and look when they become its first. Between each
// release and the grant that follows it, only the process's first waiter looks (and, by chance,
// one keeping its place); waking all of them would send every waiter still in line.
func TestFairReleaseWakesOneWaiterPerProcess(t *testing.T) {
	s, _, _ := realStore(t)
	fl := &fairLooks{RedisStore: s}
	l := mustLocker(t, fl, WithFair(), WithWait(30*time.Second))
	ctx := context.Background()
	h, err := l.Lock(ctx, "order")
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 8
	var (
		mu       sync.Mutex
		releases []time.Time // releases[i] is followed by grants[i]
		grants   []time.Time
		wg       sync.WaitGroup
	)
	for range waiters {
		wg.Go(func() {
			x, err := l.Lock(ctx, "order")
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			grants = append(grants, time.Now())
			releases = append(releases, time.Now())
			mu.Unlock()
			_ = x.Release(ctx)
		})
	}
	waitFor(t, 5*time.Second, "every waiter in line", func() bool {
		n, _ := s.Client().(*redis.Client).ZCard(ctx, lockstore.SideKey("line", "lock:order")).Result()
		return n == waiters
	})
	mu.Lock()
	releases = append(releases, time.Now())
	mu.Unlock()
	_ = h.Release(ctx)
	wg.Wait()
	for i := range waiters {
		if n := fl.lookers(releases[len(releases)-waiters-1+i], grants[i]); n > 2 {
			t.Fatalf("%d waiters looked between release %d and the grant after it: a release woke more than the process's first", n, i)
		}
	}
}

// A read under a write handed over by an upstream service (its owner in the call's metadata)
// re-enters that write instead of waiting for it: a read of its own would wait for the write
// it runs under until its budget ran out.
func TestReadUnderAHandedOverWriteReentersIt(t *testing.T) {
	s, _, _ := miniStore(t)
	upstream := mustLocker(t, s)
	down := mustLocker(t, s, WithRead(), WithWait(200*time.Millisecond))
	ctx := context.Background()
	w, err := upstream.Lock(ctx, "order")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Release(ctx)
	r, err := down.Lock(withOwner(ctx, "lock:order", w.Owner()), "order")
	if err != nil {
		t.Fatalf("a read under the handed-over write: %v", err)
	}
	if r.Grant() != GrantBorrowed {
		t.Fatalf("the read's grant: %v, want a re-entry of the write (borrowed)", r.Grant())
	}
	_ = r.Release(ctx)
}

// countingStore counts a store's acquisitions (all kinds), keeping every other part of it.
type countingStore struct {
	*redisstore.RedisStore
	acquires atomic.Int64
}

func (c *countingStore) Acquire(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	c.acquires.Add(1)
	return c.RedisStore.Acquire(ctx, req)
}

// The readers of one process share one store read hold: while one holds the key, the others
// join it with no store command and the same fence; the last to leave releases it, and a writer
// then takes the key.
func TestReadersOfAProcessShareOneStoreHold(t *testing.T) {
	rs, _, _ := miniStore(t)
	s := &countingStore{RedisStore: rs}
	ctx := context.Background()
	w := mustLocker(t, s, WithMode(Reject))
	r, err := w.With(WithRead(), WithHandoff(DefaultHandoff, time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	var leases []*Lease
	for range 10 {
		lease, err := r.Lock(NewOwner(ctx), "doc")
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, lease)
	}
	if n := s.acquires.Load(); n != 1 {
		t.Fatalf("10 readers of one process made %d store acquisitions, want 1", n)
	}
	for _, l := range leases[1:] {
		if l.Fence() != leases[0].Fence() || l.Grant() != GrantShared {
			t.Fatalf("a joined reader: fence %d grant %v, want fence %d, shared", l.Fence(), l.Grant(), leases[0].Fence())
		}
	}
	if _, err := w.Lock(NewOwner(ctx), "doc"); !errors.Is(err, ErrBusy) {
		t.Fatalf("a write beside shared readers: %v, want ErrBusy", err)
	}
	for i, l := range leases {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if i < len(leases)-1 {
			if _, err := w.Lock(NewOwner(ctx), "doc"); !errors.Is(err, ErrBusy) {
				t.Fatalf("a write with %d readers left: %v, want ErrBusy", len(leases)-1-i, err)
			}
		}
	}
	// A writer that was refused marked the key: it may take it now, readers wait for it.
	x, err := w.Lock(NewOwner(ctx), "doc")
	if err != nil {
		t.Fatalf("the write after every reader left: %v", err)
	}
	if x.Fence() <= leases[0].Fence() {
		t.Fatalf("write fence %d not above the readers' %d", x.Fence(), leases[0].Fence())
	}
	_ = x.Release(ctx)
	if n := r.gateLen(); n != 0 {
		t.Fatalf("%d gate entries left", n)
	}
	r.k.gate.mu.Lock()
	left := len(r.k.gate.reads) + len(r.k.gate.borrowed)
	r.k.gate.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d shared read holds left after every reader left", left)
	}
}

// Writers keep their preference over readers that share: once a writer of the process is on
// its way to the key, new readers of the process do not join the readers' hold and wait behind
// it; and past the handoff window a reader asks the store, which makes it wait for a writer of
// another process that waits.
func TestSharedReadersStopJoiningWhenAWriterWaits(t *testing.T) {
	for _, tc := range []struct {
		name   string
		window time.Duration
		local  bool // the writer is of the readers' process
	}{
		{"writer of the process", time.Hour, true},
		{"writer of another process, past the window", 20 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _, _ := miniStore(t)
			ctx := context.Background()
			w := mustLocker(t, s, WithWait(10*time.Second), WithHandoff(DefaultHandoff, tc.window))
			if !tc.local {
				w = mustLocker(t, s, WithWait(10*time.Second))
			}
			readers := mustLocker(t, s, WithRead(), WithWait(150*time.Millisecond), WithHandoff(DefaultHandoff, tc.window))
			if tc.local {
				var err error
				if readers, err = w.With(WithRead(), WithWait(150*time.Millisecond)); err != nil {
					t.Fatal(err)
				}
			}
			first, err := readers.Lock(NewOwner(ctx), "doc")
			if err != nil {
				t.Fatal(err)
			}
			wrote := make(chan error, 1)
			go func() {
				x, err := w.Lock(NewOwner(ctx), "doc")
				if err == nil {
					err = x.Release(ctx)
				}
				wrote <- err
			}()
			// The writer waits: marked in the store (its first attempt found the reader), and,
			// for a writer of the process, in the gate of the process. Taking the gate comes
			// before that attempt lands: a reader that asks the store in between is not yet
			// told of the writer.
			waitFor(t, 5*time.Second, "the writer to wait", func() bool {
				if tc.local {
					w.k.gate.mu.Lock()
					e := w.k.gate.entries["lock:doc"]
					taken := e != nil && e.taken
					w.k.gate.mu.Unlock()
					if !taken {
						return false
					}
				}
				v, _ := s.Client().(*redis.Client).Get(ctx, "lock:doc").Result()
				return strings.HasSuffix(v, " ~")
			})
			if !tc.local {
				time.Sleep(2 * tc.window) // past the window of the readers' hold
			}
			if late, err := readers.Lock(NewOwner(ctx), "doc"); err == nil {
				_ = late.Release(ctx)
				t.Fatalf("a new reader got in (grant %v) while a writer waited", late.Grant())
			} else if !errors.Is(err, ErrBusy) {
				t.Fatalf("a new reader while a writer waits: %v, want ErrBusy", err)
			}
			if err := first.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-wrote; err != nil {
				t.Fatalf("the writer: %v", err)
			}
		})
	}
}

// slowReadStore holds every read acquisition until gate is closed, counting them.
type slowReadStore struct {
	*redisstore.RedisStore
	acquires atomic.Int64
	gate     chan struct{}
}

func (s *slowReadStore) Acquire(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	if lockstore.IsReadOwner(req.Owner) {
		s.acquires.Add(1)
		select {
		case <-s.gate:
		case <-ctx.Done():
			return lockstore.Acquisition{}, ctx.Err()
		}
	}
	return s.RedisStore.Acquire(ctx, req)
}

// Readers of one process that come while one of them is taking the key's store read hold wait
// for it and join it, instead of each taking a hold of its own: eight readers at once, one
// store acquisition, one fence, every reader inside together.
func TestReadersThatComeWhileOneTakesTheHoldJoinIt(t *testing.T) {
	rs, _, _ := miniStore(t)
	s := &slowReadStore{RedisStore: rs, gate: make(chan struct{})}
	ctx := context.Background()
	r := mustLocker(t, s, WithRead(), WithWait(10*time.Second), WithHandoff(DefaultHandoff, time.Hour))
	const readers = 8
	leases := make(chan *Lease, readers)
	for range readers {
		go func() {
			lease, err := r.Lock(NewOwner(ctx), "doc")
			if err != nil {
				t.Error(err)
			}
			leases <- lease
		}()
	}
	waitFor(t, 5*time.Second, "the first reader to ask the store", func() bool { return s.acquires.Load() == 1 })
	time.Sleep(50 * time.Millisecond) // the other readers arrive meanwhile
	close(s.gate)
	var fences []int64
	for range readers {
		lease := <-leases
		if lease == nil {
			t.FailNow()
		}
		defer lease.Release(ctx)
		fences = append(fences, lease.Fence())
	}
	if n := s.acquires.Load(); n != 1 {
		t.Fatalf("%d store read acquisitions for %d readers arriving together, want 1", n, readers)
	}
	if slices.Min(fences) != slices.Max(fences) {
		t.Fatalf("fences %v, want the one hold's", fences)
	}
}

// While a writer of the process holds the key, the process's readers queue in its gate and,
// when it is done, share its store lock all together (one grant, one fence above the write's),
// and a writer that came after them waits for them and takes it next: reads and writes of one
// process take turns on one store acquisition, with no store command.
func TestReadersAndWritersOfAProcessTakeTurnsOnOneStoreLock(t *testing.T) {
	rs, _, _ := miniStore(t)
	s := &countingStore{RedisStore: rs}
	ctx := context.Background()
	w := mustLocker(t, s, WithWait(10*time.Second), WithHandoff(DefaultHandoff, time.Hour))
	r, err := w.With(WithRead())
	if err != nil {
		t.Fatal(err)
	}
	first, err := w.Lock(NewOwner(ctx), "doc")
	if err != nil {
		t.Fatal(err)
	}
	if late, err := r.TryLock(NewOwner(ctx), "doc"); err == nil {
		t.Fatalf("a reader joined a write's grant (grant %v)", late.Grant())
	}
	const readers = 6
	reads := queueReaders(t, w, r, readers)
	wrote := make(chan *Lease, 1)
	go func() {
		lease, err := w.Lock(NewOwner(ctx), "doc")
		if err != nil {
			t.Error(err)
		}
		wrote <- lease
	}()
	waitFor(t, 5*time.Second, "the second writer to queue", func() bool { return w.queued("lock:doc") == readers+1 })
	if late, err := r.TryLock(NewOwner(ctx), "doc"); err == nil {
		t.Fatalf("a reader got in (grant %v) beside a write", late.Grant())
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	leases := receiveLeases(t, reads, readers)
	for _, lease := range leases {
		if lease.Fence() <= first.Fence() || lease.Fence() != leases[0].Fence() {
			t.Fatalf("reader fence %d, want one fence above the write's %d (first reader's %d)", lease.Fence(), first.Fence(), leases[0].Fence())
		}
		if lease.Owner() != "" {
			t.Fatal("a read lease gave out the owner token of the write lock it shares")
		}
	}
	// A writer waits: new readers queue behind it instead of joining.
	if late, err := r.TryLock(NewOwner(ctx), "doc"); err == nil {
		t.Fatalf("a reader joined (grant %v) while a writer waits", late.Grant())
	}
	if _, err := w.Lock(leases[0].Context(), "doc"); !errors.Is(err, ErrUpgrade) {
		t.Fatalf("a write under a read lease: %v, want ErrUpgrade", err)
	}
	select {
	case <-wrote:
		t.Fatal("the writer got in beside readers")
	case <-time.After(20 * time.Millisecond):
	}
	for _, l := range leases {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	second := <-wrote
	if second == nil {
		t.FailNow()
	}
	if second.Fence() <= leases[0].Fence() {
		t.Fatalf("write fence %d not above the readers' %d", second.Fence(), leases[0].Fence())
	}
	if err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := s.acquires.Load(); n != 1 {
		t.Fatalf("a write, %d reads and a write of one process made %d store acquisitions, want 1", readers, n)
	}
	waitFor(t, 5*time.Second, "the gate to empty", func() bool { return r.gateLen() == 0 })
}

// Readers that queued in the gate behind a writer of the process, with no writer behind them,
// go back to sharing a store read hold when the write lock goes back to the store (here: no
// handoff): a reader of another process then reads beside them.
func TestReadersLeftWithoutALocalWriterShareWithReadersElsewhere(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	w := mustLocker(t, s, WithWait(5*time.Second), WithHandoff(DefaultHandoff, 0))
	r, err := w.With(WithRead())
	if err != nil {
		t.Fatal(err)
	}
	other := mustLocker(t, s, WithRead(), WithMode(Reject))
	first, err := w.Lock(NewOwner(ctx), "doc")
	if err != nil {
		t.Fatal(err)
	}
	reads := queueReaders(t, w, r, 3)
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, l := range receiveLeases(t, reads, 3) {
		defer l.Release(ctx)
	}
	lease, err := other.Lock(NewOwner(ctx), "doc")
	if err != nil {
		t.Fatalf("a reader of another process beside the readers: %v", err)
	}
	_ = lease.Release(ctx)
}

// A readers' grant of a write lock is lost as any grant is: when the store refuses its
// renewal, every reader's lease ends with ErrLost, no new reader joins it, and once they are
// released the key is taken afresh in the store, with a larger fence.
func TestReadersSharingAWriteLockAllLoseItTogether(t *testing.T) {
	rs, mr, _ := miniStore(t)
	fs := &faultStore{Store: rs}
	ctx := context.Background()
	w := mustLocker(t, fs, WithTTL(300*time.Millisecond), WithWait(5*time.Second), WithHandoff(DefaultHandoff, time.Hour))
	r, err := w.With(WithRead())
	if err != nil {
		t.Fatal(err)
	}
	first, err := w.Lock(NewOwner(ctx), "doc")
	if err != nil {
		t.Fatal(err)
	}
	const readers = 3
	reads := queueReaders(t, w, r, readers)
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	leases := receiveLeases(t, reads, readers)
	notHeld := error(ErrNotHeld)
	fs.failRefresh.Store(&notHeld)
	mr.Del("lock:doc")
	waitFor(t, 5*time.Second, "every reader told of the loss", func() bool {
		for _, l := range leases {
			if l.Context().Err() == nil {
				return false
			}
		}
		return true
	})
	for _, l := range leases {
		if cause := context.Cause(l.Context()); !errors.Is(cause, ErrLost) {
			t.Fatalf("a reader's lease ended with %v, want ErrLost", cause)
		}
	}
	if late, err := r.TryLock(NewOwner(ctx), "doc"); err == nil {
		t.Fatalf("a new reader joined a lost grant (grant %v)", late.Grant())
	}
	fs.failRefresh.Store(nil)
	for _, l := range leases {
		if err := l.Release(ctx); err != nil && !errors.Is(err, ErrNotHeld) {
			t.Fatalf("release of a lost read lease: %v", err)
		}
	}
	next, err := w.Lock(NewOwner(ctx), "doc")
	if err != nil {
		t.Fatalf("a write after the lost readers released: %v", err)
	}
	if next.Context().Err() != nil || next.Fence() <= leases[0].Fence() {
		t.Fatalf("the write after the loss: context %v, fence %d, want live and above %d", next.Context().Err(), next.Fence(), leases[0].Fence())
	}
	_ = next.Release(ctx)
	waitFor(t, 5*time.Second, "the gate to empty", func() bool { return w.gateLen() == 0 })
}

// queueReaders has n readers of r (a reader of w's gate) ask for "doc" while a writer of w
// holds it, and returns their leases' channel once all n wait in the gate.
func queueReaders(t *testing.T, w, r *Locker, n int) <-chan *Lease {
	t.Helper()
	reads := make(chan *Lease, n)
	for range n {
		go func() {
			lease, err := r.Lock(NewOwner(context.Background()), "doc")
			if err != nil {
				t.Error(err)
			}
			reads <- lease
		}()
	}
	waitFor(t, 5*time.Second, "the readers to queue", func() bool { return w.queued("lock:doc") == n })
	return reads
}

// receiveLeases takes n readers' leases from reads; a reader that got none failed the test.
func receiveLeases(t *testing.T, reads <-chan *Lease, n int) []*Lease {
	t.Helper()
	leases := make([]*Lease, 0, n)
	for range n {
		lease := <-reads
		if lease == nil {
			t.FailNow()
		}
		leases = append(leases, lease)
	}
	return leases
}

// Readers and writers of two processes, with waits cut short at random, TryLocks and nested
// writes under reads, never overlap a write, whatever the handoff bounds (which decide when
// readers share a writer's lock, and when the lock goes back to the store): a read lease gives
// out no owner token, a write under a read is refused, and both gates empty at the end.
func TestReadersAndWritersNeverOverlapUnderAnyHandoffBounds(t *testing.T) {
	for _, hb := range []struct {
		n      int
		window time.Duration
	}{{DefaultHandoff, 3 * time.Millisecond}, {0, 0}, {2, time.Second}, {DefaultHandoff, 50 * time.Microsecond}} {
		t.Run(fmt.Sprintf("%d handoffs within %v", hb.n, hb.window), func(t *testing.T) {
			s, _, _ := miniStore(t)
			ctx := context.Background()
			var readers, writers, overlaps atomic.Int32
			var procs [][2]*Locker
			for range 2 {
				w := mustLocker(t, s, WithWait(300*time.Millisecond), WithHandoff(hb.n, hb.window))
				r, err := w.With(WithRead())
				if err != nil {
					t.Fatal(err)
				}
				procs = append(procs, [2]*Locker{w, r})
			}
			end := time.Now().Add(time.Second)
			var wg sync.WaitGroup
			for _, p := range procs {
				for range 4 {
					wg.Go(func() {
						for time.Now().Before(end) {
							read := rand.IntN(10) < 7
							l := p[0]
							if read {
								l = p[1]
							}
							lctx, cancel := context.WithTimeout(NewOwner(ctx), time.Duration(rand.IntN(400))*time.Millisecond)
							lock := l.Lock
							if rand.IntN(8) == 0 {
								lock = l.TryLock
							}
							lease, err := lock(lctx, "k")
							if err != nil {
								cancel()
								continue
							}
							if read {
								readers.Add(1)
								if writers.Load() != 0 {
									overlaps.Add(1)
								}
								if lease.Owner() != "" {
									t.Errorf("a read lease gave out an owner token (grant %v)", lease.Grant())
								}
								if rand.IntN(20) == 0 {
									if _, err := p[0].Lock(lease.Context(), "k"); !errors.Is(err, ErrUpgrade) {
										t.Errorf("a write under a read: %v, want ErrUpgrade", err)
									}
								}
							} else if writers.Add(1) != 1 || readers.Load() != 0 {
								overlaps.Add(1)
							}
							time.Sleep(time.Duration(rand.IntN(1000)) * time.Microsecond)
							if read {
								readers.Add(-1)
							} else {
								writers.Add(-1)
							}
							if err := lease.Release(ctx); err != nil {
								t.Errorf("Release: %v", err)
							}
							cancel()
						}
					})
				}
			}
			wg.Wait()
			if n := overlaps.Load(); n > 0 {
				t.Fatalf("a write overlapped a read or a write %d times", n)
			}
			for _, p := range procs {
				waitFor(t, 3*time.Second, "the gate to empty", func() bool { return p[0].gateLen() == 0 })
			}
		})
	}
}

// A fair waiter that asked before its process's head, but joined the process's line after it,
// is itself a head: the store keeps the free key for it, and a waiter that is no head would
// look only every FairLookEvery, holding up the whole line that long. So is every waiter that
// asked in the first's microsecond, which the store may rank first.
func TestFairWaiterThatAskedBeforeTheHeadIsAHead(t *testing.T) {
	g := newGate()
	t0 := time.Now()
	later := g.joinFair("k", "b", t0.Add(time.Millisecond))
	if !later.isHead() {
		t.Fatal("the only waiter is not the head")
	}
	first := g.joinFair("k", "z", t0)
	if !first.isHead() {
		t.Fatal("a waiter that asked before the head, and joined after it, is not a head")
	}
	sameMicro := t0.Truncate(time.Microsecond).Add(999) // first's microsecond, not before it
	tie := g.joinFair("k", "a", sameMicro)
	if !tie.isHead() {
		t.Fatal("a waiter that asked in the head's microsecond with a smaller owner, which Redis ranks first, is not a head")
	}
	tieAfter := g.joinFair("k", "zz", sameMicro)
	if !tieAfter.isHead() {
		t.Fatal("a waiter that asked in the head's microsecond, which a store ranking by arrival may put first, is not a head")
	}
	last := g.joinFair("k", "c", t0.Add(2*time.Millisecond))
	if last.isHead() {
		t.Fatal("the last waiter is a head")
	}
	for _, w := range []*fairWaiter{first, tie, tieAfter, later} {
		g.leaveFair("k", w)
	}
	if !last.isHead() {
		t.Fatal("the only waiter left is not the head")
	}
	g.leaveFair("k", last)
	if len(g.fair) != 0 {
		t.Fatalf("the lines of keys with no waiter are kept: %v", g.fair)
	}
}
