package etcdstore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	"github.com/flightlock/flightlock/lockstore"
)

// The store is what the Locker takes.
var _ lockstore.Store = (*Store)(nil)

// Acquire takes a free key in one transaction on the TTL's lease, re-enters it for the same
// owner (same fence, hold count unchanged), and refuses another owner with the holder's lease
// TTL and metadata, marking the key as waited on once.
func TestAcquireReentryAndBusy(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	a, b := newStore(t, cli), newStore(t, cli)

	got, err := a.Acquire(ctx, lockstore.Request{Key: "lock:k", Owner: ownerA, TTL: 5 * time.Second, Meta: "host=h pid=1"})
	if err != nil || !got.Acquired || got.Reentered || got.Fence <= 0 {
		t.Fatalf("first acquire = %+v, %v; want acquired with a fence", got, err)
	}
	kv := get(t, cli, "lock:k")
	if string(kv.Value) != ownerA+" 6 1 0 host=h pid=1" {
		t.Fatalf("stored value %q", kv.Value)
	}
	if got.Fence != kv.CreateRevision<<fenceShift {
		t.Fatalf("fence %d, want the create revision %d << %d", got.Fence, kv.CreateRevision, fenceShift)
	}
	// The lease lasts the TTL plus the margin.
	if ttl := leaseTTL(t, cli, "lock:k"); ttl < 5 || ttl > 6 {
		t.Fatalf("lease TTL %ds, want 6s (5s + 1s margin)", ttl)
	}

	again, err := a.Acquire(ctx, lockstore.Request{Key: "lock:k", Owner: ownerA, TTL: 5 * time.Second})
	if err != nil || !again.Acquired || !again.Reentered || again.Fence != got.Fence {
		t.Fatalf("re-entry = %+v, %v; want reentered with fence %d", again, err, got.Fence)
	}
	if kv2 := get(t, cli, "lock:k"); kv2.ModRevision != kv.ModRevision {
		t.Fatal("a re-entry rewrote the lock")
	}
	// The same owner through another store (a re-sent acquisition that reached etcd through
	// another connection) re-enters too.
	if other, err := b.Acquire(ctx, lockstore.Request{Key: "lock:k", Owner: ownerA, TTL: 5 * time.Second}); err != nil || !other.Reentered || other.Fence != got.Fence {
		t.Fatalf("re-entry through another store = %+v, %v", other, err)
	}

	for i := range 2 {
		busy, err := b.Acquire(ctx, lockstore.Request{Key: "lock:k", Owner: ownerB, TTL: 5 * time.Second})
		if err != nil || busy.Acquired || busy.HolderTTL != 6*time.Second || busy.Holder != "host=h pid=1" {
			t.Fatalf("other owner (try %d) = %+v, %v; want busy with the holder's lease TTL and metadata", i, busy, err)
		}
		if strings.Contains(busy.Holder, ownerA) {
			t.Fatal("the holder's owner token left the store")
		}
	}
	w := get(t, cli, WaiterKey("lock:k"))
	if w == nil {
		t.Fatal("a refused acquisition set no waiter mark")
	}
	if w.Lease == 0 || w.Lease == kv.Lease {
		t.Fatalf("the waiter mark is on lease %x, want the waiter's own (holder's %x)", w.Lease, kv.Lease)
	}
	// A token that is a prefix of the holder's does not pass the owner check.
	if res, err := b.Acquire(ctx, lockstore.Request{Key: "lock:k", Owner: ownerA[:8], TTL: 5 * time.Second}); err != nil || res.Acquired {
		t.Fatalf("prefix of the owner token: %+v, %v", res, err)
	}
	if n, err := a.Release(ctx, "lock:k", ownerA, "", 0); err != nil || n != 1 {
		t.Fatalf("release of a waited-on lock = %d, %v; want 1 notified", n, err)
	}
	if get(t, cli, "lock:k") != nil || get(t, cli, WaiterKey("lock:k")) != nil {
		t.Fatal("release left the lock or its waiter mark")
	}
	// An uncontended release notifies nobody.
	if _, err := a.Acquire(ctx, lockstore.Request{Key: "lock:k", Owner: ownerA, TTL: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if n, err := a.Release(ctx, "lock:k", ownerA, "", 0); err != nil || n != 0 {
		t.Fatalf("uncontended release = %d, %v; want 0", n, err)
	}
}

// Refresh and Release by another owner change nothing, and a stale release never frees the
// next owner's lock.
func TestReleaseAndRefreshAreOwnerChecked(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	a, b := newStore(t, cli), newStore(t, cli)
	if _, err := a.Acquire(ctx, lockstore.Request{Key: "lock:o", Owner: ownerA, TTL: 5 * time.Second, Meta: "meta"}); err != nil {
		t.Fatal(err)
	}
	before := get(t, cli, "lock:o")
	if err := b.Refresh(ctx, "lock:o", ownerB, 5*time.Second); !errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("refresh by another owner: %v, want ErrNotHeld", err)
	}
	for _, s := range []*Store{a, b} {
		if _, err := s.Release(ctx, "lock:o", ownerB, "", 1<<40); !errors.Is(err, lockstore.ErrNotHeld) {
			t.Fatalf("release by another owner: %v, want ErrNotHeld", err)
		}
	}
	if after := get(t, cli, "lock:o"); after == nil || after.ModRevision != before.ModRevision {
		t.Fatal("another owner's refresh or release changed the lock")
	}
	if get(t, cli, FloorKey("lock:o")) != nil {
		t.Fatal("a refused release wrote a fence floor")
	}
	if err := a.Refresh(ctx, "lock:o", ownerA, 5*time.Second); err != nil {
		t.Fatalf("refresh by the owner: %v", err)
	}
	if n, err := a.Release(ctx, "lock:o", ownerA, "", 0); err != nil || n != 0 {
		t.Fatalf("release by the owner = %d, %v", n, err)
	}
	if _, err := a.Release(ctx, "lock:o", ownerA, "", 0); !errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("second release: %v, want ErrNotHeld", err)
	}
	next, err := b.Acquire(ctx, lockstore.Request{Key: "lock:o", Owner: ownerB, TTL: 5 * time.Second})
	if err != nil || !next.Acquired {
		t.Fatal(next, err)
	}
	if _, err := a.Release(ctx, "lock:o", ownerA, "", 0); !errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("stale release: %v, want ErrNotHeld", err)
	}
	if kv := get(t, cli, "lock:o"); kv == nil || !ownedBy(kv.Value, ownerB) {
		t.Fatal("a stale release touched the next owner's lock")
	}
	if _, err := a.TTL(ctx, "lock:none"); !errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("TTL of a free key: %v, want ErrNotHeld", err)
	}
	if d, err := a.TTL(ctx, "lock:o"); err != nil || d < 5*time.Second || d > 6*time.Second {
		t.Fatalf("TTL of a held key = %v, %v; want its lease's 6s", d, err)
	}
}

