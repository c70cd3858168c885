// Package contend runs the goroutines of a contention scenario, whatever the lock: each
// goroutine takes a key, runs the guarded critical section (guard.Critical) and releases the
// key, again and again. With one key all fight over it (a hot key); with many, each operation
// draws its key uniformly. A run counts the critical sections that end inside a fixed window,
// on every store alike.
package contend

import (
	"cmp"
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/flightlock/flightlock/bench/internal/guard"
)

// Holder is one goroutine's hold on a row's lock: Lock takes key k (an index into the run's
// keys) and returns the lock's fencing token (0: it has none), Unlock releases the key it
// holds. A Holder is used by one goroutine only.
type Holder interface {
	Lock(ctx context.Context, k int) (fence int64, err error)
	Unlock(ctx context.Context) error
}

// ReadHolder is a Holder of a read-write lock: Reading says whether its last Lock took a read
// lock, whose critical section only reads the guarded state (guard.Guard.Read, on a ReadWrite
// guard) and whose count and wait are kept apart (Result.Reads, Result.ReadWaits).
type ReadHolder interface {
	Holder
	Reading() bool
}

// Result is what the goroutines of one run (in one process) did.
type Result struct {
	Ops           int64   `json:"ops"`            // critical sections counted, reads included
	Reads         int64   `json:"reads"`          // of Ops, the read sections (ReadHolder)
	Errors        int64   `json:"errors"`         // failed Locks
	ReleaseErrors int64   `json:"release_errors"` // failed Unlocks
	FirstErr      string  `json:"first_err,omitempty"`
	Waits         []int64 `json:"waits"`                // ns from the call of each counted Lock (but reads) to holding the key
	ReadWaits     []int64 `json:"read_waits,omitempty"` // the same for the read sections
	Elapsed       int64   `json:"elapsed"`              // ns of the counting window
}

// Run starts one goroutine per holder at start; they contend for the keys guarded by gs (one
// guard per key) and take the lock while it is before end; a critical section counts when it
// ends before end. Every Lock and Unlock runs under one context that ends lockTimeout after
// end; a failed Lock is followed by a pause of a millisecond, so that a store
// that refuses fast is not hammered. seed makes the key draws of a run reproducible.
func Run(hs []Holder, gs []guard.Guard, start, end time.Time, seed uint64, lockTimeout time.Duration) Result {
	var (
		mu  sync.Mutex
		res Result
		wg  sync.WaitGroup
	)
	capWaits := 4096
	if len(hs) > 64 {
		capWaits = 256
	}
	// One deadline for every Lock of the run, lockTimeout past its end: a timer per Lock would
	// be part of what a row measures (a lease keeps its Lock's context), at a million a second.
	ctx, cancel := context.WithDeadline(context.Background(), end.Add(lockTimeout))
	defer cancel()
	for i, h := range hs {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			rh, _ := h.(ReadHolder)
			r := Result{Waits: make([]int64, 0, capWaits)}
			if rh != nil {
				r.ReadWaits = make([]int64, 0, capWaits)
			}
			var firstErr error
			time.Sleep(time.Until(start))
			for time.Now().Before(end) {
				k := 0
				if len(gs) > 1 {
					k = rng.IntN(len(gs))
				}
				t0 := time.Now()
				fence, err := h.Lock(ctx, k)
				if err != nil {
					r.Errors++
					firstErr = cmp.Or(firstErr, err)
					time.Sleep(time.Millisecond)
					continue
				}
				wait := int64(time.Since(t0))
				reading := rh != nil && rh.Reading()
				if reading {
					gs[k].Read()
				} else {
					gs[k].Critical(fence)
				}
				if !time.Now().After(end) {
					r.Ops++
					if reading {
						r.Reads++
						r.ReadWaits = append(r.ReadWaits, wait)
					} else {
						r.Waits = append(r.Waits, wait)
					}
				}
				if err := h.Unlock(ctx); err != nil {
					r.ReleaseErrors++
					firstErr = cmp.Or(firstErr, err)
				}
			}
			if firstErr != nil {
				r.FirstErr = firstErr.Error()
			}
			mu.Lock()
			res.Add(r)
			mu.Unlock()
		})
	}
	wg.Wait()
	res.Elapsed = int64(end.Sub(start))
	return res
}

// Add adds o's counts and waits to r, and its first error if r has none; the window (Elapsed)
// is the caller's to combine.
func (r *Result) Add(o Result) {
	r.Ops += o.Ops
	r.Reads += o.Reads
	r.Errors += o.Errors
	r.ReleaseErrors += o.ReleaseErrors
	r.Waits = append(r.Waits, o.Waits...)
	r.ReadWaits = append(r.ReadWaits, o.ReadWaits...)
	r.FirstErr = cmp.Or(r.FirstErr, o.FirstErr)
}
