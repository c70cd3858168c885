package main

import (
	"fmt"
	"strconv"
	"time"

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

// sumWorkers adds the workers' results up: the critical sections of all over the window,
// every error, their round trips and CPU.
func sumWorkers(wr []workerResult) workerResult {
	var all workerResult
	for _, w := range wr {
		all.Add(w.Result)
		all.CPU += w.CPU
		all.RT += w.RT
		all.Elapsed = max(all.Elapsed, w.Elapsed)
	}
	return all
}

// inAndAcross are the rows of a scenario of the primitives report, in one process and across
// processes.
type inAndAcross struct {
	InProcess []*result `json:"in_process"`
	Procs     []*result `json:"procs"`
}

// inAndAcross runs a scenario of the primitives report (10-12) on rows, tagged tag in the keys
// and the progress lines: in each repetition every row with s10Goroutines goroutines of one
// process (contendRun), then in s3Procs workers of s3Goroutines goroutines, both in the
// rotated order; reads is the percentage of Locks that are reads, for read-write rows.
func (b *bench) inAndAcross(tag string, rows []rowSpec, d time.Duration, reads int) inAndAcross {
	b.warm(rows)
	var extra []string
	if reads > 0 {
		extra = []string{"-reads", strconv.Itoa(reads)}
	}
	var out inAndAcross
	logRun := func(rep int, shape string, r rowSpec, m metrics, firstErr string) {
		progress("%s rep %d %s %-18s %9.0f CS/s RT/CS %.2f cmds/CS %.2f p99 %s fair %.2f peak %d violations %d errors %d %s", tag, rep+1, shape, r.id,
			m[rate], m[rt], m[reqs], mdfmt.Dur(m[p99]), m["fair"], int64(m["peak"]), int64(m[violations]), int64(m[failures]), firstErr)
	}
	for rep := 0; rep < b.c.reps; rep++ {
		for _, r := range interleave.Rotate(rows, rep) {
			m, mix, firstErr := b.contendRun(r, []string{fmt.Sprintf("%s:%d:%d", tag, s10Goroutines, rep)}, s10Goroutines, d, 0, reads)
			out.InProcess = addRep(out.InProcess, r, m, mix, firstErr)
			logRun(rep, fmt.Sprintf("g=%d", s10Goroutines), r, m, firstErr)
		}
		for _, r := range interleave.Rotate(rows, rep) {
			m, mix, firstErr := b.runProcs(r, fmt.Sprintf("%s:%d", tag, rep), s3Procs, s3Goroutines, d, extra...)
			out.Procs = addRep(out.Procs, r, m, mix, firstErr)
			logRun(rep, fmt.Sprintf("%dx%d", s3Procs, s3Goroutines), r, m, firstErr)
		}
	}
	return out
}

// tables writes the two parts of a primitives scenario run for d, each under a heading of its
// own (sub) or not: in one process, and in scenario 3's workers, which count the critical
// sections ending inside one common window of d (`fair`: the most of a process over the
// fewest) with checks that span the processes.
func (s inAndAcross) tables(w writer, r *report, d time.Duration, sub bool) {
	if len(s.InProcess) > 0 {
		if sub {
			w("### %d goroutines, one process\n\n", s10Goroutines)
		}
		w("%d goroutines, one process, %v per row and repetition.\n\n", s10Goroutines, d)
		contendTable(w, r.be.notes(), s.InProcess, "")
	}
	if len(s.Procs) > 0 {
		if sub {
			w("### %d processes x %d goroutines\n\n", s3Procs, s3Goroutines)
		}
		w("%d processes x %d goroutines: scenario 3's workers, counting over one common window of %v; `fair` is the most\n", s3Procs, s3Goroutines, d)
		w("critical sections of a process over the fewest (1.00: every process got through at the same pace). The checks live in\n")
		w("files every worker maps, so they span the processes; client CPU is the workers' sum.\n\n")
		contendTable(w, r.be.notes(), s.Procs, "")
	}
}
