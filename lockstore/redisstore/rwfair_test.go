package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/lockstore"
)

var (
	ownerC  = "cccccccccccccccccccccccccccccccc"
	readerA = lockstore.ReadOwner(ownerA)
	readerB = lockstore.ReadOwner(ownerB)
)

// Read holds share the key and refuse a writer; the writer's refusal holds new readers back;
// the last reader leaves the key to writers, and the readers held back wait for that writer's
// release, which wakes them.
func TestReadHoldsShareAndTheLastLeavesTheKeyToTheWaitingWriter(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		s, key := b.store, "lock:order"
		for _, r := range []string{readerA, readerB} {
			if got, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: r, TTL: 10 * time.Second, Meta: "host=a"}); err != nil || !got.Acquired {
				t.Fatalf("read hold %s: %+v %v", r, got, err)
			}
		}
		if got, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerC, TTL: 10 * time.Second}); err != nil || got.Acquired || got.HolderTTL <= 0 || got.Holder != "host=a" {
			t.Fatalf("a writer beside readers: %+v %v, want busy with their time and metadata", got, err)
		}
		if got, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: lockstore.ReadOwner("late"), TTL: 10 * time.Second}); err != nil || got.Acquired {
			t.Fatalf("a reader after a writer was refused: %+v %v, want busy (writer preference)", got, err)
		}
		if again, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: readerA, TTL: 10 * time.Second}); err != nil || !again.Reentered {
			t.Fatalf("a re-sent read acquisition: %+v %v, want a re-entry", again, err)
		}
		w, err := s.Watch(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if n, err := s.Release(ctx, key, readerA, "", 0); err != nil || n != 0 {
			t.Fatalf("the first reader's release: %d %v, want 0 notified (a reader is left)", n, err)
		}
		if _, err := s.Release(ctx, key, readerB, "", 0); err != nil {
			t.Fatalf("the last reader's release: %v", err)
		}
		select {
		case <-w.C():
		case <-time.After(5 * time.Second):
			t.Fatal("the last reader's release woke nobody")
		}
		if got, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: lockstore.ReadOwner("late"), TTL: 10 * time.Second}); err != nil || got.Acquired {
			t.Fatalf("a reader once the readers left: %+v %v, want busy: the key is the writer's", got, err)
		}
		got, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerC, TTL: 10 * time.Second})
		if err != nil || !got.Acquired {
			t.Fatalf("the waiting writer: %+v %v", got, err)
		}
		if n, err := s.Release(ctx, key, ownerC, "", 0); err != nil || n != 1 {
			t.Fatalf("the writer's release: %d %v, want the waiting reader woken", n, err)
		}
		if got, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: readerA, TTL: 10 * time.Second}); err != nil || !got.Acquired {
			t.Fatalf("a reader after the writer: %+v %v", got, err)
		}
		if _, err := s.Release(ctx, key, readerA, "", 0); err != nil {
			t.Fatal(err)
		}
		if n := b.client.Exists(ctx, key, readersKey(key)).Val(); n != 0 {
			t.Fatalf("%d keys left after the last release", n)
		}
	})
}

// A read hold refreshes and releases alone; a reader's token handed over, or forged as the read
// mark itself, re-enters nothing; a refresh of a hold past its time does not bring it back.
func TestReadHoldsRefreshAndReleaseAloneAndAreNeverReentered(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		s, key := b.store, "lock:order"
		if _, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: readerA, TTL: time.Second}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: readerB, TTL: 10 * time.Second}); err != nil {
			t.Fatal(err)
		}
		if err := s.Refresh(ctx, key, readerA, 10*time.Second); err != nil {
			t.Fatalf("refresh of a live read hold: %v", err)
		}
		for _, forged := range []string{readerA, "~r", "~w"} {
			if got, err := s.Reenter(ctx, key, forged, "h1", 10*time.Second); err != nil || got.Acquired {
				t.Fatalf("Reenter with %q: %+v %v, want nothing", forged, got, err)
			}
		}
		if _, err := s.Release(ctx, key, readerA, "", 0); err != nil {
			t.Fatal(err)
		}
		if err := s.Refresh(ctx, key, readerA, 10*time.Second); !errors.Is(err, lockstore.ErrNotHeld) {
			t.Fatalf("refresh of a released read hold: %v, want ErrNotHeld", err)
		}
		if _, err := s.Release(ctx, key, readerA, "", 0); !errors.Is(err, lockstore.ErrNotHeld) {
			t.Fatalf("a second release: %v, want ErrNotHeld", err)
		}
		if err := s.Refresh(ctx, key, readerB, 10*time.Second); err != nil {
			t.Fatalf("the other reader's refresh: %v", err)
		}
		if _, err := s.Release(ctx, key, readerB, "", 0); err != nil {
			t.Fatal(err)
		}
	})
}

