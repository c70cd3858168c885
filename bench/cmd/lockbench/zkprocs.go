package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/flightlock/flightlock/bench/internal/contend"
	"github.com/flightlock/flightlock/bench/internal/guard"
	"github.com/flightlock/flightlock/bench/internal/workerproc"
)

// Scenario 3 on ZooKeeper (worker.go): s3Procs workers of s3Goroutines goroutines each, every
// one with a session of its own (and its own flightlock Locker and store, or its own
// zk.NewLock holders on it), counting the critical sections that end inside one common window;
// the parent sums them, as the etcd rows do.

// hotProcesses runs scenario 3 for one row.
func (b *zkBench) hotProcesses(row string, rep int) zkResult {
	key := fmt.Sprintf("mp-%d", rep)
	d := b.c.d3
	shm := workerShm(row, key)
	g, unmap, err := guard.Map(shm, true)
	if err != nil {
		fatalf("map guard: %v", err)
	}
	defer unmap()
	defer os.Remove(shm)

	cmds := make([]*exec.Cmd, s3Procs)
	for i := range cmds {
		cmds[i] = workerCommand("-store", "zookeeper", "-row", row, "-addr", b.srv.addr, "-key", key,
			"-g", strconv.Itoa(s3Goroutines), "-window", "-d", d.String(), "-shm", shm,
			"-lock-timeout", b.c.lockTimeout.String(), "-zk-session", b.c.zkSession.String())
	}
	grp, err := workerproc.StartGroup(cmds, workers, 60*time.Second)
	if err != nil {
		fatalf("s3 %s: %v", row, err)
	}
	start := time.Now().Add(200 * time.Millisecond)
	grp.Release(start)
	time.Sleep(time.Until(start))
	s0 := b.srv.stats()
	time.Sleep(time.Until(start.Add(d)))
	s1 := b.srv.statsCPUFirst()
	lines, err := grp.Results(b.c.lockTimeout + 30*time.Second)
	if err != nil {
		fatalf("s3 %s: %v", row, err)
	}

	r := zkResult{window: d}
	var waits []int64
	for _, w := range workerResults(lines) {
		r.ops += w.Ops
		r.errors += w.Errors + w.ReleaseErrors
		r.perProc = append(r.perProc, w.Ops)
		waits = append(waits, w.Waits...)
		if w.FirstErr != "" {
			progress("  3 %s: a worker's first error: %s", row, w.FirstErr)
			if r.firstErr == "" {
				r.firstErr = w.FirstErr
			}
		}
	}
	r.rate = float64(r.ops) / d.Seconds()
	r.violations, r.fenceViolations = g.Violations(), g.FenceViolations()
	r.p50, r.p99 = percentiles(waits)
	r.setServer(s1.sub(s0))
	r.selfCPU = 0 // the workers' CPU, not this process's
	return r
}

// zkWorkerRow builds a ZooKeeper row in a worker process, on a session of its own: flightlock
// with a Locker and store of its own, or zk.NewLock holders on one connection.
func zkWorkerRow(id, addr string, session, lockTimeout time.Duration) (workerRow, error) {
	acl := zk.WorldACL(zk.PermAll)
	switch id {
	case rowFlight:
		store, l, err := newZKFlightlock(addr, session, lockTimeout)
		if err != nil {
			return workerRow{}, err
		}
		return workerRow{
			holders: func(keys []string, n int) ([]contend.Holder, error) {
				return zkHolders(id, l, nil, nil, keys, n), nil
			},
			// Warm-up on keys of our own: the session open, the paths taken once.
			warm: func() error {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				for i := range 5 {
					lease, err := l.Lock(ctx, fmt.Sprintf("warm-%d-%d", os.Getpid(), i))
					if err != nil {
						return err
					}
					_ = lease.Release(ctx)
				}
				return nil
			},
			close: func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = l.Drain(ctx)
				_ = store.Close()
			},
		}, nil
	case rowZKLock:
		conn, err := zkConnect(addr, session)
		if err != nil {
			return workerRow{}, err
		}
		return workerRow{
			holders: func(keys []string, n int) ([]contend.Holder, error) {
				return zkHolders(id, nil, conn, acl, keys, n), nil
			},
			warm: func() error {
				l := zk.NewLock(conn, fmt.Sprintf("%s/warm-%d", zkLockRoot, os.Getpid()), acl)
				if err := l.Lock(); err != nil {
					return err
				}
				return l.Unlock()
			},
			close: conn.Close,
		}, nil
	}
	return workerRow{}, fmt.Errorf("unknown row %q", id)
}
