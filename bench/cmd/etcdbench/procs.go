package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/flightlock/flightlock/bench/internal/shm"
	"github.com/flightlock/flightlock/bench/internal/workerproc"
	"github.com/flightlock/flightlock/internal/testenv/childproc"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Scenario 3: the command re-executes itself (os.Args[0], first argument workerFlag) as
// c.procs workers of c.perProc goroutines each. Every worker has its own etcd client (and its
// own flightlock Locker and store, or its own Mutex sessions), warms up, prints READY, and
// waits for the start time the parent writes on its stdin, so all count over the same window.
// The guard lives in a file every worker maps, so exclusion and fences are checked across
// processes without touching etcd.

const workerFlag = "-etcdbench-worker"

var (
	workersMu sync.Mutex
	workers   = map[int]*exec.Cmd{} // running worker processes by pid, for a signal's cleanup
)

// killWorkers kills every running worker by its pid.
func killWorkers() {
	workersMu.Lock()
	defer workersMu.Unlock()
	for _, c := range workers {
		_ = c.Process.Kill()
	}
}

// mapGuard maps a guard's four words from path, shared between processes.
func mapGuard(path string, create bool) (guard, func(), error) {
	w, unmap, err := shm.Map(path, create)
	if err != nil {
		return guard{}, nil, err
	}
	return guard{&w[0], &w[1], &w[2], &w[3]}, unmap, nil
}

// hotProcesses runs scenario 3 for one row.
func (b *bench) hotProcesses(row string, rep int) rowResult {
	return b.runProcs(row, fmt.Sprintf("mp-%d", rep), b.c.procs, b.c.perProc, b.c.d3)
}

// runProcs starts procs worker processes of perProc goroutines each on one fresh key, lets
// them count over one common window d, and sums their results (scenario 3, and scenario 5's
// processes axis).
func (b *bench) runProcs(row, key string, procs, perProc int, d time.Duration) rowResult {
	shm := filepath.Join(b.srv.dir, fmt.Sprintf("guard-%s-%s", row, key))
	g, unmap, err := mapGuard(shm, true)
	if err != nil {
		fatalf("map guard: %v", err)
	}
	defer unmap()
	defer os.Remove(shm)

	ws := make([]*workerproc.Proc, procs)
	for i := range ws {
		cmd := exec.Command(os.Args[0], workerFlag,
			"-lib", row, "-ep", b.srv.clientURL, "-key", key, "-g", strconv.Itoa(perProc),
			"-d", d.String(), "-shm", shm, "-to", b.c.lockTO.String())
		childproc.Tie(cmd)
		w, err := workerproc.Start(cmd)
		if err != nil {
			fatalf("%v", err)
		}
		workersMu.Lock()
		workers[cmd.Process.Pid] = cmd
		workersMu.Unlock()
		ws[i] = w
	}
	defer func() {
		for _, w := range ws {
			_ = w.Cmd.Process.Kill() // a no-op for a worker that has exited
			_ = w.Cmd.Wait()
			workersMu.Lock()
			delete(workers, w.Cmd.Process.Pid)
			workersMu.Unlock()
		}
	}()
	for _, w := range ws {
		line, err := readLine(w.Out, 60*time.Second)
		if err != nil || line != "READY" {
			killWorkers()
			fatalf("worker %d not ready: %q %v", w.Cmd.Process.Pid, line, err)
		}
	}
	start := time.Now().Add(200 * time.Millisecond)
	for _, w := range ws {
		fmt.Fprintf(w.Stdin, "%d\n", start.UnixNano())
	}
	time.Sleep(time.Until(start))
	s0 := b.srv.stats()
	time.Sleep(time.Until(start.Add(d)))
	s1 := b.srv.stats()

	r := rowResult{window: d}
	var waits []int64
	for _, w := range ws {
		line, err := readLine(w.Out, b.c.lockTO+30*time.Second)
		if err != nil {
			killWorkers()
			fatalf("worker %d: no result: %v", w.Cmd.Process.Pid, err)
		}
		var cr contendResult
		if err := json.Unmarshal([]byte(line), &cr); err != nil {
			killWorkers()
			fatalf("worker %d: bad result %q: %v", w.Cmd.Process.Pid, line, err)
		}
		r.ops += cr.CS
		r.errors += cr.Errors
		r.releaseErrors += cr.ReleaseErrors
		r.perProc = append(r.perProc, cr.CS)
		waits = append(waits, cr.Waits...)
	}
	r.rate = float64(r.ops) / d.Seconds()
	r.violations, r.fenceViolations = *g.violations, *g.fenceViolations
	r.p50, r.p99 = percentiles(waits)
	r.setServer(s1.sub(s0))
	return r
}

