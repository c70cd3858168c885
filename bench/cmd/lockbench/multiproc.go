package main

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/flightlock/flightlock/bench/internal/contend"
	"github.com/flightlock/flightlock/bench/internal/guard"
	"github.com/flightlock/flightlock/bench/internal/interleave"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
)

// Scenario 3 runs the contention of scenario 2 in several processes (worker.go): each Redis
// worker runs a quota of critical sections set by a pilot, so that the finish times show
// whether one process was starved.

const (
	s3Procs      = 4
	s3Goroutines = 16
)

// redisWorkerRow builds a Redis row in a worker process; reads is the percentage of Locks that
// take a read lock, for a read-write row.
func redisWorkerRow(id, addr string, reads int) (workerRow, error) {
	spec, ok := rowByID(id)
	if !ok {
		return workerRow{}, fmt.Errorf("unknown row %q", id)
	}
	im, err := spec.build(addr, spec.client)
	if err != nil {
		return workerRow{}, err
	}
	return workerRow{
		holders: func(keys []string, n int) ([]contend.Holder, error) {
			mapped := make([]string, len(keys))
			for i, k := range keys {
				mapped[i] = im.key(k)
			}
			if spec.rw {
				return rwHolders(im, mapped, n, reads), nil
			}
			return implHolders(im, mapped, n), nil
		},
		warm:       func() error { return warmImpl(im, fmt.Sprintf("warm:%d", os.Getpid()), 50) },
		roundTrips: im.roundTrips,
		close:      im.close,
		permits:    spec.permits,
		readWrite:  spec.rw,
	}, nil
}

// sumWorkers adds the workers' results up: the critical sections of all over the last
// finish, every error (a failed release counts as one, as in process).
func sumWorkers(wr []workerResult) contendResult {
	var all contendResult
	for _, w := range wr {
		all.Ops += w.Ops
		all.Reads += w.Reads
		all.ReadWaits = append(all.ReadWaits, w.ReadWaits...)
		all.Errors += w.Errors + w.ReleaseErrors
		all.RT += w.RT
		all.Waits = append(all.Waits, w.Waits...)
		all.Elapsed = max(all.Elapsed, w.Elapsed)
		if all.FirstErr == "" {
			all.FirstErr = w.FirstErr
		}
	}
	return all
}

// procsRun is one run of a Redis row in worker processes: each worker's result and their sum,
// the server's commands, and the guards' counts: the critical section's plain counter, the
// violations of both guards (the critical section's and, for a semaphore or read-write row,
// the whole hold's) and the most holders the hold's guard saw at once.
type procsRun struct {
	row               rowSpec
	wr                []workerResult
	all               contendResult
	delta             cmdDelta
	plain, violations int64
	peak              int64
	scpu, wcpu        float64 // µs per critical section: the server's and the workers' CPU
}

// runProcs runs one repetition of a row in procs worker processes of g goroutines each (scenario
// 3, the process axis of scenario 8, scenarios 10-12); extra are more arguments of the workers
// (scenario 11's -reads).
func (b *bench) runProcs(r rowSpec, key string, procs, g int, quota int64, d time.Duration, extra ...string) procsRun {
	hard := 6*d + 10*time.Second
	args := append([]string{"-store", "redis", "-row", r.id, "-addr", b.addr, "-key", key,
		"-g", strconv.Itoa(g), "-quota", strconv.FormatInt(quota, 10), "-d", d.String(),
		"-hard", hard.String()}, extra...)
	if r.permits > 1 {
		args = append(args, "-permits", strconv.Itoa(r.permits))
	}
	var s0 snap
	wr, cs, span, done := workerRun(r.id, key, procs, r.permits > 1 || r.rw, args, 50*time.Millisecond, hard+30*time.Second,
		func(time.Time) { s0 = b.snap() })
	defer done()
	if r.rw {
		cs, span = cs.ReadWrite(), span.ReadWrite()
	}
	pr := procsRun{row: r, wr: wr, delta: diffStats(s0.cmds, b.stats())}
	pr.all = sumWorkers(pr.wr)
	var cpu int64
	for _, w := range pr.wr {
		cpu += w.CPU
	}
	m := metrics{}
	b.cpu(m, s0, pr.all.Ops, false)
	pr.scpu, pr.wcpu = m["scpu"], float64(cpu)/1e3/float64(max(pr.all.Ops, 1))
	pr.plain, pr.violations, pr.peak = cs.Plain(), cs.Violations()+span.Violations(), span.Peak()
	return pr
}

