package redisstore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/internal/testenv/poll"
	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/lockstore"
)

// backend is a Redis the store suite runs against: miniredis (fast, clock under the test's
// control) or a real redis-server.
type backend struct {
	store   *RedisStore
	client  *redis.Client
	advance func(time.Duration) // moves time forward by at least d
}

func miniBackend(t *testing.T) backend {
	mr := miniredis.RunT(t)
	// RESP2: miniredis delivers pub/sub messages with it (DESIGN.md, known pitfalls).
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), Protocol: 2, DisableIdentity: true, ContextTimeoutEnabled: true})
	s := New(c)
	t.Cleanup(func() { _ = s.Close(); _ = c.Close() })
	return backend{store: s, client: c, advance: mr.FastForward}
}

func realBackend(t *testing.T) backend {
	srv := redistest.Start(t)
	c := srv.Client()
	s := New(c)
	t.Cleanup(func() { _ = s.Close() })
	return backend{store: s, client: c, advance: func(d time.Duration) { time.Sleep(d + 5*time.Millisecond) }}
}

// channellessBackend is a real redis-server whose store runs as a user with every key and
// command but no channel (Redis 7's default for a new ACL user, acl-pubsub-default
// resetchannels): its PUBLISHes and SUBSCRIBEs are refused with NOPERM. client is the default
// user's, to look at the keys.
func channellessBackend(t *testing.T) backend {
	srv := redistest.Start(t)
	admin := srv.Client()
	if err := admin.Do(context.Background(), "ACL", "SETUSER", "nochannels", "on", ">pw", "~*", "+@all", "resetchannels").Err(); err != nil {
		t.Fatal(err)
	}
	opts := srv.Options()
	opts.Username, opts.Password = "nochannels", "pw"
	c := redis.NewClient(opts)
	s := New(c)
	t.Cleanup(func() { _ = s.Close(); _ = c.Close() })
	return backend{store: s, client: admin, advance: func(d time.Duration) { time.Sleep(d + 5*time.Millisecond) }}
}

var backends = []struct {
	name string
	make func(*testing.T) backend
}{
	{"miniredis", miniBackend},
	{"redis-server", realBackend},
}

func forEachBackend(t *testing.T, fn func(t *testing.T, b backend)) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) { fn(t, be.make(t)) })
	}
}

const (
	ownerA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	ownerB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

func TestAcquireReentryAndBusy(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		got, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:k", Owner: ownerA, TTL: time.Second, Meta: "host=h pid=1"})
		if err != nil || !got.Acquired || got.Reentered || got.Fence <= 0 {
			t.Fatalf("first acquire = %+v, %v; want acquired with a fence", got, err)
		}
		// The value carries the owner, the fence and the metadata for operators.
		if v := b.client.Get(ctx, "lock:k").Val(); v != ownerA+" "+strconv.FormatInt(got.Fence, 10)+" 1 host=h pid=1" {
			t.Fatalf("stored value %q", v)
		}
		again, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:k", Owner: ownerA, TTL: 5 * time.Second})
		if err != nil || !again.Acquired || !again.Reentered || again.Fence != got.Fence {
			t.Fatalf("re-entry = %+v, %v; want reentered with fence %d", again, err, got.Fence)
		}
		if ttl := b.client.PTTL(ctx, "lock:k").Val(); ttl <= time.Second {
			t.Fatalf("re-entry with a longer TTL left PTTL %v", ttl)
		}
		// Re-entry never shortens a lock.
		if _, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:k", Owner: ownerA, TTL: 100 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		if ttl := b.client.PTTL(ctx, "lock:k").Val(); ttl <= time.Second {
			t.Fatalf("re-entry with a shorter TTL shortened PTTL to %v", ttl)
		}
		busy, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:k", Owner: ownerB, TTL: time.Second})
		if err != nil || busy.Acquired || busy.HolderTTL <= time.Second || busy.HolderTTL > 5*time.Second {
			t.Fatalf("other owner = %+v, %v; want busy with the holder's TTL", busy, err)
		}
		// An owner that is a prefix of the holder's value must not pass the owner check.
		if res, _ := b.store.Acquire(ctx, lockstore.Request{Key: "lock:k", Owner: ownerA[:8], TTL: time.Second}); res.Acquired {
			t.Fatal("prefix of the owner token re-entered the lock")
		}
	})
}

