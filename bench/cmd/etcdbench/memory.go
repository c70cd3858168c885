package main

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/bench/internal/memstat"
	"github.com/flightlock/flightlock/etcdstore"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Scenario 6: what each held lock and each waiter costs (the memory scenario, on etcd;
// lockbench's scenario 9 is the Redis twin). One repetition: these are counts, not timings.
//
// Holding: this process takes c.memLocks locks on distinct keys (s6Acquirers goroutines at
// once), holds them for c.d6hold and releases them all. flightlock runs as users run it: a
// Locker of its own on the etcd store, its watchdog renewing every lock every TTL/3 and the
// store keeping its session lease alive; concurrency.Mutex holds a Mutex per key on one
// session (whose lease its client keeps alive). Measured: live heap and goroutines above the
// row's baseline while holding and after releasing, the peak goroutine count while holding,
// etcd's resident memory growth, and client CPU, etcd RPCs and keep-alives per second while
// holding.
//
// Waiting: one key is held by the benchmark; c.memWait goroutines wait for it; after
// s6Settle their heap and goroutines are measured, then the RPCs, keep-alives and CPU of
// s6WaitWindow of waiting; then the key is released, and each waiter, once granted, runs the
// critical section's checks and releases at once. Measured: the time from the release to the
// first grant and to the last.

const (
	s6Acquirers  = 32   // goroutines taking (and releasing) the held locks, as lockbench's scenario 9
	s6Warm       = 1000 // locks taken and released before a row's baseline, at the same concurrency
	s6Settle     = 500 * time.Millisecond
	s6Arrive     = 250 * time.Millisecond // waiters arrive spread over this, within the settling
	s6WaitWindow = time.Second
	s6ServeBound = 30 * time.Second // bound of a waiter's Lock past the settling and the window
)

// holdResult is one row of scenario 6's holding table.
type holdResult struct {
	row                  string
	n                    int
	acquire, release     time.Duration // taking all n locks, releasing all of them
	heap, stack, gor     float64       // per held lock, above the baseline
	peakGor              int           // highest goroutine count above the baseline while holding
	etcdRSS              float64       // etcd's resident memory growth per held lock (bytes)
	window               time.Duration // how long the locks were held while measured
	cpuMs                float64       // this process's CPU, ms per second of the window
	rpcs, keepAlives     float64       // per second of the window
	afterHeap            float64       // per lock, above the baseline after releasing all
	afterGor             int           // above the baseline after releasing all
	errors, releaseFails int64
	firstErr             error
}

// waitResult is one row of scenario 6's waiting table.
type waitResult struct {
	row                         string
	w                           int
	sessionHeap, sessionGor     float64 // per waiter: the Mutex session each needs (-1: none)
	heap, stack, gor            float64 // per waiter, above the baseline while waiting
	rpcs, keepAlives, cpuMs     float64 // per second while waiting
	next, all                   time.Duration
	served, errors              int64
	violations, fenceViolations int64
	firstErr                    error
}

type memoryResults struct {
	hold []holdResult
	wait []waitResult
}

func (b *bench) memory() *memoryResults {
	out := &memoryResults{}
	if n := b.c.memLocks; n > 0 {
		for _, row := range []string{rowFlight, rowMutex} {
			var h holdResult
			if row == rowFlight {
				h = b.holdFlight(n)
			} else {
				h = b.holdMutex(n)
			}
			out.hold = append(out.hold, h)
			progress("  6 hold %d %-10s %.0f B/lock, %.3f goroutines/lock, peak +%d, etcd RSS %.0f B/lock, CPU %.1f ms/s, %.0f RPC/s, %.1f keep-alives/s; after release %.1f B/lock, %+d goroutines; errors %d %v",
				n, row, h.heap, h.gor, h.peakGor, h.etcdRSS, h.cpuMs, h.rpcs, h.keepAlives, h.afterHeap, h.afterGor, h.errors+h.releaseFails, errText(h.firstErr))
		}
	}
	if w := b.c.memWait; w > 0 {
		for _, row := range []string{rowFlight, rowMutex} {
			var r waitResult
			if row == rowFlight {
				r = b.waitFlight(w)
			} else {
				r = b.waitMutex(w)
			}
			out.wait = append(out.wait, r)
			progress("  6 wait %d %-10s %.0f B/waiter, %.2f goroutines/waiter, %.1f RPC/s, next grant %s, all served %s, served %d, violations %d/%d, errors %d %v",
				w, row, r.heap, r.gor, r.rpcs, dur(r.next), dur(r.all), r.served, r.violations, r.fenceViolations, r.errors, errText(r.firstErr))
		}
	}
	return out
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return "(first: " + err.Error() + ")"
}

// bounded runs fn(ctx, i) under a context bounded at lockTO, so no call can hang the run.
func (b *bench) bounded(fn func(ctx context.Context, i int) error) func(i int) error {
	return func(i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), b.c.lockTO)
		defer cancel()
		return fn(ctx, i)
	}
}