// The last read release of a key a writer waits for, by a user that may not publish to the
// release channel, succeeds: the key is left to the writers ("~w", for writerReserveMillis) as
// with the permission, the release reports success with nobody notified, and the writer gets
// the key at its next look.
func TestLastReadReleaseSucceedsWithoutChannelPermission(t *testing.T) {
	b := channellessBackend(t)
	ctx := context.Background()
	s, key := b.store, "lock:order"
	if got, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: readerA, TTL: 10 * time.Second}); err != nil || !got.Acquired {
		t.Fatalf("read hold: %+v %v", got, err)
	}
	if got, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerC, TTL: 10 * time.Second}); err != nil || got.Acquired {
		t.Fatalf("a writer beside a reader: %+v %v, want busy", got, err)
	}
	if n, err := s.Release(ctx, key, readerA, "", 0); err != nil || n != 0 {
		t.Fatalf("the last reader's release without channel permission = %d, %v; want 0 notified and no error", n, err)
	}
	if v := b.client.Get(ctx, key).Val(); !strings.HasPrefix(v, reservedOwner+" ") || !strings.HasSuffix(v, " 0 ~") {
		t.Fatalf("the key after the last read release = %q, want it left to the writers (%q)", v, reservedOwner+" <fence> 0 ~")
	}
	if b.client.Exists(ctx, readersKey(key)).Val() != 0 {
		t.Fatal("the read holds are still there")
	}
	if _, err := s.Release(ctx, key, readerA, "", 0); !errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("a second release: %v, want lockstore.ErrNotHeld", err)
	}
	if got, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerC, TTL: 10 * time.Second}); err != nil || !got.Acquired {
		t.Fatalf("the waiting writer's next look: %+v %v, want the key", got, err)
	}
}

// The first in line of a free fair key who gives up, by a user that may not publish to the
// release channel, leaves the line: LeaveQueue succeeds although the wake-up of the next in
// line is refused, and the next in line gets the key at its next look.
func TestLeaveQueueSucceedsWithoutChannelPermission(t *testing.T) {
	b := channellessBackend(t)
	ctx := context.Background()
	s, key := b.store, "lock:stock"
	fair := func(owner string) lockstore.Request {
		return lockstore.Request{Key: key, Owner: owner, TTL: 10 * time.Second, Asked: time.Now(), Queue: 10 * time.Second}
	}
	if got, err := s.Acquire(ctx, fair(ownerA)); err != nil || !got.Acquired {
		t.Fatalf("the first fair acquirer: %+v %v", got, err)
	}
	for _, o := range []string{ownerB, ownerC} {
		if got, err := s.Acquire(ctx, fair(o)); err != nil || got.Acquired {
			t.Fatalf("fair acquirer %s: %+v %v, want a place in line", o, got, err)
		}
	}
	// The holder leaves, its release heard by nobody (another service's user may publish;
	// this one's release is TestContendedReleaseSucceedsWithoutChannelPermission's).
	if _, err := New(b.client).Release(ctx, key, ownerA, "", 0); err != nil {
		t.Fatal(err)
	}
	// B, first in line of a free key, gives up: its LeaveQueue would wake C.
	if err := s.LeaveQueue(ctx, key, ownerB); err != nil {
		t.Fatalf("LeaveQueue of the first in line without channel permission: %v, want no error (the place is gone "+
			"before the PUBLISH)", err)
	}
	if line := b.client.ZRange(ctx, lineKey(key), 0, -1).Val(); len(line) != 1 || line[0] != ownerC {
		t.Fatalf("the line after B left = %v, want only C", line)
	}
	if n := b.client.ZCard(ctx, lineDueKey(key)).Val(); n != 1 {
		t.Fatalf("%d places' deadlines after B left, want C's only", n)
	}
	if got, err := s.Acquire(ctx, fair(ownerC)); err != nil || !got.Acquired {
		t.Fatalf("the next in line's next look: %+v %v, want the key", got, err)
	}
}

