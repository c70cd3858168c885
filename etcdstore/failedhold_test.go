package etcdstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

// Two re-entries of one owner's lock in one process (two downstream requests carrying the
// same handed-over token). The release of one of them fails (a timed-out transaction): the
// store retries it in the background. The retry must not give up the other re-entry, whose
// holder refreshed it a moment ago and counts on it for its TTL.
func TestFailedHoldReleaseKeepsOtherHolds(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	up, down := newStore(t, cli), newStore(t, cli) // two processes
	other := newStore(t, cli)
	const ttl = 5 * time.Second
	if got, err := up.Acquire(ctx, lockstore.Request{Key: "lock:h", Owner: ownerA, TTL: ttl}); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	// The downstream process holds locks of its own: its store keeps a session lease alive.
	if got, err := down.Acquire(ctx, lockstore.Request{Key: "lock:own", Owner: ownerB, TTL: ttl}); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	for _, h := range []string{"h1", "h2"} {
		if got, err := down.Reenter(ctx, "lock:h", ownerA, h, ttl); err != nil || !got.Acquired {
			t.Fatal(got, err)
		}
	}
	// h2's holder refreshes: it counts on the lock for ttl from now.
	start := time.Now()
	if err := down.Refresh(ctx, "lock:h", ownerA, ttl); err != nil {
		t.Fatal(err)
	}
	// h1's release fails (its context ran out before the call went out).
	dead, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := down.Release(dead, "lock:h", ownerA, "h1", 0); err == nil {
		t.Fatal("release on a cancelled context succeeded")
	}
	// The upstream ends its own hold: the key must stay for h2.
	if _, err := up.Release(ctx, "lock:h", ownerA, "", 0); err != nil {
		t.Fatal(err)
	}
	for time.Since(start) < ttl-time.Second {
		kv := get(t, cli, "lock:h")
		if kv == nil || !strings.Contains(string(kv.Value), ",h2") {
			got, err := other.Acquire(ctx, lockstore.Request{Key: "lock:h", Owner: ownerB, TTL: ttl})
			t.Fatalf("%v after h2's refresh (which promised %v) its hold is gone: value %v; another owner's acquire = %+v, %v",
				time.Since(start).Round(time.Millisecond), ttl, kv, got, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
