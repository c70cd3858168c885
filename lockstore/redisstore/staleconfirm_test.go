package redisstore

// A channel's state is marked ready only by the "subscribe" confirmation that answers its own
// SUBSCRIBE, never by one that answers an earlier SUBSCRIBE of the same channel, sent for a
// channelState that its linger has since expired (the notifier sends no UNSUBSCRIBE of a
// channel while its SUBSCRIBE waits for its confirmation). On a pub/sub link slower than the linger, a
// watch that gave up waiting (its ctx ended), a linger expiry and a new watch of the key would
// otherwise leave the new watch marked active by the first SUBSCRIBE's confirmation, while
// Redis is still to read the UNSUBSCRIBE and then the new SUBSCRIBE: a release between those
// two would publish to nobody although it comes after lockstore.Watch returned, which
// lockstore.Store.Watch promises is heard.
//
// Here the pub/sub link has 150ms of latency towards Redis (laggyConn, as in
// TestWatchHearsAReleaseRightAfterIt) and the linger is 10ms.

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/lockstore"
)

func TestStaleConfirmationDoesNotMarkANewSubscriptionReady(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	direct := srv.Client()
	const lag = 150 * time.Millisecond
	sub := redis.NewClient(&redis.Options{Addr: srv.Addr, DisableIdentity: true,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return newLaggyConn(c, lag), nil
		}})
	s := New(splitClient{Client: direct, sub: sub}, WithWatchLinger(10*time.Millisecond))
	t.Cleanup(func() { _ = s.Close(); _ = sub.Close() })

	// Warm up: the pub/sub connection exists and stays (another channel watched throughout).
	warm, err := s.Watch(ctx, "lock:warm")
	if err != nil {
		t.Fatal(err)
	}
	defer warm.Close()

	const key = "lock:stale"
	t0 := time.Now()
	// A first watch that gives up before the confirmation (its caller's wait ended).
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	w1, err := s.Watch(short, key)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	w1.Close() // linger 10ms, then UNSUBSCRIBE (reaches Redis about t0+180ms)
	time.Sleep(time.Until(t0.Add(100 * time.Millisecond)))
	// The key is held and marked (a refused acquire), so its release publishes.
	if got, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerA, TTL: 10 * time.Second}); err != nil || !got.Acquired {
		t.Fatalf("acquire: %+v %v", got, err)
	}
	if got, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerB, TTL: 10 * time.Second}); err != nil || got.Acquired {
		t.Fatalf("busy acquire: %+v %v", got, err)
	}
	w2, err := s.Watch(ctx, key) // its SUBSCRIBE reaches Redis about t0+250ms
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	returned := time.Since(t0)
	// Strictly after lockstore.Watch returned, and once Redis read the UNSUBSCRIBE (at once when lockstore.Watch
	// returned later, as it does when it waits for its own SUBSCRIBE's confirmation).
	time.Sleep(time.Until(t0.Add(215 * time.Millisecond)))
	releasedAt := time.Since(t0)
	notified, err := s.Release(ctx, key, ownerA, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	// The PUBLISH itself must reach the watch: a later confirmation of the channel wakes its
	// watchers too (as after a reconnect), which would hide a release published to nobody.
	if notified == 0 {
		t.Fatalf("a release after lockstore.Watch returned (at %v; the release at %v) published to nobody: the "+
			"watch was marked ready by the confirmation of the expired subscription's SUBSCRIBE",
			returned.Round(time.Millisecond), releasedAt.Round(time.Millisecond))
	}
	select {
	case <-w2.C():
	case <-time.After(time.Second):
		t.Fatalf("a release after lockstore.Watch returned (at %v; the release at %v) was never delivered (PUBLISH reached %d "+
			"subscribers): the watch was marked ready by the confirmation of the expired subscription's SUBSCRIBE",
			returned.Round(time.Millisecond), releasedAt.Round(time.Millisecond), notified)
	}
}
