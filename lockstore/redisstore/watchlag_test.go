package redisstore

import (
	"context"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/lockstore"
)

// TestWatchHearsAReleaseRightAfterIt: RedisStore.Watch returns once its subscription is
// active, so a release that happens after lockstore.Watch returned is delivered. watch waits for
// the subscription's confirmation (the *redis.Subscription message for the channel, read by
// the notifier's reader and signalled to watch), bounded by subscribeWait, 500ms, above the
// latency here.
//
// notifier.watch sends SUBSCRIBE with go-redis's PubSub.Subscribe, which only writes the
// command and does not wait for Redis to confirm it. The subscription lives on a connection
// of its own, and Redis orders nothing between two connections: a release sent on another
// connection can run (and PUBLISH to nobody) before the SUBSCRIBE is read. Here the pub/sub
// connection has 150ms of latency towards Redis (a slow or congested link): without the wait
// for the confirmation, the release right after lockstore.Watch would notify 0 subscribers and
// the watch would never fire, and a waiter that watches and then sleeps until its retry delay
// (the Locker) would stay asleep with the key free, a lost wake-up (it would wake at its next
// retry delay, capped by the holder's TTL, instead of at the release).
//
// A release between the busy reply and the subscription is missed anyway: the Locker tries once
// more after lockstore.Watch returns and before it sleeps (TestWaiterTriesAgainOnceItListens).
func TestWatchHearsAReleaseRightAfterIt(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	direct := srv.Client()
	sub := redis.NewClient(&redis.Options{Addr: srv.Addr, DisableIdentity: true,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return newLaggyConn(c, 150*time.Millisecond), nil
		}})
	s := New(splitClient{Client: direct, sub: sub})
	t.Cleanup(func() { _ = s.Close(); _ = sub.Close() })

	const key = "lock:notify"
	if got, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerA, TTL: 10 * time.Second}); err != nil || !got.Acquired {
		t.Fatalf("acquire: %+v %v", got, err)
	}
	// B is refused: the lock is marked, so its release publishes.
	if got, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerB, TTL: 10 * time.Second}); err != nil || got.Acquired {
		t.Fatalf("busy acquire: %+v %v", got, err)
	}
	w, err := s.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// Strictly after lockstore.Watch returned.
	notified, err := s.Release(ctx, key, ownerA, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.C():
	case <-time.After(time.Second):
		t.Fatalf("a release after lockstore.Watch returned was never delivered (PUBLISH reached %d subscribers): "+
			"Watch returned before its SUBSCRIBE was active", notified)
	}
}

// splitClient runs scripts on Client and subscribes on sub.
type splitClient struct {
	*redis.Client
	sub *redis.Client
}

func (c splitClient) Subscribe(ctx context.Context, channels ...string) *redis.PubSub {
	return c.sub.Subscribe(ctx, channels...)
}

// laggyConn delivers what is written to it d later, in order (network latency towards the
// server); Write returns at once, as on a link with room in its buffers. As on a kernel's send
// buffer, a write deadline bounds only the Write call: bytes Write accepted are delivered
// whatever deadline is set afterwards, and a link that fails to deliver is closed, so the
// client sees it broken rather than mute.
type laggyConn struct {
	net.Conn
	d    time.Duration
	q    chan laggyChunk
	done chan struct{}
	once sync.Once
	wg   sync.WaitGroup

	mu            sync.Mutex
	writeDeadline time.Time // guarded by mu; zero for none
}

type laggyChunk struct {
	at time.Time
	b  []byte
}

func newLaggyConn(c net.Conn, d time.Duration) *laggyConn {
	l := &laggyConn{Conn: c, d: d, q: make(chan laggyChunk, 1024), done: make(chan struct{})}
	l.wg.Add(1)
	go l.pump()
	return l
}

func (l *laggyConn) Write(b []byte) (int, error) {
	l.mu.Lock()
	dl := l.writeDeadline
	l.mu.Unlock()
	if !dl.IsZero() && !time.Now().Before(dl) {
		return 0, os.ErrDeadlineExceeded
	}
	select {
	case l.q <- laggyChunk{time.Now().Add(l.d), append([]byte(nil), b...)}:
		return len(b), nil
	case <-l.done:
		return 0, net.ErrClosed
	}
}

// SetWriteDeadline bounds the Write calls that follow, never the delivery of earlier ones.
func (l *laggyConn) SetWriteDeadline(t time.Time) error {
	l.mu.Lock()
	l.writeDeadline = t
	l.mu.Unlock()
	return nil
}