// metrics are the run's figures as in one process (hotMetrics), with the server's CPU and the
// workers' per critical section.
func (pr procsRun) metrics() metrics {
	m := hotMetrics(pr.row, pr.all, pr.delta, pr.plain, pr.violations, pr.peak)
	m["scpu"], m["ccpu"] = pr.scpu, pr.wcpu
	return m
}

// hotMetrics are the figures of a run of row on one hot key: a read-write lock's (rwMetrics),
// else scenario 2's (contendMetrics) with, for a semaphore, the most holders at once (peak).
func hotMetrics(row rowSpec, cr contendResult, d cmdDelta, plain, violations, peak int64) metrics {
	if row.rw {
		return rwMetrics(cr, d, plain, violations, peak)
	}
	m := contendMetrics(cr, d, plain, violations)
	if row.permits > 1 {
		m["peak"] = float64(peak)
	}
	return m
}

// quota adds to m what a run of a quota per process shows: how evenly the processes got
// through it (fair: the last one's finish time over the first's), the quota and the critical
// sections left undone.
func (pr procsRun) quota(m metrics, quota int64) metrics {
	var first, last int64 = 1 << 62, 0
	for _, w := range pr.wr {
		first = min(first, w.Elapsed)
		last = max(last, w.Elapsed)
	}
	m["fair"] = float64(last) / float64(max(first, 1))
	m["quota"] = float64(quota)
	m["unfinished"] = float64(quota*int64(len(pr.wr)) - pr.all.Ops)
	return m
}

// pilotQuotas runs a 1 s pilot of each row in s3Procs workers of s3Goroutines goroutines and
// returns each process's quota for d: every process then runs the same number of critical
// sections, about d long in all, and the finish times show whether one was starved.
func (b *bench) pilotQuotas(what string, rows []rowSpec, key string, d time.Duration, extra ...string) map[string]int64 {
	quotas := make(map[string]int64)
	for _, r := range rows {
		pr := b.runProcs(r, key, s3Procs, s3Goroutines, 0, time.Second, extra...)
		rate := float64(pr.all.Ops) / (float64(pr.all.Elapsed) / 1e9)
		quotas[r.id] = max(int64(rate*d.Seconds()/s3Procs), 20)
		progress("%s pilot %-18s %9.0f cs/s -> %d critical sections per process", what, r.id, rate, quotas[r.id])
	}
	return quotas
}

// inAndAcross are the rows of a scenario of the primitives report, in one process and across
// processes.
type inAndAcross struct {
	InProcess []*result `json:"in_process"`
	Procs     []*result `json:"procs"`
}

