package main

import (
	"fmt"
	"os"

	"github.com/flightlock/flightlock/bench/internal/hostinfo"
	"github.com/flightlock/flightlock/bench/internal/interleave"
)

// runEtcd runs the etcd rows' scenarios on a private etcd of their own: 1-4 in every
// repetition, then 8, 9, 5, 6 and 7, each with its own repetitions.
func runEtcd(c *config) {
	srv, err := startEtcd(c.etcdBin, c.dataDir)
	if err != nil {
		fatalf("start etcd: %v", err)
	}
	stopServers = func() {
		stopStateRedis()
		srv.stop()
	}
	progress("etcd %s (pid %d) on %s, data in %s (%s)", srv.version, srv.pid(), srv.clientURL, srv.dir, srv.fsType)
	b, err := newEtcdBench(c, srv)
	if err != nil {
		fatalf("setup: %v", err)
	}
	defer b.close()

	progress("warm-up: every row of scenario 1 for %v, unmeasured", c.warm)
	b.warmUp(c.warm)
	res := newEtcdResults()
	// The rows of a scenario that -scenarios leaves out are none.
	rowsIf := func(scenario int, rows ...string) []string {
		if !c.scenarios[scenario] {
			return nil
		}
		return rows
	}
	s1 := rowsIf(1, rowFloor, rowFlight, rowMutex)
	s2 := rowsIf(2, rowFlight, rowMutex)
	s3 := rowsIf(3, rowFlight, rowMutex)
	s4 := rowsIf(4, rowFloor, rowFlight, rowMutex)
	if c.ranAny(1, 2, 3, 4) {
		for rep := 0; rep < c.reps; rep++ {
			progress("repetition %d/%d", rep+1, c.reps)
			if len(s1) > 0 {
				order := interleave.Rotate(s1, rep)
				rs := b.uncontended(order, rep)
				for _, row := range order {
					r := rs[row]
					res.add(1, row, r)
					progress("  1 uncontended  %-10s p50 %s  %.0f ops/s  errors %d", row, etcdDur(r.p50), r.rate, r.errors)
				}
			}
			for _, row := range interleave.Rotate(s2, rep) {
				r := b.hotInProcess(row, rep)
				res.add(2, row, r)
				progress("  2 hot x%-3d     %-10s %.0f CS/s  violations %d/%d  errors %d  RPC/CS %.2f", hotGoroutines, row, r.rate, r.violations, r.fenceViolations, r.errors, r.rpcPerOp)
			}
			for _, row := range interleave.Rotate(s3, rep) {
				r := b.hotProcesses(row, rep)
				res.add(3, row, r)
				progress("  3 hot %dx%-3d   %-10s %.0f CS/s  violations %d/%d  errors %d  RPC/CS %.2f", s3Procs, s3Goroutines, row, r.rate, r.violations, r.fenceViolations, r.errors, r.rpcPerOp)
			}
			for _, row := range interleave.Rotate(s4, rep) {
				r := b.keysScenario(row, rep)
				res.add(4, row, r)
				progress("  4 x%d/%d keys  %-10s %.0f ops/s  violations %d/%d  retries %d  errors %d  RPC/op %.2f", hotGoroutines, manyKeys, row, r.rate, r.violations, r.fenceViolations, r.retries, r.errors, r.rpcPerOp)
			}
		}
	}
	if c.scenarios[8] {
		res.scaling = b.scaling()
		for _, ax := range res.scaling {
			path := chartPath(c.out, ax.name)
			if path == "" {
				continue
			}
			if err := drawScalingChart(path, ax); err != nil {
				progress("plot %s: %v (the report goes without it)", path, err)
				continue
			}
			ax.chart = path
			progress("wrote %s", path)
		}
	}
	if c.scenarios[9] {
		res.memory = b.memory()
	}
	if c.scenarios[5] {
		res.reject = b.reject()
	}
	if c.scenarios[6] {
		res.http = b.http()
	}
	if c.scenarios[7] {
		res.dups = b.dups()
	}

	m := etcdMachine{Machine: hostinfo.Collect(), etcd: srv.version, fsType: srv.fsType}
	report := res.markdown(c, m)
	if c.out == "" {
		fmt.Print(report)
	} else if err := os.WriteFile(c.out, []byte(report), 0o644); err != nil {
		fatalf("write %s: %v", c.out, err)
	} else {
		progress("wrote %s", c.out)
	}
	for _, g := range res.goals(c) {
		progress("goal %-40s %s (%s)", g.name, g.verdict(), g.measured)
	}
}

// ranAny says whether any of the scenarios runs.
func (c *config) ranAny(scenarios ...int) bool {
	for _, n := range scenarios {
		if c.scenarios[n] {
			return true
		}
	}
	return false
}
