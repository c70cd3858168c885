package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/flightlock/flightlock/lockstore"
)

// Without background keep-alives, a lock lives as long as its refreshes keep it: past its TTL
// while they go on, and it is lost (ErrNotHeld, entry dropped) once they stop.
func TestRefreshKeepsTheLockPastItsTTL(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	s := quiet(newStore(t, cli))
	// TTL 1s: a lease of 2s, etcd's minimum with default timings.
	if got, err := s.Acquire(ctx, lockstore.Request{Key: "lock:r", Owner: ownerA, TTL: time.Second}); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	end := time.Now().Add(4 * time.Second)
	for time.Now().Before(end) {
		call := time.Now()
		if err := s.Refresh(ctx, "lock:r", ownerA, time.Second); err != nil {
			t.Fatalf("refresh at %v: %v", time.Since(end.Add(-4*time.Second)), err)
		}
		l := s.ourLease(clientv3.LeaseID(get(t, cli, "lock:r").Lease))
		l.mu.Lock()
		fresh := l.fresh
		l.mu.Unlock()
		if fresh.Before(call) {
			t.Fatalf("refresh returned on a keep-alive sent %v before the call", call.Sub(fresh))
		}
		time.Sleep(400 * time.Millisecond)
	}
	if get(t, cli, "lock:r") == nil {
		t.Fatal("the refreshed lock expired")
	}
	// No more refreshes: the lease (2s) runs out; etcd revokes expired leases every 500ms.
	waitFor(t, 5*time.Second, "the lock expires once refreshes stop", func() bool { return get(t, cli, "lock:r") == nil })
	if err := s.Refresh(ctx, "lock:r", ownerA, time.Second); !errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("refresh of the expired lock: %v, want ErrNotHeld", err)
	}
	if n := s.Held(); n != 0 {
		t.Fatalf("%d entries after the loss", n)
	}
	// A later acquisition gets a new lease.
	got, err := s.Acquire(ctx, lockstore.Request{Key: "lock:r", Owner: ownerA, TTL: time.Second})
	if err != nil || !got.Acquired || got.Reentered {
		t.Fatalf("acquire after the lease expired: %+v %v", got, err)
	}
	if leaseTTL(t, cli, "lock:r") < 1 {
		t.Fatal("acquired on an expired lease")
	}
}

// An acquisition that finds its lease stale (no keep-alive for longer than the margin) keeps
// it alive first: the lock lives its TTL from the call.
func TestAcquireOnAStaleLeaseKeepsItAliveFirst(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	s := quiet(newStore(t, cli))
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:a", Owner: ownerA, TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // beyond the margin: the lease has under 1s left
	call := time.Now()
	if got, err := s.Acquire(ctx, lockstore.Request{Key: "lock:b", Owner: ownerA, TTL: time.Second}); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	l := s.ourLease(clientv3.LeaseID(get(t, cli, "lock:b").Lease))
	l.mu.Lock()
	fresh := l.fresh
	l.mu.Unlock()
	if fresh.Before(call) {
		t.Fatal("acquired on a stale lease without a keep-alive sent after the call")
	}
	if ttl := leaseTTL(t, cli, "lock:b"); ttl < 1 {
		t.Fatalf("lease has %ds left right after the acquisition", ttl)
	}
}

// With the background keep-alives a lease outlives many TTLs with no refresh at all.
func TestBackgroundKeepAlive(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	s := newStore(t, cli)
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:k", Owner: ownerA, TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	id := clientv3.LeaseID(get(t, cli, "lock:k").Lease)
	time.Sleep(3500 * time.Millisecond) // almost two lease TTLs
	if ttl, err := cli.TimeToLive(ctx, id); err != nil || ttl.TTL <= 0 {
		t.Fatalf("the session lease expired although the store kept it alive: %v %v", ttl, err)
	}
	// Keep-alives go out every margin/4; allow two late ticks (a loaded 2-core machine under
	// -race delayed one past margin/2 by 1.6 ms): a stopped loop would be 3.5s behind.
	if d := time.Since(s.byIDFresh(t, int64(id))); d > s.margin*3/4 {
		t.Fatalf("last keep-alive %v ago, want within three margin/4 periods", d)
	}
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:k2", Owner: ownerA, TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	if got := clientv3.LeaseID(get(t, cli, "lock:k2").Lease); got != id {
		t.Fatalf("a later acquisition took lease %x, not the session's %x", got, id)
	}
}