// inAndAcross runs a scenario of the primitives report (10-12) on rows, tagged tag in the keys
// and the progress lines: in each repetition every row in one process (hotInProcess), then in
// s3Procs workers of s3Goroutines goroutines with quotas from a pilot, both in the rotated
// order; reads is the percentage of Locks that are reads, for read-write rows.
func (b *bench) inAndAcross(tag string, rows []rowSpec, d time.Duration, reads int) inAndAcross {
	var extra []string
	if reads > 0 {
		extra = []string{"-reads", strconv.Itoa(reads)}
	}
	in, procs := newResults(rows), newResults(rows)
	quotas := b.pilotQuotas(tag, rows, tag+":pilot", d, extra...)
	logRun := func(rep int, shape string, r rowSpec, m metrics, firstErr string) {
		progress("%s rep %d %s %-18s %9.0f cs/s rt/cs %.2f cmds/cs %.2f p99 %s fair %.2f peak %d viol %d err %d %s", tag, rep+1, shape, r.id,
			m["csps"], m["rt"], m["cmds"], mdfmt.Dur(m["p99"]), m["fair"], int64(m["peak"]), int64(m["violations"]), int64(m["errors"]), firstErr)
	}
	for rep := 0; rep < b.cfg.reps; rep++ {
		for _, r := range interleave.Rotate(rows, rep) {
			m, mix := b.hotInProcess(r, fmt.Sprintf("%s:%d:%d", tag, s10Goroutines, rep), d, reads)
			in.add(r.id, m, mix)
			logRun(rep, fmt.Sprintf("g=%d", s10Goroutines), r, m, "")
		}
		for _, r := range interleave.Rotate(rows, rep) {
			pr := b.runProcs(r, fmt.Sprintf("%s:%d", tag, rep), s3Procs, s3Goroutines, quotas[r.id], d, extra...)
			m := pr.quota(pr.metrics(), quotas[r.id])
			procs.add(r.id, m, mixString(pr.delta, pr.all.Ops))
			logRun(rep, fmt.Sprintf("%dx%d", s3Procs, s3Goroutines), r, m, pr.all.FirstErr)
		}
	}
	return inAndAcross{InProcess: ordered(rows, in), Procs: ordered(rows, procs)}
}

// hotInProcess runs one repetition of row r with s10Goroutines goroutines of this process on
// key for d (scenarios 10-12), and returns its figures and server command mix. A mutex runs
// scenario 2's loop; a semaphore or read-write lock (reads% of its Locks reads) runs under
// two checks of its kind, one around the critical section and one around the whole hold.
func (b *bench) hotInProcess(r rowSpec, key string, d time.Duration, reads int) (metrics, string) {
	im := b.impl(r)
	keys := []string{im.key(key)}
	if r.permits <= 1 && !r.rw {
		m, cr, delta := b.contendFor(r, keys, s10Goroutines, d)
		return m, mixString(delta, cr.Ops)
	}
	cs, span := guard.New().Admitting(int64(r.permits)), guard.New().Admitting(int64(r.permits))
	hs := implHolders(im, keys, s10Goroutines)
	if r.rw {
		cs, span = guard.New().ReadWrite(), guard.New().ReadWrite()
		hs = rwHolders(im, keys, s10Goroutines, reads)
	}
	m, cr, delta := b.timedRun(im, spanHolders(hs, span), []guard.Guard{cs}, d, func(cr contendResult, delta cmdDelta) metrics {
		return hotMetrics(r, cr, delta, cs.Plain(), cs.Violations()+span.Violations(), span.Peak())
	})
	return m, mixString(delta, cr.Ops)
}

func (b *bench) scenario3() []*result {
	rows := lockRows()
	b.warm(rows)
	quotas := b.pilotQuotas("s3", rows, "s3:pilot", b.cfg.d3)
	return b.repeat(rows, func(r rowSpec, rep int) (metrics, string) {
		pr := b.runProcs(r, fmt.Sprintf("s3:%d", rep), s3Procs, s3Goroutines, quotas[r.id], b.cfg.d3)
		m := pr.quota(pr.metrics(), quotas[r.id])
		for i, w := range pr.wr {
			m["finish"+strconv.Itoa(i)] = float64(w.Elapsed)
		}
		progress("s3 rep %d %-14s %9.0f cs/s rt/cs %.2f p99 %s fair %.2f viol %d err %d %s", rep+1, r.id, m["csps"], m["rt"], mdfmt.Dur(m["p99"]), m["fair"], int64(m["violations"]), pr.all.Errors, pr.all.FirstErr)
		return m, mixString(pr.delta, pr.all.Ops)
	})
}
