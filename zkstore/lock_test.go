package zkstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/testenv/zktest"
	"github.com/flightlock/flightlock/lockstore"
)

// A TryLock whose multi went through but whose reply was lost with the connection (the client
// answers zk.ErrConnectionClosed, and reconnects to the same session) must not leave its hold
// on the session: nobody holds the key, so once the hold is given back another owner takes it.
// The reply is held back by the proxy until the hold is seen in the tree, then the connection
// is cut.
func TestTryLockWhoseReplyIsLostWithTheConnectionFreesTheKey(t *testing.T) {
	srv := zktest.Start(t)
	proxy := startProxy(t, srv.Addr)
	s, other := dial(t, proxy.Addr), dial(t, srv.Addr)
	l := mustLocker(t, s)
	ctx := context.Background()
	const key = flightlock.DefaultPrefix + "lost-reply"
	proxy.SetDelay(time.Hour) // every reply from now on is held back until the cut
	done := make(chan error, 1)
	go func() {
		lease, err := l.TryLock(ctx, "lost-reply")
		if err == nil {
			_ = lease.Release(ctx)
			err = errors.New("TryLock answered a lease")
		}
		done <- err
	}()
	waitFor(t, 5*time.Second, "the TryLock's hold in the tree", func() bool {
		_, err := other.TTL(ctx, key)
		return err == nil
	})
	proxy.SetDelay(0)
	proxy.Cut()
	select {
	case err := <-done:
		t.Logf("TryLock whose reply was lost: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("TryLock did not return after its connection was cut")
	}
	waitFor(t, 5*time.Second, "another owner takes the key that nobody holds", func() bool {
		a, err := other.Acquire(ctx, lockstore.Request{Key: key, Owner: "other-owner", TTL: 2 * time.Second})
		return err == nil && a.Acquired
	})
	if _, err := other.Release(ctx, key, "other-owner", "", 0); err != nil {
		t.Fatal(err)
	}
}

// A fair Lock whose place in the key's line was made but whose reply was lost with the
// connection must not leave that place on the session: the line would wait behind it for the
// session's life, and no fair acquirer would take the free key. The Lock fails (its store's
// first answer is the error), and once it left the line another fair owner takes the key.
func TestFairPlaceWhoseReplyIsLostWithTheConnectionLeavesTheLine(t *testing.T) {
	srv := zktest.Start(t)
	proxy := startProxy(t, srv.Addr)
	s, other := dial(t, proxy.Addr), dial(t, srv.Addr)
	l := mustLocker(t, s, flightlock.WithFair(), flightlock.WithWait(5*time.Second))
	ctx := context.Background()
	const key = flightlock.DefaultPrefix + "lost-place"
	line := other.linePath(key)
	warm, err := l.Lock(ctx, "lost-place") // makes the line's node
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Every reply is held back d: the read of the line comes back, then the place is made and
	// its reply is held while the test sees the place and cuts the connection.
	const d = 700 * time.Millisecond
	proxy.SetDelay(d)
	done := make(chan error, 1)
	go func() {
		lease, err := l.Lock(ctx, "lost-place")
		if err == nil {
			_ = lease.Release(ctx)
			err = errors.New("Lock answered a lease")
		}
		done <- err
	}()
	waitFor(t, 5*time.Second, "the Lock's place in the line", func() bool {
		kids, err := other.children(ctx, line)
		return err == nil && len(kids) > 0
	})
	proxy.SetDelay(0)
	proxy.Cut()
	select {
	case err := <-done:
		t.Logf("fair Lock whose place's reply was lost: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("Lock did not return after its connection was cut")
	}
	fair := mustLocker(t, other, flightlock.WithFair())
	waitFor(t, 5*time.Second, "another fair owner takes the key that nobody holds", func() bool {
		lease, err := fair.TryLock(ctx, "lost-place")
		if err != nil {
			return false
		}
		_ = lease.Release(ctx)
		return true
	})
}