func TestFencesStrictlyIncrease(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		var last int64
		for i := 0; i < 50; i++ {
			owner := ownerA
			if i%2 == 1 {
				owner = ownerB
			}
			got, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:f", Owner: owner, TTL: time.Second})
			if err != nil || !got.Acquired {
				t.Fatalf("acquire %d: %+v %v", i, got, err)
			}
			if got.Fence <= last {
				t.Fatalf("fence %d after %d: not increasing", got.Fence, last)
			}
			last = got.Fence
			if _, err := b.store.Release(ctx, "lock:f", owner, "", 0); err != nil {
				t.Fatal(err)
			}
		}
		// The counter is counted on, not undercut, even far ahead of server time (a clock
		// that stepped back).
		ahead := last + int64(time.Hour/time.Microsecond)
		b.client.Set(ctx, lockstore.FenceKey("lock:f"), ahead, 0)
		got, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:f", Owner: ownerA, TTL: time.Second})
		if err != nil || got.Fence != ahead+1 {
			t.Fatalf("fence after a clock step back = %d (%v), want %d", got.Fence, err, ahead+1)
		}
		// Re-entry reports the fence of the holding, although the counter moved on.
		b.client.Set(ctx, lockstore.FenceKey("lock:f"), ahead+100, 0)
		if again, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:f", Owner: ownerA, TTL: time.Second}); err != nil || !again.Reentered || again.Fence != got.Fence {
			t.Fatalf("re-entry = %+v, %v; want fence %d", again, err, got.Fence)
		}
		if _, err := b.store.Release(ctx, "lock:f", ownerA, "", 0); err != nil {
			t.Fatal(err)
		}
		// A counter that was lost (eviction, FLUSHDB) restarts from server time, which is above
		// every fence counted from an earlier seed.
		before, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:g", Owner: ownerA, TTL: time.Second})
		if err != nil || !before.Acquired {
			t.Fatalf("acquire: %+v %v", before, err)
		}
		if _, err := b.store.Release(ctx, "lock:g", ownerA, "", 0); err != nil {
			t.Fatal(err)
		}
		b.client.Del(ctx, lockstore.FenceKey("lock:g"))
		after, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:g", Owner: ownerB, TTL: time.Second})
		if err != nil || after.Fence <= before.Fence {
			t.Fatalf("fence after the counter was lost = %d (%v), the one before was %d", after.Fence, err, before.Fence)
		}
	})
}

// Locks expire; fence counters do not, but there is one per hash slot in use, so locking any
// number of distinct keys leaves at most 16,384 of them behind.
func TestLocksExpireAndFenceCountersStayBounded(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		if _, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:e", Owner: ownerA, TTL: 200 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		if ttl := b.client.PTTL(ctx, "lock:e").Val(); ttl <= 0 {
			t.Fatalf("lock has no expiry (PTTL %v): a lock must never be immortal", ttl)
		}
		b.advance(300 * time.Millisecond)
		got, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:e", Owner: ownerB, TTL: time.Second})
		if err != nil || !got.Acquired {
			t.Fatalf("expired lock not free: %+v %v", got, err)
		}
		if _, err := b.store.Release(ctx, "lock:e", ownerB, "", 0); err != nil {
			t.Fatal(err)
		}
		slots := map[uint16]bool{lockstore.KeySlot("lock:e"): true}
		for i := range 3000 {
			k := "lock:many:" + strconv.Itoa(i)
			slots[lockstore.KeySlot(k)] = true
			if _, err := b.store.Acquire(ctx, lockstore.Request{Key: k, Owner: ownerA, TTL: time.Second}); err != nil {
				t.Fatal(err)
			}
			if _, err := b.store.Release(ctx, k, ownerA, "", 0); err != nil {
				t.Fatal(err)
			}
		}
		keys := b.client.Keys(ctx, "*").Val()
		if len(keys) != len(slots) {
			t.Fatalf("%d keys left after 3001 distinct locks, want one fence counter per slot (%d)", len(keys), len(slots))
		}
		for _, k := range keys {
			if !strings.HasPrefix(k, lockstore.FenceKeyPrefix) {
				t.Fatalf("key %q left behind", k)
			}
		}
	})
}

