package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
)

// A subscription whose SUBSCRIBE the pub/sub connection lost unconfirmed (the link broke with
// it in flight) is confirmed again once go-redis has reconnected: a later watch of the key
// that meets the channel subscribed is heard all along (not fresh), as on a link that never
// broke. go-redis reports no reconnect, so nothing in flight on the broken connection may be
// left owed: here the first watch gives up before its confirmation, its linger runs out, and
// then the link breaks before Redis has read the SUBSCRIBE.
//
// The pub/sub link has 150ms of latency towards Redis (laggyConn) and the linger is 10ms.
func TestWatchIsConfirmedAfterAReconnectLostItsSubscribe(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	var mu sync.Mutex
	var conns []*laggyConn // guarded by mu
	sub := redis.NewClient(&redis.Options{Addr: srv.Addr, DisableIdentity: true,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			l := newLaggyConn(c, 150*time.Millisecond)
			mu.Lock()
			conns = append(conns, l)
			mu.Unlock()
			return l, nil
		}})
	s := New(splitClient{Client: srv.Client(), sub: sub}, WithWatchLinger(10*time.Millisecond))
	t.Cleanup(func() { _ = s.Close(); _ = sub.Close() })

	// The pub/sub connection exists and another channel stays watched throughout.
	warm, err := s.Watch(ctx, "lock:warm")
	if err != nil {
		t.Fatal(err)
	}
	defer warm.Close()

	const key = "lock:blip"
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	w1, err := s.Watch(short, key)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	w1.Close()
	time.Sleep(50 * time.Millisecond) // the 10ms linger runs out; the SUBSCRIBE is still on its way

	mu.Lock()
	_ = conns[0].Close() // the link breaks with what it carries
	mu.Unlock()
	deadline := time.Now().Add(2 * time.Second)
	for { // go-redis's reader sees the break and dials again
		mu.Lock()
		n := len(conns)
		mu.Unlock()
		if n > 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("go-redis did not reconnect")
		}
		time.Sleep(5 * time.Millisecond)
	}

	w2, err := s.Watch(ctx, key) // fresh: returns at the channel's confirmation, or after subscribeWait
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	w3, err := s.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer w3.Close()
	if w3.Fresh() {
		s.notify.mu.Lock()
		st := s.notify.channels[DefaultChannelPrefix+key]
		s.notify.mu.Unlock()
		t.Fatalf("a watch of a key watched since the reconnect is fresh (channel state %+v): its subscription is "+
			"never taken as confirmed, so every watch of the key waits subscribeWait", st)
	}
}

// A SUBSCRIBE that go-redis fails to send leaves no subscription behind: go-redis records the
// channel even then, and would subscribe it again at every later connection, an idle
// subscription (counted by every release's notified) that nobody watches or unsubscribes.
func TestFailedSubscribeLeavesNoSubscription(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	direct := srv.Client()
	var refuse atomic.Bool
	sub := redis.NewClient(&redis.Options{Addr: srv.Addr, DisableIdentity: true, MaxRetries: -1,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if refuse.Load() {
				return nil, errors.New("link down")
			}
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}})
	s := New(splitClient{Client: direct, sub: sub})
	t.Cleanup(func() { _ = s.Close(); _ = sub.Close() })

	refuse.Store(true)
	if w, err := s.Watch(ctx, "lock:down"); err == nil {
		w.Close()
		t.Fatal("a watch whose SUBSCRIBE could not be sent succeeded")
	}
	refuse.Store(false)
	w, err := s.Watch(ctx, "lock:up") // returns at its confirmation: what the connection resubscribed came first
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if !w.Fresh() {
		t.Fatal("the first watch of a key is not fresh")
	}
	n, err := direct.PubSubNumSub(ctx, DefaultChannelPrefix+"lock:down").Result()
	if err != nil {
		t.Fatal(err)
	}
	if got := n[DefaultChannelPrefix+"lock:down"]; got != 0 {
		t.Fatalf("the channel of the failed watch has %d subscribers, want 0", got)
	}
}

// A subscription that Redis never confirms is dropped (UNSUBSCRIBE sent) once its linger has
// run out and it is older than unconfirmedKeep, as a confirmed one is at its linger: the
// notifier keeps a channel state unconfirmed only for a while, not for the life of the process.
// Here the pub/sub connection's user has no channel permissions (Redis 7's default for a new
// ACL user, acl-pubsub-default resetchannels), so every SUBSCRIBE is answered NOPERM, which
// go-redis's pub/sub reader drops without a word: with a key per user or per order, a state
// kept per key ever watched would grow the notifier's map without bound.
func TestNeverConfirmedSubscriptionIsDroppedOnceOld(t *testing.T) {
	defer func(d time.Duration) { unconfirmedKeep = d }(unconfirmedKeep)
	unconfirmedKeep = 50 * time.Millisecond

	srv := redistest.Start(t)
	ctx := context.Background()
	direct := srv.Client()
	if err := direct.Do(ctx, "ACL", "SETUSER", "noperm", "on", ">pw", "~*", "+@all", "resetchannels").Err(); err != nil {
		t.Fatal(err)
	}
	sub := redis.NewClient(&redis.Options{Addr: srv.Addr, DisableIdentity: true, Username: "noperm", Password: "pw"})
	s := New(splitClient{Client: direct, sub: sub}, WithWatchLinger(10*time.Millisecond))
	t.Cleanup(func() { _ = s.Close(); _ = sub.Close() })

	const channel = DefaultChannelPrefix + "lock:order-1"
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	w, err := s.Watch(short, "lock:order-1")
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if !w.Fresh() {
		t.Fatal("a watch whose SUBSCRIBE Redis refused is not fresh")
	}
	w.Close()

	deadline := time.Now().Add(5 * time.Second)
	for {
		s.notify.mu.Lock()
		st := s.notify.channels[channel]
		var active bool
		if st != nil {
			active = st.active
		}
		s.notify.mu.Unlock()
		if st == nil && unsubscribes(t, direct) > 0 {
			break
		}
		if active {
			t.Fatal("Redis confirmed a SUBSCRIBE of a user without channel permissions")
		}
		if time.Now().After(deadline) {
			t.Fatalf("a channel state never confirmed is kept (state %v, UNSUBSCRIBEs %d) 5s after its linger "+
				"(10ms) and unconfirmedKeep (50ms) ran out: one stays per key ever watched",
				st != nil, unsubscribes(t, direct))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// unsubscribes is the number of UNSUBSCRIBE commands the server has run (INFO commandstats).
func unsubscribes(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.InfoMap(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	stat := info["Commandstats"]["cmdstat_unsubscribe"] // calls=1,usec=...
	var calls int64
	if stat != "" {
		if _, err := fmt.Sscanf(stat, "calls=%d,", &calls); err != nil {
			t.Fatalf("parse cmdstat_unsubscribe %q: %v", stat, err)
		}
	}
	return calls
}
