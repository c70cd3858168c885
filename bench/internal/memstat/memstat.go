// Package memstat measures what the benchmark process holds, for the memory scenarios of
// the benchmark command, on every store: live heap, stacks and goroutines after a full
// collection, the peak goroutine count over a window, and work spread over a bounded number of
// goroutines.
package memstat

import (
	"cmp"
	"context"
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
func Parallel(n, k int, fn func(i int) error) (int64, error) {
	var (
		next atomic.Int64
		f    failures
		wg   sync.WaitGroup
	)
	for range min(n, k) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				f.add(fn(i))
			}
		})
	}
	wg.Wait()
	return f.n.Load(), f.first
}

// failures counts the errors of concurrent calls and keeps the first.
type failures struct {
	n     atomic.Int64
	mu    sync.Mutex
	first error // guarded by mu
}

// add counts err unless it is nil.
func (f *failures) add(err error) {
	if err == nil {
		return
	}
	f.n.Add(1)
	f.mu.Lock()
	f.first = cmp.Or(f.first, err)
	f.mu.Unlock()
}

// Waiting is one row of a memory scenario's waiting part: a key is held when Wait is called;
// W goroutines wait for it, arriving evenly over Arrive; after Settle their cost is read, then
// Window measures a while of waiting; then the key is released and every waiter, once
// granted, runs Granted and releases at once.
type Waiting struct {
	W      int
	Arrive time.Duration
	Settle time.Duration
	// Bound is each waiter's context: from the first arrival, long enough for the settling, the
	// window and the serving.
	Bound   time.Duration
	Lock    func(ctx context.Context, i int) error // waiter i waits for the held key
	Granted func(i int)                            // waiter i holds the key (nil: nothing to check)
	Unlock  func(i int) error                      // waiter i releases the key
	Window  func()                                 // measures the waiting (and takes its time)
	Release func() error                           // releases the held key
}

// Waited is what Wait measured. Next and All are from the release of the held key to the first
// grant and to the last; they are 0 when no waiter was served.
type Waited struct {
	Base, Waiting State
	Next, All     time.Duration
	Served        int64
	Errors        int64 // failed Locks and Unlocks, and a failed release of the held key
	FirstErr      error
}

// Wait measures one waiting row.
func Wait(w Waiting) Waited {
	var r Waited
	r.Base = Live()
	ctx, cancel := context.WithTimeout(context.Background(), w.Bound)
	defer cancel()
	var (
		first, last, served atomic.Int64
		f                   failures
		wg                  sync.WaitGroup
	)
	first.Store(1 << 62)
	for i := range w.W {
		wg.Go(func() {
			// Arrivals spread over Arrive, as requests come: waiters that all start at once and
			// poll at a fixed interval would retry in lockstep.
			time.Sleep(time.Duration(i) * w.Arrive / time.Duration(w.W))
			if err := w.Lock(ctx, i); err != nil {
				f.add(err)
				return
			}
			at := time.Now().UnixNano()
			if w.Granted != nil {
				w.Granted(i)
			}
			for v := first.Load(); at < v && !first.CompareAndSwap(v, at); v = first.Load() {
			}
			for v := last.Load(); at > v && !last.CompareAndSwap(v, at); v = last.Load() {
			}
			served.Add(1)
			f.add(w.Unlock(i))
		})
	}
	time.Sleep(w.Settle)
	r.Waiting = Live()
	w.Window()
	t0 := time.Now().UnixNano()
	f.add(w.Release())
	wg.Wait()
	r.Served, r.Errors, r.FirstErr = served.Load(), f.n.Load(), f.first
	if r.Served > 0 {
		r.Next, r.All = time.Duration(first.Load()-t0), time.Duration(last.Load()-t0)
	}
	return r
}