// holdFlight holds n locks with a Locker and store of their own (their baseline and what
// stays after release are theirs alone), on the benchmark's etcd client.
func (b *bench) holdFlight(n int) holdResult {
	store, l, err := newFlightlock(b.cli, b.c.lockTO)
	if err != nil {
		fatalf("scenario 6: %v", err)
	}
	defer closeFlightlock(store, l)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("m6h-%d", i)
	}
	leases := make([]*flightlock.Lease, n)
	return b.hold(rowFlight, n,
		func(ctx context.Context, i int) error {
			lease, err := l.Lock(ctx, fmt.Sprintf("m6w-%d", i))
			if err != nil {
				return err
			}
			return lease.Release(ctx)
		},
		func(ctx context.Context, i int) (err error) {
			leases[i], err = l.Lock(ctx, keys[i])
			return err
		},
		func(ctx context.Context, i int) error {
			if leases[i] == nil {
				return nil
			}
			err := leases[i].Release(ctx)
			leases[i] = nil
			return err
		},
		func() { runtime.KeepAlive(keys); runtime.KeepAlive(leases) })
}

// holdMutex holds n concurrency.Mutexes on distinct keys, all on one session of their own.
func (b *bench) holdMutex(n int) holdResult {
	sess, err := concurrency.NewSession(b.cli, concurrency.WithTTL(leaseSeconds))
	if err != nil {
		fatalf("scenario 6: mutex session: %v", err)
	}
	defer sess.Close()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("/mutex/m6h-%d", i)
	}
	ms := make([]*concurrency.Mutex, n)
	return b.hold(rowMutex, n,
		func(ctx context.Context, i int) error {
			m := concurrency.NewMutex(sess, fmt.Sprintf("/mutex/m6w-%d", i))
			if err := m.Lock(ctx); err != nil {
				return err
			}
			return m.Unlock(ctx)
		},
		func(ctx context.Context, i int) error {
			m := concurrency.NewMutex(sess, keys[i])
			if err := m.Lock(ctx); err != nil {
				return err
			}
			ms[i] = m
			return nil
		},
		func(ctx context.Context, i int) error {
			if ms[i] == nil {
				return nil
			}
			err := ms[i].Unlock(ctx)
			ms[i] = nil
			return err
		},
		func() { runtime.KeepAlive(keys); runtime.KeepAlive(ms) })
}

