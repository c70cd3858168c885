package flightlock

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Locks with a short TTL, taken next to one with a long TTL through a derived Locker, are
// renewed in time: each lock follows its own TTL.
func TestWatchdogRenewsShortTTLBesideLongTTL(t *testing.T) {
	s, mr, c := miniStore(t)
	clk := newManualClock()
	ctx := context.Background()
	long := mustLocker(t, s, WithTTL(10*time.Second), withClock(clk))
	short, err := long.With(WithTTL(300 * time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	a, err := long.Lock(ctx, "wd:long")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	var leases []*Lease
	for i := range 20 {
		b, err := short.Lock(ctx, "wd:short:"+strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, b)
	}
	clk.Step(mr, 1200*time.Millisecond, 10*time.Millisecond) // four TTLs of the short locks
	for _, b := range leases {
		if err := context.Cause(b.Context()); err != nil {
			t.Fatalf("%s: context ended with %v while its holder still held it", b.Key(), err)
		}
		if v := c.Get(ctx, b.Key()).Val(); !strings.HasPrefix(v, b.Owner()+" ") {
			t.Fatalf("%s: not renewed in time, Redis holds %q", b.Key(), v)
		}
		if err := b.Release(ctx); err != nil {
			t.Fatalf("%s: release: %v", b.Key(), err)
		}
	}
}
