package flightlock

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A caller that waits for a key held by another process waits in acquire's retry loop, not in
// the gate's queue. Drain tells queued callers ErrClosed, but this one keeps retrying: Drain
// waits for it as for a held lock (and reports it as held when its grace ends) though the
// process holds nothing, and once the other process releases, the caller gets the lock after
// the drain, with a context that the drain never cancels.
func TestDrainAnswersACallerRetryingInRedis(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	other := mustLocker(t, s)
	held, err := other.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	l := mustLocker(t, s, WithWait(10*time.Second))
	got := lockIn(l, "k")
	waitFor(t, 5*time.Second, "the caller to own the gate slot", func() bool { return l.gateLen() == 1 })
	time.Sleep(20 * time.Millisecond) // it is retrying in Redis

	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	derr := l.Drain(dctx)
	cancel()
	if derr != nil {
		t.Errorf("Drain while the process holds nothing (one caller retrying in Redis): %v", derr)
	}
	_ = held.Release(ctx)
	select {
	case r := <-got:
		if r.err == nil {
			t.Errorf("the caller got the lock after the drain (grant %v), context cause %v",
				r.lease.Grant(), context.Cause(r.lease.Context()))
			_ = r.lease.Release(ctx)
		} else if !errors.Is(r.err, ErrClosed) {
			t.Errorf("the caller: %v, want ErrClosed", r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the caller did not return")
	}
}
