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
