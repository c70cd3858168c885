package main

import (
	"cmp"
	"context"
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/flightlock/flightlock/bench/internal/guard"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
	"github.com/flightlock/flightlock/bench/internal/memstat"
)

// Scenario 9: what each held lock and each waiter costs (s9Section says what is measured).
// Rows that renew (flightlock's watchdog, rueidislock's extend loop) hold for d9hold, long
// enough for every lock to be renewed; rows that cannot renew hold for at most s9HoldNoRenew,
// since their keys would expire.

const (
	s9Acquirers   = 32
	s9Warm        = 10000 // locks taken and released before a row's baseline (holdOn)
	s9HoldNoRenew = 2 * time.Second
	s9Settle      = 500 * time.Millisecond
	s9Arrive      = 250 * time.Millisecond // waiters arrive spread over this, within the settling
	s9WaitWindow  = time.Second            // settle + window stay well inside rueidisWait
	s9ServeBound  = 30 * time.Second
)

// renews says how a Redis row keeps its locks alive while held.
var renews = map[string]string{
	"flightlock":  "watchdog: every TTL/3, renewals due together pipelined",
	"rueidislock": "a goroutine per lock, every KeyValidity/2",
	"redislock":   "none (Refresh exists, called by hand; not run here)",
	"redsync":     "none (Extend exists, called by hand; not run here)",
	"gozero":      "none",
}

// s9Results are scenario 9's holding rows by locks held, and its waiting rows with w waiters,
// one repetition each.
type s9Results struct {
	Held    map[int][]*result `json:"held"`
	Sizes   []int             `json:"sizes"`
	Waiters []*result         `json:"waiters"`
	W       int               `json:"w"`
}

// memory is scenario 9: the holding rows (rows(5)) at every size, then the waiting rows
// (rows(2)).
func (b *bench) memory() *s9Results {
	out := &s9Results{Held: map[int][]*result{}, Sizes: b.c.memLocks, W: b.c.memWaiters}
	rows, unit := b.rows(5), b.be.notes().reqUnit
	b.warm(rows)
	for _, n := range b.c.memLocks {
		for _, r := range rows {
			m, err := b.holdRow(r, n)
			out.Held[n] = addRep(out.Held[n], r, m, "", errString(err))
			progress("s9 hold %d %-14s %.0f B/lock, %.3f goroutines/lock, peak +%.0f, server %.0f B/lock, CPU %.1f ms/s, %.0f %s/s, %.0f RT/s, %.1f keep-alives/s; after release %.1f B/lock, %+.0f goroutines; errors %.0f %s",
				n, r.id, m["heap"], m["gor"], m["peak_gor"], m["server_mem"], m["ccpu_ms"], m["reqs_s"], unit, m["rt_s"], m["keepalives_s"], m["after_heap"], m["after_gor"], m[failures], errString(err))
		}
	}
	if w := b.c.memWaiters; w > 0 {
		rows := b.rows(2)
		b.warm(rows)
		for _, r := range rows {
			m, err := b.waitRow(r, w)
			out.Waiters = addRep(out.Waiters, r, m, "", errString(err))
			progress("s9 wait %d %-14s %.0f B/waiter, %.2f goroutines/waiter, %.1f %s/s, %.0f RT/s, next grant %s, all served %s, unserved %.0f, violations %.0f/%.0f, errors %.0f %s",
				w, r.id, m["heap"], m["gor"], m["reqs_s"], unit, m["rt_s"], mdfmt.Dur(m["next"]), mdfmt.Dur(m["all"]), m["unserved"], m[violations], m[fenceViolations], m[failures], errString(err))
		}
	}
	return out
}

// errString is err's text ("": none).
func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// memoryRow is row's lock for scenario 9 and its teardown: the bench's flightlock on a Locker
// and store of their own (their baseline and what stays after release are theirs alone), on
// the bench's client; any other row on the process's own lock.
func (b *bench) memoryRow(row string) (impl, func()) {
	if row != rowFlight || b.l == nil {
		return b.rowImpl(row, -1), func() {}
	}
	l, closeL, err := b.newLocker()
	check(err, "scenario 9: %v")
	return lockerRow{locker: l}, closeL
}

