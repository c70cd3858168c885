package etcdstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/lockstore"
)

var _ lockstore.Passer = (*Store)(nil)

// Pass keeps a lock that nobody else asked for under the same grant, with no write: the next
// fence follows every fence handed out under it, the lock is refreshed, and the release that
// ends it all reports the last fence. A marked lock, a lock re-entered from elsewhere, and a
// grant whose fence room is half used are released instead.
func TestPassKeepsAnUnaskedLockWithoutAWrite(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	a, b := newStore(t, cli), newStore(t, cli)

	got, err := a.Acquire(ctx, lockstore.Request{Key: "lock:p", Owner: ownerA, TTL: 5 * time.Second})
	if err != nil || !got.Acquired {
		t.Fatalf("acquire = %+v, %v", got, err)
	}
	before := get(t, cli, "lock:p")
	kept, fence, n, err := a.Pass(ctx, "lock:p", ownerA, 5*time.Second, got.Fence+64)
	if err != nil || !kept || n != 0 {
		t.Fatalf("pass of an unmarked lock = %v, %d, %d, %v; want kept", kept, fence, n, err)
	}
	if fence != got.Fence+65 {
		t.Fatalf("pass fence %d, want the one after the handed-out %d", fence, got.Fence+64)
	}
	if kv := get(t, cli, "lock:p"); kv.ModRevision != before.ModRevision {
		t.Fatal("the pass wrote the lock")
	}
	// A pass without handoffs since the last one still moves on.
	if kept, again, _, err := a.Pass(ctx, "lock:p", ownerA, 5*time.Second, 0); err != nil || !kept || again != fence+1 {
		t.Fatalf("second pass = %v, %d, %v; want kept with fence %d", kept, again, err, fence+1)
	}
	if _, err := a.Release(ctx, "lock:p", ownerA, "", 0); err != nil {
		t.Fatal(err)
	}
	next, err := b.Acquire(ctx, lockstore.Request{Key: "lock:p", Owner: ownerB, TTL: 5 * time.Second})
	if err != nil || next.Fence <= fence+1 {
		t.Fatalf("next grant = %+v, %v; want a fence above the passes' %d", next, err, fence+1)
	}
	if _, err := b.Release(ctx, "lock:p", ownerB, "", 0); err != nil {
		t.Fatal(err)
	}

	// Not held: ErrNotHeld, nothing written.
	if kept, _, _, err := a.Pass(ctx, "lock:p", ownerA, 5*time.Second, 0); kept || !errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("pass of a free key = %v, %v; want ErrNotHeld", kept, err)
	}

	// Marked: released, the waiter told.
	if _, err := a.Acquire(ctx, lockstore.Request{Key: "lock:m", Owner: ownerA, TTL: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if busy, err := b.Acquire(ctx, lockstore.Request{Key: "lock:m", Owner: ownerB, TTL: 5 * time.Second}); err != nil || busy.Acquired {
		t.Fatalf("busy acquire = %+v, %v", busy, err)
	}
	if kept, _, n, err := a.Pass(ctx, "lock:m", ownerA, 5*time.Second, 0); err != nil || kept || n != 1 {
		t.Fatalf("pass of a marked lock = %v, %d, %v; want released with one waiter told", kept, n, err)
	}
	if get(t, cli, "lock:m") != nil {
		t.Fatal("a marked lock was kept")
	}

	// Re-entered from another process: its own hold given up, the key stays.
	if _, err := a.Acquire(ctx, lockstore.Request{Key: "lock:r", Owner: ownerA, TTL: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if re, err := b.Reenter(ctx, "lock:r", ownerA, "h1", 5*time.Second); err != nil || !re.Acquired {
		t.Fatalf("re-enter = %+v, %v", re, err)
	}
	if kept, _, _, err := a.Pass(ctx, "lock:r", ownerA, 5*time.Second, 0); err != nil || kept {
		t.Fatalf("pass of a re-entered lock = %v, %v; want its own hold released", kept, err)
	}
	if get(t, cli, "lock:r") == nil {
		t.Fatal("the pass deleted a lock that a re-entry holds")
	}
	if _, err := b.Release(ctx, "lock:r", ownerA, "h1", 0); err != nil {
		t.Fatal(err)
	}

	// Half the grant's fence room used: released, so that a dead holder's next turn could not
	// reach the next grant's fences.
	g, err := a.Acquire(ctx, lockstore.Request{Key: "lock:h", Owner: ownerA, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if kept, _, _, err := a.Pass(ctx, "lock:h", ownerA, 5*time.Second, g.Fence+1<<fenceShift-1); err != nil || kept {
		t.Fatalf("pass past half the room = %v, %v; want released", kept, err)
	}
	if get(t, cli, "lock:h") != nil {
		t.Fatal("a lock past half its fence room was kept")
	}
	if after, err := b.Acquire(ctx, lockstore.Request{Key: "lock:h", Owner: ownerB, TTL: 5 * time.Second}); err != nil || after.Fence <= g.Fence+1<<fenceShift-1 {
		t.Fatalf("next grant = %+v, %v; want above the reported fence", after, err)
	}
}

// Through the Locker on etcd: the end of a turn with local waiters and nobody elsewhere keeps
// the lock (GrantPass) with increasing fences, and no write reaches etcd for it.
func TestLockerTurnEndPassesOnEtcd(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	s := newStore(t, cli)
	l, err := flightlock.New(s, flightlock.WithTTL(5*time.Second), flightlock.WithWait(10*time.Second),
		flightlock.WithHandoff(1, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	first, err := l.Lock(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	rev := get(t, cli, "lock:t").ModRevision
	const waiters = 4
	got := make(chan *flightlock.Lease, waiters)
	errs := make(chan error, waiters)
	for range waiters {
		go func() {
			lease, err := l.Lock(context.Background(), "t")
			if err != nil {
				errs <- err
				return
			}
			got <- lease
		}()
	}
	time.Sleep(300 * time.Millisecond) // let them queue in the gate (no etcd call: the key is held here)
	cur, last := first, first.Fence()
	var passes int
	for range waiters {
		if err := cur.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case cur = <-got:
		case err := <-errs:
			t.Fatal(err)
		case <-time.After(10 * time.Second):
			t.Fatal("no grant within 10s")
		}
		if cur.Fence() <= last {
			t.Fatalf("fence %d after %d", cur.Fence(), last)
		}
		last = cur.Fence()
		if cur.Grant() == flightlock.GrantPass {
			passes++
		}
	}
	if passes == 0 {
		t.Fatal("no grant was a pass")
	}
	if kv := get(t, cli, "lock:t"); kv == nil || kv.ModRevision != rev {
		t.Fatalf("the lock was written during the turns (revision %v, acquired at %d)", kv, rev)
	}
	if err := cur.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if get(t, cli, "lock:t") != nil {
		t.Fatal("the last release left the lock")
	}
}

// A grant that followed a refusal of the same store is one other processes compete for: its
// turn ends with a release at once, without the read (which cost 15-25 % of the throughput of
// 8 processes on one key); a later grant with no refusal before it passes again.
func TestPassAfterARefusalReleases(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	a, b := newStore(t, cli), newStore(t, cli)
	if _, err := b.Acquire(ctx, lockstore.Request{Key: "lock:c", Owner: ownerB, TTL: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if busy, err := a.Acquire(ctx, lockstore.Request{Key: "lock:c", Owner: ownerA, TTL: 5 * time.Second}); err != nil || busy.Acquired {
		t.Fatalf("acquire of a held key = %+v, %v; want busy", busy, err)
	}
	if _, err := b.Release(ctx, "lock:c", ownerB, "", 0); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Acquire(ctx, lockstore.Request{Key: "lock:c", Owner: ownerA, TTL: 5 * time.Second}); err != nil || !got.Acquired {
		t.Fatalf("acquire after the release = %+v, %v", got, err)
	}
	// Nobody marked it since (b has gone), yet the grant followed a refusal: released.
	if kept, _, _, err := a.Pass(ctx, "lock:c", ownerA, 5*time.Second, 0); err != nil || kept {
		t.Fatalf("pass of a contended grant = %v, %v; want released", kept, err)
	}
	if get(t, cli, "lock:c") != nil {
		t.Fatal("a contended grant was kept")
	}
	if got, err := a.Acquire(ctx, lockstore.Request{Key: "lock:c", Owner: ownerA, TTL: 5 * time.Second}); err != nil || !got.Acquired {
		t.Fatalf("acquire of a free key = %+v, %v", got, err)
	}
	if kept, _, _, err := a.Pass(ctx, "lock:c", ownerA, 5*time.Second, 0); err != nil || !kept {
		t.Fatalf("pass of an uncontended grant = %v, %v; want kept", kept, err)
	}
	if _, err := a.Release(ctx, "lock:c", ownerA, "", 0); err != nil {
		t.Fatal(err)
	}
}

// A read hold is never kept for a next turn: Pass releases it, with no waiter told while no
// writer waits, and a second Pass finds nothing held.
func TestPassReleasesAReadHold(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	a := newStore(t, cli)
	reader := lockstore.ReadOwner(ownerA)

	got, err := a.Acquire(ctx, lockstore.Request{Key: "lock:rd", Owner: reader, TTL: 5 * time.Second})
	if err != nil || !got.Acquired {
		t.Fatalf("read acquire = %+v, %v", got, err)
	}
	if get(t, cli, readKey("lock:rd", reader)) == nil {
		t.Fatal("the read hold was not written")
	}
	if kept, fence, n, err := a.Pass(ctx, "lock:rd", reader, 5*time.Second, got.Fence+1); err != nil || kept || fence != 0 || n != 0 {
		t.Fatalf("pass of a read hold = %v, %d, %d, %v; want released, no waiter told", kept, fence, n, err)
	}
	if get(t, cli, readKey("lock:rd", reader)) != nil {
		t.Fatal("a read hold was kept for a next turn")
	}
	if n := a.Held(); n != 0 {
		t.Fatalf("%d entries left after the read hold's release", n)
	}
	if kept, _, _, err := a.Pass(ctx, "lock:rd", reader, 5*time.Second, 0); kept || !errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("second pass of the read hold = %v, %v; want ErrNotHeld", kept, err)
	}
}
