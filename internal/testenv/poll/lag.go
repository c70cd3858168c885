package poll

import (
	"sync/atomic"
	"testing"
	"time"
)

// DeadlineSlack is how far past its deadline a call may return beside the scheduling delay a
// LagProbe saw meanwhile: a machine's pace, not a wait of the code under test.
const DeadlineSlack = 250 * time.Millisecond

// LagProbe measures how late a sleeping goroutine wakes, the scheduling delay of a loaded
// machine, so that a deadline check counts only what the code under test added to it.
type LagProbe struct {
	worst atomic.Int64 // the latest wake-up since the last Lag, in ns
}

// StartLagProbe starts a probe that runs until t ends.
func StartLagProbe(t testing.TB) *LagProbe {
	p, stop, done := new(LagProbe), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		const nap = 5 * time.Millisecond
		for {
			start := time.Now()
			select {
			case <-stop:
				return
			case <-time.After(nap):
			}
			late := int64(time.Since(start) - nap)
			for w := p.worst.Load(); late > w && !p.worst.CompareAndSwap(w, late); w = p.worst.Load() {
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return p
}

// Lag returns the latest wake-up since the last call, and starts counting afresh.
func (p *LagProbe) Lag() time.Duration { return time.Duration(p.worst.Swap(0)) }
