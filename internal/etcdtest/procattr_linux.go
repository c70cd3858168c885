package etcdtest

import "syscall"

// sysProcAttr makes the kernel SIGKILL a member when the test binary that started it dies
// (a test that panics or times out), so no etcd outlives its test.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
