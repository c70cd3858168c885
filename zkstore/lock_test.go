package zkstore

import (
	"context"
	"errors"
	"testing"
	"time"

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
