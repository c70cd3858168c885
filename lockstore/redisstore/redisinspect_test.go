package redisstore

import (
	"cmp"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/lockstore"
)

// inspected is a store and its inspector on one miniredis, with the prefix "lock:".
func inspected(t *testing.T) (*RedisStore, *RedisInspector, *redis.Client) {
	t.Helper()
	mr := miniredis.RunT(t)
	// RESP2: miniredis delivers pub/sub messages with it (DESIGN.md, known pitfalls).
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), Protocol: 2, DisableIdentity: true})
	s := New(c)
	t.Cleanup(func() { _ = s.Close(); _ = c.Close() })
	return s, NewInspector(c, "lock:"), c
}

// TestParseLock reads the values the scripts write, and refuses what they do not write.
func TestParseLock(t *testing.T) {
	var l lockstore.LockInfo
	parseLock(&l, "0123abcd 1764000000000001 1,r1,r2 host=h pid=42 trace=t1 extra ~")
	if l.Owner != "0123abcd" || l.Fence != 1764000000000001 || !l.Own || strings.Join(l.Borrowed, ",") != "r1,r2" ||
		l.Host != "h" || l.Pid != "42" || l.Trace != "t1" || l.Metadata != "extra" || !l.Contended || l.Unrecognized != "" {
		t.Errorf("parsed %+v", l)
	}
	l = lockstore.LockInfo{}
	parseLock(&l, "o 7 0 ~")
	if l.Own || !l.Contended || l.Fence != 7 || l.Metadata != "" {
		t.Errorf("parsed %+v", l)
	}
	for _, v := range []string{"", "just-a-value", "o notanumber 1", "o 5 7", " 5 1"} {
		l = lockstore.LockInfo{}
		want := cmp.Or(v, lockstore.EmptyValue) // an empty Unrecognized would be a lock
		if parseLock(&l, v); l.Unrecognized != want {
			t.Errorf("%q read as a lock: %+v", v, l)
		}
	}
}

