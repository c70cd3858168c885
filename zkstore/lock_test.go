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

// An acquisition that went through after its caller left is given back even when the first
// release of it fails: the hold would otherwise keep the key from every other owner for as
// long as the session lives.
func TestLateAcquisitionIsGivenBackThoughItsFirstReleaseFails(t *testing.T) {
	srv := zktest.Start(t)
	f := &connFaults{}
	s, direct := dialFaulty(t, f, srv.Addr), dial(t, srv.Addr)
	ctx := context.Background()
	holds := func() int { return countChildren(t, direct, direct.keyPath("late")) }

	f.holdReplies()
	actx, leave := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := s.Acquire(actx, lockstore.Request{Key: "late", Owner: "left", TTL: 2 * time.Second})
		done <- err
	}()
	waitFor(t, 10*time.Second, "the acquisition to reach the server", func() bool { return holds() > 0 })
	leave()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("an acquisition whose caller left before the reply: %v, want context.Canceled", err)
	}
	failed := f.failNext(opMulti) // the late hook's release
	f.passReplies()
	select {
	case <-failed:
	case <-time.After(10 * time.Second):
		t.Fatal("the late hook sent no release")
	}
	waitFor(t, 10*time.Second, "the hold of the caller that left to be given back", func() bool { return holds() == 0 })
	if a, err := direct.Acquire(ctx, lockstore.Request{Key: "late", Owner: "other", TTL: 2 * time.Second}); err != nil || !a.Acquired {
		t.Fatalf("another owner after the hold went back: %+v, %v", a, err)
	}
}

// A request re-sent by its owner (the Store contract makes that harmless) after its first try
// was cut short, though that try took a hold whose give-back is still being retried in the
// background, is answered that it holds the key: that give-back must then leave the hold
// alone. The first try of each kind (a lock, a reader joining readers, a re-entry) takes its
// hold after its caller left, the late hook's give-back and the first background tries fail,
// and the owner sends the request again before the next try.
func TestResentRequestKeepsTheHoldALateGiveBackWouldDelete(t *testing.T) {
	for _, c := range []struct {
		name, owner, hold string
		multis            int                               // sent by the first try before the one that takes its hold
		before            func(t *testing.T, direct *Store) // what another process holds first
		send              func(ctx context.Context, s *Store) (lockstore.Acquisition, error)
	}{
		{
			name: "acquire", owner: "same",
			send: func(ctx context.Context, s *Store) (lockstore.Acquisition, error) {
				return s.Acquire(ctx, lockstore.Request{Key: "late", Owner: "same", TTL: 2 * time.Second})
			},
		},
		{
			name: "join readers", owner: lockstore.ReadOwner("same"), multis: 1,
			before: func(t *testing.T, direct *Store) {
				if a, err := direct.Acquire(context.Background(), lockstore.Request{Key: "late", Owner: lockstore.ReadOwner("first"), TTL: 2 * time.Second}); err != nil || !a.Acquired {
					t.Fatal(a, err)
				}
			},
			send: func(ctx context.Context, s *Store) (lockstore.Acquisition, error) {
				return s.Acquire(ctx, lockstore.Request{Key: "late", Owner: lockstore.ReadOwner("same"), TTL: 2 * time.Second})
			},
		},
		{
			name: "reenter", owner: "same", hold: "handed",
			before: func(t *testing.T, direct *Store) {
				if a, err := direct.Acquire(context.Background(), lockstore.Request{Key: "late", Owner: "same", TTL: 2 * time.Second}); err != nil || !a.Acquired {
					t.Fatal(a, err)
				}
			},
			send: func(ctx context.Context, s *Store) (lockstore.Acquisition, error) {
				return s.Reenter(ctx, "late", "same", "handed", 2*time.Second)
			},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := zktest.Start(t)
			f := &connFaults{}
			s, direct := dialFaulty(t, f, srv.Addr), dial(t, srv.Addr)
			ctx := context.Background()
			p := direct.keyPath("late")
			hold := p + "/" + holdName(c.owner, c.hold)
			if c.before != nil {
				c.before(t, direct)
			}
			exists := func() bool {
				ok, _, err := direct.conn.Exists(hold)
				if err != nil {
					t.Fatal(err)
				}
				return ok
			}

			f.holdFromAfter(opMulti, c.multis) // the requests before it answered
			actx, leave := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				_, err := c.send(actx, s)
				done <- err
			}()
			waitFor(t, 10*time.Second, "the first try to reach the server", exists)
			leave()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("a request whose caller left before the reply: %v, want context.Canceled", err)
			}
			failed := f.failNext(opMulti) // the late hook's give-back
			f.passReplies()
			<-failed
			for range 4 { // the first background tries: the next waits 1.6s
				failed = f.failNext(opMulti)
				<-failed
			}
			waitFor(t, 10*time.Second, "a session", func() bool { return s.conn.State() == zk.StateHasSession })
			var a lockstore.Acquisition
			var err error
			waitFor(t, 10*time.Second, "the re-sent request to be answered", func() bool {
				a, err = c.send(ctx, s)
				return err == nil
			})
			if !a.Acquired {
				t.Fatalf("the re-sent request: %+v, want it granted", a)
			}
			waitFor(t, 10*time.Second, "the background give-back to end", func() bool { return s.laters.Load() == 0 })
			if !exists() {
				t.Errorf("the hold the re-sent request was told it holds (%+v) was given back", a)
			}
			if err := s.Refresh(ctx, "late", c.owner, 2*time.Second); err != nil {
				t.Errorf("refresh of the re-sent grant: %v", err)
			}
			if b, err := direct.Acquire(ctx, lockstore.Request{Key: "late", Owner: "other", TTL: 2 * time.Second}); err != nil || b.Acquired {
				t.Errorf("another owner while the re-sent request holds the key: %+v, %v, want busy", b, err)
			}
		})
	}
}

