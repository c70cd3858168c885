package main

import (
	"fmt"
	"strings"
	"time"
)

// The primitives report holds the scenarios of flightlock's primitives beyond the mutex
// (10, semaphores; 11, read-write locks; 12, fair locks): a document of its own, docs/benchmarks-primitives.md, with the
// machine header of the main report, so that a run of these scenarios alone never rewrites
// the main report's figures.

// ranMain says whether any scenario of the main report (all but 10-12) ran.
func ranMain(c config) bool { return c.ranAny(1, 2, 3, 4, 5, 6, 7, 8, 9, 13) }

// ranPrimitives says whether any scenario of the primitives report ran.
func (r *report) ranPrimitives() bool { return r.s10 != nil || r.s11 != nil || r.s12 != nil }

func (r *report) primitivesMarkdown() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# Benchmarks: flightlock's primitives beyond the mutex\n\n")
	w("Generated on %s in %v by this command, run from `bench/` (`bench/run.sh` runs the same binary with the arguments\n",
		r.started.UTC().Format("2006-01-02 15:04 MST"), r.elapsed.Round(time.Second))
	w("shown, and writes this file on a full run too):\n\n```\n%s\n```\n\n", r.cfg.cmdline)
	w("The scenarios of the mutex, 1-9, are in [benchmarks.md](benchmarks.md),\n")
	w("on the same kind of run: one `redis-server` that the benchmark starts on a free loopback port (`--save \"\" --appendonly no`),\n")
	w("every figure the **median of %d repetitions**.\n\n", r.cfg.reps)
	if r.cfg.quick {
		w("**This is a quick run (`-quick`)**: short durations, one repetition. Its figures show that the scenario runs;\n")
		w("they are not the benchmark's results.\n\n")
	}
	r.machineTable(w)
	w("The benchmark process, its worker processes and `redis-server` share these cores; one round trip on loopback is mostly\n")
	w("CPU (syscalls, scheduling), not wire.\n\n")
	if r.s10 != nil {
		r.s10Section(w)
	}
	if r.s11 != nil {
		r.s11Section(w)
	}
	if r.s12 != nil {
		r.s12Section(w)
	}
	return b.String()
}