// The inspector lists a read-held key with its readers and a fair key with its line, and never
// lists the keys beside them.
func TestInspectorCountsReadersAndPlacesInLine(t *testing.T) {
	b := realBackend(t)
	ctx := context.Background()
	s := b.store
	for _, r := range []string{readerA, readerB} {
		if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:order", Owner: r, TTL: 10 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:stock", Owner: ownerA, TTL: 10 * time.Second, Asked: time.Now(), Queue: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	for _, o := range []string{ownerB, ownerC} {
		if got, err := s.Acquire(ctx, lockstore.Request{Key: "lock:stock", Owner: o, TTL: 10 * time.Second, Asked: time.Now(), Queue: 10 * time.Second}); err != nil || got.Acquired {
			t.Fatalf("a second fair acquirer: %+v %v", got, err)
		}
	}
	in := NewInspector(b.client, "")
	locks, _, err := in.List(ctx, "*", lockstore.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(locks) != 2 || locks[0].Key != "lock:order" || locks[0].Readers != 2 || !strings.HasPrefix(locks[0].Owner, "~r:") ||
		locks[1].Key != "lock:stock" || locks[1].Queued != 2 || locks[1].Owner != ownerA {
		t.Fatalf("listed %+v, want lock:order with 2 readers (the readers' marker, no token) and lock:stock held by A with 2 in line", locks)
	}
	// An operator may force the readers out: the key goes, and so do their refreshes.
	if _, err := in.ForceUnlock(ctx, locks[0]); err != nil {
		t.Fatalf("force unlock of a read-held key: %v", err)
	}
	if err := s.Refresh(ctx, "lock:order", readerA, 10*time.Second); !errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("a reader's refresh after the force unlock: %v, want ErrNotHeld", err)
	}
}

// A fair acquirer's place is when it asked, clamped to the store's clock: one with a clock an
// hour behind goes at most a second before the store's time, one an hour ahead goes last; a
// TryLock (no place) is refused while others wait and takes no place.
func TestFairPlaceIsClampedToTheStoresClock(t *testing.T) {
	b := realBackend(t)
	ctx := context.Background()
	s, key := b.store, "lock:stock"
	if _, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerA, TTL: 10 * time.Second, Asked: time.Now(), Queue: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		owner string
		asked time.Time
	}{
		{ownerB, time.Now().Add(-500 * time.Millisecond)},
		{ownerC, time.Now().Add(-time.Hour)},
		{"ahead", time.Now().Add(time.Hour)},
	} {
		if _, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: p.owner, TTL: 10 * time.Second, Asked: p.asked, Queue: 10 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	line := b.client.ZRangeWithScores(ctx, lineKey(key), 0, -1).Val()
	if len(line) != 3 || line[0].Member != ownerC || line[1].Member != ownerB || line[2].Member != "ahead" {
		t.Fatalf("line %v, want C (an hour behind, clamped), B (0.5s ago), then the clock an hour ahead", line)
	}
	if gap := line[1].Score - line[0].Score; gap > 0.7e6 {
		t.Fatalf("C went %.0fµs before B, which asked 0.5s ago: more than the 1s clamp allows", gap)
	}
	if got, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: "try", TTL: 10 * time.Second, Asked: time.Now(), Queue: 0}); err != nil || got.Acquired {
		t.Fatalf("TryLock with others in line: %+v %v", got, err)
	}
	if n := b.client.ZCard(ctx, lineKey(key)).Val(); n != 3 {
		t.Fatalf("%d in line after a TryLock, want 3: it takes no place", n)
	}
}

