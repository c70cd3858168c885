package zkstore

import (
	"context"
	"errors"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/handover"
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

// A fair waiter that gives up (its context ends) while its place's create is on the wire, and
// whose reply is then lost with the connection, leaves no place behind: the late reply says
// only that the connection closed, and the place, on a session that lives on, would keep every
// fair acquirer of the free key waiting.
func TestFairWaiterThatLeftBeforeItsPlacesReplyWasLostLeavesTheLine(t *testing.T) {
	srv := zktest.Start(t)
	proxy := startProxy(t, srv.Addr)
	s, other := dial(t, proxy.Addr), dial(t, srv.Addr)
	l := mustLocker(t, s, flightlock.WithFair(), flightlock.WithWait(10*time.Second))
	ctx := context.Background()
	const name = "left-place"
	line := other.linePath(flightlock.DefaultPrefix + name)
	warm, err := l.Lock(ctx, name) // makes the line's node
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Every reply is held back 1s: the read of the line comes back, then the place is made and
	// its reply is held while the waiter leaves and the test cuts the connection.
	proxy.SetDelay(time.Second)
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		lease, err := l.Lock(lctx, name)
		if err == nil {
			_ = lease.Release(ctx)
			err = errors.New("Lock answered a lease")
		}
		done <- err
	}()
	waitFor(t, 10*time.Second, "the Lock's place in the line", func() bool {
		kids, err := other.children(ctx, line)
		return err == nil && len(kids) > 0
	})
	cancel()
	t.Logf("fair Lock that left: %v", <-done)
	proxy.Cut()
	proxy.SetDelay(0)
	fair := mustLocker(t, other, flightlock.WithFair())
	waitFor(t, 5*time.Second, "another fair owner takes the key that nobody holds", func() bool {
		lease, err := fair.TryLock(ctx, name)
		if err != nil {
			return false
		}
		_ = lease.Release(ctx)
		return true
	})
}

