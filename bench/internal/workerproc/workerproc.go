// Package workerproc starts the worker processes of the benchmarks' multi-process scenarios
// (lockbench re-executes itself as workers, -guard too): the parent writes the common start
// time to a worker's standard input and reads its READY line and its result from its standard
// output.
package workerproc

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/flightlock/flightlock/internal/testenv/childproc"
)

// Set tracks the processes a run started (workers, wrk), so that an interrupted run ends
// them by their pids. The zero value is ready to use.
type Set struct {
	cmds sync.Map // the started *exec.Cmd of every tracked process
}

// Track adds a started cmd; the returned func removes it.
func (s *Set) Track(cmd *exec.Cmd) (untrack func()) {
	s.cmds.Store(cmd, nil)
	return func() { s.cmds.Delete(cmd) }
}

// KillAll kills every tracked process.
func (s *Set) KillAll() {
	for c := range s.cmds.Range {
		_ = c.(*exec.Cmd).Process.Kill()
	}
}

// worker is a started worker process, tracked in a Set until it has exited.
type worker struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	out     *bufio.Reader
	untrack func()
}

// line reads the worker's next line without its line ending, giving up after within.
func (w *worker) line(within time.Duration) (string, error) {
	type res struct {
		s   string
		err error
	}
	ch := make(chan res, 1)
	go func() {
		s, err := w.out.ReadString('\n')
		ch <- res{strings.TrimSpace(s), err}
	}()
	select {
	case x := <-ch:
		return x.s, x.err
	case <-time.After(within):
		return "", fmt.Errorf("no line after %v", within)
	}
}

// Run re-executes this binary as procs workers with args, tracked in set, waits up to a
// minute for each to say READY (it has connected and warmed up), sends them all a start lead
// ahead, calls during(start) (nil: nothing) and returns their result lines, waiting up to
// within for each, and the start. It returns once every worker has exited (after its own
// clean-up, which releases what it holds on the server); on an error it kills them first.
func Run(procs int, args []string, set *Set, lead, within time.Duration, during func(start time.Time)) (lines []string, start time.Time, err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, start, err
	}
	ws := make([]*worker, 0, procs)
	defer func() {
		for _, w := range ws {
			if err != nil {
				_ = w.cmd.Process.Kill() // a no-op for a worker that has exited
			}
			_ = w.cmd.Wait()
			w.untrack()
		}
	}()
	for range procs {
		cmd := exec.Command(self, args...)
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return nil, start, fmt.Errorf("worker stdin: %w", err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, start, fmt.Errorf("worker stdout: %w", err)
		}
		childproc.Tie(cmd) // a worker dies with the benchmark, however it ends
		if err := cmd.Start(); err != nil {
			return nil, start, fmt.Errorf("start worker: %w", err)
		}
		ws = append(ws, &worker{cmd: cmd, stdin: in, out: bufio.NewReader(out), untrack: set.Track(cmd)})
	}
	for i, w := range ws {
		if line, err := w.line(time.Minute); err != nil || line != "READY" {
			return nil, start, fmt.Errorf("worker %d (pid %d) not ready: %q %v", i, w.cmd.Process.Pid, line, err)
		}
	}
	start = time.Now().Add(lead)
	for _, w := range ws {
		_, _ = fmt.Fprintf(w.stdin, "%d\n", start.UnixNano())
		_ = w.stdin.Close()
	}
	if during != nil {
		during(start)
	}
	lines = make([]string, len(ws))
	for i, w := range ws {
		if lines[i], err = w.line(within); err != nil {
			return nil, start, fmt.Errorf("worker %d (pid %d): no result: %v", i, w.cmd.Process.Pid, err)
		}
	}
	return lines, start, nil
}

// AwaitStart is the worker's side: it says READY on standard output and returns the common
// start time the parent writes on standard input.
func AwaitStart() (time.Time, error) {
	fmt.Println("READY")
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil {
		return time.Time{}, fmt.Errorf("read start: %w", err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("bad start %q", line)
	}
	return time.Unix(0, ns), nil
}