func TestRefreshAndReleaseAreOwnerChecked(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		if _, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:o", Owner: ownerA, TTL: time.Second, Meta: "meta"}); err != nil {
			t.Fatal(err)
		}
		if err := b.store.Refresh(ctx, "lock:o", ownerB, time.Minute); !errors.Is(err, lockstore.ErrNotHeld) {
			t.Fatalf("refresh by another owner: %v, want lockstore.ErrNotHeld", err)
		}
		if _, err := b.store.Release(ctx, "lock:o", ownerB, "", 0); !errors.Is(err, lockstore.ErrNotHeld) {
			t.Fatalf("release by another owner: %v, want lockstore.ErrNotHeld", err)
		}
		if !strings.HasPrefix(b.client.Get(ctx, "lock:o").Val(), ownerA+" ") {
			t.Fatal("another owner's refresh or release changed the lock")
		}
		if err := b.store.Refresh(ctx, "lock:o", ownerA, time.Minute); err != nil {
			t.Fatalf("refresh by the owner: %v", err)
		}
		if ttl, err := b.store.TTL(ctx, "lock:o"); err != nil || ttl <= time.Second {
			t.Fatalf("TTL after refresh = %v, %v", ttl, err)
		}
		if _, err := b.store.Release(ctx, "lock:o", ownerA, "", 0); err != nil {
			t.Fatalf("release by the owner: %v", err)
		}
		// A stale second release must not free the next owner's lock.
		if _, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:o", Owner: ownerB, TTL: time.Second}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.store.Release(ctx, "lock:o", ownerA, "", 0); !errors.Is(err, lockstore.ErrNotHeld) {
			t.Fatalf("stale release: %v, want lockstore.ErrNotHeld", err)
		}
		if v := b.client.Get(ctx, "lock:o").Val(); !strings.HasPrefix(v, ownerB+" ") {
			t.Fatalf("stale release touched the next owner's lock: value %q", v)
		}
		if _, err := b.store.TTL(ctx, "lock:none"); !errors.Is(err, lockstore.ErrNotHeld) {
			t.Fatalf("TTL of a free key: %v, want lockstore.ErrNotHeld", err)
		}
	})
}

func TestReleaseNotifiesWatchers(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		w, err := b.store.Watch(ctx, "lock:n")
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()

		// An uncontended release publishes nothing.
		if _, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:n", Owner: ownerA, TTL: time.Second}); err != nil {
			t.Fatal(err)
		}
		if n, err := b.store.Release(ctx, "lock:n", ownerA, "", 0); err != nil || n != 0 {
			t.Fatalf("uncontended release = %d, %v; want 0 notified", n, err)
		}

		// A refused acquirer marks the lock; its release then notifies. The subscription is
		// asynchronous: repeat, boundedly, until the watcher hears one.
		for {
			held, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:n", Owner: ownerA, TTL: time.Second, Meta: "host=h"})
			if err != nil {
				t.Fatal(err)
			}
			busy, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:n", Owner: ownerB, TTL: time.Second})
			if err != nil || busy.Acquired {
				t.Fatalf("second owner: %+v %v", busy, err)
			}
			if v := b.client.Get(ctx, "lock:n").Val(); v != ownerA+" "+strconv.FormatInt(held.Fence, 10)+" 1 host=h ~" {
				t.Fatalf("value after a refused acquire = %q, want the waiters mark", v)
			}
			// The mark changes neither the owner check nor the TTL.
			if err := b.store.Refresh(ctx, "lock:n", ownerA, time.Second); err != nil {
				t.Fatal(err)
			}
			n, err := b.store.Release(ctx, "lock:n", ownerA, "", 0)
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-w.C():
				if n < 1 {
					t.Fatalf("release reported %d listeners yet delivered", n)
				}
				return
			case <-time.After(50 * time.Millisecond):
			case <-ctx.Done():
				t.Fatal("no release notification within 5s")
			}
		}
	})
}

// A release of a contended lock (and a pass, which releases a contended lock) by a user that
// may not publish to the release channel succeeds: the key is deleted whatever the PUBLISH
// after it does, so the release reports success with nobody notified, and the waiter, who
// heard nothing, gets the lock at its next look.
func TestContendedReleaseSucceedsWithoutChannelPermission(t *testing.T) {
	b := channellessBackend(t)
	ctx := context.Background()
	for _, pass := range []bool{false, true} {
		key := "lock:release"
		if pass {
			key = "lock:pass"
		}
		if got, err := b.store.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerA, TTL: 10 * time.Second}); err != nil || !got.Acquired {
			t.Fatalf("%s: first owner: %+v %v", key, got, err)
		}
		if got, err := b.store.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerB, TTL: 10 * time.Second}); err != nil || got.Acquired {
			t.Fatalf("%s: second owner: %+v %v, want busy (the lock is marked)", key, got, err)
		}
		short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		w, err := b.store.Watch(short, key) // its SUBSCRIBE is refused: a fresh watch that hears nothing
		cancel()
		if err != nil {
			t.Fatalf("%s: the waiter's watch: %v", key, err)
		}
		var n int
		if pass {
			var kept bool
			kept, _, n, err = b.store.Pass(ctx, key, ownerA, 10*time.Second, 0)
			if kept {
				t.Fatalf("%s: a pass of a contended lock kept it", key)
			}
		} else {
			n, err = b.store.Release(ctx, key, ownerA, "", 0)
		}
		w.Close()
		if err != nil || n != 0 {
			t.Fatalf("%s: release of a contended lock without channel permission = %d, %v; want 0 notified and "+
				"no error (the key is deleted before the PUBLISH)", key, n, err)
		}
		if b.client.Exists(ctx, key).Val() != 0 {
			t.Fatalf("%s: the released lock is still there", key)
		}
		if _, err := b.store.Release(ctx, key, ownerA, "", 0); !errors.Is(err, lockstore.ErrNotHeld) {
			t.Fatalf("%s: a second release: %v, want lockstore.ErrNotHeld", key, err)
		}
		if got, err := b.store.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerB, TTL: 10 * time.Second}); err != nil || !got.Acquired {
			t.Fatalf("%s: the waiter's next look: %+v %v, want the lock", key, got, err)
		}
	}
}

