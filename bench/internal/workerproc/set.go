package workerproc

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Set tracks the processes a run started (workers, wrk), so that an interrupted run ends
// them by their pids. The zero value is ready to use.
type Set struct {
	mu sync.Mutex
	m  map[*exec.Cmd]bool // guarded by mu
}

// Track adds a started cmd; the returned func removes it.
func (s *Set) Track(cmd *exec.Cmd) (untrack func()) {
	s.mu.Lock()
	if s.m == nil {
		s.m = map[*exec.Cmd]bool{}
	}
	s.m[cmd] = true
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.m, cmd)
		s.mu.Unlock()
	}
}

// KillAll kills every tracked process.
func (s *Set) KillAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.m {
		if c.Process != nil {
			_ = c.Process.Kill()
		}
	}
}

// readLine reads one line from r without its line ending, giving up after within.
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

// Run re-executes this binary as procs workers with args, tracked in set, waits up to a
// minute for each to say READY, sends them all a start lead ahead, calls during(start) (nil:
// nothing) and returns their result lines, waiting up to within for each, and the start.
func Run(procs int, args []string, set *Set, lead, within time.Duration, during func(start time.Time)) ([]string, time.Time, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, time.Time{}, err
	}
	cmds := make([]*exec.Cmd, procs)
	for i := range cmds {
		cmds[i] = exec.Command(self, args...)
	}
	g, err := startGroup(cmds, set, time.Minute)
	if err != nil {
		return nil, time.Time{}, err
	}
	start := time.Now().Add(lead)
	g.release(start)
	if during != nil {
		during(start)
	}
	lines, err := g.results(within)
	return lines, start, err
}

// group is the workers of one measurement, started together.
type group struct {
	Procs   []*proc
	set     *Set
	untrack []func()
}

// startGroup starts a worker per command, tracked in set, and waits up to ready for each
// one's READY line (it has connected and warmed up).
func startGroup(cmds []*exec.Cmd, set *Set, ready time.Duration) (*group, error) {
	g := &group{set: set}
	for _, cmd := range cmds {
		p, err := start(cmd)
		if err != nil {
			g.kill()
			return nil, err
		}
		g.Procs = append(g.Procs, p)
		g.untrack = append(g.untrack, set.Track(cmd))
	}
	for i, p := range g.Procs {
		line, err := readLine(p.Out, ready)
		if err != nil || line != "READY" {
			g.kill()
			return nil, fmt.Errorf("worker %d (pid %d) not ready: %q %v", i, p.Cmd.Process.Pid, line, err)
		}
	}
	return g, nil
}

// release sends every worker the common start time.
func (g *group) release(start time.Time) {
	for _, p := range g.Procs {
		_, _ = fmt.Fprintf(p.Stdin, "%d\n", start.UnixNano())
		_ = p.Stdin.Close()
	}
}

// results reads each worker's result line, waiting up to within for each, and waits for the
// workers to exit (after their own clean-up, which releases what they hold on the server).
func (g *group) results(within time.Duration) ([]string, error) {
	lines := make([]string, len(g.Procs))
	for i, p := range g.Procs {
		line, err := readLine(p.Out, within)
		if err != nil {
			g.kill()
			return nil, fmt.Errorf("worker %d (pid %d): no result: %v", i, p.Cmd.Process.Pid, err)
		}
		lines[i] = line
	}
	for i, p := range g.Procs {
		_ = p.Cmd.Wait()
		g.untrack[i]()
	}
	g.Procs, g.untrack = nil, nil
	return lines, nil
}

// kill kills the workers that are still running, waits for them and untracks them.
func (g *group) kill() {
	for i, p := range g.Procs {
		_ = p.Cmd.Process.Kill() // a no-op for a worker that has exited
		_ = p.Cmd.Wait()
		g.untrack[i]()
	}
	g.Procs, g.untrack = nil, nil
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
