package zkstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/flightlock/flightlock/internal/testenv/zktest"
	"github.com/flightlock/flightlock/lockstore"
)

// fairTry is a fair TryLock of key by owner on s: it takes the key only when nobody is in line.
func fairTry(ctx context.Context, s *Store, key, owner string) (lockstore.Acquisition, error) {
	return s.Acquire(ctx, lockstore.Request{Key: key, Owner: owner, TTL: 2 * time.Second, Asked: time.Now()})
}

// A place in a fair line that was taken after its caller left is given back even when the first
// delete of it fails: a place lives as long as its session, and the line would wait behind it.
func TestLatePlaceIsGivenBackThoughItsFirstDeleteFails(t *testing.T) {
	srv := zktest.Start(t)
	f := &connFaults{}
	s, direct := dialFaulty(t, f, srv.Addr), dial(t, srv.Addr)
	ctx := context.Background()
	line := s.linePath("fair")
	if _, err := direct.conn.CreateContainer(line, nil, zk.FlagContainer, direct.acl); err != nil {
		t.Fatal(err) // so that the place is taken by one create, whose reply is held back
	}
	places := func() int { return countChildren(t, direct, line) }

	f.holdFrom(opCreate)
	actx, leave := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := s.Acquire(actx, lockstore.Request{Key: "fair", Owner: "left", TTL: 2 * time.Second, Asked: time.Now(), Queue: time.Second})
		done <- err
	}()
	waitFor(t, 10*time.Second, "the place to reach the server", func() bool { return places() > 0 })
	leave()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("a fair acquisition whose caller left before its place was answered: %v, want context.Canceled", err)
	}
	failed := f.failNext(opDelete) // the late hook's delete
	f.passReplies()
	select {
	case <-failed:
	case <-time.After(10 * time.Second):
		t.Fatal("the late hook sent no delete")
	}
	waitFor(t, 10*time.Second, "the place of the caller that left to be given back", func() bool { return places() == 0 })
	if a, err := fairTry(ctx, direct, "fair", "other"); err != nil || !a.Acquired {
		t.Fatalf("a fair TryLock after the place went back: %+v, %v", a, err)
	}
}

// A waiter that leaves the line leaves it even when the delete of its place fails: the place
// would hold up every later waiter for as long as the session lives.
func TestPlaceLeftIsGivenBackThoughItsFirstDeleteFails(t *testing.T) {
	srv := zktest.Start(t)
	f := &connFaults{}
	s, direct := dialFaulty(t, f, srv.Addr), dial(t, srv.Addr)
	ctx := context.Background()
	if a, err := direct.Acquire(ctx, lockstore.Request{Key: "fair", Owner: "holder", TTL: 2 * time.Second}); err != nil || !a.Acquired {
		t.Fatal(a, err)
	}
	if a, err := s.Acquire(ctx, lockstore.Request{Key: "fair", Owner: "waiter", TTL: 2 * time.Second, Asked: time.Now(), Queue: time.Second}); err != nil || a.Acquired {
		t.Fatalf("a fair waiter on a held key: %+v, %v", a, err)
	}
	line := s.linePath("fair")
	if n := countChildren(t, direct, line); n != 1 {
		t.Fatalf("%d places in line, want the waiter's", n)
	}
	failed := f.failNext(opDelete)
	_ = s.LeaveQueue(ctx, "fair", "waiter") // fails: the place goes all the same
	select {
	case <-failed:
	default:
		t.Fatal("LeaveQueue sent no delete")
	}
	if _, err := direct.Release(ctx, "fair", "holder", "", 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the place left to be given back", func() bool { return countChildren(t, direct, line) == 0 })
	if a, err := fairTry(ctx, direct, "fair", "other"); err != nil || !a.Acquired {
		t.Fatalf("a fair TryLock after the waiter left: %+v, %v", a, err)
	}
}