// Reenter (an owner token handed over by another process) never takes a free key, adds named
// holds once each, and the key goes only with its last hold; a release with other holds left
// keeps its lastFence for the last one.
func TestReenterNamedHolds(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	a, b := newStore(t, cli), newStore(t, cli) // two processes

	if got, err := b.Reenter(ctx, "lock:r", ownerA, "h1", time.Second); err != nil || got.Acquired {
		t.Fatalf("re-enter of a free key = %+v, %v; want nothing taken", got, err)
	}
	if get(t, cli, "lock:r") != nil {
		t.Fatal("re-enter took a free key")
	}
	held, err := a.Acquire(ctx, lockstore.Request{Key: "lock:r", Owner: ownerA, TTL: 5 * time.Second})
	if err != nil || !held.Acquired {
		t.Fatal(held, err)
	}
	if got, err := b.Reenter(ctx, "lock:r", ownerB, "h1", time.Second); err != nil || got.Acquired || got.HolderTTL != 6*time.Second {
		t.Fatalf("re-enter by another owner = %+v, %v; want busy with the lease's 6s", got, err)
	}
	in, err := b.Reenter(ctx, "lock:r", ownerA, "h1", time.Second)
	if err != nil || !in.Acquired || !in.Reentered || in.Fence != held.Fence {
		t.Fatalf("re-enter by the owner = %+v, %v; want fence %d", in, err, held.Fence)
	}
	if again, err := b.Reenter(ctx, "lock:r", ownerA, "h1", time.Second); err != nil || !again.Reentered {
		t.Fatalf("re-sent re-enter = %+v, %v", again, err)
	}
	if v := string(get(t, cli, "lock:r").Value); v != ownerA+" 6 1,h1 0" {
		t.Fatalf("value after re-entries %q, want h1 listed once", v)
	}
	// A TTL longer than the holder's lease cannot be honoured by keeping that lease alive.
	if _, err := b.Reenter(ctx, "lock:r", ownerA, "h9", 10*time.Second); err == nil || errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("re-enter for 10s on a 6s lease: %v, want a refusal", err)
	}
	// The re-entry refreshes through the holder's lease.
	if err := b.Refresh(ctx, "lock:r", ownerA, time.Second); err != nil {
		t.Fatalf("refresh of the re-entered lock: %v", err)
	}

	// The owner releases its own hold, handing out fences beyond the bound of the revision
	// alone: the key stays for the re-entry, and keeps the fence for the last release.
	handed := held.Fence + 5<<fenceShift
	if n, err := a.Release(ctx, "lock:r", ownerA, "", handed); err != nil || n != 0 {
		t.Fatalf("release of the own hold = %d, %v", n, err)
	}
	if _, err := a.Release(ctx, "lock:r", ownerA, "", 0); !errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("re-sent release of the own hold: %v, want ErrNotHeld", err)
	}
	kv := get(t, cli, "lock:r")
	if v := string(kv.Value); v != ownerA+" 6 0,h1 "+strconv.FormatInt(handed, 10) {
		t.Fatalf("value after the own release %q", v)
	}
	// Off the owner's session lease (which its store keeps alive for as long as the process
	// lives), onto one that only the re-entry's refreshes keep alive.
	if a.ourLease(clientv3.LeaseID(kv.Lease)) != nil {
		t.Fatal("the re-entries left are still on the owner's session lease")
	}
	if ttl := leaseTTL(t, cli, "lock:r"); ttl < 5 || ttl > 6 {
		t.Fatalf("the re-entries' lease has %ds, want the lock's 6s", ttl)
	}
	if err := b.Refresh(ctx, "lock:r", ownerA, time.Second); err != nil {
		t.Fatalf("refresh of the re-entry on its new lease: %v", err)
	}
	if _, err := b.Release(ctx, "lock:r", ownerA, "h2", 0); !errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("release of a hold never taken: %v, want ErrNotHeld", err)
	}
	if _, err := b.Release(ctx, "lock:r", ownerA, "h1", 0); err != nil {
		t.Fatal(err)
	}
	if get(t, cli, "lock:r") != nil {
		t.Fatal("the last release left the key")
	}
	if _, err := b.Release(ctx, "lock:r", ownerA, "h1", 0); !errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("re-sent last release: %v, want ErrNotHeld", err)
	}
	next, err := a.Acquire(ctx, lockstore.Request{Key: "lock:r", Owner: ownerB, TTL: time.Second})
	if err != nil || next.Fence <= handed {
		t.Fatalf("fence after the owner handed out up to %d = %d (%v)", handed, next.Fence, err)
	}
	if a.Held()+b.Held() != 1 {
		t.Fatalf("stores keep %d entries, want 1 (the lock held now)", a.Held()+b.Held())
	}
}

