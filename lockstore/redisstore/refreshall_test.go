package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

// RefreshAll answers for each lock what Refresh would: extended for its owner (never
// shortened), lockstore.ErrNotHeld for a free key or another owner's, an argument error for a bad key,
// each in batch order, in one pipeline; and it still works after the server lost its script
// cache (NOSCRIPT: the scripts are sent again with EVAL).
func TestRefreshAll(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		for _, k := range []string{"lock:ra1", "lock:ra2"} {
			if got, err := b.store.Acquire(ctx, lockstore.Request{Key: k, Owner: ownerA, TTL: time.Second}); err != nil || !got.Acquired {
				t.Fatalf("Acquire %s: %+v %v", k, got, err)
			}
		}
		if got, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:rb", Owner: ownerB, TTL: 30 * time.Second}); err != nil || !got.Acquired {
			t.Fatalf("Acquire lock:rb: %+v %v", got, err)
		}
		batch := []lockstore.Renewal{
			{Key: "lock:ra1", Owner: ownerA, TTL: 20 * time.Second},
			{Key: "lock:rb", Owner: ownerA, TTL: 20 * time.Second}, // ownerB's lock
			{Key: "lock:free", Owner: ownerA, TTL: 20 * time.Second},
			{Key: "", Owner: ownerA, TTL: 20 * time.Second}, // bad key
			{Key: "lock:ra2", Owner: ownerA, TTL: 20 * time.Second},
		}
		check := func(round string) {
			errs := b.store.RefreshAll(ctx, batch)
			if len(errs) != len(batch) {
				t.Fatalf("%s: %d errors for %d renewals", round, len(errs), len(batch))
			}
			for i, want := range []error{nil, lockstore.ErrNotHeld, lockstore.ErrNotHeld, nil, nil} {
				switch {
				case i == 3 && errs[i] == nil:
					t.Errorf("%s: an empty key was refreshed", round)
				case i != 3 && !errors.Is(errs[i], want) && !(want == nil && errs[i] == nil):
					t.Errorf("%s: renewal %d (%s): %v, want %v", round, i, batch[i].Key, errs[i], want)
				}
			}
			for _, k := range []string{"lock:ra1", "lock:ra2"} {
				if d := b.client.PTTL(ctx, k).Val(); d < 19*time.Second {
					t.Errorf("%s: %s has %v left, want about 20s", round, k, d)
				}
			}
			if d := b.client.PTTL(ctx, "lock:rb").Val(); d < 29*time.Second {
				t.Errorf("%s: another owner's lock was touched: %v left of 30s", round, d)
			}
			if n := b.client.Exists(ctx, "lock:free").Val(); n != 0 {
				t.Errorf("%s: a refresh of a free key created it", round)
			}
		}
		check("cached scripts")
		if err := b.client.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		check("after SCRIPT FLUSH")
		// A lock is never shortened: a refresh with a smaller TTL leaves it alone.
		if errs := b.store.RefreshAll(ctx, []lockstore.Renewal{{Key: "lock:ra1", Owner: ownerA, TTL: time.Second}}); errs[0] != nil {
			t.Fatal(errs[0])
		}
		if d := b.client.PTTL(ctx, "lock:ra1").Val(); d < 19*time.Second {
			t.Errorf("a refresh with TTL 1s shortened the lock to %v", d)
		}
	})
}

// lockstore.Renewal batches share the store's lanes (up to 32 renewers pipelining at once, each
// on a pooled connection of its own, would leave the client's pool at 20 connections after
// 10,000 locks are held, 186 B per released lock): no more RefreshAll pipelines than lanes are
// on the wire at once, a batch waits for a free slot within its context, and one whose context
// ends while it waits is not sent and reports the context's error for every lock.
func TestRefreshAllPipelinesShareTheLanes(t *testing.T) {
	s, c, h := oneLaneStore(t)
	ctx := context.Background()
	for _, k := range []string{"lock:ra1", "lock:ra2"} {
		if a, err := s.Acquire(ctx, lockstore.Request{Key: k, Owner: ownerA, TTL: time.Minute}); err != nil || !a.Acquired {
			t.Fatalf("acquire %s: %+v %v", k, a, err)
		}
	}
	before := h.pipelines.Load()
	h.pipeArmed.Store(true)
	first := make(chan []error, 1)
	go func() {
		first <- s.RefreshAll(ctx, []lockstore.Renewal{{Key: "lock:ra1", Owner: ownerA, TTL: time.Minute}})
	}()
	<-h.pipeIn // the first batch is on the wire, held by the hook

	// A second batch whose context ends while the lane is taken is never sent.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	errs := s.RefreshAll(short, []lockstore.Renewal{{Key: "lock:ra2", Owner: ownerA, TTL: time.Minute}})
	if len(errs) != 1 || !errors.Is(errs[0], context.DeadlineExceeded) {
		t.Fatalf("a batch that waited past its deadline for a lane = %v, want DeadlineExceeded", errs)
	}
	if n := h.pipelines.Load() - before; n != 1 {
		t.Fatalf("%d renewal pipelines reached the client while the only lane was taken, want 1", n)
	}

	// A second batch with time to wait goes out once the first returns.
	second := make(chan []error, 1)
	go func() {
		second <- s.RefreshAll(ctx, []lockstore.Renewal{{Key: "lock:ra2", Owner: ownerA, TTL: time.Minute}})
	}()
	close(h.pipeGo)
	for i, ch := range []chan []error{first, second} {
		if errs := <-ch; len(errs) != 1 || errs[0] != nil {
			t.Fatalf("batch %d = %v, want renewed", i+1, errs)
		}
	}
	if n := h.pipelines.Load() - before; n != 2 {
		t.Fatalf("%d renewal pipelines, want 2", n)
	}
	if ttl := c.PTTL(ctx, "lock:ra2").Val(); ttl < 30*time.Second {
		t.Fatalf("lock:ra2 has %v left after its renewal", ttl)
	}
}