// Read holds and fair grants count only with the replicas' acknowledgement: without it nothing
// is handed out and nothing is left behind.
func TestReadAndFairGrantsNeedTheReplicasAcknowledgement(t *testing.T) {
	primary := redistest.Start(t)
	ctx := context.Background()
	client := primary.Client()
	s := New(client, WithReplicas(1, 50*time.Millisecond))
	t.Cleanup(func() { _ = s.Close() })
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:order", Owner: readerA, TTL: 10 * time.Second}); !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("a read hold without a replica: %v, want ErrNotReplicated", err)
	}
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:stock", Owner: ownerA, TTL: 10 * time.Second, Asked: time.Now(), Queue: time.Second}); !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("a fair grant without a replica: %v, want ErrNotReplicated", err)
	}
	waitGone(t, client, "lock:order", "lock:stock")
	if n := client.ZScore(ctx, readersKey("lock:order"), readerA); n.Err() != redis.Nil {
		t.Fatalf("the unacknowledged read hold was left: %v", n)
	}
	redistest.StartReplica(t, primary.Addr)
	waitAcknowledging(t, client, 1)
	if got, err := s.Acquire(ctx, lockstore.Request{Key: "lock:order", Owner: readerA, TTL: 10 * time.Second}); err != nil || !got.Acquired {
		t.Fatalf("a read hold with a replica: %+v %v", got, err)
	}
	if err := s.Refresh(ctx, "lock:order", readerA, 10*time.Second); err != nil {
		t.Fatalf("its refresh with a replica: %v", err)
	}
	if got, err := s.Acquire(ctx, lockstore.Request{Key: "lock:stock", Owner: ownerA, TTL: 10 * time.Second, Asked: time.Now(), Queue: time.Second}); err != nil || !got.Acquired {
		t.Fatalf("a fair grant with a replica: %+v %v", got, err)
	}
}

// waitGone waits for keys to be deleted: an unacknowledged grant is given up in the background.
func waitGone(t *testing.T, c *redis.Client, keys ...string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for c.Exists(context.Background(), keys...).Val() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%v still there", keys)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A force unlock of a group of readers an operator saw removes that group only: the next group,
// with no write between them, may carry the same fence, but not the same marker.
func TestForceUnlockOfReadersSparesTheNextGroup(t *testing.T) {
	ctx := context.Background()
	s, in, seen := readerSeenByAnOperator(t)
	key := "lock:k"
	if _, err := s.Release(ctx, key, readerA, "", 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Millisecond) // a new group, in another microsecond
	next, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: readerB, TTL: 10 * time.Second})
	if err != nil || !next.Acquired {
		t.Fatal(next, err)
	}
	var changed *lockstore.ChangedError
	if _, err := in.ForceUnlock(ctx, seen); !errors.As(err, &changed) {
		t.Fatalf("force unlock of the group seen, with another group holding now: %v, want ChangedError", err)
	}
	if err := s.Refresh(ctx, key, readerB, 10*time.Second); err != nil {
		t.Fatalf("the next group's reader after the refused force unlock: %v", err)
	}
}

// A read's fence is at least the last write's also when Redis lost the fence counter (a restart
// from an old snapshot): it is minted from the clock, as a write's is, and the next write's is
// above it.
func TestReadFenceFollowsTheLastWriteAfterTheCounterIsLost(t *testing.T) {
	b := realBackend(t)
	ctx := context.Background()
	s, key := b.store, "lock:k"
	w, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerA, TTL: 10 * time.Second})
	if err != nil || !w.Acquired {
		t.Fatal(w, err)
	}
	if _, err := s.Release(ctx, key, ownerA, "", 0); err != nil {
		t.Fatal(err)
	}
	b.client.Del(ctx, lockstore.FenceKey(key)) // the counter's last writes are lost
	r, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: readerA, TTL: 10 * time.Second})
	if err != nil || r.Fence < w.Fence {
		t.Fatalf("a read after the write with fence %d and a lost counter: %+v %v", w.Fence, r, err)
	}
	if _, err := s.Release(ctx, key, readerA, "", 0); err != nil {
		t.Fatal(err)
	}
	w2, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerB, TTL: 10 * time.Second})
	if err != nil || w2.Fence <= r.Fence {
		t.Fatalf("the write after the read with fence %d: %+v %v", r.Fence, w2, err)
	}
}

