package workerproc

import (
	"os/exec"
	"sync"
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
