package flightlock

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"
)

// goroutineBlockedIn reports whether some goroutine's stack holds fn and waits for a mutex.
func goroutineBlockedIn(fn string) bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, fn) && strings.Contains(g, "Mutex).Lock") {
			return true
		}
	}
	return false
}

// A release whose handoff checked the hold (handable) and then waits for the gate's mutex
// while the watchdog loses the hold and, at its expiry, finds the grant already ended (live 0,
// abandonLocked does nothing and schedules nothing more) hands a lost hold to the next waiter
// (nextGrant sets live to 1 on it). Nothing is left to end that grant if its lease is never
// released: the waiters behind it stay queued while the key is free in Redis.
func TestHandoffOfAHoldLostMeanwhileReleasesIt(t *testing.T) {
	s, mr, _ := miniStore(t)
	ctx := context.Background()
	clk := newManualClock()
	const ttl = 3 * time.Second
	l := mustLocker(t, s, WithTTL(ttl), WithWait(time.Minute), WithHandoff(8, time.Hour), withClock(clk))

	a, w, x := holdWithTwoQueued(t, l, "k")

	// The releasing goroutine is held up between its handable check and the gate's mutex.
	l.k.gate.mu.Lock()
	released := make(chan error, 1)
	go func() { released <- a.Release(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for !goroutineBlockedIn("(*gate).handoff") {
		if time.Now().After(deadline) {
			l.k.gate.mu.Unlock()
			t.Fatal("the release did not reach the handoff")
		}
		time.Sleep(time.Millisecond)
	}
	// Meanwhile the lock goes away in Redis: the next renewal is refused, the hold is lost, and
	// at its expiry the watchdog finds no live lease.
	mr.Del(l.cfg.prefix + "k")
	clk.Advance(ttl + time.Millisecond)
	l.k.gate.mu.Unlock()
	if err := <-released; err != nil && !errors.Is(err, ErrNotHeld) {
		t.Fatalf("release: %v", err) // ErrNotHeld: the lock vanished in Redis
	}

	var wl *Lease
	select {
	case r := <-w:
		wl = r.must(t)
	case <-time.After(5 * time.Second):
		t.Fatal("the first waiter was not granted")
	}
	defer func() { _ = wl.Release(ctx) }()
	if cause := context.Cause(wl.Context()); !errors.Is(cause, ErrLost) {
		t.Logf("the first waiter got a live lease (grant %v): fine", wl.Grant())
		return
	}
	t.Logf("the first waiter got a lease lost at birth (grant %v); it is never released", wl.Grant())

	// Its holder was told to stop but never releases (a forgotten Release): once the lock may
	// have expired, the grant must end and the next waiter get the key, free in Redis.
	clk.Advance(2 * ttl)
	select {
	case r := <-x:
		xl := r.must(t)
		_ = xl.Release(ctx)
	case <-time.After(2 * time.Second):
		t.Errorf("the second waiter is stranded: the key is free in Redis (exists %v), the lost grant never ends (live %d, abandoned %v, in heap %v)",
			mr.Exists(l.cfg.prefix+"k"), liveOf(wl.h), abandonedOf(wl.h), wl.h.slot != 0)
		_ = wl.Release(ctx)
		select {
		case r := <-x:
			if r.lease != nil {
				_ = r.lease.Release(ctx)
			}
		case <-time.After(5 * time.Second):
		}
	}
}

func liveOf(h *hold) int32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.live
}

func abandonedOf(h *hold) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.has(holdAbandoned)
}
