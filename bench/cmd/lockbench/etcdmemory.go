package main

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/bench/internal/guard"
	"github.com/flightlock/flightlock/bench/internal/memstat"
	"github.com/flightlock/flightlock/etcdstore"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Scenario 9 on etcd: what each held lock and each waiter costs, as for the Redis rows. One
// repetition: these are counts, not timings.
//
// Holding: this process takes c.memLocks locks on distinct keys (s9Acquirers goroutines at
// once), holds them for c.d9hold and releases them all. flightlock runs as users run it: a
// Locker of its own on the etcd store, its watchdog renewing every lock every TTL/3 and the
// store keeping its session lease alive; concurrency.Mutex holds a Mutex per key on one
// session (whose lease its client keeps alive). Measured: live heap and goroutines above the
// row's baseline while holding and after releasing, the peak goroutine count while holding,
// etcd's resident memory growth, and client CPU, etcd RPCs and keep-alives per second while
// holding.
//
// Waiting: one key is held by the benchmark; c.memWaiters goroutines wait for it; after
// s9Settle their heap and goroutines are measured, then the RPCs, keep-alives and CPU of
// s9WaitWindow of waiting; then the key is released, and each waiter, once granted, runs the
// critical section's checks and releases at once. Measured: the time from the release to the
// first grant and to the last.

// etcdHoldWarm is how many locks are taken and released before a holding row's baseline, at
// the same concurrency.
const etcdHoldWarm = 1000

// holdResult is one row of scenario 9's holding table.
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

// waitResult is one row of scenario 9's waiting table.
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

