package flightlock

import (
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// manualClock is a clock that moves only when a test advances it. Timers fire in due order
// inside Advance, on the test's goroutine, so that every renewal and expiry a step causes has
// happened when Advance returns.
type manualClock struct {
	mu      sync.Mutex
	now     time.Time      // guarded by mu
	timers  []*manualTimer // guarded by mu: every timer made, armed or not
	changes int            // guarded by mu: timers made, reset and stopped
}

type manualTimer struct {
	c     *manualClock
	due   time.Time // guarded by c.mu
	armed bool      // guarded by c.mu
	f     func()
}

func newManualClock() *manualClock { return &manualClock{now: time.Now()} }

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

func (c *manualClock) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }

func (c *manualClock) AfterFunc(d time.Duration, f func()) clockTimer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &manualTimer{c: c, due: c.now.Add(d), armed: true, f: f}
	c.timers = append(c.timers, t)
	c.changes++
	return t
}

func (t *manualTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.armed
	t.due, t.armed = t.c.now.Add(d), true
	t.c.changes++
	return was
}

func (t *manualTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.armed
	t.armed = false
	t.c.changes++
	return was
}

// Advance moves the clock by d, firing each timer that falls due on the way at its due time.
func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	target := c.now.Add(d)
	for {
		var next *manualTimer
		for _, t := range c.timers {
			if t.armed && !t.due.After(target) && (next == nil || t.due.Before(next.due)) {
				next = t
			}
		}
		if next == nil {
			c.now = target
			c.mu.Unlock()
			return
		}
		if next.due.After(c.now) {
			c.now = next.due
		}
		next.armed = false
		c.mu.Unlock()
		next.f() // may Reset timers and read the clock
		c.mu.Lock()
	}
}

// Step advances the clock and miniredis's key expiry together, by d in increments of at most
// tick, so that a renewal due inside the step reaches Redis before a key it would keep expires.
func (c *manualClock) Step(mr *miniredis.Miniredis, d, tick time.Duration) {
	for d > 0 {
		s := min(d, tick)
		c.Advance(s)
		if mr != nil {
			mr.FastForward(s)
		}
		d -= s
	}
}

// The manual clock fires timers in due order, re-armed ones included, and never early.
func TestManualClock(t *testing.T) {
	c := newManualClock()
	start := c.Now()
	var fired []time.Duration
	var rearm clockTimer
	rearm = c.AfterFunc(10*time.Millisecond, func() {
		fired = append(fired, c.Now().Sub(start))
		if len(fired) < 3 {
			rearm.Reset(10 * time.Millisecond)
		}
	})
	stopped := c.AfterFunc(5*time.Millisecond, func() { t.Error("a stopped timer fired") })
	if !stopped.Stop() {
		t.Fatal("Stop of an armed timer reported it idle")
	}
	c.Advance(9 * time.Millisecond)
	if len(fired) != 0 {
		t.Fatalf("fired early: %v", fired)
	}
	c.Advance(time.Second)
	want := []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 30 * time.Millisecond}
	if len(fired) != len(want) {
		t.Fatalf("fired at %v, want %v", fired, want)
	}
	for i := range want {
		if fired[i] != want[i] {
			t.Fatalf("fired at %v, want %v", fired, want)
		}
	}
	if got := c.Now().Sub(start); got != 9*time.Millisecond+time.Second {
		t.Fatalf("clock at %v after advancing 1.009s", got)
	}
}