func TestMetadataCannotFakeTheWaitersMark(t *testing.T) {
	b := miniBackend(t)
	ctx := context.Background()
	got, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:m", Owner: ownerA, TTL: time.Second, Meta: "req=1 ~"})
	if err != nil {
		t.Fatal(err)
	}
	if v := b.client.Get(ctx, "lock:m").Val(); v != ownerA+" "+strconv.FormatInt(got.Fence, 10)+" 1 req=1" {
		t.Fatalf("stored %q", v)
	}
	if n, err := b.store.Release(ctx, "lock:m", ownerA, "", 0); err != nil || n != 0 {
		t.Fatalf("release = %d, %v", n, err)
	}
}

func TestWatchLingerAndClose(t *testing.T) {
	b := miniBackend(t)
	ctx := context.Background()
	s := New(b.client, WithWatchLinger(10*time.Millisecond))
	w1, err := s.Watch(ctx, "lock:x")
	if err != nil {
		t.Fatal(err)
	}
	w2, err := s.Watch(ctx, "lock:x")
	if err != nil {
		t.Fatal(err)
	}
	w1.Close()
	w1.Close() // idempotent
	w2.Close()
	waitUnsubscribed(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Watch(ctx, "lock:x"); err == nil {
		t.Fatal("Watch on a closed store succeeded")
	}
	var nilWatch *lockstore.Watch
	nilWatch.Close()
	if nilWatch.C() != nil {
		t.Fatal("nil lockstore.Watch has a channel")
	}
}

// waitUnsubscribed waits until s subscribes no channel any more (their lingers ran out).
func waitUnsubscribed(t *testing.T, s *RedisStore) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		s.notify.mu.Lock()
		n := len(s.notify.channels)
		s.notify.mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d channels still subscribed after the linger", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestBadArguments(t *testing.T) {
	b := miniBackend(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name, key, owner string
		ttl              time.Duration
	}{
		{"empty key", "", ownerA, time.Second},
		{"empty owner", "k", "", time.Second},
		{"owner with space", "k", "a b", time.Second},
		{"zero ttl", "k", ownerA, 0},
		{"negative ttl", "k", ownerA, -time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := b.store.Acquire(ctx, lockstore.Request{Key: tc.key, Owner: tc.owner, TTL: tc.ttl}); err == nil {
				t.Fatal("Acquire accepted it")
			}
			if err := b.store.Refresh(ctx, tc.key, tc.owner, tc.ttl); err == nil {
				t.Fatal("Refresh accepted it")
			}
		})
	}
	if n := b.client.DBSize(ctx).Val(); n != 0 {
		t.Fatalf("bad arguments wrote %d keys", n)
	}
}

func TestOddKeys(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		for _, key := range []string{"a\nb", "\x00\xff\x01", "ключ:🔒", "a}b", "{tag}x", "{}", strings.Repeat("k", lockstore.MaxKeyLen)} {
			got, err := b.store.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerA, TTL: time.Second})
			if err != nil || !got.Acquired {
				t.Fatalf("acquire %q: %+v %v", key, got, err)
			}
			if ttl := b.client.PTTL(ctx, key).Val(); ttl <= 0 {
				t.Fatalf("%q written without expiry", key)
			}
			if _, err := b.store.Release(ctx, key, ownerA, "", 0); err != nil {
				t.Fatalf("release %q: %v", key, err)
			}
		}
	})
}