// A handed-over re-entry whose multi went through but whose reply was lost with the connection
// is given back by the downstream: its borrowed hold alone, so the upstream's grant stays held,
// and once the upstream releases, the key is free. The give-back's first Release often fails
// (the client is still reconnecting), so the store must retry it (releaseLater): the borrowed
// hold would otherwise keep the key node, which has another hold, for the session's life.
func TestHandedReentryWhoseReplyIsLostIsGivenBackAlone(t *testing.T) {
	srv := zktest.Start(t)
	proxy := startProxy(t, srv.Addr)
	s, other := dial(t, proxy.Addr), dial(t, srv.Addr)
	up, down := mustLocker(t, other), mustLocker(t, loggedStore{s, t})
	ctx := context.Background()
	const name = "lost-reentry"
	key := flightlock.DefaultPrefix + name
	lease, err := up.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	// Every reply is held back: the read comes back, then the re-entry's multi runs and its
	// reply is held while the test sees the borrowed hold and cuts the connection.
	proxy.SetDelay(700 * time.Millisecond)
	done := make(chan error, 1)
	go func() {
		l, err := down.Lock(handover.With(ctx, handover.Owner{Key: key, Token: lease.Owner()}), name)
		if err == nil {
			_ = l.Release(ctx)
			err = errors.New("the handed-over Lock answered a lease")
		}
		done <- err
	}()
	borrowed := func() bool {
		kids, err := other.children(ctx, other.keyPath(key))
		return err == nil && slices.ContainsFunc(kids, func(k string) bool { return strings.HasPrefix(k, borrowPre) })
	}
	waitFor(t, 5*time.Second, "the re-entry's hold in the tree", borrowed)
	proxy.SetDelay(0)
	proxy.Cut()
	select {
	case err := <-done:
		t.Logf("handed-over Lock whose reply was lost: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the handed-over Lock did not return after its connection was cut")
	}
	waitFor(t, 10*time.Second, "the borrowed hold given back", func() bool { return !borrowed() })
	if err := lease.Refresh(ctx); err != nil {
		t.Fatalf("the upstream's lease after the downstream's give-back: %v", err)
	}
	if a, err := other.Acquire(ctx, lockstore.Request{Key: key, Owner: "third", TTL: time.Second}); err != nil || a.Acquired {
		t.Fatalf("another owner while the upstream holds the key: %+v, %v", a, err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "another owner takes the key the upstream released", func() bool {
		a, err := other.Acquire(ctx, lockstore.Request{Key: key, Owner: "third", TTL: time.Second})
		return err == nil && a.Acquired
	})
	waitFor(t, 5*time.Second, "the store forgets the hold it gave back", func() bool { return s.unsureCount() == 0 })
}

// A read that joins another process's readers, whose multi went through but whose reply was
// lost with the connection, is given back: once the other reader left, a writer takes the key.
// Its give-back's first Release often fails while the client reconnects, and the store retries
// it (releaseLater).
func TestJoinedReadWhoseReplyIsLostLeavesTheKeyToWriters(t *testing.T) {
	srv := zktest.Start(t)
	proxy := startProxy(t, srv.Addr)
	s, other := dial(t, proxy.Addr), dial(t, srv.Addr)
	upR, downR := mustLocker(t, other, flightlock.WithRead()), mustLocker(t, loggedStore{s, t}, flightlock.WithRead())
	ctx := context.Background()
	const name = "lost-read"
	key := flightlock.DefaultPrefix + name
	first, err := upR.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	proxy.SetDelay(700 * time.Millisecond) // as in the re-entry's test: the join's reply is held
	done := make(chan error, 1)
	go func() {
		l, err := downR.TryLock(ctx, name)
		if err == nil {
			_ = l.Release(ctx)
			err = errors.New("the read TryLock answered a lease")
		}
		done <- err
	}()
	readers := func() int {
		kids, _ := other.children(ctx, other.keyPath(key))
		return len(kids)
	}
	waitFor(t, 5*time.Second, "the second reader's hold in the tree", func() bool { return readers() == 2 })
	proxy.SetDelay(0)
	proxy.Cut()
	select {
	case err := <-done:
		t.Logf("read TryLock whose reply was lost: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the read TryLock did not return after its connection was cut")
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	w := mustLocker(t, other)
	waitFor(t, 10*time.Second, "a writer takes the key its only reader left", func() bool {
		l, err := w.TryLock(ctx, name)
		if err != nil {
			return false
		}
		_ = l.Release(ctx)
		return true
	})
	waitFor(t, 5*time.Second, "the store forgets the hold it gave back", func() bool { return s.unsureCount() == 0 })
}

// A hold that a request whose reply was lost may have made proves nothing: a Refresh of its
// owner checks only the holds the store knows it made. A handed-over owner's re-entry and its
// grant may be on one store (two Lockers on one session): the re-entry's multi may never have
// run, and the grant must not be reported lost for that. The give-back of the unsure hold
// finds it missing, touches nothing else, and the store forgets it.
func TestRefreshIgnoresAHoldALostReplyMayHaveMade(t *testing.T) {
	srv := zktest.Start(t)
	s := dial(t, srv.Addr)
	ctx := context.Background()
	const key, owner = "lock:unsure", "upstream-owner"
	if a, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: owner, TTL: 2 * time.Second}); err != nil || !a.Acquired {
		t.Fatal(a, err)
	}
	err := s.mayHaveMade(s.keyPath(key), owner, holdName(owner, "borrowed"), zk.ErrConnectionClosed)
	if !errors.Is(err, lockstore.ErrOutcomeUnknown) {
		t.Fatalf("a multi whose connection closed: %v, want ErrOutcomeUnknown", err)
	}
	if err := s.Refresh(ctx, key, owner, 2*time.Second); err != nil {
		t.Fatalf("Refresh of a grant beside a re-entry that may never have run: %v", err)
	}
	if errs := s.RefreshAll(ctx, []lockstore.Renewal{{Key: key, Owner: owner, TTL: 2 * time.Second}}); errs[0] != nil {
		t.Fatalf("RefreshAll of that grant: %v", errs[0])
	}
	if _, err := s.Release(ctx, key, owner, "borrowed", 0); !errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("the give-back of a re-entry that never ran: %v, want ErrNotHeld", err)
	}
	if n := s.unsureCount(); n != 0 {
		t.Fatalf("%d unsure holds after their give-back", n)
	}
	if err := s.Refresh(ctx, key, owner, 2*time.Second); err != nil {
		t.Fatalf("Refresh of the grant after the give-back: %v", err)
	}
}

