package zkstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock"

	"github.com/flightlock/flightlock/internal/testenv/zktest"
	"github.com/flightlock/flightlock/lockstore"
)

// A holder forced out by an operator is told so at its next renewal, also when another owner
// took the key meanwhile: a renewal checks the holder's own hold, not any hold of the key.
func TestRefreshOfAHolderForcedOutIsNotHeld(t *testing.T) {
	a, b := forcedOut(t)
	ctx := context.Background()
	if r, err := b.Acquire(ctx, lockstore.Request{Key: "k", Owner: "ownerY", TTL: 2 * time.Second}); err != nil || !r.Acquired {
		t.Fatal(r, err)
	}
	if err := a.Refresh(ctx, "k", "ownerX", 2*time.Second); !errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("the forced-out holder's refresh while another holds the key: %v, want ErrNotHeld", err)
	}
	if _, err := a.Release(ctx, "k", "ownerX", "", 0); !errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("the forced-out holder's release: %v, want ErrNotHeld", err)
	}
	if err := b.Refresh(ctx, "k", "ownerY", 2*time.Second); err != nil {
		t.Fatalf("the new holder's refresh: %v", err)
	}
}

// A busy mark read from one grant never lands on the next grant's node, though ZooKeeper gives a
// re-created node the same version: the mark is written only while a hold of the grant it read
// is still there.
func TestBusyMarkNeverLandsOnTheNextOwnersNode(t *testing.T) {
	srv := zktest.Start(t)
	x, y, w := dial(t, srv.Addr), dial(t, srv.Addr), dial(t, srv.Addr)
	ctx := context.Background()
	if r, err := x.Acquire(ctx, lockstore.Request{Key: "k", Owner: "X", TTL: 2 * time.Second}); err != nil || !r.Acquired {
		t.Fatal(r, err)
	}
	p := w.keyPath("k")
	data, stat, err := w.get(ctx, p) // a waiter read X's grant...
	if err != nil {
		t.Fatal(err)
	}
	kids, err := w.children(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.Release(ctx, "k", "X", "", 0); err != nil { // ...X released...
		t.Fatal(err)
	}
	if r, err := y.Acquire(ctx, lockstore.Request{Key: "k", Owner: "Y", TTL: 2 * time.Second}); err != nil || !r.Acquired { // ...Y took it
		t.Fatal(r, err)
	}
	w.refuse(ctx, p, data, stat, kids) // and the waiter's mark, built on its read, comes now
	now, _, err := w.get(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if owner, _, marked := parseValue(now); owner != ownerHash("Y") || marked {
		t.Fatalf("Y's node reads %q after a mark built on X's grant", now)
	}
	if _, err := y.Release(ctx, "k", "Y", "", 0); err != nil {
		t.Fatalf("Y's release: %v", err)
	}
	if r, err := y.Reenter(ctx, "k", "X", "downstream", 2*time.Second); err != nil || r.Acquired {
		t.Fatalf("X's stale token re-enters: %+v %v", r, err)
	}
}

// The last two readers releasing at once leave the key to the writer that waited, as one last
// reader does: each release of a reader that is not last changes the node's version, so the
// second finds itself last.
func TestLastTwoReadersReleasingTogetherLeaveTheKeyToTheWriter(t *testing.T) {
	srv := zktest.Start(t)
	a, b, w := dial(t, srv.Addr), dial(t, srv.Addr), dial(t, srv.Addr)
	ctx := context.Background()
	r1, r2 := lockstore.ReadOwner("r1"), lockstore.ReadOwner("r2")
	for _, c := range []struct {
		s     *Store
		owner string
	}{{a, r1}, {b, r2}} {
		if r, err := c.s.Acquire(ctx, lockstore.Request{Key: "k", Owner: c.owner, TTL: 2 * time.Second}); err != nil || !r.Acquired {
			t.Fatal(r, err)
		}
	}
	if r, _ := w.Acquire(ctx, lockstore.Request{Key: "k", Owner: "writer", TTL: 2 * time.Second}); r.Acquired {
		t.Fatal("a writer beside readers")
	}
	p := a.keyPath("k")
	data, stat, err := a.get(ctx, p) // both readers read the node with its two holds
	if err != nil {
		t.Fatal(err)
	}
	errA := a.releaseNotLast(ctx, p, holdName(r1, ""), data, stat)
	errB := b.releaseNotLast(ctx, p, holdName(r2, ""), data, stat)
	if errA == nil && errB == nil {
		t.Fatal("both readers released as if another were left")
	}
	if errB != nil {
		if _, err := b.Release(ctx, "k", r2, "", 0); err != nil {
			t.Fatal(err)
		}
	}
	data, _, err = a.get(ctx, p)
	if err != nil {
		t.Fatalf("the key node after the last reader: %v, want it kept for the writer", err)
	}
	if owner, _, _ := parseValue(data); owner != writerTag {
		t.Fatalf("the key node after the last reader reads %q, want it kept for the writer", data)
	}
}

// A fair acquisition that finds its owner holding the key already (a re-sent one) leaves its
// place: the line is not held up behind a place that nobody will take.
func TestReenteredFairAcquisitionLeavesItsPlace(t *testing.T) {
	srv := zktest.Start(t)
	a, b := dial(t, srv.Addr), dial(t, srv.Addr)
	ctx := context.Background()
	if r, err := a.Acquire(ctx, lockstore.Request{Key: "k", Owner: "X", TTL: 2 * time.Second, Asked: time.Now(), Queue: 2 * time.Second}); err != nil || !r.Acquired {
		t.Fatal(r, err)
	}
	if r, err := a.Acquire(ctx, lockstore.Request{Key: "k", Owner: "X", TTL: 2 * time.Second, Asked: time.Now(), Queue: 2 * time.Second}); err != nil || !r.Reentered {
		t.Fatalf("X again: %+v %v", r, err)
	}
	if _, err := a.Release(ctx, "k", "X", "", 0); err != nil {
		t.Fatal(err)
	}
	if r, err := b.Acquire(ctx, lockstore.Request{Key: "k", Owner: "Y", TTL: 2 * time.Second, Asked: time.Now(), Queue: 2 * time.Second}); err != nil || !r.Acquired {
		t.Fatalf("Y on the free key: %+v %v, want it (no place left before Y's)", r, err)
	}
}

// A waiter whose place is gone (its session expired) takes a new one, and the free key, instead
// of waiting behind a place that no longer exists.
func TestFairWaiterWhosePlaceIsGoneTakesAnother(t *testing.T) {
	srv := zktest.Start(t)
	a, z := dial(t, srv.Addr), dial(t, srv.Addr)
	ctx := context.Background()
	if r, err := z.Acquire(ctx, lockstore.Request{Key: "k", Owner: "Z", TTL: 2 * time.Second}); err != nil || !r.Acquired {
		t.Fatal(r, err)
	}
	if r, _ := a.Acquire(ctx, lockstore.Request{Key: "k", Owner: "X", TTL: 2 * time.Second, Asked: time.Now(), Queue: 2 * time.Second}); r.Acquired {
		t.Fatal("X took a held key")
	}
	place := a.placeOf(a.linePath("k"), "X")
	if err := a.conn.Delete(place, -1); err != nil { // as its session's expiry would
		t.Fatal(err)
	}
	if _, err := z.Release(ctx, "k", "Z", "", 0); err != nil {
		t.Fatal(err)
	}
	var got lockstore.Acquisition
	for range 3 {
		if got, _ = a.Acquire(ctx, lockstore.Request{Key: "k", Owner: "X", TTL: 2 * time.Second, Asked: time.Now(), Queue: 2 * time.Second}); got.Acquired {
			break
		}
	}
	if !got.Acquired {
		t.Fatal("a waiter whose place is gone never took the free key")
	}
}

// A hot key shared by four sessions keeps moving: no release is answered ErrNotHeld (a hold
// lost to a stale mark or release), every session gets the key, and never two at once.
func TestHotKeyAcrossSessionsKeepsMovingWithoutADoubleGrant(t *testing.T) {
	srv := zktest.Start(t)
	var (
		c        inside
		notHeld  atomic.Int64
		perStore [4]atomic.Int64
		wg       sync.WaitGroup
	)
	stop := time.Now().Add(2 * time.Second)
	for i := range 4 {
		l := mustLocker(t, dial(t, srv.Addr), flightlock.WithWait(5*time.Second))
		for range 8 {
			wg.Go(func() {
				for time.Now().Before(stop) {
					lease, err := l.Lock(context.Background(), "hot")
					if err != nil {
						continue
					}
					if c.enter(lease) {
						perStore[i].Add(1)
						c.now.Add(-1)
					}
					if err := lease.Release(context.Background()); errors.Is(err, flightlock.ErrNotHeld) {
						notHeld.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	if c.most.Load() > 1 || notHeld.Load() > 0 {
		t.Fatalf("%d holders at once at most, %d releases answered ErrNotHeld", c.most.Load(), notHeld.Load())
	}
	for i := range perStore {
		if perStore[i].Load() == 0 {
			t.Fatalf("session %d never got the key (grants per session: %d %d %d %d)", i,
				perStore[0].Load(), perStore[1].Load(), perStore[2].Load(), perStore[3].Load())
		}
	}
}
