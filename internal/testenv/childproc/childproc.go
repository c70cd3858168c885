// Package childproc ties the processes that tests start (redis-server, etcd, mariadbd, copies
// of the test binary) to the test process: on Linux the kernel SIGKILLs such a child when the
// process that started it dies. A test ends its children by pid in its cleanup, but a test
// binary that panics, or that go test kills at its -timeout, runs no cleanup, and its servers
// would otherwise live on (holding ports, and any file lock the test's caller took, such as
// flock's on a shared lock file).
//
// The kernel signals the child when the thread that forked it exits. Go's runtime keeps its
// threads for the life of the process, except one that a goroutine locked with LockOSThread
// and never unlocked; no caller here starts a child from such a goroutine.
package childproc

import (
	"os/exec"
	"syscall"
)

// Tie makes cmd, not yet started, die with the process that starts it, where the system can
// (Linux); elsewhere it changes nothing.
func Tie(cmd *exec.Cmd) {
	if !canTie {
		return
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	setDeathSignal(cmd.SysProcAttr)
}