func (s *Store) byIDFresh(t *testing.T, id int64) time.Time {
	t.Helper()
	l := s.ourLease(clientv3.LeaseID(id))
	if l == nil {
		t.Fatalf("lease %x is not the store's", id)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fresh
}

// A lease revoked behind the store's back took its locks: refreshes and releases answer
// ErrNotHeld, the entries go, and the next acquisition gets a new lease.
func TestLeaseLossIsErrNotHeld(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	s := newStore(t, cli)
	for i := range 3 {
		if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:l" + strconv.Itoa(i), Owner: ownerA, TTL: time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	old := get(t, cli, "lock:l0").Lease
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(old)); err != nil {
		t.Fatal(err)
	}
	errs := s.RefreshAll(ctx, []lockstore.Renewal{
		{Key: "lock:l0", Owner: ownerA, TTL: time.Second},
		{Key: "lock:l1", Owner: ownerA, TTL: time.Second},
	})
	for i, err := range errs {
		if !errors.Is(err, lockstore.ErrNotHeld) {
			t.Fatalf("refresh %d after the lease was revoked: %v, want ErrNotHeld", i, err)
		}
	}
	if _, err := s.Release(ctx, "lock:l2", ownerA, "", 0); !errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("release after the lease was revoked: %v, want ErrNotHeld", err)
	}
	waitFor(t, 2*time.Second, "entries dropped", func() bool { return s.Held() == 0 })
	got, err := s.Acquire(ctx, lockstore.Request{Key: "lock:l0", Owner: ownerA, TTL: time.Second})
	if err != nil || !got.Acquired || got.Reentered {
		t.Fatalf("acquire after the loss: %+v %v", got, err)
	}
	if kv := get(t, cli, "lock:l0"); kv.Lease == old {
		t.Fatal("acquired on the revoked lease")
	}
	if err := s.Refresh(ctx, "lock:l0", ownerA, time.Second); err != nil {
		t.Fatal(err)
	}
}

// A lease lost while the store still thinks it fresh (revoked between two keep-alives): the
// acquisition's put is refused by etcd, and the store takes a new lease in the same call.
func TestAcquireAfterAnUnnoticedLeaseLoss(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	s := quiet(newStore(t, cli))
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:u", Owner: ownerA, TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	old := get(t, cli, "lock:u").Lease
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(old)); err != nil {
		t.Fatal(err)
	}
	got, err := s.Acquire(ctx, lockstore.Request{Key: "lock:u", Owner: ownerB, TTL: time.Second})
	if err != nil || !got.Acquired {
		t.Fatalf("acquire on a lease revoked unnoticed: %+v %v", got, err)
	}
	if get(t, cli, "lock:u").Lease == old {
		t.Fatal("still on the old lease")
	}
}

