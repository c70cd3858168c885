package zkstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
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
	return dialSession(t, testSession, hosts...)
}

// dialSession is dial with a session timeout of the test's own.
func dialSession(t testing.TB, session time.Duration, hosts ...string) *Store {
	t.Helper()
	s, err := Dial(Config{Hosts: hosts, SessionTimeout: session, Root: "/flightlock-test", TickTime: 500 * time.Millisecond, SyncLimit: 5})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// renewals records a Locker's watchdog renewals (its Observer.Renewed), for a test to wait on
// them rather than for a fixed time, and to show them when it fails.
type renewals struct {
	mu  sync.Mutex
	log []renewal // guarded by mu
}

type renewal struct {
	key string
	at  time.Time // when the reply came
	err error
}

// add is the Observer.Renewed to install.
func (r *renewals) add(key string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, renewal{key: key, at: time.Now(), err: err})
}

// okSince counts key's successful renewals whose replies came after from.
func (r *renewals) okSince(key string, from time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, x := range r.log {
		if x.key == key && x.err == nil && x.at.After(from) {
			n++
		}
	}
	return n
}

// since lists key's renewals whose replies came after from, each at its offset from from.
func (r *renewals) since(key string, from time.Time) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, x := range r.log {
		if x.key != key || !x.at.After(from) {
			continue
		}
		outcome := "ok"
		if x.err != nil {
			outcome = x.err.Error()
		}
		fmt.Fprintf(&b, "\n\t+%v: %s", x.at.Sub(from).Round(time.Millisecond), outcome)
	}
	if b.Len() == 0 {
		return " none"
	}
	return b.String()
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
