package flightlock

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

// stallCtx is a context whose second Err call (Lock's b.spent() after the gate granted the
// slot) stops until the test lets it go, and then reports the context ended: it stands for a
// waiter goroutine that was granted the slot by handoff and was not scheduled again until its
// context (or its wait budget) had ended.
type stallCtx struct {
	context.Context
	calls   atomic.Int32
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func newStallCtx() *stallCtx {
	return &stallCtx{Context: context.Background(), entered: make(chan struct{}), release: make(chan struct{})}
}

func (c *stallCtx) Err() error {
	switch n := c.calls.Add(1); {
	case n < 2:
		return nil
	case n == 2:
		c.once.Do(func() { close(c.entered) })
		<-c.release
	}
	return context.Canceled
}

// A waiter that the gate granted a hold by handoff, and that gives the slot back because its
// wait ended (locker.go: "The slot was granted just as the wait ended"), must not end the
// grant a second time when the watchdog has abandoned that grant meanwhile (the hold was lost
// and Redis may have expired the key: hold.abandonLocked ends the grant on a renewer). The
// spent path calls endGrant directly, without hold.done(), which is what keeps a Lease.Release
// from doing the same. Ending the grant twice leaves the gate slot twice: the second leave
// frees the slot (or grants it) while the goroutine that the first leave granted it to holds
// the lock, and deletes the key's entry while it is held.
func TestSpentWaiterDoesNotEndAnAbandonedGrantAgain(t *testing.T) {
	l, _, xl := abandonedWhileHandedOver(t)
	ctx := context.Background()
	// The second waiter holds the key: the gate must still know it.
	if n := l.gateLen(); n != 1 {
		t.Errorf("gate has %d entries while a goroutine holds the key, want 1", n)
	}
	dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	derr := l.Drain(dctx)
	cancel()
	if derr == nil {
		t.Errorf("Drain returned nil while a lease of this process still held the key")
	}
	_ = xl.Release(ctx)
}

// The same double end, with WithFailOpen: the gate is all that excludes the goroutines of a
// process while Redis cannot be reached, and after the double end it lets a second goroutine
// in beside the holder.
func TestSpentWaiterAbandonRaceLetsTwoInWithFailOpen(t *testing.T) {
	l, mr, xl := abandonedWhileHandedOver(t, WithFailOpen(true))
	ctx := context.Background()
	mr.Close() // Redis goes away; the holder's lease is still live (its clock has not moved)
	if err := context.Cause(xl.Context()); err != nil {
		t.Fatalf("the holder's lease ended: %v", err)
	}
	y, err := l.TryLock(ctx, "k")
	if err == nil {
		t.Errorf("a second goroutine of the process got the key (degraded %v, grant %v) while another holds it",
			y.Degraded(), y.Grant())
		_ = y.Release(ctx)
	} else if !errors.Is(err, ErrBusy) {
		t.Errorf("TryLock of a key held in this process: %v, want ErrBusy", err)
	}
	_ = xl.Release(ctx)
}

// abandonedWhileHandedOver hands a hold to a waiter that stalls before it sees that its wait
// ended, lets the watchdog abandon that grant meanwhile (the lock vanished in Redis), which
// gives the slot to a second waiter, and then lets the stalled waiter give its slot back. It
// returns the Locker, the miniredis and the second waiter's lease.
func abandonedWhileHandedOver(t *testing.T, opts ...Option) (*Locker, interface{ Close() }, *Lease) {
	t.Helper()
	s, mr, _ := miniStore(t)
	ctx := context.Background()
	clk := newManualClock()
	const ttl = 3 * time.Second
	l := mustLocker(t, s, append([]Option{WithTTL(ttl), WithWait(time.Minute), WithHandoff(8, time.Hour), withClock(clk)}, opts...)...)

	a, err := l.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	sc := newStallCtx()
	wDone := make(chan error, 1)
	go func() {
		lease, err := l.Lock(sc, "k")
		if lease != nil {
			_ = lease.Release(ctx)
			err = errors.New("the stalled waiter got a lease")
		}
		wDone <- err
	}()
	waitFor(t, 5*time.Second, "the stalled waiter to queue", func() bool { return queuedOn(l, "k") == 1 })
	x := lockIn(l, "k")
	waitFor(t, 5*time.Second, "the second waiter to queue", func() bool { return queuedOn(l, "k") == 2 })

	if err := a.Release(ctx); err != nil { // handoff to the stalled waiter
		t.Fatal(err)
	}
	<-sc.entered // it owns the slot and the hold, and has not looked at its context yet

	// The lock goes away in Redis: the next renewal answers ErrNotHeld, the hold is lost, and
	// once the key may have expired (validUntil) the watchdog abandons the grant, whose one
	// live count is the stalled waiter's: the gate slot goes to the second waiter.
	mr.Del(l.cfg.prefix + "k")
	clk.Advance(ttl + time.Millisecond)

	var xl *Lease
	select {
	case r := <-x:
		xl = r.must(t)
	case <-time.After(5 * time.Second):
		close(sc.release)
		t.Fatal("the abandoned grant did not pass the slot on")
	}

	close(sc.release) // the stalled waiter sees its context ended and gives the slot back
	if err := <-wDone; err == nil || !errors.Is(err, ErrBusy) {
		t.Errorf("stalled waiter: %v, want ErrBusy", err)
	}
	return l, mr, xl
}

// A waiter granted a hold by handoff that stops between its wake-up and its look at what it
// was granted (testHookWoken) must get that hold, not whatever the gate holds when it looks:
// meanwhile the watchdog may abandon the handed grant (lost, past its expiry) and pass the slot
// to the next waiter, which acquires afresh. The gate's current hold is then the next waiter's,
// and a lease on it would let two goroutines of the process into the critical section (and
// its release would end the other's grant). The stalled waiter gets a lease that is lost at
// once instead, and its Release leaves the gate alone.
func TestWokenWaiterGetsTheHoldItWasGranted(t *testing.T) {
	s, mr, _ := miniStore(t)
	ctx := context.Background()
	clk := newManualClock()
	const ttl = 3 * time.Second
	l := mustLocker(t, s, WithTTL(ttl), WithWait(time.Minute), WithHandoff(8, time.Hour), withClock(clk))

	woken := make(chan struct{})
	resume := make(chan struct{})
	var first atomic.Bool
	testHookWoken = func() {
		if first.CompareAndSwap(false, true) { // the first waiter to wake stops; later ones go on
			close(woken)
			<-resume
		}
	}
	t.Cleanup(func() { testHookWoken = nil })

	a, w, x := holdWithTwoQueued(t, l, "k")

	if err := a.Release(ctx); err != nil { // handoff to the first waiter
		t.Fatal(err)
	}
	<-woken // it has the slot and the hold, and has not looked yet

	// The lock goes away in Redis; the watchdog loses the hold, abandons the grant at its
	// expiry and passes the slot to the second waiter, which acquires the key afresh.
	mr.Del(l.cfg.prefix + "k")
	clk.Advance(ttl + time.Millisecond)
	var xl *Lease
	select {
	case r := <-x:
		xl = r.must(t)
	case <-time.After(5 * time.Second):
		close(resume)
		t.Fatal("the abandoned grant did not pass the slot on")
	}
	if err := context.Cause(xl.Context()); err != nil {
		t.Fatalf("the second waiter's lease ended: %v", err)
	}

	close(resume) // the first waiter looks at what it was granted
	var wl *Lease
	select {
	case r := <-w:
		if r.err != nil {
			t.Fatalf("first waiter: %v", r.err)
		}
		wl = r.lease
	case <-time.After(5 * time.Second):
		t.Fatal("the first waiter did not return")
	}
	if err := context.Cause(wl.Context()); !errors.Is(err, ErrLost) {
		t.Errorf("the first waiter's lease is live (cause %v) while the second waiter holds the key: two goroutines inside", err)
	}
	_ = wl.Release(ctx)
	if err := context.Cause(xl.Context()); err != nil {
		t.Errorf("the first waiter's release ended the second waiter's lease: %v", err)
	}
	if n := l.gateLen(); n != 1 {
		t.Errorf("gate has %d entries while the second waiter holds the key, want 1", n)
	}
	if _, err := l.TryLock(ctx, "k"); !errors.Is(err, ErrBusy) {
		t.Errorf("TryLock while the second waiter holds the key: %v, want ErrBusy", err)
	}
	if err := xl.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A grant the watchdog gave up (lost, past its expiry) admits no re-entry: a Lock on a context
// that carries its lease without the lease's cancellation (a job started from the handler with
// context.WithoutCancel) fails with ErrLost, as the holder's own context says, instead of
// returning a lease of a lock another owner may hold by now.
func TestAbandonedGrantAdmitsNoReentry(t *testing.T) {
	s, mr, _ := miniStore(t)
	ctx := context.Background()
	clk := newManualClock()
	const ttl = 3 * time.Second
	l := mustLocker(t, s, WithTTL(ttl), withClock(clk))
	lease, err := l.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	mr.Del(l.cfg.prefix + "k") // the lock goes away in the store; the next renewal finds it gone
	clk.Advance(ttl + time.Millisecond)
	waitFor(t, 5*time.Second, "the watchdog to give the grant up", func() bool {
		lease.h.mu.Lock()
		defer lease.h.mu.Unlock()
		return lease.h.has(holdAbandoned)
	})
	if !errors.Is(context.Cause(lease.Context()), ErrLost) {
		t.Fatalf("the abandoned lease's context: %v, want ErrLost", context.Cause(lease.Context()))
	}
	again, err := l.Lock(context.WithoutCancel(lease.Context()), "k")
	if err == nil {
		_ = again.Release(ctx)
		t.Fatalf("a re-entry into an abandoned grant returned a lease (fence %d, grant %v)", again.Fence(), again.Grant())
	}
	if !errors.Is(err, ErrLost) {
		t.Fatalf("a re-entry into an abandoned grant: %v, want ErrLost", err)
	}
	_ = lease.Release(ctx)
}

// The place of a grant (Lease.site) belongs to the grant: one gate entry carries several holds
// over time, and a lease made late on an abandoned hold (the woken waiter of
// TestWokenWaiterGetsTheHoldItWasGranted) must neither change the next grant's place nor race
// with it.

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
		if !strings.Contains(at, "came by handoff") {
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
		if strings.HasPrefix(at, "unknown") || !strings.Contains(at, "handoff_test.go") {
			t.Errorf("the abandoned store grant is reported taken at %q, want lockIn's Lock call (handoff_test.go)", at)
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

// Fences strictly increase across grants of a key (Guarantee 3), also when the slot's fence
// counter reads ahead of the server clock (a clock that stepped back, or a slot whose keys
// hand out fences faster than one per microsecond). A grant that went on by handoff (fence
// base+1) and then lost its lock (renewals cannot reach Redis, the key expires) is abandoned
// by the watchdog; its release finds the key gone, and release.lua returns before it raises the
// counter to the handed fences. The next grant then draws base+1 again.
func TestFenceAfterAnAbandonedHandedGrant(t *testing.T) {
	s, mr, _ := miniStore(t)
	ctx := context.Background()
	clk := newManualClock()
	const ttl = 3 * time.Second
	fs := &faultStore{Store: s}
	l := mustLocker(t, fs, WithTTL(ttl), WithWait(time.Minute), WithHandoff(8, time.Hour), withClock(clk))
	rkey := l.cfg.prefix + "k"
	// The counter reads an hour ahead of the server clock.
	ahead := time.Now().Add(time.Hour).UnixMicro()
	if err := mr.Set(lockstore.FenceKey(rkey), strconv.FormatInt(ahead, 10)); err != nil {
		t.Fatal(err)
	}

	a, err := l.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	w := lockIn(l, "k")
	waitFor(t, 5*time.Second, "the waiter to queue", func() bool { return queuedOn(l, "k") == 1 })
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wl := (<-w).must(t)
	if wl.Grant() != GrantHandoff || wl.Fence() != a.Fence()+1 {
		t.Fatalf("waiter: grant %v fence %d, want handoff at %d", wl.Grant(), wl.Fence(), a.Fence()+1)
	}

	// Renewals cannot reach Redis; the key expires there; the watchdog loses the hold and
	// abandons the grant (its holder stalls and never releases).
	down := error(errors.New("dial tcp: connection refused"))
	fs.failRefresh.Store(&down)
	// Redis's clock runs a little ahead of this process's (within the TTL/10 the loss signal
	// allows): the key expires there just before the watchdog's expiry of the grant.
	clk.Advance(ttl - 50*time.Millisecond)
	mr.FastForward(ttl + time.Millisecond)
	clk.Advance(150 * time.Millisecond)
	if cause := context.Cause(wl.Context()); !errors.Is(cause, ErrLost) {
		t.Fatalf("the stalled holder's lease: %v, want ErrLost", cause)
	}
	waitFor(t, 5*time.Second, "the abandoned grant to leave the gate", func() bool { return l.gateLen() == 0 })

	other := mustLocker(t, s)
	next, err := other.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(ctx)
	t.Logf("acquired %d, handed %d, next %d, counter %s", a.Fence(), wl.Fence(), next.Fence(), mustGet(mr, lockstore.FenceKey(rkey)))
	if next.Fence() <= wl.Fence() {
		t.Errorf("the next grant's fence %d is not above the abandoned handed grant's %d (acquired at %d)",
			next.Fence(), wl.Fence(), a.Fence())
	}
	_ = wl.Release(ctx)
}