// Release's lastFence raises the next grant's fence; a floor key is written only when the
// revision alone would not, and the next release that finds it obsolete deletes it.
func TestLastFenceRaisesTheNextFence(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	s := newStore(t, cli)
	acquire := func(owner string) int64 {
		t.Helper()
		got, err := s.Acquire(ctx, lockstore.Request{Key: "lock:h", Owner: owner, TTL: 5 * time.Second})
		if err != nil || !got.Acquired {
			t.Fatal(got, err)
		}
		return got.Fence
	}
	// Within flightlock's handoff bound no floor is written.
	f := acquire(ownerA)
	if _, err := s.Release(ctx, "lock:h", ownerA, "", f+64); err != nil {
		t.Fatal(err)
	}
	if get(t, cli, FloorKey("lock:h")) != nil {
		t.Fatal("64 handoffs wrote a floor key")
	}
	if g := acquire(ownerB); g <= f+64 {
		t.Fatalf("fence %d after handoffs up to %d", g, f+64)
	} else {
		f = g
	}
	// Far beyond it, the floor carries the fence.
	handed := f + 100<<fenceShift
	if _, err := s.Release(ctx, "lock:h", ownerB, "", handed); err != nil {
		t.Fatal(err)
	}
	if get(t, cli, FloorKey("lock:h")) == nil {
		t.Fatal("no floor key after handoffs beyond the revision's reach")
	}
	g := acquire(ownerA)
	if g <= handed {
		t.Fatalf("fence %d after handoffs up to %d", g, handed)
	}
	// Re-entry reports the fence of the holding, floor included.
	if again, err := s.Acquire(ctx, lockstore.Request{Key: "lock:h", Owner: ownerA, TTL: 5 * time.Second}); err != nil || again.Fence != g {
		t.Fatalf("re-entry = %+v, %v; want fence %d", again, err, g)
	}
	// A refused release moves no floor.
	floor := get(t, cli, FloorKey("lock:h"))
	if _, err := s.Release(ctx, "lock:h", ownerB, "", g+1000<<fenceShift); !errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatal(err)
	}
	if now := get(t, cli, FloorKey("lock:h")); now.ModRevision != floor.ModRevision {
		t.Fatal("a refused release moved the floor")
	}
	// The floor's offset carries on while it matters, then goes with a release that no
	// longer needs it.
	last := g
	for i := range 150 {
		if _, err := s.Release(ctx, "lock:h", ownerA, "", 0); err != nil {
			t.Fatal(err)
		}
		next := acquire(ownerA)
		if next <= last {
			t.Fatalf("round %d: fence %d after %d", i, next, last)
		}
		last = next
		if get(t, cli, FloorKey("lock:h")) == nil {
			break
		}
	}
	if get(t, cli, FloorKey("lock:h")) != nil {
		t.Fatal("the floor key outlived 150 grants")
	}
	if _, err := s.Release(ctx, "lock:h", ownerA, "", 0); err != nil {
		t.Fatal(err)
	}
	if g := acquire(ownerB); g <= last {
		t.Fatalf("fence %d after the floor went, last %d", g, last)
	}
}

