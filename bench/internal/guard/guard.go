// Package guard is the state a benchmark's critical section protects, and the checks that
// find a second holder: an "inside" count that must read 1 (at most n for a semaphore of n
// permits, Admitting; no writer beside a reader for a read-write lock, ReadWrite), a plain
// counter that a lost update leaves short, and, for locks with fencing tokens, a fence that
// must rise. The words live in this process's memory or in a file every worker process maps
// (Map), so that the checks span processes without touching the lock's store.
package guard

import (
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// Guard guards one key. Its zero value is unusable: build it with New or Map.
type Guard struct {
	inside          *int64 // changed atomically: the holders in the critical section
	plain           *int64 // read and written without atomics: a lost update shows as a shortfall
	violations      *int64 // critical sections that found another holder inside
	lastFence       *int64 // the largest fence seen so far
	fenceViolations *int64 // fences not above the last one seen
	peak            *int64 // the most holders inside at once (readers, for ReadWrite), kept only when limit is above 1 or rw
	readers         *int64 // changed atomically: the readers in a read section (ReadWrite)

	limit int64 // the holders admitted at once; 0 and 1 mean a lock. Per process, not shared.
	rw    bool  // writers (Enter, Critical) also count the readers inside as a violation. Per process.
}

// A guard uses words int64 words; Map maps them from the first page (page bytes) of its file.
const (
	words = 7
	page  = 4096
)

func fromWords(w []int64) Guard {
	return Guard{inside: &w[0], plain: &w[1], violations: &w[2], lastFence: &w[3], fenceViolations: &w[4], peak: &w[5], readers: &w[6]}
}

// Admitting returns a copy of g that admits n holders at once, the check of a semaphore of n
// permits: a critical section that finds n others inside is a violation. Its plain counter is
// incremented atomically, since up to n holders legitimately run at once, and it keeps the
// most holders seen inside at once (Peak), which shows how hard the bound was tested. Every
// process that maps a shared guard must admit the same n.
func (g Guard) Admitting(n int64) Guard {
	g.limit = n
	return g
}

// ReadWrite returns a copy of g that checks a read-write lock: Critical and Enter are a
// writer's, which must find nobody inside, neither a writer nor a reader; Read and EnterRead
// are a reader's, which must find no writer inside and may share with other readers. Peak is
// then the most readers inside at once, which shows whether reads did share. A writer counts
// itself in before it looks at the readers and a reader the other way round (both atomic, so
// sequentially consistent): of two that overlap, at least one sees the other. Every process
// that maps a shared guard must use it this way.
func (g Guard) ReadWrite() Guard {
	g.rw = true
	return g
}

// New returns a guard in this process's memory.
func New() Guard { return fromWords(make([]int64, words)) }

// Map returns a guard whose words live in the file at path (created and zeroed when create),
// shared with every process that maps it, and the function that unmaps it.
func Map(path string, create bool) (Guard, func(), error) {
	flags := os.O_RDWR
	if create {
		flags |= os.O_CREATE | os.O_TRUNC
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		return Guard{}, nil, err
	}
	defer f.Close()
	if create {
		if err := f.Truncate(page); err != nil {
			return Guard{}, nil, err
		}
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return Guard{}, nil, err
	}
	return fromWords(unsafe.Slice((*int64)(unsafe.Pointer(&mem[0])), words)), func() { _ = syscall.Munmap(mem) }, nil
}

// Critical is the benchmark's critical section, run by a holder whose lock gave it fence (0:
// the lock has none, nothing to check): the checks of Enter, one increment of the plain
// counter, Exit.
func (g Guard) Critical(fence int64) {
	g.Enter(fence)
	if g.limit > 1 {
		atomic.AddInt64(g.plain, 1)
	} else {
		v := *g.plain
		*g.plain = v + 1
	}
	g.Exit()
}

// Enter begins a critical section: it counts a violation when another holder is inside, and
// a fence violation when fence (if not 0) is not above the last one seen. A holder that must
// stay inside across other calls (a held key that waiters must not be granted) calls Enter and
// Exit itself.
func (g Guard) Enter(fence int64) {
	n := atomic.AddInt64(g.inside, 1)
	if g.limit > 1 {
		g.raisePeak(n)
	}
	if n > max(g.limit, 1) || g.rw && atomic.LoadInt64(g.readers) != 0 {
		atomic.AddInt64(g.violations, 1)
	}
	if fence != 0 {
		if prev := atomic.SwapInt64(g.lastFence, fence); fence <= prev {
			atomic.AddInt64(g.fenceViolations, 1)
		}
	}
}

// raisePeak raises the peak to n if n is above it.
func (g Guard) raisePeak(n int64) {
	for p := atomic.LoadInt64(g.peak); n > p; p = atomic.LoadInt64(g.peak) {
		if atomic.CompareAndSwapInt64(g.peak, p, n) {
			break
		}
	}
}

// Read is a reader's critical section on a ReadWrite guard: the checks of EnterRead, the
// plain counter read twice, which a write landing in between would change (a violation),
// ExitRead.
func (g Guard) Read() {
	g.EnterRead()
	v := atomic.LoadInt64(g.plain)
	if atomic.LoadInt64(g.plain) != v {
		atomic.AddInt64(g.violations, 1)
	}
	g.ExitRead()
}

// EnterRead begins a read section: it counts a violation when a writer is inside, and raises
// the peak of readers inside at once.
func (g Guard) EnterRead() {
	n := atomic.AddInt64(g.readers, 1)
	if atomic.LoadInt64(g.inside) != 0 {
		atomic.AddInt64(g.violations, 1)
	}
	g.raisePeak(n)
}

// ExitRead ends the read section that EnterRead began.
func (g Guard) ExitRead() { atomic.AddInt64(g.readers, -1) }

// Exit ends the critical section that Enter began.
func (g Guard) Exit() { atomic.AddInt64(g.inside, -1) }

// Plain is the plain counter: the critical sections run, less any lost update.
func (g Guard) Plain() int64 { return atomic.LoadInt64(g.plain) }

// Violations counts the critical sections that found another holder inside.
func (g Guard) Violations() int64 { return atomic.LoadInt64(g.violations) }

// Peak is the most holders seen inside at once by a guard that admits more than one
// (Admitting), the most readers by a ReadWrite guard; 0 for a lock's guard, which does not
// keep it.
func (g Guard) Peak() int64 { return atomic.LoadInt64(g.peak) }

// FenceViolations counts the fences that were not above the last one seen.
func (g Guard) FenceViolations() int64 { return atomic.LoadInt64(g.fenceViolations) }
