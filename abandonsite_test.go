package flightlock

// The place of a grant (Lease.site) belongs to the grant: one gate entry carries several holds
// over time, and a lease made late on an abandoned hold (the woken waiter of
// TestWokenWaiterGetsTheHoldItWasGranted) must neither change the next grant's place nor race
// with it.

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The grant taken afresh after an abandoned handoff reports where it was taken when it is
// abandoned in turn, not "came by handoff": the late lease on the abandoned hold must not
// overwrite the site of the entry's next grant.
func TestAbandonReportNamesWhereTheAbandonedGrantWasTaken(t *testing.T) {
	s, mr, _ := miniStore(t)
	ctx := context.Background()
	clk := newManualClock()
	const ttl = 3 * time.Second
	reports := make(chan string, 4)
	l := mustLocker(t, s, WithTTL(ttl), WithWait(time.Minute), WithHandoff(8, time.Hour), withClock(clk),
		WithObserver(Observer{Abandoned: func(_, at string) { reports <- at }}))

	woken, resume := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	testHookWoken = func() {
		if first.CompareAndSwap(false, true) {
			close(woken)
			<-resume
		}
	}
	t.Cleanup(func() { testHookWoken = nil })

	a, w, x := holdWithTwoQueued(t, l, "k")
	if err := a.Release(ctx); err != nil { // handoff to the first waiter, which stalls
		t.Fatal(err)
	}
	<-woken
	mr.Del(l.cfg.prefix + "k")
	clk.Advance(ttl + time.Millisecond) // the handed grant is abandoned; the second waiter acquires
	var xl *Lease
	select {
	case r := <-x:
		xl = r.must(t)
	case <-time.After(5 * time.Second):
		close(resume)
		t.Fatal("the abandoned grant did not pass the slot on")
	}
	select {
	case at := <-reports:
		// The abandoned grant came by handoff; its receiver had made no lease yet, so the entry
		// still names the previous grant's Lock, whose lease was released properly.
		if !strings.Contains(at, "handoff") {
			t.Errorf("the abandoned handed grant is reported taken at %q: the previous holder's Lock, whose lease was released", at)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the handed grant's abandon was not reported")
	}
	if xl.Grant() != GrantStore {
		t.Fatalf("the second waiter's grant is %v, want a store grant", xl.Grant())
	}

	close(resume) // the stalled waiter makes its (lost) lease on the abandoned hold
	r := <-w
	if r.err != nil {
		t.Fatal(r.err)
	}
	_ = r.lease.Release(ctx)

	// The second waiter never releases: its lock goes away, its grant is abandoned in turn.
	mr.Del(l.cfg.prefix + "k")
	clk.Advance(ttl/3 + time.Millisecond) // the renewal is refused: lost
	waitFor(t, 5*time.Second, "the second grant to be lost", xl.h.isLost)
	clk.Advance(ttl) // past its expiry: abandoned
	select {
	case at := <-reports:
		if strings.Contains(at, "handoff") || !strings.Contains(at, "_test.go") {
			t.Errorf("the abandoned store grant is reported taken at %q, want lockIn's Lock call (turnend_test.go)", at)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the second grant's abandon was not reported")
	}
	if err := xl.Release(ctx); err != nil && !errors.Is(err, ErrNotHeld) && !errors.Is(err, ErrLost) {
		t.Logf("release: %v", err)
	}
}

// The same interleaving without the test ordering the two goroutines: the stalled waiter's late
// lease on hold A and the next owner's grant of hold B must not both write the entry's site
// unordered (-race sees it).
func TestWokenWaiterAndNextOwnerDoNotRaceOnTheGrantSite(t *testing.T) {
	s, mr, _ := miniStore(t)
	ctx := context.Background()
	clk := newManualClock()
	const ttl = 3 * time.Second
	l := mustLocker(t, s, WithTTL(ttl), WithWait(time.Minute), WithHandoff(8, time.Hour), withClock(clk),
		WithObserver(Observer{Abandoned: func(string, string) {}}))

	woken, resume := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	testHookWoken = func() {
		if first.CompareAndSwap(false, true) {
			close(woken)
			<-resume
		}
	}
	t.Cleanup(func() { testHookWoken = nil })

	a, w, x := holdWithTwoQueued(t, l, "k")
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	<-woken
	mr.Del(l.cfg.prefix + "k")
	clk.Advance(ttl + time.Millisecond)
	close(resume) // at once: the stalled waiter and the second waiter go on side by side
	for _, c := range []<-chan lockResult{w, x} {
		select {
		case r := <-c:
			if r.lease != nil {
				_ = r.lease.Release(ctx)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a waiter did not return")
		}
	}
}