// Only a closed connection leaves a request's outcome unknown: a write to the connection that
// failed sent nothing whole, and a request that its context cut short is the late hook's and
// its caller's. Neither error says the reply was lost, nor records a hold as unsure.
func TestOnlyAClosedConnectionLeavesTheOutcomeUnknown(t *testing.T) {
	s := &Store{holds: make(map[holdKey][]string), unsure: make(map[holdKey][]string)}
	for _, tc := range []struct {
		err     error
		unknown bool
	}{
		{zk.ErrConnectionClosed, true},
		{&net.OpError{Op: "write", Net: "tcp", Err: errors.New("broken pipe")}, false},
		{&net.OpError{Op: "write", Net: "tcp", Err: os.ErrDeadlineExceeded}, false},
		{context.DeadlineExceeded, false},
		{context.Canceled, false},
		{zk.ErrSessionMoved, false},
		{zk.ErrNoServer, false},
	} {
		err := s.mayHaveMade("/k", "owner", "o-h", tc.err)
		if got := errors.Is(err, lockstore.ErrOutcomeUnknown); got != tc.unknown {
			t.Errorf("%v: outcome unknown %v, want %v", tc.err, got, tc.unknown)
		}
		if !errors.Is(err, tc.err) {
			t.Errorf("%v: the error %v does not wrap it", tc.err, err)
		}
	}
	if n := s.unsureCount(); n != 1 {
		t.Errorf("%d unsure holds, want the closed connection's one", n)
	}
}

// unsureCount is how many holds s remembers as unsure, of every key node and owner.
func (s *Store) unsureCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, hs := range s.unsure {
		n += len(hs)
	}
	return n
}

// loggedStore logs each Release and its outcome, to show a failing test's give-backs.
type loggedStore struct {
	lockstore.Store
	t *testing.T
}

func (s loggedStore) Release(ctx context.Context, key, owner, hold string, lastFence int64) (int, error) {
	start := time.Now()
	n, err := s.Store.Release(ctx, key, owner, hold, lastFence)
	s.t.Logf("Release(%q, hold %q) after %v: %d, %v", key, hold, time.Since(start).Round(time.Millisecond), n, err)
	return n, err
}

// A handed-over re-entry whose caller left while its request was in flight, and whose reply is
// then lost with the connection, is given back: the caller's give-back found nothing (the
// replies were held), so the store's late hook, which hears only "connection closed", gives
// the borrowed hold back, retried until the client has reconnected. The upstream keeps its lock.
func TestReentryThatLeftBeforeItsReplyWasLostIsGivenBack(t *testing.T) {
	srv := zktest.Start(t)
	proxy := startProxy(t, srv.Addr)
	s, other := dial(t, proxy.Addr), dial(t, srv.Addr)
	up, down := mustLocker(t, other), mustLocker(t, loggedStore{s, t})
	ctx := context.Background()
	const name = "left-lost-reentry"
	key := flightlock.DefaultPrefix + name
	lease, err := up.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	proxy.SetDelay(700 * time.Millisecond) // the read, then the re-entry's multi, each answered late
	dctx, leave := context.WithCancel(handover.With(ctx, handover.Owner{Key: key, Token: lease.Owner()}))
	defer leave()
	done := make(chan error, 1)
	go func() {
		l, err := down.Lock(dctx, name)
		if err == nil {
			_ = l.Release(ctx)
			err = errors.New("the handed-over Lock answered a lease")
		}
		done <- err
	}()
	borrowed := func() bool {
		kids, err := other.children(ctx, other.keyPath(key))
		return err == nil && slices.ContainsFunc(kids, func(k string) bool { return strings.HasPrefix(k, borrowPre) })
	}
	waitFor(t, 10*time.Second, "the re-entry's hold in the tree", borrowed)
	proxy.Stall(time.Hour) // the multi's reply, and every request after it, are held until the cut
	leave()                // the caller leaves before the reply
	select {
	case err := <-done:
		t.Logf("handed-over Lock that left: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the handed-over Lock did not return when its caller left")
	}
	time.Sleep(time.Second) // the core's give-back (half a second) runs out on the stalled connection
	proxy.SetDelay(0)
	proxy.Cut() // the multi's reply is lost
	waitFor(t, 10*time.Second, "the borrowed hold given back", func() bool { return !borrowed() })
	if err := lease.Refresh(ctx); err != nil {
		t.Fatalf("the upstream's lease after the downstream's give-back: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "another owner takes the key the upstream released", func() bool {
		a, err := other.Acquire(ctx, lockstore.Request{Key: key, Owner: "third", TTL: time.Second})
		return err == nil && a.Acquired
	})
	waitFor(t, 5*time.Second, "the store forgets the hold it gave back", func() bool { return s.unsureCount() == 0 })
}
