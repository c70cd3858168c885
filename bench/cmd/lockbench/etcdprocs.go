package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/flightlock/flightlock/bench/internal/contend"
	"github.com/flightlock/flightlock/bench/internal/guard"
	"github.com/flightlock/flightlock/bench/internal/workerproc"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Scenario 3 on etcd (worker.go): s3Procs workers of s3Goroutines goroutines each, every one
// with its own etcd client (and its own flightlock Locker and store, or its own Mutex
// sessions), counting the critical sections that end inside one common window; the parent
// sums them.

// hotProcesses runs scenario 3 for one row.
func (b *etcdBench) hotProcesses(row string, rep int) rowResult {
	return b.runProcs(row, fmt.Sprintf("mp-%d", rep), s3Procs, s3Goroutines, b.c.d3)
}

// runProcs starts procs worker processes of perProc goroutines each on one fresh key, lets
// them count over one common window d, and sums their results (scenario 3, and scenario 8's
// processes axis).
func (b *etcdBench) runProcs(row, key string, procs, perProc int, d time.Duration) rowResult {
	shm := workerShm(row, key)
	g, unmap, err := guard.Map(shm, true)
	if err != nil {
		fatalf("map guard: %v", err)
	}
	defer unmap()
	defer os.Remove(shm)

	cmds := make([]*exec.Cmd, procs)
	for i := range cmds {
		cmds[i] = workerCommand("-store", "etcd", "-row", row, "-addr", b.srv.clientURL, "-key", key,
			"-g", strconv.Itoa(perProc), "-window", "-d", d.String(), "-shm", shm, "-lock-timeout", b.c.lockTimeout.String())
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
	s1 := b.srv.stats()
	lines, err := grp.Results(b.c.lockTimeout + 30*time.Second)
	if err != nil {
		fatalf("s3 %s: %v", row, err)
	}

	r := rowResult{window: d}
	var waits []int64
	for _, w := range workerResults(lines) {
		r.ops += w.Ops
		r.errors += w.Errors
		r.releaseErrors += w.ReleaseErrors
		r.perProc = append(r.perProc, w.Ops)
		waits = append(waits, w.Waits...)
	}
	r.rate = float64(r.ops) / d.Seconds()
	r.violations, r.fenceViolations = g.Violations(), g.FenceViolations()
	r.p50, r.p99 = percentiles(waits)
	r.setServer(s1.sub(s0))
	return r
}

// etcdWorkerRow builds an etcd row in a worker process, on a client of its own: flightlock
// with a Locker and store of its own, or a Mutex session per goroutine.
func etcdWorkerRow(id, endpoint string, lockTimeout time.Duration) (workerRow, error) {
	cli, err := etcdClient(endpoint)
	if err != nil {
		return workerRow{}, fmt.Errorf("client: %w", err)
	}
	warmCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 30*time.Second)
	}
	switch id {
	case rowFlight:
		store, l, err := newEtcdFlightlock(cli, lockTimeout)
		if err != nil {
			return workerRow{}, err
		}
		return workerRow{
			holders: func(keys []string, n int) ([]contend.Holder, error) {
				hs := make([]contend.Holder, n)
				for i := range hs {
					hs[i] = &lockerHolder{l: l, keys: keys}
				}
				return hs, nil
			},
			// Warm-up on keys of our own: the store's lease granted, the connection open.
			warm: func() error {
				ctx, cancel := warmCtx()
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
				closeFlightlock(store, l)
				_ = cli.Close()
			},
		}, nil
	case rowMutex:
		var sessions []*concurrency.Session
		return workerRow{
			holders: func(keys []string, n int) ([]contend.Holder, error) {
				hs := make([]contend.Holder, n)
				for i := range hs {
					s, err := concurrency.NewSession(cli, concurrency.WithTTL(leaseSeconds))
					if err != nil {
						return nil, fmt.Errorf("session: %w", err)
					}
					sessions = append(sessions, s)
					hs[i] = &etcdMutexHolder{sess: s, keys: prefixed("/mutex/", keys), ms: map[int]*concurrency.Mutex{}}
				}
				return hs, nil
			},
			warm: func() error {
				ctx, cancel := warmCtx()
				defer cancel()
				m := concurrency.NewMutex(sessions[0], fmt.Sprintf("/mutex/warm-%d", os.Getpid()))
				if err := m.Lock(ctx); err != nil {
					return err
				}
				return m.Unlock(ctx)
			},
			close: func() {
				for _, s := range sessions {
					_ = s.Close()
				}
				_ = cli.Close()
			},
		}, nil
	}
	return workerRow{}, fmt.Errorf("unknown row %q", id)
}