// A release that failed is retried in the background; the owner gave the hold up, but if it
// acquires the key again before a retry gets through and is answered that it holds it (the
// hold, still there, re-entered), that is a new grant: the retry must not end it.
func TestAcquisitionAfterAFailedReleaseKeepsItsHold(t *testing.T) {
	srv := zktest.Start(t)
	f := &connFaults{}
	s, direct := dialFaulty(t, f, srv.Addr), dial(t, srv.Addr)
	ctx := context.Background()
	req := lockstore.Request{Key: "k", Owner: "same", TTL: 2 * time.Second}
	if a, err := s.Acquire(ctx, req); err != nil || !a.Acquired {
		t.Fatal(a, err)
	}
	failed := f.failNext(opMulti)
	if _, err := s.Release(ctx, "k", "same", "", 0); err == nil {
		t.Fatal("a release whose request failed reported no error")
	}
	<-failed
	for range 4 { // the first background tries: the next waits 1.6s
		failed = f.failNext(opMulti)
		<-failed
	}
	waitFor(t, 10*time.Second, "a session", func() bool { return s.conn.State() == zk.StateHasSession })
	var a lockstore.Acquisition
	var err error
	waitFor(t, 10*time.Second, "the new acquisition to be answered", func() bool {
		a, err = s.Acquire(ctx, req)
		return err == nil
	})
	if !a.Acquired {
		t.Fatalf("the owner's new acquisition: %+v, want it granted", a)
	}
	waitFor(t, 10*time.Second, "the background release to end", func() bool { return s.laters.Load() == 0 })
	if err := s.Refresh(ctx, "k", "same", 2*time.Second); err != nil {
		t.Errorf("refresh of the new grant: %v", err)
	}
	if b, err := direct.Acquire(ctx, lockstore.Request{Key: "k", Owner: "other", TTL: 2 * time.Second}); err != nil || b.Acquired {
		t.Errorf("another owner while the new grant holds the key: %+v, %v, want busy", b, err)
	}
}