// holdRow holds n locks of row r on distinct keys (holdOn), s9Warm taken and released before.
func (b *bench) holdRow(r rowSpec, n int) (metrics, error) {
	im, done := b.memoryRow(r.id)
	defer done()
	return b.holdOn(r, im, n, s9Warm)
}

// holdOn measures n locks of row r held at once on im, on distinct keys built before the
// baseline and live through all three measurements. First warmN locks of other keys are taken
// and released at the holding's concurrency: then the client's pool holds the connections the
// locks will use before the baseline (go-redis keeps 32 KiB read and 32 KiB write buffers per
// connection) and the row's lease is in place, the client's fixed cost, not the locks'; a
// warm-up of 128 locks leaves the pool smaller than 10,000 locks grow it, and "after release"
// would count the connections the acquisition opened as the locks' memory. Every step is
// unbounded: a lease keeps its Lock's context, whose timer would count as the lock's memory.
// Rows whose locks would run out hold for s9HoldNoRenew at most. The figures are per held lock
// above the baseline: heap, stack and goroutines while holding and after releasing all, the
// peak goroutines, the time to acquire and to release all, the failures, the server's memory
// and what it and this process did per second of the holding.
func (b *bench) holdOn(r rowSpec, im impl, n, warmN int) (metrics, error) {
	window := b.c.d9hold
	if strings.HasPrefix(renews[baseRow(r.id)], "none") { // no renewal: the locks would run out
		window = min(window, s9HoldNoRenew)
	}
	ctx, prefix := context.Background(), fmt.Sprintf("s9:%d:", n)
	keys, warmKeys := rowKeys(im, prefix+"h", n), rowKeys(im, prefix+"w", min(n, warmN))
	held, locked := make([]any, n), make([]bool, n)
	memstat.Parallel(len(warmKeys), s9Acquirers, func(i int) error {
		h, err := im.lock(ctx, warmKeys[i])
		if err != nil {
			return err
		}
		return im.unlock(ctx, warmKeys[i], h)
	})
	mem0, l0 := b.be.serverMemory(), memstat.Live()
	t0 := time.Now()
	lockErrs, firstErr := memstat.Parallel(n, s9Acquirers, func(i int) (err error) {
		held[i], err = im.lock(ctx, keys[i])
		locked[i] = err == nil
		return err
	})
	acquire := time.Since(t0)
	memstat.SettleGoroutines(l0.Goroutines, time.Second) // the acquirers
	l1, mem1 := memstat.Live(), b.be.serverMemory()
	peak := memstat.PeakSampler()
	st := windowStats(time.Now(), window, meter{b.be, im})
	peakGor := peak()
	t1 := time.Now()
	unlockErrs, unlockErr := memstat.Parallel(n, s9Acquirers, func(i int) error {
		if !locked[i] {
			return nil
		}
		h := held[i]
		held[i], locked[i] = nil, false // what stays after release is measured: no handle kept
		return im.unlock(ctx, keys[i], h)
	})
	release := time.Since(t1)
	// Goroutines a release ends exit on their own schedule: l2 is read once they are back at
	// the baseline, or after 2 s.
	memstat.SettleGoroutines(l0.Goroutines, 2*time.Second)
	l2 := memstat.Live()
	runtime.KeepAlive(keys)
	runtime.KeepAlive(held)
	fn, secs := float64(n), window.Seconds()
	m := metrics{"n": fn, "acquire": float64(acquire.Nanoseconds()), "release": float64(release.Nanoseconds()),
		"heap": (l1.Heap - l0.Heap) / fn, "stack": (l1.Stack - l0.Stack) / fn, "gor": float64(l1.Goroutines-l0.Goroutines) / fn,
		"peak_gor": float64(peakGor - l0.Goroutines), "after_heap": (l2.Heap - l0.Heap) / fn, "after_gor": float64(l2.Goroutines - l0.Goroutines),
		failures: float64(lockErrs + unlockErrs), "window": secs, "ccpu_ms": float64(st.self.Microseconds()) / 1e3 / secs,
		"reqs_s": st.reqs / secs, "rt_s": float64(st.rts) / secs, "keepalives_s": st.keepAlives / secs}
	if mem0 > 0 && mem1 > 0 {
		m["server_mem"] = float64(mem1-mem0) / fn
	}
	return m, cmp.Or(firstErr, unlockErr)
}