// Watch fires on a release and on the expiry of the holder's lease, and a release between a
// busy reply and the Watch that follows it is not missed.
func TestWatchWakes(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	holder, waiter := quiet(newStore(t, cli)), newStore(t, cli)
	wait := func(w *lockstore.Watch, what string) {
		t.Helper()
		select {
		case <-w.C():
		case <-time.After(5 * time.Second):
			t.Fatalf("no wake-up on %s within 5s", what)
		}
	}
	noWake := func(w *lockstore.Watch, what string) {
		t.Helper()
		select {
		case <-w.C():
			t.Fatalf("woken by %s", what)
		case <-time.After(200 * time.Millisecond):
		}
	}

	// Release.
	if _, err := holder.Acquire(ctx, lockstore.Request{Key: "lock:w", Owner: ownerA, TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	if busy, err := waiter.Acquire(ctx, lockstore.Request{Key: "lock:w", Owner: ownerB, TTL: time.Second}); err != nil || busy.Acquired {
		t.Fatal(busy, err)
	}
	w, err := waiter.Watch(ctx, "lock:w")
	if err != nil {
		t.Fatal(err)
	}
	noWake(w, "nothing")
	if err := holder.Refresh(ctx, "lock:w", ownerA, time.Second); err != nil {
		t.Fatal(err)
	}
	noWake(w, "a refresh")
	if n, err := holder.Release(ctx, "lock:w", ownerA, "", 0); err != nil || n != 1 {
		t.Fatalf("release = %d, %v; want 1 notified", n, err)
	}
	wait(w, "release")

	// Expiry of the holder's lease (no keep-alives: the quiet store's lease is 2s).
	if _, err := holder.Acquire(ctx, lockstore.Request{Key: "lock:w", Owner: ownerA, TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	noWake(w, "a grant")
	start := time.Now()
	wait(w, "lease expiry")
	if d := time.Since(start); d < time.Second {
		t.Fatalf("woken %v after the grant, before the lease could expire", d)
	}
	w.Close()
	w.Close()

	// A release between the busy reply and the Watch.
	if _, err := holder.Acquire(ctx, lockstore.Request{Key: "lock:w", Owner: ownerA, TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	if busy, err := waiter.Acquire(ctx, lockstore.Request{Key: "lock:w", Owner: ownerB, TTL: time.Second}); err != nil || busy.Acquired {
		t.Fatal(busy, err)
	}
	if _, err := holder.Release(ctx, "lock:w", ownerA, "", 0); err != nil {
		t.Fatal(err)
	}
	w2, err := waiter.Watch(ctx, "lock:w")
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	wait(w2, "a release before the watch started")

	// The caller's context ends the watch.
	cctx, cancel := context.WithCancel(ctx)
	w3, err := waiter.Watch(cctx, "lock:w")
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	w3.Close()
}

// The store's entries follow the locks it holds: none are left after releases, losses and
// busy replies, and the busy-revision cache is bounded.
func TestEntriesDoNotGrow(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	s, other := newStore(t, cli), newStore(t, cli)
	for i := range 300 {
		k := "lock:m" + strconv.Itoa(i)
		if _, err := s.Acquire(ctx, lockstore.Request{Key: k, Owner: ownerA, TTL: 5 * time.Second}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Acquire(ctx, lockstore.Request{Key: k, Owner: ownerA, TTL: 5 * time.Second}); err != nil { // re-entry
			t.Fatal(err)
		}
		if busy, err := other.Acquire(ctx, lockstore.Request{Key: k, Owner: ownerB, TTL: 5 * time.Second}); err != nil || busy.Acquired {
			t.Fatal(busy, err)
		}
		if _, err := s.Release(ctx, k, ownerA, "", 0); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Held(); n != 0 {
		t.Fatalf("%d entries after 300 locks were released", n)
	}
	// Locks lost with their lease leave no entry either, once the loss is seen.
	for i := range 50 {
		if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:x" + strconv.Itoa(i), Owner: ownerA, TTL: 5 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Held(); n != 50 {
		t.Fatalf("%d entries for 50 held locks", n)
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(get(t, cli, "lock:x0").Lease)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Second, "entries of a lost lease dropped by the keep-alive loop", func() bool { return s.Held() == 0 })

	for i := range maxWaitRevs + 10 {
		s.noteBusy("lock:b"+strconv.Itoa(i), int64(i+1))
	}
	s.mu.Lock()
	n := len(s.waitRev)
	s.mu.Unlock()
	if n > maxWaitRevs {
		t.Fatalf("%d busy revisions kept, at most %d allowed", n, maxWaitRevs)
	}
	if resp, err := cli.Get(ctx, lockstore.FenceKeyPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
		t.Fatalf("%d of the store's own keys left after 350 locks (%v)", resp.Count, err)
	}
}

// Close stops every goroutine the store started, revokes its leases once they hold no lock,
// and refuses later calls (TestCloseLeavesHeldKeysToTheirTTL: a lock still held stays).
func TestCloseLeavesNothing(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	if _, err := cli.Get(ctx, "warm"); err != nil { // the client's connection is up
		t.Fatal(err)
	}
	base := goleak.IgnoreCurrent()
	s, err := New(cli)
	if err != nil {
		t.Fatal(err)
	}
	for i, ttl := range []time.Duration{5 * time.Second, 6 * time.Second} {
		if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:c" + strconv.Itoa(i), Owner: ownerA, TTL: ttl}); err != nil {
			t.Fatal(err)
		}
	}
	if busy, err := s.Acquire(ctx, lockstore.Request{Key: "lock:c0", Owner: ownerB, TTL: 5 * time.Second}); err != nil || busy.Acquired {
		t.Fatal(busy, err)
	}
	w, err := s.Watch(ctx, "lock:c0")
	if err != nil {
		t.Fatal(err)
	}
	// The watch works (a clientv3 watch cancelled before etcd confirmed it leaves the client's
	// stream open until the client closes: not the store's goroutine, but goleak would see it).
	if _, err := s.Release(ctx, "lock:c0", ownerA, "", 0); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.C():
	case <-time.After(5 * time.Second):
		t.Fatal("watch not woken")
	}
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:c0", Owner: ownerA, TTL: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if errs := s.RefreshAll(ctx, []lockstore.Renewal{{Key: "lock:c0", Owner: ownerA, TTL: 5 * time.Second}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	for i := range 2 {
		if _, err := s.Release(ctx, "lock:c"+strconv.Itoa(i), ownerA, "", 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	w.Close()
	if ls, err := cli.Leases(ctx); err != nil || len(ls.Leases) != 0 {
		t.Fatalf("leases after Close: %v %v", ls, err)
	}
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:c0", Owner: ownerA, TTL: time.Second}); err == nil {
		t.Fatal("Acquire after Close succeeded")
	}
	if _, err := s.Watch(ctx, "lock:c0"); err == nil {
		t.Fatal("Watch after Close succeeded")
	}
	// The client's own goroutines (the watch stream winding down) may take a moment.
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := goleak.Find(base)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// RefreshAll answers for each lock what Refresh would, in order, reading many keys in
// transactions of at most --max-txn-ops reads and keeping each lease alive once.
func TestRefreshAll(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	s, other := newStore(t, cli, WithMaxTxnOps(16)), newStore(t, cli)
	for _, k := range []string{"lock:ra1", "lock:ra2"} {
		if _, err := s.Acquire(ctx, lockstore.Request{Key: k, Owner: ownerA, TTL: 2 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := other.Acquire(ctx, lockstore.Request{Key: "lock:rb", Owner: ownerB, TTL: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	batch := []lockstore.Renewal{
		{Key: "lock:ra1", Owner: ownerA, TTL: 2 * time.Second},
		{Key: "lock:rb", Owner: ownerA, TTL: 2 * time.Second}, // ownerB's lock
		{Key: "lock:free", Owner: ownerA, TTL: 2 * time.Second},
		{Key: "", Owner: ownerA, TTL: 2 * time.Second}, // bad key
		{Key: "lock:ra2", Owner: ownerA, TTL: 1500 * time.Millisecond},
		{Key: "lock:ra2", Owner: ownerA, TTL: 3 * time.Second}, // as long as its lease
		{Key: "lock:ra2", Owner: ownerA, TTL: 4 * time.Second}, // longer than its 3s lease
	}
	errs := s.RefreshAll(ctx, batch)
	if len(errs) != len(batch) {
		t.Fatalf("%d errors for %d renewals", len(errs), len(batch))
	}
	for i, want := range []string{"nil", "notheld", "notheld", "error", "error", "nil", "error"} {
		got := errs[i]
		switch {
		case want == "nil" && got != nil,
			want == "notheld" && !errors.Is(got, lockstore.ErrNotHeld),
			want == "error" && (got == nil || errors.Is(got, lockstore.ErrNotHeld)):
			t.Errorf("renewal %d (%s, %v): %v, want %s", i, batch[i].Key, batch[i].TTL, got, want)
		}
	}
	if kv := get(t, cli, "lock:rb"); !ownedBy(kv.Value, ownerB) {
		t.Fatal("another owner's lock was touched")
	}
	if get(t, cli, "lock:free") != nil {
		t.Fatal("a refresh created a free key")
	}

	// Many keys on one lease: reads in chunks, one keep-alive.
	var many []lockstore.Renewal
	for i := range 100 {
		k := "lock:many" + strconv.Itoa(i)
		if _, err := s.Acquire(ctx, lockstore.Request{Key: k, Owner: ownerA, TTL: 5 * time.Second}); err != nil {
			t.Fatal(err)
		}
		many = append(many, lockstore.Renewal{Key: k, Owner: ownerA, TTL: 5 * time.Second})
	}
	call := time.Now()
	for i, err := range s.RefreshAll(ctx, many) {
		if err != nil {
			t.Fatalf("renewal %d of 100: %v", i, err)
		}
	}
	if s.byIDFresh(t, get(t, cli, "lock:many0").Lease).Before(call) {
		t.Fatal("RefreshAll returned without a keep-alive sent after the call")
	}
}

// AcquireAll takes as many keys as its limit says, and refuses more itself, naming the limit:
// etcd counts a nested transaction's operations against what its parent leaves of
// --max-txn-ops, so each key's waiter mark costs more than its own two operations.
func TestAcquireAllTakesAsManyKeysAsItsLimitSays(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	s, other := newStore(t, cli), newStore(t, cli)
	most := (DefaultMaxTxnOps - 4) / 2
	keys := make([]string, most+1)
	for i := range keys {
		keys[i] = fmt.Sprintf("many:%d", i)
	}
	if _, err := other.Acquire(ctx, lockstore.Request{Key: keys[most-1], Owner: ownerB, TTL: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	got, err := s.AcquireAll(ctx, keys[:most], ownerA, 5*time.Second, "")
	if err != nil || got[0].Acquired || got[most-1].Acquired || got[most-1].HolderTTL <= 0 {
		t.Fatalf("AcquireAll of %d keys, one held elsewhere = %v, %v; want all refused", most, got, err)
	}
	if _, err := other.Release(ctx, keys[most-1], ownerB, "", 0); err != nil {
		t.Fatal(err)
	}
	if got, err := s.AcquireAll(ctx, keys[:most], ownerA, 5*time.Second, ""); err != nil || !got[most-1].Acquired {
		t.Fatalf("AcquireAll of %d free keys = %v, %v", most, got, err)
	}
	if _, err := s.AcquireAll(ctx, keys, ownerB, 5*time.Second, ""); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("at most %d", most)) {
		t.Fatalf("AcquireAll of %d keys: %v, want the limit of %d named", len(keys), err, most)
	}
}

// AcquireAll takes every key in one transaction or none, and re-enters them all for the same
// owner.
func TestAcquireAll(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	s, other := newStore(t, cli), newStore(t, cli)
	keys := []string{"acct:2", "acct:1", "acct:3"}
	got, err := s.AcquireAll(ctx, keys, ownerA, 5*time.Second, "transfer")
	if err != nil || len(got) != 3 {
		t.Fatal(got, err)
	}
	for i, a := range got {
		kv := get(t, cli, keys[i])
		if !a.Acquired || a.Fence != kv.CreateRevision<<fenceShift || a.Fence != got[0].Fence {
			t.Fatalf("key %s: %+v (create revision %d)", keys[i], a, kv.CreateRevision)
		}
	}
	again, err := s.AcquireAll(ctx, keys, ownerA, 5*time.Second, "")
	if err != nil || !again[2].Reentered || again[2].Fence != got[2].Fence {
		t.Fatalf("re-sent AcquireAll = %+v, %v", again, err)
	}
	// Another owner wanting one held key and one free key takes neither.
	busy, err := other.AcquireAll(ctx, []string{"acct:9", "acct:3"}, ownerB, 5*time.Second, "")
	if err != nil || busy[0].Acquired || busy[1].Acquired || busy[1].Holder != "transfer" || busy[1].HolderTTL != 6*time.Second {
		t.Fatalf("AcquireAll over a held key = %+v, %v", busy, err)
	}
	if get(t, cli, "acct:9") != nil {
		t.Fatal("a refused AcquireAll took the free key")
	}
	if get(t, cli, WaiterKey("acct:3")) == nil || get(t, cli, WaiterKey("acct:9")) != nil {
		t.Fatal("waiter marks: want one on the held key only")
	}
	for _, k := range keys {
		if _, err := s.Release(ctx, k, ownerA, "", 0); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := other.AcquireAll(ctx, []string{"acct:9", "acct:3"}, ownerB, 5*time.Second, ""); err != nil || !got[0].Acquired || !got[1].Acquired {
		t.Fatalf("AcquireAll after the release = %+v, %v", got, err)
	}
	if _, err := s.AcquireAll(ctx, []string{"a", "a"}, ownerA, 5*time.Second, ""); err == nil {
		t.Fatal("duplicate keys accepted")
	}
	tooMany := make([]string, DefaultMaxTxnOps/2+1)
	for i := range tooMany {
		tooMany[i] = "k" + strconv.Itoa(i)
	}
	if _, err := s.AcquireAll(ctx, tooMany, ownerA, 5*time.Second, ""); err == nil {
		t.Fatal("more keys than one transaction takes were accepted")
	}
}