// hold measures one holding row: warm (up to s6Warm locks of other keys taken and released
// at the same concurrency, so the client's buffers and the row's lease are in place before the
// baseline), then lock all n, hold, unlock all. keepAlive keeps the row's keys and handle
// slices, built before the baseline, live through all three measurements.
func (b *bench) hold(row string, n int, warm, lock, unlock func(ctx context.Context, i int) error, keepAlive func()) holdResult {
	h := holdResult{row: row, n: n, window: b.c.d6hold}
	memstat.Parallel(min(n, s6Warm), s6Acquirers, b.bounded(warm))
	rss0 := b.srv.rss()
	l0 := memstat.Live()

	t0 := time.Now()
	h.errors, h.firstErr = memstat.Parallel(n, s6Acquirers, b.bounded(lock))
	h.acquire = time.Since(t0)
	memstat.SettleGoroutines(l0.Goroutines, time.Second) // the acquirers
	l1 := memstat.Live()
	rss1 := b.srv.rss()

	peak := memstat.PeakSampler()
	s0 := b.srv.stats()
	time.Sleep(b.c.d6hold)
	s1 := b.srv.stats()
	h.peakGor = peak() - l0.Goroutines

	t1 := time.Now()
	var firstErr error
	h.releaseFails, firstErr = memstat.Parallel(n, s6Acquirers, b.bounded(unlock))
	h.release = time.Since(t1)
	if h.firstErr == nil {
		h.firstErr = firstErr
	}
	memstat.SettleGoroutines(l0.Goroutines, 2*time.Second) // goroutines a release ends exit on their own schedule
	l2 := memstat.Live()
	keepAlive()

	fn := float64(n)
	h.heap, h.stack, h.gor = (l1.Heap-l0.Heap)/fn, (l1.Stack-l0.Stack)/fn, float64(l1.Goroutines-l0.Goroutines)/fn
	if rss0 > 0 && rss1 > 0 {
		h.etcdRSS = float64(rss1-rss0) / fn
	}
	d := s1.sub(s0)
	h.cpuMs = float64(d.self.Microseconds()) / 1e3 / b.c.d6hold.Seconds()
	h.rpcs, h.keepAlives = d.rpcs/b.c.d6hold.Seconds(), d.keepAlives/b.c.d6hold.Seconds()
	h.afterHeap, h.afterGor = (l2.Heap-l0.Heap)/fn, l2.Goroutines-l0.Goroutines
	return h
}

// waitFlight: a Locker of its own holds the key; w goroutines of this process wait on it
// through the same Locker, as a service's concurrent requests for one key do.
func (b *bench) waitFlight(w int) waitResult {
	store, l, err := newFlightlock(b.cli, b.c.lockTO)
	if err != nil {
		fatalf("scenario 6: %v", err)
	}
	defer closeFlightlock(store, l)
	ctx, cancel := context.WithTimeout(context.Background(), b.c.lockTO)
	defer cancel()
	for i := range 10 { // the store's lease and the Locker's paths in place before the baseline
		lease, err := l.Lock(ctx, fmt.Sprintf("m6ww-%d", i))
		if err != nil {
			fatalf("scenario 6: warm-up: %v", err)
		}
		_ = lease.Release(ctx)
	}
	key := fmt.Sprintf("m6wait-%d", w)
	held, err := l.Lock(ctx, key)
	if err != nil {
		fatalf("scenario 6: hold %s: %v", key, err)
	}
	leases := make([]*flightlock.Lease, w)
	r := b.wait(rowFlight, w, held.Fence(), nil,
		func(ctx context.Context, i int) (int64, error) {
			lease, err := l.Lock(ctx, key)
			if err != nil {
				return 0, err
			}
			leases[i] = lease
			return lease.Fence(), nil
		},
		func(ctx context.Context, i int) error { return leases[i].Release(ctx) },
		held.Release)
	return r
}

// waitMutex: one session holds the key; each of the w waiters needs a session of its own (two
// Mutexes of one session on one key are the same holder: both would be granted), made after
// the baseline and measured apart from the waiting itself.
func (b *bench) waitMutex(w int) waitResult {
	holder, err := concurrency.NewSession(b.cli, concurrency.WithTTL(leaseSeconds))
	if err != nil {
		fatalf("scenario 6: mutex session: %v", err)
	}
	defer holder.Close()
	ctx, cancel := context.WithTimeout(context.Background(), b.c.lockTO)
	defer cancel()
	key := fmt.Sprintf("/mutex/m6wait-%d", w)
	held := concurrency.NewMutex(holder, key)
	if err := held.Lock(ctx); err != nil {
		fatalf("scenario 6: hold %s: %v", key, err)
	}
	sessions := make([]*concurrency.Session, w)
	defer func() {
		memstat.Parallel(w, sessionMakers, func(i int) error {
			if sessions[i] == nil {
				return nil
			}
			return sessions[i].Close()
		})
	}()
	ms := make([]*concurrency.Mutex, w)
	return b.wait(rowMutex, w, 0,
		func() error {
			errs, first := memstat.Parallel(w, sessionMakers, func(i int) (err error) {
				sessions[i], err = concurrency.NewSession(b.cli, concurrency.WithTTL(leaseSeconds))
				return err
			})
			if errs > 0 {
				return fmt.Errorf("%d of %d waiter sessions: %w", errs, w, first)
			}
			return nil
		},
		func(ctx context.Context, i int) (int64, error) {
			ms[i] = concurrency.NewMutex(sessions[i], key)
			return 0, ms[i].Lock(ctx)
		},
		func(ctx context.Context, i int) error { return ms[i].Unlock(ctx) },
		held.Unlock)
}

