package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// guard is the state a critical section protects. inside is changed atomically and counts the
// goroutines (of any process) in the critical section: more than one is a violation. plain is
// read and written without atomics: a lost update also shows a violation. In scenario 3 both
// live in a file mapped into every worker process.
type guard struct {
	inside     *int64
	plain      *int64
	violations *int64
}

func newGuard() guard {
	var s [3]int64
	return guard{inside: &s[0], plain: &s[1], violations: &s[2]}
}

// critical is the benchmark's critical section: one guarded counter increment.
func (g guard) critical() {
	if atomic.AddInt64(g.inside, 1) != 1 {
		atomic.AddInt64(g.violations, 1)
	}
	v := *g.plain
	*g.plain = v + 1
	atomic.AddInt64(g.inside, -1)
}

// contendResult is what a set of goroutines fighting over one key report.
type contendResult struct {
	Ops      int64   `json:"ops"`
	Errors   int64   `json:"errors"`
	FirstErr string  `json:"first_err,omitempty"`
	Waits    []int64 `json:"waits"` // acquire waits, ns
	Elapsed  int64   `json:"elapsed"`
	RT       int64   `json:"rt"`
}

// contend runs g goroutines that lock a key, run its critical section, and unlock, until stop
// is closed (quota 0) or until quota critical sections have been run in all. Each operation
// takes a key drawn uniformly from keys (guarded by gds, one guard per key); with one key, all
// fight over it. Goroutines that are waiting when stop closes finish their critical section, so
// every counted one was real.
func contend(im impl, keys []string, gds []guard, g int, start time.Time, stop <-chan struct{}, quota int64, hardDeadline time.Time) contendResult {
	var (
		tickets  atomic.Int64
		ops      atomic.Int64
		errs     atomic.Int64
		errMu    sync.Mutex
		firstErr string
		wg       sync.WaitGroup
		waitsMu  sync.Mutex
		waits    []int64
	)
	tickets.Store(quota)
	rt0 := im.roundTrips()
	ctx, cancel := context.WithDeadline(context.Background(), hardDeadline)
	defer cancel()
	capWaits := 4096
	if g > 64 {
		capWaits = 256
	}
	for i := 0; i < g; i++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(start.UnixNano())))
			local := make([]int64, 0, capWaits)
			time.Sleep(time.Until(start))
			for {
				if quota > 0 {
					if tickets.Add(-1) < 0 {
						break
					}
				} else if isClosed(stop) {
					break
				}
				if ctx.Err() != nil {
					break
				}
				k := 0
				if len(keys) > 1 {
					k = rng.IntN(len(keys))
				}
				t0 := time.Now()
				h, err := im.lock(ctx, keys[k])
				if err != nil {
					errs.Add(1)
					setErr(&errMu, &firstErr, err)
					if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
						break
					}
					continue
				}
				local = append(local, int64(time.Since(t0)))
				gds[k].critical()
				if err := im.unlock(context.Background(), keys[k], h); err != nil {
					errs.Add(1)
					setErr(&errMu, &firstErr, err)
				}
				ops.Add(1)
			}
			waitsMu.Lock()
			waits = append(waits, local...)
			waitsMu.Unlock()
		}(uint64(i))
	}
	wg.Wait()
	res := contendResult{Ops: ops.Load(), Errors: errs.Load(), Waits: waits, Elapsed: int64(time.Since(start)), RT: im.roundTrips() - rt0}
	res.FirstErr = firstErr
	return res
}

func setErr(mu *sync.Mutex, first *string, err error) {
	mu.Lock()
	if *first == "" {
		*first = err.Error()
	}
	mu.Unlock()
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