func (l *laggyConn) SetDeadline(t time.Time) error {
	_ = l.SetWriteDeadline(t)
	return l.Conn.SetReadDeadline(t)
}

func (l *laggyConn) pump() {
	defer l.wg.Done()
	for {
		select {
		case c := <-l.q:
			select {
			case <-time.After(time.Until(c.at)):
			case <-l.done:
				return
			}
			if _, err := l.Conn.Write(c.b); err != nil {
				_ = l.Conn.Close() // the reader sees the broken link
				return
			}
		case <-l.done:
			return
		}
	}
}

func (l *laggyConn) Close() error {
	l.once.Do(func() { close(l.done) })
	err := l.Conn.Close()
	l.wg.Wait()
	return err
}

// A watch says whether it began listening only now (lockstore.Watch.Fresh): the first watch of a channel
// does, a second one while the channel is subscribed (watched, or within its linger) does not,
// and a watch after the linger ran out does again. The Locker looks at the key once more only
// after a fresh watch, so a hot key waited on turn after turn costs no extra round trip.
func TestWatchSaysWhetherItIsFresh(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		s := New(b.client, WithWatchLinger(50*time.Millisecond))
		t.Cleanup(func() { _ = s.Close() })
		w1, err := s.Watch(ctx, "lock:fresh")
		if err != nil {
			t.Fatal(err)
		}
		w2, err := s.Watch(ctx, "lock:fresh")
		if err != nil {
			t.Fatal(err)
		}
		if !w1.Fresh() || w2.Fresh() {
			t.Errorf("first watch fresh %v, second while subscribed fresh %v; want true, false", w1.Fresh(), w2.Fresh())
		}
		w1.Close()
		w2.Close()
		w3, err := s.Watch(ctx, "lock:fresh") // within the linger: still subscribed
		if err != nil {
			t.Fatal(err)
		}
		if w3.Fresh() {
			t.Error("a watch within the linger is fresh, want it heard all along")
		}
		w3.Close()
		waitUnsubscribed(t, s)
		w4, err := s.Watch(ctx, "lock:fresh")
		if err != nil {
			t.Fatal(err)
		}
		defer w4.Close()
		if !w4.Fresh() {
			t.Error("a watch after the linger ran out is not fresh")
		}
	})
}

// A watch whose context ends before Redis confirmed its SUBSCRIBE returns fresh, yet its
// subscription goes on: the command was handed to the connection and reaches Redis later, the
// confirmation marks the channel active, and a watch of the key after that hears a release.
// The caller's deadline bounds its own wait, never the subscription it started.
//
// The pub/sub link has 100ms of latency towards Redis and the connection is warm (another
// channel watched throughout), so the SUBSCRIBE of the cut-short watch leaves at once and
// reaches Redis 100ms later, always after the caller's 30ms deadline.
func TestWatchCutShortStillSubscribes(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	sub := redis.NewClient(&redis.Options{Addr: srv.Addr, DisableIdentity: true, ContextTimeoutEnabled: true,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return newLaggyConn(c, 100*time.Millisecond), nil
		}})
	s := New(splitClient{Client: srv.Client(), sub: sub})
	t.Cleanup(func() { _ = s.Close(); _ = sub.Close() })

	warm, err := s.Watch(ctx, "lock:warm")
	if err != nil {
		t.Fatal(err)
	}
	defer warm.Close()

	const key = "lock:cut"
	short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	w1, err := s.Watch(short, key)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer w1.Close()
	if !w1.Fresh() {
		t.Fatal("a watch that gave up before the confirmation is not fresh")
	}
	if got, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerA, TTL: 10 * time.Second}); err != nil || !got.Acquired {
		t.Fatalf("acquire: %+v %v", got, err)
	}
	if got, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerB, TTL: 10 * time.Second}); err != nil || got.Acquired {
		t.Fatalf("busy acquire: %+v %v", got, err)
	}
	// Returns at the confirmation of w1's SUBSCRIBE, or after subscribeWait without one.
	w2, err := s.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	s.notify.mu.Lock()
	active := s.notify.channels[DefaultChannelPrefix+key].active
	s.notify.mu.Unlock()
	notified, err := s.Release(ctx, key, ownerA, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-w2.C():
	case <-time.After(time.Second):
		t.Fatalf("a release after lockstore.Watch returned was never delivered (channel confirmed: %v; PUBLISH "+
			"reached %d subscribers): the cut-short watch's SUBSCRIBE never took effect", active, notified)
	}
}