func TestStoreDown(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), Protocol: 2, DisableIdentity: true, ContextTimeoutEnabled: true, MaxRetries: -1})
	s := New(c)
	t.Cleanup(func() { _ = s.Close(); _ = c.Close() })
	mr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:d", Owner: ownerA, TTL: time.Second}); err == nil || errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("acquire on a stopped Redis: %v, want a store error", err)
	}
	if _, err := s.Release(ctx, "lock:d", ownerA, "", 0); err == nil || errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("release on a stopped Redis: %v, want a store error", err)
	}
	if time.Since(start) > time.Second {
		t.Fatal("calls outlived their context deadline")
	}
	if err := mr.Restart(); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Acquire(context.Background(), lockstore.Request{Key: "lock:d", Owner: ownerA, TTL: time.Second}); err != nil || !got.Acquired {
		t.Fatalf("after restart: %+v %v", got, err)
	}
}

// A reply lost with its connection is answered by go-redis's resend of the script, which
// re-enters what the first send took (holds are named, not counted): the acquire is granted
// once, and one release frees the key. So a lost reply is no unknown outcome on Redis: only a
// Redis out of reach for every resend leaves one, as a crash right after the script would.
func TestReplyLostWithItsConnectionIsAnsweredByTheResend(t *testing.T) {
	mr := miniredis.RunT(t)
	p := redistest.StartProxy(t, mr.Addr())
	c := redis.NewClient(&redis.Options{Addr: p.Addr, Protocol: 2, DisableIdentity: true, ContextTimeoutEnabled: true})
	s := New(c)
	t.Cleanup(func() { _ = s.Close(); _ = c.Close() })
	if err := s.Preload(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p.SetDelay(time.Hour) // the reply is held back until its connection is cut
	type result struct {
		res lockstore.Acquisition
		err error
	}
	out := make(chan result, 1)
	go func() {
		res, err := s.Acquire(ctx, lockstore.Request{Key: "lock:lost", Owner: ownerA, TTL: time.Minute})
		out <- result{res, err}
	}()
	poll.Until(t, 10*time.Second, 5*time.Millisecond, "the script takes the key", func() bool { return mr.Exists("lock:lost") })
	p.SetDelay(0)
	if p.Cut() == 0 {
		t.Fatal("no connection to cut")
	}
	r := <-out
	if r.err != nil || !r.res.Acquired {
		t.Fatalf("acquire whose reply was lost: %+v, %v; want granted by the resend", r.res, r.err)
	}
	if _, err := s.Release(ctx, "lock:lost", ownerA, "", 0); err != nil || mr.Exists("lock:lost") {
		t.Fatalf("one release after a resent acquire: %v, key left: %v", err, mr.Exists("lock:lost"))
	}
}

// Close runs the WithOnClose functions once, last added first, and joins their errors; a nil
// function is ignored.
func TestWithOnClose(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), Protocol: 2, DisableIdentity: true, ContextTimeoutEnabled: true})
	var order []string
	errFirst := errors.New("first")
	s := New(c,
		WithOnClose(func() error { order = append(order, "first"); return errFirst }),
		WithOnClose(nil),
		WithOnClose(func() error { order = append(order, "second"); return c.Close() }),
	)
	if err := s.Close(); !errors.Is(err, errFirst) {
		t.Fatalf("Close: %v, want the first closer's error joined", err)
	}
	if got := strings.Join(order, ","); got != "second,first" {
		t.Fatalf("closers ran in order %q, want second,first", got)
	}
	if err := s.Close(); err != nil || len(order) != 2 {
		t.Fatalf("second Close: %v, closers ran %d times in all, want 2", err, len(order))
	}
}

// A busy acquisition tells who holds the key: the metadata its holder stored, never the
// holder's owner token (a capability: it could release or re-enter the lock).
func TestBusyAcquisitionNamesTheHolder(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		if _, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:who", Owner: ownerA, TTL: time.Second, Meta: "host=h pid=1 trace=t1"}); err != nil {
			t.Fatal(err)
		}
		for range 2 { // the second sees the waiters mark (" ~") too
			busy, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:who", Owner: ownerB, TTL: time.Second})
			if err != nil || busy.Acquired || busy.Holder != "host=h pid=1 trace=t1" {
				t.Fatalf("busy: %+v %v, want the holder's metadata", busy, err)
			}
			if strings.Contains(busy.Holder, ownerA) {
				t.Fatal("the holder's owner token left the store")
			}
		}
		if _, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:bare", Owner: ownerA, TTL: time.Second}); err != nil {
			t.Fatal(err)
		}
		if busy, _ := b.store.Acquire(ctx, lockstore.Request{Key: "lock:bare", Owner: ownerB, TTL: time.Second}); busy.Holder != "" {
			t.Fatalf("a holder without metadata: Holder %q", busy.Holder)
		}
	})
}

