package waitbudget

import (
	"context"
	"testing"
	"time"
)

// The wait for a busy key ends a reserve before the caller's deadline.
func TestWaitDeadlineLeavesAReserve(t *testing.T) {
	now := time.Now()
	bg := context.Background()
	withDeadline := func(d time.Duration) context.Context {
		ctx, cancel := context.WithDeadline(bg, now.Add(d))
		t.Cleanup(cancel)
		return ctx
	}
	for _, c := range []struct {
		name string
		ctx  context.Context
		wait time.Duration
		want time.Duration // from now
	}{
		{"no deadline", bg, 2 * time.Second, 2 * time.Second},
		{"deadline beyond the wait", withDeadline(10 * time.Second), 2 * time.Second, 2 * time.Second},
		{"go-zero's 2s timeout, Wait 2s", withDeadline(2 * time.Second), 2 * time.Second, 1900 * time.Millisecond},
		{"500ms left, Wait 2s", withDeadline(500 * time.Millisecond), 2 * time.Second, 450 * time.Millisecond},
		{"deadline just after the wait", withDeadline(2010 * time.Millisecond), 2 * time.Second, 1910 * time.Millisecond},
		{"too near for a reserve", withDeadline(500 * time.Microsecond), time.Second, time.Second},
	} {
		got := Deadline(c.ctx, now, c.wait).Sub(now)
		if got != c.want {
			t.Errorf("%s: the wait ends %v from now, want %v", c.name, got, c.want)
		}
	}
}