// A server clock that steps back (an NTP step, a restored VM) keeps the line in order: the
// waiters in line before the step still go before those who ask after it, and a place whose
// owner stopped asking before the step is dropped once its time is up, not the step later;
// also when the line waited longer than the step (its newest place then shows no step).
func TestFairLineKeepsItsOrderWhenTheServersClockStepsBack(t *testing.T) {
	for _, tc := range []struct{ step, waited time.Duration }{{time.Hour, 0}, {10 * time.Second, 20 * time.Second}} {
		t.Run(fmt.Sprintf("%v back after %v in line", tc.step, tc.waited), func(t *testing.T) {
			mr := miniredis.RunT(t)
			c := redis.NewClient(&redis.Options{Addr: mr.Addr(), Protocol: 2, DisableIdentity: true, ContextTimeoutEnabled: true})
			s := New(c)
			t.Cleanup(func() { _ = s.Close(); _ = c.Close() })
			ctx, key, ttl, queue := context.Background(), "lock:stepped", time.Hour, 2*time.Second
			start := time.Now()
			mr.SetTime(start)
			ask := func(owner string) lockstore.Acquisition {
				t.Helper()
				got, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: owner, TTL: ttl, Asked: start, Queue: queue})
				if err != nil {
					t.Fatal(err)
				}
				return got
			}
			if got := ask("holder"); !got.Acquired {
				t.Fatalf("holder: %+v", got)
			}
			for d := time.Duration(0); d <= tc.waited; d += queue / 4 { // both look every FairLookEvery
				mr.SetTime(start.Add(d))
				ask("0dead") // ahead of A (the same ask, a token that sorts first), then never asks again
				ask(ownerA)  // asks on
			}
			after := start.Add(tc.waited - tc.step)
			mr.SetTime(after) // the server's clock steps back
			ask(ownerB)       // asks after the step (its own clock did not step)
			if _, err := s.Release(ctx, key, "holder", "", 0); err != nil {
				t.Fatal(err)
			}
			if got := ask(ownerB); got.Acquired {
				t.Fatal("a waiter that asked after the server's clock stepped back went before the line")
			}
			mr.SetTime(after.Add(queue / 2)) // the live waiters look again; the dead one does not
			ask(ownerA)
			ask(ownerB)
			mr.SetTime(after.Add(queue + 100*time.Millisecond)) // the dead one's time is up
			if got := ask(ownerA); !got.Acquired {
				line := c.ZRangeWithScores(ctx, lineKey(key), 0, -1).Val()
				t.Fatalf("the first live waiter in line was refused once the dead one's time was up: %+v, line %v", got, line)
			}
		})
	}
}

// An operator's unlock of a read lock ends every read hold of that group: a reader of it is
// not held again when another group of readers takes the key after it.
func TestForceUnlockOfReadersEndsTheirHolds(t *testing.T) {
	ctx := context.Background()
	s, in, seen := readerSeenByAnOperator(t)
	key := "lock:k"
	if _, err := in.ForceUnlock(ctx, seen); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Millisecond) // a new group, in another microsecond
	if next, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: readerB, TTL: 10 * time.Second}); err != nil || !next.Acquired {
		t.Fatal(next, err)
	}
	if err := s.Refresh(ctx, key, readerA, 10*time.Second); !errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("a reader whose lock an operator removed, refreshed once another group reads: %v, want ErrNotHeld", err)
	}
}

// readerSeenByAnOperator is a store on which readerA reads "lock:k", and what an operator's
// inspector saw of it.
func readerSeenByAnOperator(t *testing.T) (*RedisStore, *RedisInspector, lockstore.LockInfo) {
	t.Helper()
	b := miniBackend(t)
	ctx := context.Background()
	if _, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:k", Owner: readerA, TTL: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	in := NewInspector(b.client, "lock:")
	seen, err := in.Lookup(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	return b.store, in, seen
}