// readLine reads one line from r, giving up after within.
func readLine(r *bufio.Reader, within time.Duration) (string, error) {
	type res struct {
		s   string
		err error
	}
	ch := make(chan res, 1)
	go func() {
		s, err := r.ReadString('\n')
		ch <- res{strings.TrimSpace(s), err}
	}()
	select {
	case x := <-ch:
		return x.s, x.err
	case <-time.After(within):
		return "", fmt.Errorf("no line after %v", within)
	}
}

// workerMain is the entry point of a worker process of scenario 3.
func workerMain(args []string) {
	fs := flag.NewFlagSet("worker", flag.ExitOnError)
	lib := fs.String("lib", "", "flightlock or mutex")
	ep := fs.String("ep", "", "etcd client URL")
	key := fs.String("key", "", "the hot key")
	n := fs.Int("g", 16, "goroutines")
	d := fs.Duration("d", 3*time.Second, "window")
	shm := fs.String("shm", "", "guard file")
	to := fs.Duration("to", 10*time.Second, "bound of every Lock's context")
	_ = fs.Parse(args)

	cli, err := newClient(*ep)
	if err != nil {
		fatalf("worker: client: %v", err)
	}
	defer cli.Close()
	g, unmap, err := mapGuard(*shm, false)
	if err != nil {
		fatalf("worker: map guard: %v", err)
	}
	defer unmap()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs := make([]contender, *n)
	var cleanup func()
	switch *lib {
	case rowFlight:
		store, l, err := newFlightlock(cli, *to)
		if err != nil {
			fatalf("worker: %v", err)
		}
		// Warm-up on a key of our own: the store's lease granted, the connection open.
		for i := range 5 {
			lease, err := l.Lock(ctx, fmt.Sprintf("warm-%d-%d", os.Getpid(), i))
			if err != nil {
				fatalf("worker: warm-up: %v", err)
			}
			_ = lease.Release(ctx)
		}
		for i := range cs {
			cs[i] = &flightContender{l: l, key: *key}
		}
		cleanup = func() {
			dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer dcancel()
			_ = l.Drain(dctx)
			_ = store.Close()
		}
	case rowMutex:
		var sessions []*concurrency.Session
		for i := range cs {
			s, err := concurrency.NewSession(cli, concurrency.WithTTL(leaseSeconds))
			if err != nil {
				fatalf("worker: session: %v", err)
			}
			sessions = append(sessions, s)
			cs[i] = &mutexContender{m: concurrency.NewMutex(s, "/mutex/"+*key)}
		}
		m := concurrency.NewMutex(sessions[0], fmt.Sprintf("/mutex/warm-%d", os.Getpid()))
		if err := m.Lock(ctx); err != nil {
			fatalf("worker: warm-up: %v", err)
		}
		_ = m.Unlock(ctx)
		cleanup = func() {
			for _, s := range sessions {
				_ = s.Close()
			}
		}
	default:
		fatalf("worker: unknown -lib %q", *lib)
	}

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
	cr := contend(cs, g, start, start.Add(*d), *to)
	out, _ := json.Marshal(cr)
	fmt.Println(string(out))
	cleanup()
}
