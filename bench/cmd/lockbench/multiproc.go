package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/flightlock/flightlock/bench/internal/cpustat"
	"github.com/flightlock/flightlock/bench/internal/shm"
	"github.com/flightlock/flightlock/bench/internal/workerproc"
)

// Scenario 3 runs the contention of scenario 2 in several processes: the binary re-executes
// itself with -worker. Each worker connects, warms up, says READY, and waits for the start time
// the parent sends on its stdin, so all start together. The guard lives in a file that every
// worker maps, so mutual exclusion is checked across processes without touching Redis.

const (
	s3Procs      = 4
	s3Goroutines = 16
)

type workerResult struct {
	contendResult
	Finish int64 `json:"finish"` // ns from the common start to the last critical section's end
	CPU    int64 `json:"cpu"`    // ns of CPU the worker used while it ran

	serverCPU, workersCPU float64 // µs per critical section, filled in by the parent on results[0]
}

// mapGuard maps the 3 counters of a guard from path, shared between processes.
func mapGuard(path string, create bool) (guard, func(), error) {
	p, unmap, err := shm.Map(path, create)
	if err != nil {
		return guard{}, nil, err
	}
	return guard{inside: &p[0], plain: &p[1], violations: &p[2]}, unmap, nil
}

// workerMain is the entry point of a worker process.
func workerMain(args []string) {
	fs := flag.NewFlagSet("worker", flag.ExitOnError)
	row := fs.String("row", "", "row id")
	addr := fs.String("addr", "", "redis address")
	key := fs.String("key", "", "benchmark key")
	g := fs.Int("g", s3Goroutines, "goroutines")
	quota := fs.Int64("quota", 0, "critical sections to run in this process (0: run for -d)")
	d := fs.Duration("d", time.Second, "duration when -quota is 0")
	hard := fs.Duration("hard", 30*time.Second, "give up after this long")
	shm := fs.String("shm", "", "guard file")
	_ = fs.Parse(args)

	spec, ok := rowByID(*row)
	if !ok {
		fatalf("worker: unknown row %q", *row)
	}
	im, err := spec.build(*addr)
	if err != nil {
		fatalf("worker: %v", err)
	}
	gd, unmap, err := mapGuard(*shm, false)
	if err != nil {
		fatalf("worker: map guard: %v", err)
	}
	defer unmap()
	// Warm-up on keys of our own: scripts loaded, connections open.
	for i := 0; i < 50; i++ {
		k := im.key(fmt.Sprintf("warm:%d:%d", os.Getpid(), i))
		if h, err := im.lock(context.Background(), k); err == nil {
			_ = im.unlock(context.Background(), k, h)
		}
	}
	k := im.key(*key)
	fmt.Println("READY")
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil {
		fatalf("worker: read start: %v", err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
	if err != nil {
		fatalf("worker: bad start %q", line)
	}
	start := time.Unix(0, ns)
	stop := make(chan struct{})
	if *quota == 0 {
		time.AfterFunc(time.Until(start)+*d, func() { close(stop) })
	}
	cpu0 := cpustat.Self()
	cr := contend(im, []string{k}, []guard{gd}, *g, start, stop, *quota, start.Add(*hard))
	wr := workerResult{contendResult: cr, Finish: cr.Elapsed, CPU: int64(cpustat.Self() - cpu0)}
	out, _ := json.Marshal(wr)
	fmt.Println(string(out))
	im.close()
}

// runProcs runs one repetition of a row in procs worker processes of g goroutines each (scenario
// 3, and the process axis of scenario 8) and returns each worker's result.
func (b *bench) runProcs(r rowSpec, key string, procs, g int, quota int64, d time.Duration) ([]workerResult, cmdDelta, guard, func()) {
	shm := fmt.Sprintf("%s/lockbench-%d-%s.shm", os.TempDir(), os.Getpid(), r.id)
	gd, unmap, err := mapGuard(shm, true)
	if err != nil {
		fatalf("s3: guard file: %v", err)
	}
	defer os.Remove(shm)
	self, err := os.Executable()
	if err != nil {
		fatalf("s3: %v", err)
	}
	hard := 6*d + 10*time.Second
	ps := make([]*workerproc.Proc, procs)
	for i := range ps {
		cmd := exec.Command(self, "-worker", "-row", r.id, "-addr", b.addr, "-key", key,
			"-g", strconv.Itoa(g), "-quota", strconv.FormatInt(quota, 10), "-d", d.String(),
			"-hard", hard.String(), "-shm", shm)
		p, err := workerproc.Start(cmd)
		if err != nil {
			fatalf("s3: %v", err)
		}
		workers.add(cmd)
		ps[i] = p
	}
	for i, p := range ps {
		line, err := p.Out.ReadString('\n')
		if err != nil || strings.TrimSpace(line) != "READY" {
			fatalf("s3: worker %d of %s did not get ready: %q %v", i, r.id, line, err)
		}
	}
	s0 := b.snap()
	start := time.Now().Add(50 * time.Millisecond)
	for _, p := range ps {
		_, _ = fmt.Fprintf(p.Stdin, "%d\n", start.UnixNano())
		_ = p.Stdin.Close()
	}
	results := make([]workerResult, len(ps))
	for i, p := range ps {
		line, err := p.Out.ReadString('\n')
		if err != nil {
			fatalf("s3: worker %d of %s: %v", i, r.id, err)
		}
		if err := json.Unmarshal([]byte(line), &results[i]); err != nil {
			fatalf("s3: worker %d of %s: %v (%q)", i, r.id, err, line)
		}
		_ = p.Cmd.Wait()
		workers.remove(p.Cmd)
	}
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
		for _, r := range order(rows, rep) {
			wr, delta, gd, unmap := b.runProcs(r, fmt.Sprintf("s3:%d", rep), s3Procs, s3Goroutines, quotas[r.id], b.cfg.d3)
			var all contendResult
			var first, last int64 = 1 << 62, 0
			finishes := make([]float64, 0, len(wr))
			for _, w := range wr {
				all.Ops += w.Ops
				all.Errors += w.Errors
				all.RT += w.RT
				all.Waits = append(all.Waits, w.Waits...)
				first = min(first, w.Finish)
				last = max(last, w.Finish)
				finishes = append(finishes, float64(w.Finish))
				if w.FirstErr != "" && all.FirstErr == "" {
					all.FirstErr = w.FirstErr
				}
			}
			all.Elapsed = last
			m := contendMetrics(all, delta, *gd.plain, *gd.violations)
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
			progress("s3 rep %d %-14s %9.0f cs/s rt/cs %.2f p99 %s fair %.2f viol %d err %d %s", rep+1, r.id, m["csps"], m["rt"], dur(m["p99"]), m["fair"], int64(m["violations"]), all.Errors, all.FirstErr)
		}
	}
	return ordered(rows, res)
}
