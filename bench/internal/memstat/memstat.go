// Package memstat measures what the benchmark process holds, for the memory scenarios of
// the benchmark command, on every store: live heap, stacks and goroutines after a full
// collection, the peak goroutine count over a window, and work spread over a bounded number of
// goroutines.
package memstat

import (
	"cmp"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// State is what the process holds after a full collection.
type State struct {
	Heap, Stack float64 // bytes: live heap objects, goroutine stacks in use
	Goroutines  int
}

// Live collects twice (the first collection's finalizers may free more) and reads the live
// heap, the stacks in use and the goroutine count.
func Live() State {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return State{Heap: float64(ms.HeapAlloc), Stack: float64(ms.StackInuse), Goroutines: runtime.NumGoroutine()}
}

// SettleGoroutines waits up to d for the goroutine count to come down to base (goroutines
// that a release ends exit on their own schedule).
func SettleGoroutines(base int, d time.Duration) {
	for deadline := time.Now().Add(d); runtime.NumGoroutine() > base && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
}

// PeakSampler records the highest goroutine count, every 2ms, until stop is called; stop
// returns it, the sampler itself not counted.
func PeakSampler() (stop func() int) {
	var peak atomic.Int64
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			if n := int64(runtime.NumGoroutine()); n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() int {
		close(done)
		<-finished
		return int(peak.Load()) - 1
	}
}

// Parallel runs fn(i) for i in [0, n) on at most k goroutines; it returns how many failed and
// the first error.
func Parallel(n, k int, fn func(i int) error) (failed int64, first error) {
	var (
		next atomic.Int64
		mu   sync.Mutex // guards failed and first
		wg   sync.WaitGroup
	)
	for range min(n, k) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if err := fn(i); err != nil {
					mu.Lock()
					failed, first = failed+1, cmp.Or(first, err)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return failed, first
}
