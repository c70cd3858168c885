package main

import (
	"fmt"
	"os"

	"github.com/flightlock/flightlock/bench/internal/hostinfo"
	"github.com/flightlock/flightlock/bench/internal/interleave"
)

// zkScenarios are the scenarios the ZooKeeper rows run: uncontended, a hot key in one process,
// a hot key across processes.
var zkScenarios = []int{1, 2, 3}

// runZooKeeper runs the ZooKeeper rows' scenarios on a private ZooKeeper server of their own,
// every scenario in every repetition.
func runZooKeeper(c *config) {
	srv, err := startZooKeeper(c.javaBin, c.zkJar, c.dataDir, c.zkTick)
	if err != nil {
		fatalf("start zookeeper: %v", err)
	}
	stopServers = srv.stop
	progress("zookeeper %s (pid %d, %s) on %s, tickTime %v, data in %s (%s)", srv.version, srv.pid(), srv.java, srv.addr, srv.tick, srv.dir, srv.fsType)
	b, err := newZKBench(c, srv)
	if err != nil {
		fatalf("setup: %v", err)
	}
	defer b.close()
	progress("flightlock: session %v, MaxTTL %v, TTL %v", c.zkSession, b.store.MaxTTL(), flightTTL)

	s1 := []string{rowFloor, rowFlight, rowZKLock, rowZKLockFresh}
	progress("warm-up: every row of scenario 1 for %v, unmeasured", c.warm)
	b.uncontended(s1, "w", c.warm)

	res := &zkResults{rows: map[int]map[string][]zkResult{}}
	for rep := 0; rep < c.reps; rep++ {
		progress("repetition %d/%d", rep+1, c.reps)
		if c.scenarios[1] {
			order := interleave.Rotate(s1, rep)
			rs := b.uncontended(order, fmt.Sprint(rep), c.d1)
			for _, row := range order {
				r := rs[row]
				res.add(1, row, r)
				progress("  1 uncontended  %-12s p50 %s  %.0f ops/s  requests/op %.2f  errors %d", row, etcdDur(r.p50), r.rate, r.packetsPerOp, r.errors)
			}
		}
		if c.scenarios[2] {
			for _, row := range interleave.Rotate([]string{rowFlight, rowZKLock}, rep) {
				r := b.hotInProcess(row, rep)
				res.add(2, row, r)
				progress("  2 hot x%-3d     %-12s %.0f CS/s  violations %d/%d  errors %d  requests/CS %.3f", hotGoroutines, row, r.rate, r.violations, r.fenceViolations, r.errors, r.packetsPerOp)
			}
		}
		if c.scenarios[3] {
			for _, row := range interleave.Rotate([]string{rowFlight, rowZKLock}, rep) {
				r := b.hotProcesses(row, rep)
				res.add(3, row, r)
				progress("  3 hot %dx%-3d   %-12s %.0f CS/s  violations %d/%d  errors %d  requests/CS %.3f", s3Procs, s3Goroutines, row, r.rate, r.violations, r.fenceViolations, r.errors, r.packetsPerOp)
			}
		}
	}

	m := zkMachine{Machine: hostinfo.Collect(), zookeeper: srv.version, java: srv.java, fsType: srv.fsType}
	report := res.markdown(c, m, b.store.MaxTTL())
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
