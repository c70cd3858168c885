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

// Scenario 3 runs the contention of scenario 2 in several processes (worker.go), each counting
// the critical sections that end inside one common window, so that the counts per process show
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
		holders: func(keys []string, n int) []contend.Holder {
			if spec.rw {
				return rwHolders(im, rowNames(im, keys), n, reads)
			}
			return implHolders(im, rowNames(im, keys), n)
		},
		warm:       func() error { return warmImpl(im, fmt.Sprintf("warm:%d", os.Getpid()), 50) },
		roundTrips: im.roundTrips,
		close:      im.close,
		permits:    spec.permits,
		readWrite:  spec.rw,
	}, nil
}

// sumWorkers adds the workers' results up: the critical sections of all over the window,
// every error (a failed release counts as one, as in process), their round trips and CPU.
func sumWorkers(wr []workerResult) workerResult {
	var all workerResult
	for _, w := range wr {
		all.CPU += w.CPU
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

// runProcs runs one repetition of a row in procs worker processes of g goroutines each over a
// common window d (scenario 3, the process axis of scenario 8, scenarios 10-12); extra are more
// arguments of the workers (scenario 11's -reads). It returns the run's figures as in one process
// (hotMetrics) with the server's CPU and the workers' per critical section, how evenly the
// processes got through (fair: the most critical sections of a process over the fewest, and
// per_proc), the server command mix and the first error.
func (b *bench) runProcs(r rowSpec, key string, procs, g int, d time.Duration, extra ...string) (metrics, string, string) {
	args := append([]string{"-addr", b.addr}, extra...)
	if r.permits > 1 {
		args = append(args, "-permits", strconv.Itoa(r.permits))
	}
	wr, st, cs, span, done := workerRun("redis", r.id, key, procs, g, d, waitBudget, r.permits > 1 || r.rw, b.meter(nil), args...)
	defer done()
	if r.rw {
		cs, span = cs.ReadWrite(), span.ReadWrite()
	}
	all := sumWorkers(wr)
	st.rts = all.RT
	m := hotMetrics(r, all.Result, st, cs.Plain(), cs.Violations()+span.Violations(), span.Peak())
	perOpMicros(m, st, all.Ops, false)
	var fewest, most int64 = 1 << 62, 0
	for _, w := range wr {
		fewest, most = min(fewest, w.Ops), max(most, w.Ops)
	}
	m["ccpu"] = float64(all.CPU) / 1e3 / float64(max(all.Ops, 1))
	m["fair"], m["per_proc"] = float64(most)/float64(max(fewest, 1)), float64(all.Ops)/float64(len(wr))
	return m, mixString(st.cmds, all.Ops), all.FirstErr
}

// hotMetrics are the figures of a run of row on one hot key: a read-write lock's (rwMetrics),
// else scenario 2's (contendMetrics) with, for a semaphore, the most holders at once (peak).
func hotMetrics(row rowSpec, cr contend.Result, st serverStats, plain, violations, peak int64) metrics {
	if row.rw {
		return rwMetrics(cr, st, plain, violations, peak)
	}
	m := contendMetrics(cr, st, plain, violations)
	if row.permits > 1 {
		m["peak"] = float64(peak)
	}
	return m
}

// inAndAcross are the rows of a scenario of the primitives report, in one process and across
// processes.
type inAndAcross struct {
	InProcess []*result `json:"in_process"`
	Procs     []*result `json:"procs"`
}

// inAndAcross runs a scenario of the primitives report (10-12) on rows, tagged tag in the keys
// and the progress lines: in each repetition every row in one process (hotInProcess), then in
// s3Procs workers of s3Goroutines goroutines, both in the rotated order; reads is the percentage of Locks that are reads, for read-write rows.
func (b *bench) inAndAcross(tag string, rows []rowSpec, d time.Duration, reads int) inAndAcross {
	var extra []string
	if reads > 0 {
		extra = []string{"-reads", strconv.Itoa(reads)}
	}
	in, procs := newResults(rows), newResults(rows)
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
			m, mix, firstErr := b.runProcs(r, fmt.Sprintf("%s:%d", tag, rep), s3Procs, s3Goroutines, d, extra...)
			procs.add(r.id, m, mix)
			logRun(rep, fmt.Sprintf("%dx%d", s3Procs, s3Goroutines), r, m, firstErr)
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
		m, cr, st := b.contendFor(r, keys, s10Goroutines, d, 0)
		return m, mixString(st.cmds, cr.Ops)
	}
	cs, span := guard.New().Admitting(int64(r.permits)), guard.New().Admitting(int64(r.permits))
	hs := implHolders(im, keys, s10Goroutines)
	if r.rw {
		cs, span = guard.New().ReadWrite(), guard.New().ReadWrite()
		hs = rwHolders(im, keys, s10Goroutines, reads)
	}
	m, cr, st := b.timedRun(im, spanHolders(hs, span), []guard.Guard{cs}, d, 0, func(cr contend.Result, st serverStats) metrics {
		return hotMetrics(r, cr, st, cs.Plain(), cs.Violations()+span.Violations(), span.Peak())
	})
	return m, mixString(st.cmds, cr.Ops)
}

func (b *bench) scenario3() []*result {
	rows := lockRows()
	b.warm(rows)
	return b.repeat(rows, func(r rowSpec, rep int) (metrics, string) {
		m, mix, firstErr := b.runProcs(r, fmt.Sprintf("s3:%d", rep), s3Procs, s3Goroutines, b.cfg.d3)
		progress("s3 rep %d %-14s %9.0f cs/s rt/cs %.2f p99 %s fair %.2f viol %d err %d %s", rep+1, r.id, m["csps"], m["rt"], mdfmt.Dur(m["p99"]), m["fair"], int64(m["violations"]), int64(m["errors"]), firstErr)
		return m, mix
	})
}