// wait measures one waiting row. The key is held (with fence heldFence, 0: none) when it is
// called; prepare (nil: none) makes what each waiter needs before it can wait, measured apart;
// release gives the held key up.
func (b *bench) wait(row string, w int, heldFence int64, prepare func() error,
	lock func(ctx context.Context, i int) (int64, error), unlock func(ctx context.Context, i int) error,
	release func(ctx context.Context) error,
) waitResult {
	r := waitResult{row: row, w: w, sessionHeap: -1, sessionGor: -1}
	g := newLocalGuard()
	g.enter(heldFence) // the benchmark is inside until it releases: a waiter granted before is a violation
	l0 := memstat.Live()
	if prepare != nil {
		if err := prepare(); err != nil {
			fatalf("scenario 6: %v", err)
		}
		lp := memstat.Live()
		r.sessionHeap, r.sessionGor = (lp.Heap-l0.Heap)/float64(w), float64(lp.Goroutines-l0.Goroutines)/float64(w)
		l0 = lp
	}

	ctx, cancel := context.WithTimeout(context.Background(), s6Settle+s6WaitWindow+s6ServeBound)
	defer cancel()
	var (
		first, last, served, errs atomic.Int64
		errMu                     sync.Mutex
		firstErr                  error
		wg                        sync.WaitGroup
	)
	fail := func(err error) {
		errs.Add(1)
		errMu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		errMu.Unlock()
	}
	first.Store(1 << 62)
	for i := range w {
		wg.Go(func() {
			// Arrivals spread over s6Arrive, as requests come.
			time.Sleep(time.Duration(i) * s6Arrive / time.Duration(w))
			fence, err := lock(ctx, i)
			if err != nil {
				fail(err)
				return
			}
			at := time.Now().UnixNano()
			g.critical(fence)
			for v := first.Load(); at < v && !first.CompareAndSwap(v, at); v = first.Load() {
			}
			for v := last.Load(); at > v && !last.CompareAndSwap(v, at); v = last.Load() {
			}
			served.Add(1)
			uctx, ucancel := context.WithTimeout(context.Background(), b.c.lockTO)
			defer ucancel()
			if err := unlock(uctx, i); err != nil {
				fail(fmt.Errorf("release: %w", err))
			}
		})
	}
	time.Sleep(s6Settle)
	l1 := memstat.Live()
	s0 := b.srv.stats()
	time.Sleep(s6WaitWindow)
	d := b.srv.stats().sub(s0)

	g.exit()
	t0 := time.Now().UnixNano()
	rctx, rcancel := context.WithTimeout(context.Background(), b.c.lockTO)
	if err := release(rctx); err != nil {
		fail(fmt.Errorf("release of the held key: %w", err))
	}
	rcancel()
	wg.Wait()

	fw := float64(w)
	r.heap, r.stack, r.gor = (l1.Heap-l0.Heap)/fw, (l1.Stack-l0.Stack)/fw, float64(l1.Goroutines-l0.Goroutines)/fw
	r.rpcs, r.keepAlives = d.rpcs/s6WaitWindow.Seconds(), d.keepAlives/s6WaitWindow.Seconds()
	r.cpuMs = float64(d.self.Microseconds()) / 1e3 / s6WaitWindow.Seconds()
	r.served, r.errors, r.firstErr = served.Load(), errs.Load(), firstErr
	r.violations, r.fenceViolations = *g.violations, *g.fenceViolations
	if r.served > 0 {
		r.next, r.all = time.Duration(first.Load()-t0), time.Duration(last.Load()-t0)
	}
	return r
}

// closeFlightlock drains a Locker of scenario 6 and closes its store (revoking its lease).
func closeFlightlock(store *etcdstore.Store, l *flightlock.Locker) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = l.Drain(ctx)
	_ = store.Close()
}
