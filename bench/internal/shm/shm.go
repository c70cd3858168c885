// Package shm maps a page of int64 words from a file, shared between the benchmark's worker
// processes: the critical-section guards of the multi-process scenarios live there, so that a
// second holder in another process is seen as an overlap.
package shm

import (
	"os"
	"syscall"
	"unsafe"
)

// Words is the number of int64 words a mapping holds (one 4 KiB page).
const Words = 512

// Map maps the first page of the file at path (created and zeroed when create) and returns its
// words and the function that unmaps them.
func Map(path string, create bool) (*[Words]int64, func(), error) {
	flags := os.O_RDWR
	if create {
		flags |= os.O_CREATE | os.O_TRUNC
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	if create {
		if err := f.Truncate(Words * 8); err != nil {
			return nil, nil, err
		}
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, Words*8, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, err
	}
	return (*[Words]int64)(unsafe.Pointer(&mem[0])), func() { _ = syscall.Munmap(mem) }, nil
}
