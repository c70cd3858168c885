package etcdstore

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

// The inspector lists a key held for reading once, with the count of its read holds and no
// owner, and a held key with the count of its fair line; read holds and places are never
// listed as locks of their own or as unrecognized keys, also beside user keys that look like
// them ("orders" and "orders/0"). ForceUnlock of a read-held key ends its read holds.
func TestInspectorCountsReadersAndPlacesInLine(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	s := newStore(t, cli)
	const ttl, queue = 2 * time.Second, 2 * time.Second
	r1, r2 := lockstore.ReadOwner(ownerA), lockstore.ReadOwner(ownerB)
	for _, o := range []string{r1, r2} {
		if r, err := s.Acquire(ctx, lockstore.Request{Key: "lock:orders", Owner: o, TTL: ttl, Meta: "host=r"}); err != nil || !r.Acquired {
			t.Fatalf("read = %+v, %v", r, err)
		}
	}
	if r, err := s.Acquire(ctx, lockstore.Request{Key: "lock:orders/0", Owner: ownerA, TTL: ttl, Meta: "host=w"}); err != nil || !r.Acquired {
		t.Fatalf("write = %+v, %v", r, err)
	}
	for _, o := range []string{"cccccccccccccccccccccccccccccccc", "dddddddddddddddddddddddddddddddd"} {
		if r, err := s.Acquire(ctx, lockstore.Request{Key: "lock:orders/0", Owner: o, TTL: ttl, Asked: time.Now(), Queue: queue}); err != nil || r.Acquired {
			t.Fatalf("waiter in line = %+v, %v", r, err)
		}
	}

	for _, prefix := range []string{"lock:", ""} {
		in := NewInspector(cli, prefix)
		locks, more, err := in.List(ctx, "*", lockstore.ListOptions{})
		if err != nil || more != 0 {
			t.Fatalf("List(%q) = %v, %d, %v", prefix, locks, more, err)
		}
		if len(locks) != 2 {
			t.Fatalf("List(%q) = %d locks, want 2: %+v", prefix, len(locks), locks)
		}
		read, write := locks[0], locks[1]
		if want := strings.TrimPrefix("lock:orders", prefix); read.Key != want {
			t.Fatalf("first lock %q, want %q", read.Key, want)
		}
		switch {
		case read.StoreKey != "lock:orders" || read.Readers != 2 || read.Queued != 0 || read.Owner != "" || read.Own:
			t.Errorf("read-held key: %+v", read)
		case read.TTL <= 0 || read.TTL > 3*time.Second || read.Fence <= 0 || read.Unrecognized != "":
			t.Errorf("read-held key's TTL, fence: %+v", read)
		case write.StoreKey != "lock:orders/0" || write.Readers != 0 || write.Queued != 2 || !write.Own || !write.Contended:
			t.Errorf("write-held key with a line: %+v", write)
		}
		for _, l := range locks {
			if strings.Contains(l.Key, ownerA) || strings.Contains(l.Key, ownerB) || strings.Contains(l.Metadata, ownerA) {
				t.Errorf("an owner token was listed: %+v", l)
			}
		}
	}

	in := NewInspector(cli, "lock:")
	l, err := in.Lookup(ctx, "orders")
	if err != nil || l.Readers != 2 || l.Owner != "" {
		t.Fatalf("Lookup of a read-held key = %+v, %v", l, err)
	}
	if w, err := in.Lookup(ctx, "orders/0"); err != nil || w.Queued != 2 || w.Readers != 0 {
		t.Fatalf("Lookup of a write-held key with a line = %+v, %v", w, err)
	}
	if _, err := in.Lookup(ctx, "orders/1"); !errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("Lookup of a free key: %v", err)
	}

	// A read hold granted after the read is another grant: ForceUnlock removes nothing.
	r3 := lockstore.ReadOwner("eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee")
	if r, err := s.Acquire(ctx, lockstore.Request{Key: "lock:orders", Owner: r3, TTL: ttl}); err != nil || !r.Acquired {
		t.Fatalf("third read = %+v, %v", r, err)
	}
	var changed *lockstore.ChangedError
	if _, err := in.ForceUnlock(ctx, l); !errors.As(err, &changed) || changed.Now == nil || changed.Now.Readers != 3 {
		t.Fatalf("ForceUnlock after a new read hold: %v, want changed with 3 readers", err)
	}
	if _, err := in.ForceUnlock(ctx, *changed.Now); err != nil {
		t.Fatalf("ForceUnlock of the read holds: %v", err)
	}
	if err := s.Refresh(ctx, "lock:orders", r1, ttl); !errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("refresh of a force-unlocked read hold: %v", err)
	}
	if r, err := s.Acquire(ctx, lockstore.Request{Key: "lock:orders", Owner: ownerB, TTL: ttl}); err != nil || !r.Acquired {
		t.Fatalf("write after the read holds were removed = %+v, %v", r, err)
	}
}