// s9HoldCold is holdRow as a program that measures its first locks would see it: a client and
// a Locker made for the measurement, nothing locked before the baseline, so that the
// connections the locks open and anything the library fills on first use count as the locks'
// memory.
func (b *bench) s9HoldCold(r rowSpec, n int) metrics {
	im, err := r.build(b.be.(*redisBackend).addr, r.client)
	check(err, "build %s: %v", r.id)
	defer im.close()
	m, _ := b.holdOn(r, im, n, 0)
	if f, ok := im.(*flightlockImpl); ok {
		// What the client's pool kept of the connections the locks opened, at go-redis's
		// default buffer sizes: 32 KiB to read and 32 KiB to write on a pool connection, 128 KiB
		// each on a connection of its pipeline pool.
		st := f.client.PoolStats()
		conns, pipes := float64(st.TotalConns), 0.0
		if st.PipelineStats != nil {
			pipes = float64(st.PipelineStats.TotalConns)
		}
		m["conns"], m["pipe_conns"] = conns, pipes
		m["conn_bytes"] = (conns*64*1024 + pipes*256*1024) / float64(n)
	}
	return m
}

// waitRow has w goroutines of this process wait for a key that row r's lock holds, arriving
// over s9Arrive, each Lock bounded at lockTimeout past the settling and window: flightlock's
// through the holder's Locker, as a service's concurrent requests for one key do; on a store
// whose peer waiters need sessions of their own (an etcd Mutex), the peer's each on a lock of
// its own, made after the baseline and measured apart (session_heap and session_gor per
// waiter, -1 without). The holder counts as inside the key's guard until its release, so that
// a waiter granted before is a violation; once granted, each waiter runs the critical
// section's checks and unlocks at once. The figures are heap, stack and goroutines per waiter
// above the baseline while waiting, what the server and this process did per second of
// waiting, the waiters served and the times from the release to the next grant and to the
// last, the failures and the checks' violations.
func (b *bench) waitRow(r rowSpec, w int) (metrics, error) {
	own, done := b.memoryRow(r.id)
	defer done()
	// The store's lease and the lock's paths in place before the baseline.
	check(warmImpl(own, "s9ww", 10), "scenario 9: warm-up: %v")
	waiter := func(int) impl { return own }
	bounded := func(fn func(ctx context.Context) error) error {
		ctx, cancel := context.WithTimeout(context.Background(), b.c.lockTimeout)
		defer cancel()
		return fn(ctx)
	}
	key := own.key(fmt.Sprintf("s9w:%d", w))
	ctx, cancel := context.WithTimeout(context.Background(), b.c.lockTimeout)
	defer cancel()
	held, err := own.lock(ctx, key)
	check(err, "scenario 9: hold %s: %v", key)
	sessHeap, sessGor := -1.0, -1.0
	if b.be.notes().waiterSessions && r.id != rowFlight { // the waiters' locks come after the hot goroutines'
		check(b.be.peerGoroutines(hotGoroutines), "scenario 9: %v")
		b.be.dropGoroutinesBeyond(hotGoroutines)
		defer b.be.dropGoroutinesBeyond(hotGoroutines)
		l0 := memstat.Live()
		check(b.be.peerGoroutines(hotGoroutines+w), "scenario 9: %v")
		lp := memstat.Live()
		sessHeap, sessGor = (lp.Heap-l0.Heap)/float64(w), float64(lp.Goroutines-l0.Goroutines)/float64(w)
		waiter = func(i int) impl { return b.be.lockOf(r.id, hotGoroutines+i) }
	}
	g := guard.New()
	g.Enter(fenceOf(held))
	hs, fences := make([]any, w), make([]int64, w)
	var st serverStats
	res := memstat.Wait(memstat.Waiting{
		W: w, Arrive: s9Arrive, Settle: s9Settle, Bound: s9Settle + s9WaitWindow + s9ServeBound,
		Lock: func(ctx context.Context, i int) (err error) {
			hs[i], err = waiter(i).lock(ctx, key)
			fences[i] = fenceOf(hs[i])
			return err
		},
		Granted: func(i int) { g.Critical(fences[i]) },
		Unlock: func(i int) error {
			if err := bounded(func(ctx context.Context) error { return waiter(i).unlock(ctx, key, hs[i]) }); err != nil {
				return fmt.Errorf("release: %w", err)
			}
			return nil
		},
		Window: func() { st = windowStats(time.Now(), s9WaitWindow, meter{b.be, own}) },
		Release: func() error {
			g.Exit()
			if err := bounded(func(ctx context.Context) error { return own.unlock(ctx, key, held) }); err != nil {
				return fmt.Errorf("release of the held key: %w", err)
			}
			return nil
		},
	})
	fw, secs := float64(w), s9WaitWindow.Seconds()
	l0, l1 := res.Base, res.Waiting
	m := metrics{"w": fw, "heap": (l1.Heap - l0.Heap) / fw, "stack": (l1.Stack - l0.Stack) / fw, "gor": float64(l1.Goroutines-l0.Goroutines) / fw,
		"served": float64(res.Served), "unserved": float64(int64(w) - res.Served), "session_heap": sessHeap, "session_gor": sessGor,
		failures: float64(res.Errors), violations: float64(g.Violations()), fenceViolations: float64(g.FenceViolations()),
		"reqs_s": st.reqs / secs, "rt_s": float64(st.rts) / secs, "keepalives_s": st.keepAlives / secs, "ccpu_ms": float64(st.self.Microseconds()) / 1e3 / secs}
	if res.Served > 0 {
		m["next"], m["all"] = float64(res.Next), float64(res.All)
	}
	return m, res.FirstErr
}

