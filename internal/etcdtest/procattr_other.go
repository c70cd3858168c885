//go:build !linux

package etcdtest

import "syscall"

// sysProcAttr is nil where the kernel cannot signal a child on its parent's death: members
// are still ended by pid in each test's cleanup.
func sysProcAttr() *syscall.SysProcAttr { return nil }
