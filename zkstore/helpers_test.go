package zkstore

import (
	"context"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/testenv/poll"
	"github.com/flightlock/flightlock/internal/testenv/zktest"
	"github.com/flightlock/flightlock/lockstore"
)

// testSession is the session timeout of the tests' stores: with zktest's 500ms ticks and
// syncLimit 5 it outlives a cut-off follower (3s) and leaves a lock TTL of 3s (MaxTTL).
const testSession = 9 * time.Second

// dial returns a store on hosts (a process of its own: a session of its own), closed when t
// ends. The ensemble's timings are given too (zktest's), for the stores behind a fault proxy,
// through which the "conf" four-letter word does not always come back whole.
func dial(t testing.TB, hosts ...string) *Store {
	t.Helper()
	s, err := Dial(Config{Hosts: hosts, SessionTimeout: testSession, Root: "/flightlock-test", TickTime: 500 * time.Millisecond, SyncLimit: 5})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func mustLocker(t testing.TB, s lockstore.Store, opts ...flightlock.Option) *flightlock.Locker {
	t.Helper()
	l, err := flightlock.New(s, append([]flightlock.Option{flightlock.WithTTL(2 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func waitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, within, 10*time.Millisecond, what, cond)
}

// forcedOut returns two stores (processes) of one new server, after a's lock of "k" (owner
// "ownerX") was forced out by an operator through b's inspector: a still thinks it holds it.
func forcedOut(t *testing.T) (a, b *Store) {
	t.Helper()
	srv := zktest.Start(t)
	a, b = dial(t, srv.Addr), dial(t, srv.Addr)
	ctx := context.Background()
	if r, err := a.Acquire(ctx, lockstore.Request{Key: "k", Owner: "ownerX", TTL: 2 * time.Second}); err != nil || !r.Acquired {
		t.Fatal(r, err)
	}
	in := NewInspector(b, "")
	l, err := in.Lookup(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.ForceUnlock(ctx, l); err != nil {
		t.Fatal(err)
	}
	return a, b
}
