package main

import (
	"context"
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
	im, err := spec.build(addr)
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
			hs := make([]contend.Holder, n)
			for i := range hs {
				hs[i] = &implHolder{im: im, keys: mapped}
			}
			return hs, nil
		},
		warm: func() error {
			for i := 0; i < 50; i++ {
				k := im.key(fmt.Sprintf("warm:%d:%d", os.Getpid(), i))
				if h, err := im.lock(context.Background(), k); err == nil {
					_ = im.unlock(context.Background(), k, h)
				}
				if rim, ok := im.(rwImpl); ok {
					if h, err := rim.rlock(context.Background(), k); err == nil {
						_ = rim.runlock(context.Background(), k, h)
					}
				}
			}
			return nil
		},
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

// runProcs runs one repetition of a row in procs worker processes of g goroutines each (scenario
// 3, and the process axis of scenario 8) and returns each worker's result; extra are more
// arguments of the workers (scenario 11's -reads).
func (b *bench) runProcs(r rowSpec, key string, procs, g int, quota int64, d time.Duration, extra ...string) ([]workerResult, cmdDelta, guard.Guard, func()) {
	shm := workerShm(r.id, key)
	gd, unmap, err := guard.Map(shm, true)
	if err != nil {
		fatalf("s3: guard file: %v", err)
	}
	defer os.Remove(shm)
	hard := 6*d + 10*time.Second
	args := append([]string{"-store", "redis", "-row", r.id, "-addr", b.addr, "-key", key,
		"-g", strconv.Itoa(g), "-quota", strconv.FormatInt(quota, 10), "-d", d.String(),
		"-hard", hard.String(), "-shm", shm}, extra...)
	grp := startWorkers(r.id, procs, args, time.Minute)
	s0 := b.snap()
	grp.Release(time.Now().Add(50 * time.Millisecond))
	lines, err := grp.Results(hard + 30*time.Second)
	if err != nil {
		fatalf("s3 %s: %v", r.id, err)
	}
	results := workerResults(lines)
	delta := diffStats(s0.cmds, b.stats())
	var ops, cpu int64
	for _, w := range results {
		ops += w.Ops
		cpu += w.CPU
	}
	m := metrics{}
	b.cpu(m, s0, ops, false)
	results[0].serverCPU = m["scpu"]
	results[0].workersCPU = float64(cpu) / 1e3 / float64(max(ops, 1))
	return results, delta, gd, unmap
}

func (b *bench) scenario3() []*result {
	rows := lockRows()
	b.warm(rows)
	res := newResults(rows)
	// A 1 s pilot per row sets the work: each process then runs the same number of critical
	// sections, about d3 long in all, and the finish times show whether one was starved.
	quotas := make(map[string]int64)
	for _, r := range rows {
		wr, _, _, unmap := b.runProcs(r, "s3:pilot", s3Procs, s3Goroutines, 0, time.Second)
		unmap()
		var ops int64
		var maxEl int64
		for _, w := range wr {
			ops += w.Ops
			maxEl = max(maxEl, w.Elapsed)
		}
		rate := float64(ops) / (float64(maxEl) / 1e9)
		quotas[r.id] = max(int64(rate*b.cfg.d3.Seconds()/s3Procs), 20)
		progress("s3 pilot %-14s %9.0f cs/s -> %d critical sections per process", r.id, rate, quotas[r.id])
	}
	for rep := 0; rep < b.cfg.reps; rep++ {
		for _, r := range interleave.Rotate(rows, rep) {
			wr, delta, gd, unmap := b.runProcs(r, fmt.Sprintf("s3:%d", rep), s3Procs, s3Goroutines, quotas[r.id], b.cfg.d3)
			all := sumWorkers(wr)
			var first, last int64 = 1 << 62, 0
			finishes := make([]float64, 0, len(wr))
			for _, w := range wr {
				first = min(first, w.Elapsed)
				last = max(last, w.Elapsed)
				finishes = append(finishes, float64(w.Elapsed))
			}
			m := contendMetrics(all, delta, gd.Plain(), gd.Violations())
			unmap()
			m["scpu"], m["ccpu"] = wr[0].serverCPU, wr[0].workersCPU
			m["fair"] = float64(last) / float64(max(first, 1))
			m["quota"] = float64(quotas[r.id])
			m["unfinished"] = float64(quotas[r.id]*s3Procs - all.Ops)
			for i, f := range finishes {
				m["finish"+strconv.Itoa(i)] = f
			}
			res[r.id].Reps = append(res[r.id].Reps, m)
			res[r.id].Mix = mixString(delta, all.Ops)
			progress("s3 rep %d %-14s %9.0f cs/s rt/cs %.2f p99 %s fair %.2f viol %d err %d %s", rep+1, r.id, m["csps"], m["rt"], mdfmt.Dur(m["p99"]), m["fair"], int64(m["violations"]), all.Errors, all.FirstErr)
		}
	}
	return ordered(rows, res)
}