// A fence counter that is not a number below 2^53 (a key someone else wrote, of another type
// or with other text) is refused, and acquire.lua leaves both keys as it found them: the lock
// is not taken (a grant with a fence that might repeat one is worse than none) and the
// counter is not overwritten. acquire.lua writes the counter after the grant in one SET ...
// GET, so both refusals undo what the script wrote.
func TestBadFenceCounterIsRefusedAndLeftAlone(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		for _, tc := range []struct {
			name  string
			set   func(fk string) error
			check func(fk string) string // "" when the counter is as it was set
		}{
			{"text", func(fk string) error { return b.client.Set(ctx, fk, "not a fence", 0).Err() },
				func(fk string) string { return strings.TrimPrefix(b.client.Get(ctx, fk).Val(), "not a fence") }},
			{"beyond 2^53", func(fk string) error { return b.client.Set(ctx, fk, "9007199254740993", 0).Err() },
				func(fk string) string { return strings.TrimPrefix(b.client.Get(ctx, fk).Val(), "9007199254740993") }},
			{"a hash", func(fk string) error { return b.client.HSet(ctx, fk, "f", "1").Err() },
				func(fk string) string {
					if typ := b.client.Type(ctx, fk).Val(); typ != "hash" {
						return typ
					}
					return ""
				}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				key := "lock:badcounter:" + tc.name
				fk := lockstore.FenceKey(key)
				b.client.Del(ctx, fk)
				if err := tc.set(fk); err != nil {
					t.Fatal(err)
				}
				got, err := b.store.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerA, TTL: time.Second})
				if err == nil || got.Acquired {
					t.Fatalf("acquire with a bad fence counter = %+v, %v; want an error", got, err)
				}
				if !strings.Contains(err.Error(), fk) {
					t.Fatalf("error %q does not name the counter %s", err, fk)
				}
				if n := b.client.Exists(ctx, key).Val(); n != 0 {
					t.Fatalf("the refused acquire left the lock taken: %q", b.client.Get(ctx, key).Val())
				}
				if diff := tc.check(fk); diff != "" {
					t.Fatalf("the refused acquire changed the counter: %q", diff)
				}
				b.client.Del(ctx, fk)
				if got, err := b.store.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerA, TTL: time.Second}); err != nil || !got.Acquired {
					t.Fatalf("acquire after the counter was removed = %+v, %v", got, err)
				}
			})
		}
	})
}