// Fences strictly increase across grants by different owners and stores, and are the grant's
// create revision shifted.
func TestFencesStrictlyIncrease(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	stores := []*Store{newStore(t, cli), newStore(t, cli)}
	var last int64
	for i := range 60 {
		s, owner := stores[i%2], []string{ownerA, ownerB}[i%3%2]
		got, err := s.Acquire(ctx, lockstore.Request{Key: "lock:f", Owner: owner, TTL: 5 * time.Second})
		if err != nil || !got.Acquired {
			t.Fatalf("acquire %d: %+v %v", i, got, err)
		}
		if got.Fence <= last {
			t.Fatalf("fence %d after %d: not increasing", got.Fence, last)
		}
		if kv := get(t, cli, "lock:f"); got.Fence != kv.CreateRevision<<fenceShift {
			t.Fatalf("fence %d, create revision %d", got.Fence, kv.CreateRevision)
		}
		last = got.Fence
		// Unrelated writes move the revision on; fences follow.
		if i%7 == 0 {
			if _, err := cli.Put(ctx, "other", strconv.Itoa(i)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.Release(ctx, "lock:f", owner, "", got.Fence+int64(i)); err != nil {
			t.Fatal(err)
		}
	}
}

// A TTL etcd cannot honour is refused before any lease is granted (not whole seconds) or
// after etcd raised the grant (below its minimum); nothing is rounded.
func TestTTLThatCannotBeHonouredIsRefused(t *testing.T) {
	t.Run("not whole seconds", func(t *testing.T) {
		_, cli := single(t)
		ctx := bg(t)
		s := newStore(t, cli)
		for _, ttl := range []time.Duration{1500 * time.Millisecond, 500 * time.Millisecond, time.Second + time.Nanosecond} {
			if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:t", Owner: ownerA, TTL: ttl}); err == nil || !strings.Contains(err.Error(), "whole seconds") {
				t.Fatalf("Acquire with TTL %v: %v, want a refusal naming whole seconds", ttl, err)
			}
			if err := s.Refresh(ctx, "lock:t", ownerA, ttl); err == nil {
				t.Fatalf("Refresh with TTL %v accepted", ttl)
			}
		}
		if ls, err := cli.Leases(ctx); err != nil || len(ls.Leases) != 0 {
			t.Fatalf("leases after refusals: %v %v", ls, err)
		}
		if get(t, cli, "lock:t") != nil {
			t.Fatal("a refused TTL wrote the lock")
		}
	})
	t.Run("below the minimum", func(t *testing.T) {
		// An election timeout of 3s makes etcd's minimum lease TTL 5s (1.5 elections, rounded
		// up): a 2s TTL (a 3s lease) is raised, so it is refused.
		c := etcdtest.Start(t, etcdtest.WithTimings(100*time.Millisecond, 3*time.Second))
		cli := c.Client(t)
		ctx := bg(t)
		s := newStore(t, cli)
		for range 2 {
			_, err := s.Acquire(ctx, lockstore.Request{Key: "lock:t", Owner: ownerA, TTL: 2 * time.Second})
			if err == nil || !strings.Contains(err.Error(), "cannot be honoured") {
				t.Fatalf("Acquire with TTL 2s under a 5s minimum: %v, want a refusal", err)
			}
		}
		if ls, err := cli.Leases(ctx); err != nil || len(ls.Leases) != 0 {
			t.Fatalf("the raised lease was not revoked: %v %v", ls, err)
		}
		if got, err := s.Acquire(ctx, lockstore.Request{Key: "lock:t", Owner: ownerA, TTL: 4 * time.Second}); err != nil || !got.Acquired {
			t.Fatalf("Acquire with TTL 4s (a 5s lease): %+v %v", got, err)
		}
	})
}

// Bad arguments are refused with clear errors and write nothing.
func TestBadArguments(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	s := newStore(t, cli)
	for _, tc := range []struct {
		name, key, owner string
		ttl              time.Duration
	}{
		{"empty key", "", ownerA, time.Second},
		{"store's own key", FloorKey("x"), ownerA, time.Second},
		{"empty owner", "k", "", time.Second},
		{"owner with space", "k", "a b", time.Second},
		{"zero ttl", "k", ownerA, 0},
		{"negative ttl", "k", ownerA, -time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := s.Acquire(ctx, lockstore.Request{Key: tc.key, Owner: tc.owner, TTL: tc.ttl}); err == nil {
				t.Fatal("Acquire accepted it")
			}
			if err := s.Refresh(ctx, tc.key, tc.owner, tc.ttl); err == nil {
				t.Fatal("Refresh accepted it")
			}
			if _, err := s.Reenter(ctx, tc.key, tc.owner, "h", tc.ttl); err == nil {
				t.Fatal("Reenter accepted it")
			}
		})
	}
	if _, err := s.Reenter(ctx, "k", ownerA, "a,b", time.Second); err == nil {
		t.Fatal("Reenter accepted a hold name with a comma")
	}
	if _, err := s.Release(ctx, "k", ownerA, "a b", 0); err == nil {
		t.Fatal("Release accepted a hold name with a space")
	}
	if resp, err := cli.Get(ctx, "", clientv3.WithFromKey(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
		t.Fatalf("bad arguments wrote %d keys (%v)", resp.Count, err)
	}
	if _, err := New(nil); err == nil {
		t.Fatal("New accepted a nil client")
	}
	for _, m := range []time.Duration{0, 500 * time.Millisecond, 1500 * time.Millisecond} {
		if _, err := New(cli, WithLeaseMargin(m)); err == nil {
			t.Fatalf("New accepted a lease margin of %v", m)
		}
	}
}

// Keys of any bytes work, and are written with a lease.
func TestOddKeys(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	s := newStore(t, cli)
	for _, key := range []string{"a\nb", "\x00\xff\x01", "ключ:🔒", "a b", "{tag}x", strings.Repeat("k", lockstore.MaxKeyLen)} {
		got, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerA, TTL: 5 * time.Second, Meta: "m\nx y"})
		if err != nil || !got.Acquired {
			t.Fatalf("acquire %q: %+v %v", key, got, err)
		}
		if leaseTTL(t, cli, key) <= 0 {
			t.Fatalf("%q written without a live lease", key)
		}
		if busy, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerB, TTL: 5 * time.Second}); err != nil || busy.Holder != "m\nx y" {
			t.Fatalf("busy %q: %+v %v", key, busy, err)
		}
		if _, err := s.Release(ctx, key, ownerA, "", 0); err != nil {
			t.Fatalf("release %q: %v", key, err)
		}
	}
}