// TestInspectorReadsWhatTheStoreWrote: List and Lookup give the owner, fence, TTL, holder
// metadata, contention and waiters of locks a RedisStore holds; the pattern, Skip and Limit
// choose them.
func TestInspectorReadsWhatTheStoreWrote(t *testing.T) {
	s, in, _ := inspected(t)
	ctx := context.Background()
	const owner = "ownerAAAAAAAAAAAAAAAAA"
	a, err := s.Acquire(ctx, lockstore.Request{Key: "lock:order:1", Owner: owner, TTL: time.Minute, Meta: "host=h1 pid=42 trace=t zone=eu"})
	if err != nil || !a.Acquired {
		t.Fatalf("acquire: %+v %v", a, err)
	}
	if b, err := s.Acquire(ctx, lockstore.Request{Key: "lock:order:1", Owner: "ownerBBBBBBBBBBBBBBBBBB", TTL: time.Minute}); err != nil || b.Acquired {
		t.Fatalf("second owner: %+v %v", b, err) // refused: the lock is marked contended
	}
	w, err := s.Watch(ctx, "lock:order:1") // a waiter of this process, subscribed to its release
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, k := range []string{"lock:order:2", "lock:shadow:order:3", "lock:acct:1"} {
		if _, err := s.Acquire(ctx, lockstore.Request{Key: k, Owner: owner, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}

	locks, more, err := in.List(ctx, "order:*", lockstore.ListOptions{})
	if err != nil || more != 0 || len(locks) != 2 {
		t.Fatalf("List order:*: %d locks, %d more, %v; want order:1 and order:2", len(locks), more, err)
	}
	l := locks[0]
	switch {
	case l.Key != "order:1" || l.StoreKey != "lock:order:1" || l.Owner != owner || l.Fence != a.Fence:
		t.Errorf("lock %+v, want order:1 of %s with fence %d", l, owner, a.Fence)
	case !l.Own || len(l.Borrowed) != 0 || l.TTL <= 0 || l.TTL > time.Minute:
		t.Errorf("holds %v %v ttl %v, want the own hold and a TTL within a minute", l.Own, l.Borrowed, l.TTL)
	case l.Host != "h1" || l.Pid != "42" || l.Trace != "t" || l.Metadata != "zone=eu":
		t.Errorf("holder %q %q %q %q", l.Host, l.Pid, l.Trace, l.Metadata)
	case !l.Contended || l.Waiters != 1:
		t.Errorf("contended %v waiters %d, want true and 1", l.Contended, l.Waiters)
	}

	skipShadow := func(k string) bool { return strings.HasPrefix(k, "shadow:") }
	if locks, more, err = in.List(ctx, "*", lockstore.ListOptions{Limit: 2, Skip: skipShadow}); err != nil || more != 1 ||
		len(locks) != 2 || locks[0].Key != "acct:1" || locks[1].Key != "order:1" {
		t.Errorf("List * limit 2 without shadow: %+v, %d more, %v; want acct:1, order:1 and 1 more", locks, more, err)
	}

	shown, err := in.Lookup(ctx, "order:1")
	if err != nil || shown.FenceCounterKey != lockstore.FenceKey("lock:order:1") || shown.FenceCounter == nil || *shown.FenceCounter < a.Fence {
		t.Errorf("Lookup: %+v, %v; want the slot's fence counter at or above %d", shown, err, a.Fence)
	}
	if _, err := in.Lookup(ctx, "order:9"); !errors.Is(err, lockstore.ErrNotHeld) {
		t.Errorf("Lookup of a free key: %v, want lockstore.ErrNotHeld", err)
	}
}

// TestListShowsAForeignKeyBesideTheLocks: a key under the prefix that is not a string (a hash
// someone keeps there) is listed as not a lock, and does not hide the locks, even when its read
// comes first in the pipeline (Pipelined reports the first command's error).
func TestListShowsAForeignKeyBesideTheLocks(t *testing.T) {
	s, in, c := inspected(t)
	ctx := context.Background()
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:order:1", Owner: "ownerAAAAAAAAAAAAAAAAA", TTL: time.Minute, Meta: "host=h pid=1"}); err != nil {
		t.Fatal(err)
	}
	if err := c.HSet(ctx, "lock:a-hash", "f", "v").Err(); err != nil { // sorted before order:1
		t.Fatal(err)
	}
	if err := c.Set(ctx, "lock:a-string", "not a lock", 0).Err(); err != nil {
		t.Fatal(err)
	}
	locks, _, err := in.List(ctx, "*", lockstore.ListOptions{})
	if err != nil || len(locks) != 3 {
		t.Fatalf("List: %+v, %v; want the hash, the string and order:1", locks, err)
	}
	if !strings.Contains(locks[0].Unrecognized, "WRONGTYPE") || locks[1].Unrecognized != "not a lock" || locks[1].TTL != lockstore.NoTTL ||
		locks[2].Key != "order:1" || locks[2].Unrecognized != "" {
		t.Errorf("List: %+v", locks)
	}
}

// TestForceUnlockRemovesOnlyTheGrantItRead: a lock that changed hands or was released since
// it was read is not removed; the grant that was read is, whatever its holds, and its waiters
// are woken.
func TestForceUnlockRemovesOnlyTheGrantItRead(t *testing.T) {
	s, in, c := inspected(t)
	ctx := context.Background()
	const first, second = "ownerAAAAAAAAAAAAAAAAA", "ownerBBBBBBBBBBBBBBBBBB"
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:k", Owner: first, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	read, err := in.Lookup(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, "lock:k", first, "", 0); err != nil {
		t.Fatal(err)
	}
	var changed *lockstore.ChangedError
	if _, err := in.ForceUnlock(ctx, read); !errors.As(err, &changed) || changed.Now != nil {
		t.Fatalf("ForceUnlock of a released lock: %v, want a lockstore.ChangedError with nothing now", err)
	}
	next, err := s.Acquire(ctx, lockstore.Request{Key: "lock:k", Owner: second, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.ForceUnlock(ctx, read); !errors.As(err, &changed) || changed.Now == nil ||
		changed.Now.Owner != second || changed.Now.Fence != next.Fence {
		t.Fatalf("ForceUnlock of a lock that changed hands: %v, want a lockstore.ChangedError naming %s", err, second)
	}
	if c.Exists(ctx, "lock:k").Val() != 1 {
		t.Fatal("the second holder's lock was removed")
	}

	// The second grant, read, then re-entered from another process: still the grant read.
	read, err = in.Lookup(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reenter(ctx, "lock:k", second, "r1", time.Minute); err != nil {
		t.Fatal(err)
	}
	w, err := s.Watch(ctx, "lock:k")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	notified, err := in.ForceUnlock(ctx, read)
	if err != nil || notified != 1 {
		t.Fatalf("ForceUnlock: %d notified, %v; want 1 (this process's waiter)", notified, err)
	}
	select {
	case <-w.C():
	case <-time.After(5 * time.Second):
		t.Error("the waiter was not woken")
	}
	if c.Exists(ctx, "lock:k").Val() != 0 {
		t.Error("the lock is still there")
	}
}

// TestForceUnlockSucceedsWithoutChannelPermission: an operator's force unlock by a user that may
// not publish to the release channel removes the lock and says so, with nobody woken; the
// waiter gets the lock at its next look.
func TestForceUnlockSucceedsWithoutChannelPermission(t *testing.T) {
	b := channellessBackend(t)
	ctx := context.Background()
	in := NewInspector(b.store.client.(redis.UniversalClient), "lock:")
	if _, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:k", Owner: ownerA, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if got, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:k", Owner: ownerB, TTL: time.Minute}); err != nil || got.Acquired {
		t.Fatalf("a waiter: %+v %v, want busy", got, err)
	}
	read, err := in.Lookup(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if n, err := in.ForceUnlock(ctx, read); err != nil || n != 0 {
		t.Fatalf("ForceUnlock without channel permission = %d, %v; want 0 notified and no error (the key is "+
			"deleted before the PUBLISH)", n, err)
	}
	if b.client.Exists(ctx, "lock:k").Val() != 0 {
		t.Fatal("the lock is still there")
	}
	if _, err := b.store.Release(ctx, "lock:k", ownerA, "", 0); !errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("the former holder's release: %v, want lockstore.ErrNotHeld", err)
	}
	if got, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:k", Owner: ownerB, TTL: time.Minute}); err != nil || !got.Acquired {
		t.Fatalf("the waiter's next look: %+v %v, want the lock", got, err)
	}
}