// release.lua's short path (exactly "<owner> <fence> 1": GET and DEL, no pattern match) must do
// what the general path does, and must not take values that only look like it: metadata that
// ends in " 1", a waiters mark, a re-entry's hold, a release that reports fences handed out
// locally (the counter must be raised).
func TestReleaseShortPathBoundaries(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		// Metadata that ends in " 1" is kept apart from the hold list.
		if _, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:rs1", Owner: ownerA, TTL: time.Minute, Meta: "x 1"}); err != nil {
			t.Fatal(err)
		}
		if n, err := b.store.Release(ctx, "lock:rs1", ownerB, "", 0); !errors.Is(err, lockstore.ErrNotHeld) {
			t.Fatalf("release by another owner = %d, %v", n, err)
		}
		if n, err := b.store.Release(ctx, "lock:rs1", ownerA, "", 0); err != nil || n != 0 {
			t.Fatalf("release = %d, %v", n, err)
		}
		if b.client.Exists(ctx, "lock:rs1").Val() != 0 {
			t.Fatal("lock with metadata not deleted")
		}
		// A marked lock publishes on release (the general path), also without metadata.
		w, err := b.store.Watch(ctx, "lock:rs2")
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		// The subscription is asynchronous: a release published before the server has it is
		// lost (seen on miniredis under load), so wait for it.
		for deadline := time.Now().Add(5 * time.Second); b.client.PubSubNumSub(ctx, DefaultChannelPrefix+"lock:rs2").Val()[DefaultChannelPrefix+"lock:rs2"] == 0; {
			if time.Now().After(deadline) {
				t.Fatal("the watch never subscribed")
			}
			time.Sleep(time.Millisecond)
		}
		if _, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:rs2", Owner: ownerA, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if got, _ := b.store.Acquire(ctx, lockstore.Request{Key: "lock:rs2", Owner: ownerB, TTL: time.Minute}); got.Acquired {
			t.Fatal("busy lock granted")
		}
		if _, err := b.store.Release(ctx, "lock:rs2", ownerA, "", 0); err != nil {
			t.Fatal(err)
		}
		select {
		case <-w.C():
		case <-time.After(5 * time.Second):
			t.Fatal("release of a marked lock published nothing")
		}
		// A re-entry from another process keeps the lock past the acquisition's release.
		if _, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:rs3", Owner: ownerA, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if got, err := b.store.Reenter(ctx, "lock:rs3", ownerA, "h1", time.Minute); err != nil || !got.Acquired {
			t.Fatalf("re-enter = %+v, %v", got, err)
		}
		if n, err := b.store.Release(ctx, "lock:rs3", ownerA, "", 0); err != nil || n != 0 {
			t.Fatalf("release of the acquisition's hold = %d, %v", n, err)
		}
		if b.client.Exists(ctx, "lock:rs3").Val() != 1 {
			t.Fatal("the acquisition's release deleted a lock a re-entry still holds")
		}
		if n, err := b.store.Release(ctx, "lock:rs3", ownerA, "", 0); !errors.Is(err, lockstore.ErrNotHeld) {
			t.Fatalf("second release of the acquisition's hold = %d, %v; want lockstore.ErrNotHeld", n, err)
		}
		if _, err := b.store.Release(ctx, "lock:rs3", ownerA, "h1", 0); err != nil || b.client.Exists(ctx, "lock:rs3").Val() != 0 {
			t.Fatalf("release of the last hold = %v, key left: %d", err, b.client.Exists(ctx, "lock:rs3").Val())
		}
		// A release that reports fences handed out locally raises the counter.
		got, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:rs4", Owner: ownerA, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		used := got.Fence + int64(time.Hour/time.Microsecond)
		if _, err := b.store.Release(ctx, "lock:rs4", ownerA, "", used); err != nil {
			t.Fatal(err)
		}
		if v, _ := b.client.Get(ctx, lockstore.FenceKey("lock:rs4")).Int64(); v != used {
			t.Fatalf("counter after a release that used fence %d = %d", used, v)
		}
		if next, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:rs4", Owner: ownerB, TTL: time.Minute}); err != nil || next.Fence != used+1 {
			t.Fatalf("next grant = %+v, %v; want fence %d", next, err, used+1)
		}
	})
}