// s9Section writes scenario 9: what each held lock and each waiter costs.
func (r *report) s9Section(w writer) {
	s, n, c := r.s9, r.be.notes(), r.cfg
	w("What each held lock and each waiter costs this process and %s; one repetition (counts, except CPU and grant times).\n\n", r.be.notes().title)
	f := func(name, format string) func(*result) string {
		return ifHas(name, func(x *result) string { return fmt.Sprintf(format, x.med(name)) })
	}
	cpu, reqsPerSec := column{"client CPU ms/s", f("ccpu_ms", "%.1f")}, column{n.reqCol + "/s", f("reqs_s", "%.0f")}
	rts, keepAlives := column{"RT/s", countCell("rt_s")}, column{"keep-alives/s", countCell("keepalives_s")}
	if len(s.Sizes) > 0 {
		w("**Holding.** This process takes %s locks on distinct keys (%d goroutines at once), holds them, then releases them\n", countList(s.Sizes), s9Acquirers)
		w("all. Heap (`HeapAlloc` after two `runtime.GC()`), stacks (`StackInuse`) and goroutines are per lock above the row's\n")
		w("baseline, taken once the keys are built and up to %s locks of other keys were taken and released (so the client's\n", countStr(s9Warm))
		w("pool holds its connections and the row's lease is in place); peak is the most goroutines above it, sampled every 2 ms.\n")
		w("flightlock runs as users run it: its watchdog renews every lock every TTL/3 (%v). Rows that renew hold for %v", (lockTTL / 3).Round(time.Millisecond), c.d9hold)
		if whole(c.d9hold, lockTTL/3) && whole(c.d9hold, lockTTL/2) {
			w(", a whole number of flightlock's period and of rueidislock's (KeyValidity/2 = %v), so the window sees the same renewals of every lock", lockTTL/2)
		} else if c.d9hold < lockTTL/3 {
			w(", shorter than a watchdog period: not every lock is renewed inside it")
		}
		w("; rows without renewal hold for %v, since their keys would run out. %s CPU is this process's user + system\n", min(c.d9hold, s9HoldNoRenew), n.s9HoldNote)
		w("time per second of the window; requests per second are the server's counts. After release: heap still live above the\n")
		w("baseline per lock, and goroutines above the baseline (waited for up to 2 s to exit).\n\n")
		var hold []*result
		for _, size := range s.Sizes {
			hold = append(hold, s.Held[size]...)
		}
		table(w, hold, column{"renewal", func(x *result) string { return renews[x.Row] }}, column{"locks", intCell("n")},
			column{"acquire all", durCell("acquire")}, column{"heap B/lock", intCell("heap")}, column{"stack B/lock", intCell("stack")},
			column{"goroutines/lock", f("gor", "%.3f")}, column{"peak goroutines", intCell("peak_gor")},
			column{r.be.notes().title + " memory B/lock", func(x *result) string { return cmp.Or(ifHas("server_mem", intCell("server_mem"))(x), "n/a") }}, cpu, reqsPerSec, rts, keepAlives, column{"release all", durCell("release")},
			column{"after release: B/lock", f("after_heap", "%.1f")}, column{"after release: goroutines", intCell("after_gor")}, column{"errors", errorsCell})
		firstErrors(w, hold)
	}
	if len(s.Waiters) > 0 {
		w("**Waiting.** One key is held in this process; %s goroutines wait for it (each `Lock` in its row's waiting strategy,\n", countStr(s.W))
		w("bounded to %v), arriving evenly over %v (started at once, the fixed-interval pollers would retry in lockstep).\n", s9Settle+s9WaitWindow+s9ServeBound, s9Arrive)
		w("flightlock's waiters use the holder's Locker, as a service's concurrent requests for one key do.%s After %v of\n", n.s9WaitNote, s9Settle)
		w("settling, heap, stacks and goroutines above the baseline taken before they started, per waiter (the waiting goroutine\n")
		w("itself is one), then %v of waiting: the server's requests, round trips and client CPU per second, all waiters\n", s9WaitWindow)
		w("together. Then the key is released; each waiter, once granted, runs the critical section's checks (the holder counts as\n")
		w("inside until its release, so a waiter granted before it is a violation; flightlock's fences must rise) and releases at\n")
		w("once. Next grant and all served are times from the release call.\n\n")
		session := func(name, format string) func(*result) string {
			return func(x *result) string {
				if x.med(name) < 0 {
					return ""
				}
				return fmt.Sprintf(format, x.med(name))
			}
		}
		table(w, s.Waiters, column{"session B/waiter", session("session_heap", "%.0f")}, column{"session goroutines/waiter", session("session_gor", "%.2f")},
			column{"heap B/waiter", intCell("heap")}, column{"stack B/waiter", intCell("stack")}, column{"goroutines/waiter", f("gor", "%.2f")},
			column{n.reqCol + "/s while waiting", f("reqs_s", "%.1f")}, rts, keepAlives, cpu,
			column{"release → next grant", durCell("next")}, column{"release → all served", durCell("all")}, column{"unserved", intCell("unserved")},
			column{"errors", errorsCell}, column{"violations (inside / fence)", violationsCell})
		firstErrors(w, s.Waiters)
	}
}

// whole says whether d is a whole number of periods p (to the millisecond).
func whole(d, p time.Duration) bool {
	n := (d + p/2) / p
	return n > 0 && (d-n*p).Abs() <= time.Millisecond
}
