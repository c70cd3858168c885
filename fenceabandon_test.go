package flightlock

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

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