// Pass (the end of a turn of a lock whose process has more goroutines waiting for it) keeps an
// unmarked lock that only its acquisition holds, with a fence above every earlier grant, the
// counter and the fences handed out locally; everything else it releases as Release does.
func TestPassKeepsOnlyALockNobodyElseAskedFor(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		// Kept: a new fence above the local ones, the counter raised to it, the metadata and
		// a longer TTL kept (a pass never shortens a lock).
		got, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:p1", Owner: ownerA, TTL: time.Minute, Meta: "req=1"})
		if err != nil || !got.Acquired {
			t.Fatalf("acquire = %+v, %v", got, err)
		}
		local := got.Fence + int64(time.Hour/time.Microsecond) // handoffs ran ahead of the clock
		kept, fence, n, err := b.store.Pass(ctx, "lock:p1", ownerA, time.Second, local)
		if err != nil || !kept || n != 0 {
			t.Fatalf("pass of an unmarked lock = %v, %d, %d, %v; want kept", kept, fence, n, err)
		}
		if fence <= local {
			t.Fatalf("pass fence %d, not above the local fences (%d)", fence, local)
		}
		if v := b.client.Get(ctx, "lock:p1").Val(); v != ownerA+" "+strconv.FormatInt(fence, 10)+" 1 req=1" {
			t.Fatalf("value after the pass = %q", v)
		}
		if c, _ := b.client.Get(ctx, lockstore.FenceKey("lock:p1")).Int64(); c != fence {
			t.Fatalf("counter after the pass = %d, want %d", c, fence)
		}
		if d := b.client.PTTL(ctx, "lock:p1").Val(); d < 30*time.Second {
			t.Fatalf("the pass cut the TTL to %v", d)
		}
		if next, _, _, err := b.store.Pass(ctx, "lock:p1", ownerA, time.Second, 0); err != nil || !next {
			t.Fatalf("second pass = %v, %v", next, err)
		}
		if _, err := b.store.Release(ctx, "lock:p1", ownerA, "", 0); err != nil {
			t.Fatal(err)
		}
		if after, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:p1", Owner: ownerB, TTL: time.Second}); err != nil || after.Fence <= fence {
			t.Fatalf("next owner = %+v, %v; want a fence above the pass's %d", after, err, fence)
		}

		// Another owner's lock, or none: lockstore.ErrNotHeld, nothing changed.
		before := b.client.Get(ctx, "lock:p1").Val()
		if kept, _, _, err := b.store.Pass(ctx, "lock:p1", ownerA, time.Second, 0); kept || !errors.Is(err, lockstore.ErrNotHeld) {
			t.Fatalf("pass of another owner's lock = %v, %v; want lockstore.ErrNotHeld", kept, err)
		}
		if v := b.client.Get(ctx, "lock:p1").Val(); v != before {
			t.Fatalf("another owner's lock changed: %q -> %q", before, v)
		}
		if kept, _, _, err := b.store.Pass(ctx, "lock:p-none", ownerA, time.Second, 0); kept || !errors.Is(err, lockstore.ErrNotHeld) {
			t.Fatalf("pass of a free key = %v, %v; want lockstore.ErrNotHeld", kept, err)
		}

		// Marked (an acquirer elsewhere was refused): released, and the waiters told.
		w, err := b.store.Watch(ctx, "lock:p2")
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		for delivered := false; !delivered; { // the subscription is asynchronous: repeat
			if _, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:p2", Owner: ownerA, TTL: time.Minute}); err != nil {
				t.Fatal(err)
			}
			if busy, _ := b.store.Acquire(ctx, lockstore.Request{Key: "lock:p2", Owner: ownerB, TTL: time.Minute}); busy.Acquired {
				t.Fatal("busy lock granted")
			}
			kept, _, n, err := b.store.Pass(ctx, "lock:p2", ownerA, time.Second, 0)
			if err != nil || kept {
				t.Fatalf("pass of a marked lock = %v, %v; want released", kept, err)
			}
			if b.client.Exists(ctx, "lock:p2").Val() != 0 {
				t.Fatal("a marked lock was not released")
			}
			select {
			case <-w.C():
				delivered = n >= 1
				if !delivered {
					t.Fatalf("pass reported %d listeners yet delivered", n)
				}
			case <-time.After(50 * time.Millisecond):
			}
		}

		// Re-entered from another process: the acquisition's hold is given up, the key stays.
		if _, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:p3", Owner: ownerA, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if got, err := b.store.Reenter(ctx, "lock:p3", ownerA, "h1", time.Minute); err != nil || !got.Acquired {
			t.Fatalf("re-enter = %+v, %v", got, err)
		}
		if kept, _, _, err := b.store.Pass(ctx, "lock:p3", ownerA, time.Second, 0); err != nil || kept {
			t.Fatalf("pass of a re-entered lock = %v, %v; want its own hold released", kept, err)
		}
		if b.client.Exists(ctx, "lock:p3").Val() != 1 {
			t.Fatal("the pass deleted a lock a re-entry still holds")
		}
		if _, err := b.store.Release(ctx, "lock:p3", ownerA, "h1", 0); err != nil {
			t.Fatal(err)
		}

		// A counter the script cannot read: released rather than kept, the counter as found.
		fk := lockstore.FenceKey("lock:p4")
		if _, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:p4", Owner: ownerA, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		b.client.Set(ctx, fk, "not a fence", 0)
		if kept, _, _, err := b.store.Pass(ctx, "lock:p4", ownerA, time.Second, 0); err != nil || kept {
			t.Fatalf("pass with a bad counter = %v, %v; want released", kept, err)
		}
		if b.client.Exists(ctx, "lock:p4").Val() != 0 || b.client.Get(ctx, fk).Val() != "not a fence" {
			t.Fatalf("after a pass with a bad counter: lock %d, counter %q", b.client.Exists(ctx, "lock:p4").Val(), b.client.Get(ctx, fk).Val())
		}

		// Bad arguments are refused before anything is sent.
		if _, _, _, err := b.store.Pass(ctx, "lock:p5", ownerA, 0, 0); err == nil {
			t.Fatal("pass with TTL 0 accepted")
		}
	})
}

// With WithReplicas a pass never keeps the lock: a kept lock would need a WAIT of its own, and
// the Locker's fresh acquisition brings one.
func TestPassWithReplicasReleases(t *testing.T) {
	b := miniBackend(t)
	s := New(b.client, WithReplicas(1, 20*time.Millisecond))
	ctx := context.Background()
	if _, err := b.store.Acquire(ctx, lockstore.Request{Key: "lock:pr", Owner: ownerA, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if kept, _, _, err := s.Pass(ctx, "lock:pr", ownerA, time.Second, 0); err != nil || kept {
		t.Fatalf("pass with replicas = %v, %v; want released", kept, err)
	}
	if b.client.Exists(ctx, "lock:pr").Val() != 0 {
		t.Fatal("the lock was kept")
	}
}