// Every call honours its context's deadline when the cluster does not answer; the session
// lease outlives the outage, and a release that failed during it is carried out by the store
// once the cluster is back.
func TestStoreDownHonoursDeadlines(t *testing.T) {
	c, cli := single(t)
	s := newStore(t, cli)
	ctx := bg(t)
	for _, k := range []string{"lock:d", "lock:k"} {
		if _, err := s.Acquire(ctx, lockstore.Request{Key: k, Owner: ownerA, TTL: 10 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	// A lease for 1s locks, so that the acquisition below goes out on it.
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:s", Owner: ownerA, TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, "lock:s", ownerA, "", 0); err != nil {
		t.Fatal(err)
	}
	c.Members[0].Kill()
	calls := map[string]func(context.Context) error{
		"Acquire": func(ctx context.Context) error {
			_, err := s.Acquire(ctx, lockstore.Request{Key: "lock:e", Owner: ownerA, TTL: time.Second})
			return err
		},
		"Acquire new TTL": func(ctx context.Context) error {
			_, err := s.Acquire(ctx, lockstore.Request{Key: "lock:e", Owner: ownerA, TTL: 7 * time.Second})
			return err
		},
		"Refresh": func(ctx context.Context) error { return s.Refresh(ctx, "lock:k", ownerA, 10*time.Second) },
		"Release": func(ctx context.Context) error {
			_, err := s.Release(ctx, "lock:d", ownerA, "", 0)
			return err
		},
		"Reenter": func(ctx context.Context) error {
			_, err := s.Reenter(ctx, "lock:k", ownerA, "h", time.Second)
			return err
		},
		"TTL": func(ctx context.Context) error {
			_, err := s.TTL(ctx, "lock:k")
			return err
		},
		"Watch": func(ctx context.Context) error {
			w, err := s.Watch(ctx, "lock:k")
			if err != nil {
				return err
			}
			defer w.Close()
			select {
			case <-w.C():
			case <-ctx.Done():
			}
			return ctx.Err()
		},
	}
	for name, call := range calls {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		start := time.Now()
		err := call(ctx)
		cancel()
		if err == nil || errors.Is(err, lockstore.ErrNotHeld) {
			t.Errorf("%s on a stopped cluster: %v, want a store error", name, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("%s took %v past its 300ms deadline", name, d)
		}
	}
	// An acquisition that sent nothing (no lease of its TTL could be granted) is given back
	// with no round trip: ErrNotHeld at once, although etcd does not answer.
	uctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	if got, err := s.Acquire(uctx, lockstore.Request{Key: "lock:u", Owner: ownerA, TTL: 9 * time.Second}); err == nil {
		t.Fatalf("acquire with a new TTL on a stopped cluster = %+v, want an error", got)
	}
	cancel()
	rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	start := time.Now()
	_, err := s.Release(rctx, "lock:u", ownerA, "", 0)
	cancel()
	if d := time.Since(start); !errors.Is(err, lockstore.ErrNotHeld) || d > 100*time.Millisecond {
		t.Errorf("release of an acquisition that sent nothing = %v after %v, want ErrNotHeld at once", err, d)
	}
	c.Members[0].Restart()
	if err := s.Refresh(ctx, "lock:k", ownerA, 10*time.Second); err != nil {
		t.Fatalf("refresh after the restart: %v", err)
	}
	waitFor(t, 10*time.Second, "the release that failed is carried out", func() bool { return get(t, cli, "lock:d") == nil })
	if get(t, cli, "lock:e") != nil {
		t.Fatal("an acquisition that failed during the outage left its key")
	}
	if _, err := s.Release(ctx, "lock:k", ownerA, "", 0); err != nil {
		t.Fatalf("release after the restart: %v", err)
	}
	waitFor(t, 5*time.Second, "no entry left", func() bool { return s.Held() == 0 })
}

// A lock its holder neither refreshes nor releases goes one TTL after its acquisition, as a
// Redis key would, although the store keeps its session lease alive.
func TestUnrefreshedLockIsReleasedAfterItsTTL(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	s, other := newStore(t, cli), newStore(t, cli)
	start := time.Now()
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:f", Owner: ownerA, TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:g", Owner: ownerA, TTL: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	w, err := other.Watch(ctx, "lock:f")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	select {
	case <-w.C():
	case <-time.After(5 * time.Second):
		t.Fatal("the unrefreshed lock was not released")
	}
	if d := time.Since(start); d < time.Second {
		t.Fatalf("released %v after the acquisition, before its 1s TTL", d)
	}
	// The refreshed one stays, on the same lease.
	for range 4 {
		if err := s.Refresh(ctx, "lock:g", ownerA, 2*time.Second); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if get(t, cli, "lock:g") == nil {
		t.Fatal("a refreshed lock was released")
	}
	if got, err := other.Acquire(ctx, lockstore.Request{Key: "lock:f", Owner: ownerB, TTL: time.Second}); err != nil || !got.Acquired {
		t.Fatalf("the released lock: %+v %v", got, err)
	}
}

// Close never ends a grant whose holder may still run: a lock held when the store closes stays
// in etcd, refusing other owners, until its lease runs out (TTL + margin after the last
// keep-alive), as a Redis key runs out with its PX. A lease that holds nothing is revoked.
func TestCloseLeavesHeldKeysToTheirTTL(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	s, err := New(cli)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const ttl = 2 * time.Second
	if got, err := s.Acquire(ctx, lockstore.Request{Key: "lock:held", Owner: ownerA, TTL: ttl}); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	held := get(t, cli, "lock:held")
	// A lease of another TTL that nothing is on any more.
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:freed", Owner: ownerA, TTL: 3 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, "lock:freed", ownerA, "", 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	closed := time.Now()
	if kv := get(t, cli, "lock:held"); kv == nil || kv.CreateRevision != held.CreateRevision {
		t.Fatalf("Close freed a lock whose holder may still run: %v", kv)
	}
	if n := leaseCount(t, cli); n != 1 {
		t.Fatalf("%d leases after Close, want only the one under the held lock", n)
	}
	other := newStore(t, cli)
	if got, err := other.Acquire(ctx, lockstore.Request{Key: "lock:held", Owner: ownerB, TTL: ttl}); err != nil || got.Acquired {
		t.Fatalf("another owner after Close = %+v, %v; want busy", got, err)
	}
	// Nothing keeps the lease alive any more: it runs out within TTL + margin.
	waitFor(t, ttl+DefaultLeaseMargin+2*time.Second, "the held lock runs out with its lease", func() bool {
		return get(t, cli, "lock:held") == nil
	})
	if d := time.Since(closed); d < ttl-DefaultLeaseMargin {
		t.Fatalf("the held lock went %v after Close, before its TTL", d)
	}
}