// TestWatchByPollingReportsEachChange: on a server without keyspace notifications (miniredis
// has no CONFIG), a watch reads the locks held, then reports an acquisition, a contention, a
// re-entry that comes and goes, and the release of a contended lock (heard on its release channel), and the
// release of an uncontended one at the next read (gone); keys it skips never.
func TestWatchByPollingReportsEachChange(t *testing.T) {
	s, in, _ := inspected(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const owner, other = "ownerAAAAAAAAAAAAAAAAA", "ownerBBBBBBBBBBBBBBBBBB"
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:order:0", Owner: owner, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		events []string
		mode   string
	)
	add := func(e lockstore.Event) {
		mu.Lock()
		defer mu.Unlock()
		switch e.Kind {
		case lockstore.EventRead:
		case lockstore.EventWatching:
			mode = e.Mode
			events = append(events, "watching "+strings.Repeat("x", len(e.Locks)))
		default:
			events = append(events, string(e.Kind)+" "+e.Lock.Key)
		}
	}
	seen := func(n int) func() bool {
		return func() bool { mu.Lock(); defer mu.Unlock(); return len(events) >= n }
	}
	done := make(chan error, 1)
	opts := lockstore.WatchOptions{Interval: 20 * time.Millisecond, Skip: func(k string) bool { return strings.HasPrefix(k, "shadow:") }}
	go func() { done <- in.Watch(ctx, "*", opts, add) }()
	waitUntil(t, seen(1))

	step := func(n int, do func() error) {
		t.Helper()
		if err := do(); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, seen(n))
	}
	step(2, func() error {
		_, err := s.Acquire(ctx, lockstore.Request{Key: "lock:order:1", Owner: owner, TTL: time.Minute})
		return err
	})
	step(3, func() error {
		_, err := s.Acquire(ctx, lockstore.Request{Key: "lock:order:1", Owner: other, TTL: time.Minute})
		return err
	})
	step(4, func() error { _, err := s.Reenter(ctx, "lock:order:1", owner, "r1", time.Minute); return err })
	step(5, func() error { _, err := s.Release(ctx, "lock:order:1", owner, "r1", 0); return err })
	step(6, func() error { _, err := s.Release(ctx, "lock:order:0", owner, "", 0); return err })
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:shadow:order:2", Owner: owner, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	step(7, func() error { _, err := s.Release(ctx, "lock:order:1", owner, "", 0); return err })
	time.Sleep(60 * time.Millisecond) // reads that find nothing more to report
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Watch: %v", err)
	}
	// The last release notifies a waiter: it is reported as released when the notification
	// comes first, or as gone when a poll finds the key gone first; once either way.
	want := "watching x,acquired order:1,contended order:1,changed order:1,changed order:1,gone order:0,"
	mu.Lock()
	defer mu.Unlock()
	got := strings.Join(events, ",")
	if (got != want+"released order:1" && got != want+"gone order:1") || mode != "polling every 20ms" {
		t.Errorf("events %s (mode %q)\nwant   %s{released,gone} order:1 (polling every 20ms)", got, mode, want)
	}
}

// waitUntil polls cond for up to five seconds.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
	}
}

// A polling watch reports each release once: a poll that finds a key gone reports it gone, and
// the release notification that arrives after that poll is the same release, not a second
// event; a notification of a key no poll saw go is reported as released.
func TestPolledReleaseIsReportedOnce(t *testing.T) {
	s, in, _ := inspected(t)
	ctx := context.Background()
	const owner = "ownerAAAAAAAAAAAAAAAAA"
	var events []string
	w := &redisWatch{r: in, pattern: "*", opts: lockstore.WatchOptions{Timeout: time.Second}, gone: make(map[string]int), fn: func(e lockstore.Event) {
		events = append(events, string(e.Kind)+" "+e.Lock.Key)
	}}
	for _, k := range []string{"lock:order:1", "lock:order:2"} {
		if _, err := s.Acquire(ctx, lockstore.Request{Key: k, Owner: owner, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.poll(ctx); err != nil { // the first read
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, "lock:order:1", owner, "", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := w.poll(ctx); err != nil { // the poll comes first: gone
		t.Fatal(err)
	}
	if err := w.notified(ctx, &redis.Message{Channel: DefaultChannelPrefix + "lock:order:1"}); err != nil {
		t.Fatal(err)
	}
	// The notification comes first: released, and the poll has nothing more to say.
	if _, err := s.Release(ctx, "lock:order:2", owner, "", 0); err != nil {
		t.Fatal(err)
	}
	if err := w.notified(ctx, &redis.Message{Channel: DefaultChannelPrefix + "lock:order:2"}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.poll(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(events, ","), "gone order:1,released order:2"; got != want {
		t.Fatalf("events %s, want %s", got, want)
	}
}
