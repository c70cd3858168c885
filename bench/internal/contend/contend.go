// Package contend runs the goroutines of a contention scenario, whatever the lock: each
// goroutine takes a key, runs the guarded critical section (guard.Critical) and releases the
// key, again and again. With one key all fight over it (a hot key); with many, each operation
// draws its key uniformly. A Policy says when the goroutines stop, what context a Lock runs
// under, and which critical sections count.
package contend

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
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
	Elapsed       int64   `json:"elapsed"`              // ns from the start to the last goroutine's return
}

// Policy is how a run ends and counts: Until or Window.
type Policy interface {
	more() bool                                         // whether a goroutine takes the lock again
	lockContext() (context.Context, context.CancelFunc) // the context of one Lock (and Window's Unlock)
	unlockContext(lockCtx context.Context) context.Context
	failed(ctx context.Context, err error) (stop bool) // after a failed Lock
	counts() bool                                      // whether the critical section that just ended counts
	done()
}

// Until runs until stop is closed or, with quota above 0, until quota critical sections have
// begun in all. Every critical section that begins counts: goroutines that are waiting when
// stop closes finish theirs. Every Lock runs under one context that ends at deadline (a Lock
// that runs out of it ends its goroutine); Unlocks run without a deadline.
func Until(stop <-chan struct{}, quota int64, deadline time.Time) Policy {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	u := &until{stop: stop, quota: quota, ctx: ctx, cancel: cancel}
	u.tickets.Store(quota)
	return u
}

type until struct {
	stop    <-chan struct{}
	quota   int64
	tickets atomic.Int64
	ctx     context.Context
	cancel  context.CancelFunc
}

func (u *until) more() bool {
	if u.quota > 0 {
		if u.tickets.Add(-1) < 0 {
			return false
		}
	} else {
		select {
		case <-u.stop:
			return false
		default:
		}
	}
	return u.ctx.Err() == nil
}

func (u *until) lockContext() (context.Context, context.CancelFunc) { return u.ctx, func() {} }
func (u *until) unlockContext(context.Context) context.Context      { return context.Background() }
func (u *until) failed(ctx context.Context, err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil
}
func (u *until) counts() bool { return true }
func (u *until) done()        { u.cancel() }

// Window runs until end: goroutines take the lock while it is before end, and a critical
// section counts when it ends before end. Every Lock runs under a context of its own bounded
// at lockTimeout, and its Unlock under the same; a failed Lock is followed by a pause of a
// millisecond, so a store that refuses fast is not hammered.
func Window(end time.Time, lockTimeout time.Duration) Policy {
	return window{end: end, lockTimeout: lockTimeout}
}

type window struct {
	end         time.Time
	lockTimeout time.Duration
}

func (w window) more() bool { return time.Now().Before(w.end) }
func (w window) lockContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), w.lockTimeout)
}
func (w window) unlockContext(lockCtx context.Context) context.Context { return lockCtx }
func (w window) failed(context.Context, error) bool {
	time.Sleep(time.Millisecond)
	return false
}
func (w window) counts() bool { return !time.Now().After(w.end) }
func (w window) done()        {}

// Run starts one goroutine per holder at start; they contend for the keys guarded by gs (one
// guard per key) under policy p. seed makes the key draws of a run reproducible.
func Run(hs []Holder, gs []guard.Guard, start time.Time, seed uint64, p Policy) Result {
	defer p.done()
	var (
		mu  sync.Mutex
		res Result
		wg  sync.WaitGroup
	)
	capWaits := 4096
	if len(hs) > 64 {
		capWaits = 256
	}
	for i, h := range hs {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			rh, _ := h.(ReadHolder)
			var ops, reads, errs, rerrs int64
			var firstErr error
			var readWaits []int64
			waits := make([]int64, 0, capWaits)
			if rh != nil {
				readWaits = make([]int64, 0, capWaits)
			}
			time.Sleep(time.Until(start))
			for p.more() {
				k := 0
				if len(gs) > 1 {
					k = rng.IntN(len(gs))
				}
				ctx, cancel := p.lockContext()
				t0 := time.Now()
				fence, err := h.Lock(ctx, k)
				if err != nil {
					cancel()
					errs++
					if firstErr == nil {
						firstErr = err
					}
					if p.failed(ctx, err) {
						break
					}
					continue
				}
				wait := time.Since(t0)
				reading := rh != nil && rh.Reading()
				if reading {
					gs[k].Read()
				} else {
					gs[k].Critical(fence)
				}
				if p.counts() {
					ops++
					if reading {
						reads++
						readWaits = append(readWaits, int64(wait))
					} else {
						waits = append(waits, int64(wait))
					}
				}
				if err := h.Unlock(p.unlockContext(ctx)); err != nil {
					rerrs++
					if firstErr == nil {
						firstErr = err
					}
				}
				cancel()
			}
			mu.Lock()
			res.Ops += ops
			res.Reads += reads
			res.ReadWaits = append(res.ReadWaits, readWaits...)
			res.Errors += errs
			res.ReleaseErrors += rerrs
			res.Waits = append(res.Waits, waits...)
			if res.FirstErr == "" && firstErr != nil {
				res.FirstErr = firstErr.Error()
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	res.Elapsed = int64(time.Since(start))
	return res
}