func (b *etcdBench) memory() *memoryResults {
	out := &memoryResults{}
	for _, n := range b.c.memLocks {
		for _, row := range []string{rowFlight, rowMutex} {
			var h holdResult
			if row == rowFlight {
				h = b.holdFlight(n)
			} else {
				h = b.holdMutex(n)
			}
			out.hold = append(out.hold, h)
			progress("s9 hold %d %-10s %.0f B/lock, %.3f goroutines/lock, peak +%d, etcd RSS %.0f B/lock, CPU %.1f ms/s, %.0f RPC/s, %.1f keep-alives/s; after release %.1f B/lock, %+d goroutines; errors %d %v",
				n, row, h.heap, h.gor, h.peakGor, h.etcdRSS, h.cpuMs, h.rpcs, h.keepAlives, h.afterHeap, h.afterGor, h.errors+h.releaseFails, errText(h.firstErr))
		}
	}
	if w := b.c.memWaiters; w > 0 {
		for _, row := range []string{rowFlight, rowMutex} {
			var r waitResult
			if row == rowFlight {
				r = b.waitFlight(w)
			} else {
				r = b.waitMutex(w)
			}
			out.wait = append(out.wait, r)
			progress("s9 wait %d %-10s %.0f B/waiter, %.2f goroutines/waiter, %.1f RPC/s, next grant %s, all served %s, served %d, violations %d/%d, errors %d %v",
				w, row, r.heap, r.gor, r.rpcs, etcdDur(r.next), etcdDur(r.all), r.served, r.violations, r.fenceViolations, r.errors, errText(r.firstErr))
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
func (b *etcdBench) bounded(fn func(ctx context.Context, i int) error) func(i int) error {
	return func(i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), b.c.lockTimeout)
		defer cancel()
		return fn(ctx, i)
	}
}

// holdFlight holds n locks with a Locker and store of their own (their baseline and what
// stays after release are theirs alone), on the benchmark's etcd client.
func (b *etcdBench) holdFlight(n int) holdResult {
	store, l, err := newEtcdFlightlock(b.cli, b.c.lockTimeout)
	if err != nil {
		fatalf("scenario 9: %v", err)
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
func (b *etcdBench) holdMutex(n int) holdResult {
	sess, err := concurrency.NewSession(b.cli, concurrency.WithTTL(leaseSeconds))
	if err != nil {
		fatalf("scenario 9: mutex session: %v", err)
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

// hold measures one holding row: warm (up to etcdHoldWarm locks of other keys taken and released
// at the same concurrency, so the client's buffers and the row's lease are in place before the
// baseline), then lock all n, hold, unlock all. keepAlive keeps the row's keys and handle
// slices, built before the baseline, live through all three measurements.
func (b *etcdBench) hold(row string, n int, warm, lock, unlock func(ctx context.Context, i int) error, keepAlive func()) holdResult {
	h := holdResult{row: row, n: n, window: b.c.d9hold}
	memstat.Parallel(min(n, etcdHoldWarm), s9Acquirers, b.bounded(warm))
	var d serverStats
	m := memstat.Hold(memstat.Holding{
		N: n, Acquirers: s9Acquirers,
		Lock: b.bounded(lock), Unlock: b.bounded(unlock),
		ServerMemory: b.srv.rss,
		Window: func() {
			s0 := b.srv.stats()
			time.Sleep(b.c.d9hold)
			d = b.srv.stats().sub(s0)
		},
	})
	keepAlive()
	l0, l1, l2 := m.Base, m.Holding, m.After
	h.acquire, h.release = m.Acquire, m.Release
	h.errors, h.releaseFails, h.firstErr = m.LockErrors, m.UnlockErrors, m.FirstErr
	h.peakGor = m.PeakGoroutines - l0.Goroutines
	fn := float64(n)
	h.heap, h.stack, h.gor = (l1.Heap-l0.Heap)/fn, (l1.Stack-l0.Stack)/fn, float64(l1.Goroutines-l0.Goroutines)/fn
	if m.ServerBefore > 0 && m.ServerHolding > 0 {
		h.etcdRSS = float64(m.ServerHolding-m.ServerBefore) / fn
	}
	h.cpuMs = float64(d.self.Microseconds()) / 1e3 / b.c.d9hold.Seconds()
	h.rpcs, h.keepAlives = d.rpcs/b.c.d9hold.Seconds(), d.keepAlives/b.c.d9hold.Seconds()
	h.afterHeap, h.afterGor = (l2.Heap-l0.Heap)/fn, l2.Goroutines-l0.Goroutines
	return h
}

// waitFlight: a Locker of its own holds the key; w goroutines of this process wait on it
// through the same Locker, as a service's concurrent requests for one key do.
func (b *etcdBench) waitFlight(w int) waitResult {
	store, l, err := newEtcdFlightlock(b.cli, b.c.lockTimeout)
	if err != nil {
		fatalf("scenario 9: %v", err)
	}
	defer closeFlightlock(store, l)
	ctx, cancel := context.WithTimeout(context.Background(), b.c.lockTimeout)
	defer cancel()
	for i := range 10 { // the store's lease and the Locker's paths in place before the baseline
		lease, err := l.Lock(ctx, fmt.Sprintf("m6ww-%d", i))
		if err != nil {
			fatalf("scenario 9: warm-up: %v", err)
		}
		_ = lease.Release(ctx)
	}
	key := fmt.Sprintf("m6wait-%d", w)
	held, err := l.Lock(ctx, key)
	if err != nil {
		fatalf("scenario 9: hold %s: %v", key, err)
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
func (b *etcdBench) waitMutex(w int) waitResult {
	holder, err := concurrency.NewSession(b.cli, concurrency.WithTTL(leaseSeconds))
	if err != nil {
		fatalf("scenario 9: mutex session: %v", err)
	}
	defer holder.Close()
	ctx, cancel := context.WithTimeout(context.Background(), b.c.lockTimeout)
	defer cancel()
	key := fmt.Sprintf("/mutex/m6wait-%d", w)
	held := concurrency.NewMutex(holder, key)
	if err := held.Lock(ctx); err != nil {
		fatalf("scenario 9: hold %s: %v", key, err)
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
func (b *etcdBench) wait(row string, w int, heldFence int64, prepare func() error,
	lock func(ctx context.Context, i int) (int64, error), unlock func(ctx context.Context, i int) error,
	release func(ctx context.Context) error,
) waitResult {
	r := waitResult{row: row, w: w, sessionHeap: -1, sessionGor: -1}
	g := guard.New()
	g.Enter(heldFence) // the benchmark is inside until it releases: a waiter granted before is a violation
	if prepare != nil {
		l0 := memstat.Live()
		if err := prepare(); err != nil {
			fatalf("scenario 9: %v", err)
		}
		lp := memstat.Live()
		r.sessionHeap, r.sessionGor = (lp.Heap-l0.Heap)/float64(w), float64(lp.Goroutines-l0.Goroutines)/float64(w)
	}
	fences := make([]int64, w)
	var d serverStats
	m := memstat.Wait(memstat.Waiting{
		W: w, Arrive: s9Arrive, Settle: s9Settle, Bound: s9Settle + s9WaitWindow + s9ServeBound,
		Lock: func(ctx context.Context, i int) (err error) {
			fences[i], err = lock(ctx, i)
			return err
		},
		Granted: func(i int) { g.Critical(fences[i]) },
		Unlock: func(i int) error {
			ctx, cancel := context.WithTimeout(context.Background(), b.c.lockTimeout)
			defer cancel()
			if err := unlock(ctx, i); err != nil {
				return fmt.Errorf("release: %w", err)
			}
			return nil
		},
		Window: func() {
			s0 := b.srv.stats()
			time.Sleep(s9WaitWindow)
			d = b.srv.stats().sub(s0)
		},
		Release: func() error {
			g.Exit()
			ctx, cancel := context.WithTimeout(context.Background(), b.c.lockTimeout)
			defer cancel()
			if err := release(ctx); err != nil {
				return fmt.Errorf("release of the held key: %w", err)
			}
			return nil
		},
	})
	l0, l1 := m.Base, m.Waiting
	fw := float64(w)
	r.heap, r.stack, r.gor = (l1.Heap-l0.Heap)/fw, (l1.Stack-l0.Stack)/fw, float64(l1.Goroutines-l0.Goroutines)/fw
	r.rpcs, r.keepAlives = d.rpcs/s9WaitWindow.Seconds(), d.keepAlives/s9WaitWindow.Seconds()
	r.cpuMs = float64(d.self.Microseconds()) / 1e3 / s9WaitWindow.Seconds()
	r.served, r.errors, r.firstErr = m.Served, m.Errors, m.FirstErr
	r.violations, r.fenceViolations = g.Violations(), g.FenceViolations()
	r.next, r.all = m.Next, m.All
	return r
}

// closeFlightlock drains a Locker of scenario 9 (or of a worker) and closes its store (revoking its lease).
func closeFlightlock(store *etcdstore.Store, l *flightlock.Locker) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = l.Drain(ctx)
	_ = store.Close()
}
