//go:build !linux

package childproc

import "syscall"

const canTie = false

func setDeathSignal(*syscall.SysProcAttr) {}
