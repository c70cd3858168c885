package etcdstore

import (
	"cmp"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/flightlock/flightlock/lockstore"
)

// TestLockOfReadsTheValueButNotTheOwner: the inspector reads holds, holder metadata and the
// fence (create revision and floor offset) from a lock key, never its owner token, and
// refuses values the store does not write.
func TestLockOfReadsTheValueButNotTheOwner(t *testing.T) {
	v := lockValue{owner: ownerA, secs: 6, holds: "1,r1,r2", last: 0, meta: "host=h pid=42 trace=t zone=eu"}
	kv := &mvccpb.KeyValue{Key: []byte("p/order:1"), Value: []byte(v.String()), CreateRevision: 7, ModRevision: 9, Lease: 0x2a}
	floor := &mvccpb.KeyValue{Value: []byte(strconv.FormatInt(5<<fenceShift+3, 10)), ModRevision: 5}
	l := lockOf("order:1", kv, true, floor)
	switch {
	case l.Owner != "" || strings.Contains(l.Metadata, ownerA):
		t.Errorf("the owner token was read: %+v", l)
	case l.Key != "order:1" || l.StoreKey != "p/order:1" || l.Lease != "2a" || l.CreateRevision != 7 || l.ModRevision != 9:
		t.Errorf("keys and revisions: %+v", l)
	case l.Fence != 7<<fenceShift+3:
		t.Errorf("fence %d, want %d (revision 7 and the floor's offset 3)", l.Fence, 7<<fenceShift+3)
	case !l.Own || strings.Join(l.Borrowed, ",") != "r1,r2" || !l.Contended || l.TTL != lockstore.NoTTL:
		t.Errorf("holds %v %v contended %v ttl %v", l.Own, l.Borrowed, l.Contended, l.TTL)
	case l.Host != "h" || l.Pid != "42" || l.Trace != "t" || l.Metadata != "zone=eu":
		t.Errorf("holder %q %q %q %q", l.Host, l.Pid, l.Trace, l.Metadata)
	}
	if l := lockOf("order:1", kv, false, nil); l.Fence != 7<<fenceShift {
		t.Errorf("fence without a floor: %d, want %d", l.Fence, 7<<fenceShift)
	}
	for _, bad := range []string{"", "just-a-value", ownerA + " 0 1 0", ownerA + " 6 7 0", ownerA + " 6 1 x"} {
		kv := &mvccpb.KeyValue{Key: []byte("p/k"), Value: []byte(bad), CreateRevision: 7}
		want := cmp.Or(bad, lockstore.EmptyValue) // an empty Unrecognized would be a lock
		if l := lockOf("k", kv, true, nil); l.Unrecognized != want || l.Contended || l.Fence != 0 {
			t.Errorf("%q read as a lock: %+v", bad, l)
		}
	}
}

// TestInspectorOnEtcd: List and Lookup read the locks a Store holds (fence, lease TTL,
// holder, waiter mark); ForceUnlock removes nothing when the lock changed since it was read,
// and otherwise deletes the key with its waiter mark.
func TestInspectorOnEtcd(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	s := newStore(t, cli)
	in := NewInspector(cli, "p/")
	a, err := s.Acquire(ctx, lockstore.Request{Key: "p/order:1", Owner: ownerA, TTL: 5 * time.Second, Meta: "host=h1 pid=42"})
	if err != nil || !a.Acquired {
		t.Fatalf("acquire: %+v %v", a, err)
	}
	if b, err := s.Acquire(ctx, lockstore.Request{Key: "p/order:1", Owner: ownerB, TTL: 5 * time.Second}); err != nil || b.Acquired {
		t.Fatalf("second owner: %+v %v", b, err) // refused: it sets the waiter mark
	}
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "p/acct:1", Owner: ownerA, TTL: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}

	locks, more, err := in.List(ctx, "order:*", lockstore.ListOptions{})
	if err != nil || more != 0 || len(locks) != 1 {
		t.Fatalf("List order:*: %+v, %d more, %v", locks, more, err)
	}
	l := locks[0]
	if l.Key != "order:1" || l.Fence != a.Fence || l.Owner != "" || !l.Contended || l.Host != "h1" ||
		l.TTL <= 0 || l.TTL > 6*time.Second || l.Lease == "" {
		t.Errorf("List: %+v; want fence %d, no owner, the mark, the holder and a lease TTL", l, a.Fence)
	}
	if locks, more, err := in.List(ctx, "*", lockstore.ListOptions{Limit: 1}); err != nil || more != 1 || len(locks) != 1 || locks[0].Key != "acct:1" {
		t.Errorf("List * limit 1: %+v, %d more, %v", locks, more, err)
	}
	if _, err := in.Lookup(ctx, "order:9"); !errors.Is(err, lockstore.ErrNotHeld) {
		t.Errorf("Lookup of a free key: %v, want ErrNotHeld", err)
	}
	read, err := in.Lookup(ctx, "order:1")
	if err != nil || read.FenceCounterKey != FloorKey("p/order:1") || read.FenceCounter != nil {
		t.Fatalf("Lookup: %+v, %v", read, err)
	}

	// Re-entered since it was read: its revision moved, nothing is removed.
	if _, err := s.Reenter(ctx, "p/order:1", ownerA, "r1", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	var changed *lockstore.ChangedError
	if _, err := in.ForceUnlock(ctx, read); !errors.As(err, &changed) || changed.Now == nil || changed.Now.CreateRevision != read.CreateRevision {
		t.Fatalf("ForceUnlock of a lock whose holds changed: %v, want a ChangedError with the same grant", err)
	}
	if get(t, cli, "p/order:1") == nil {
		t.Fatal("the lock was removed")
	}
	if read, err = in.Lookup(ctx, "order:1"); err != nil {
		t.Fatal(err)
	}
	notified, err := in.ForceUnlock(ctx, read)
	if err != nil || notified != 1 {
		t.Fatalf("ForceUnlock: %d, %v; want 1 (the waiter mark deleted)", notified, err)
	}
	if get(t, cli, "p/order:1") != nil || get(t, cli, WaiterKey("p/order:1")) != nil {
		t.Error("the key or its waiter mark is still there")
	}
	if _, err := in.ForceUnlock(ctx, read); !errors.As(err, &changed) || changed.Now != nil {
		t.Errorf("ForceUnlock of a removed lock: %v, want a ChangedError with nothing now", err)
	}
}
