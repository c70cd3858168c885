package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/flightlock/flightlock/lockstore"
	"github.com/redis/go-redis/v9"
)

// notifier multiplexes release notifications of many keys over one pub/sub connection. A
// channel is subscribed while someone watches it, plus a linger (WithWatchLinger).
//
// A channel has at most one channelState, dropped (UNSUBSCRIBE sent) at the end of its linger
// only once it is active or older than unconfirmedKeep. While a young state waits, its
// SUBSCRIBE is the channel's only one unanswered, no UNSUBSCRIBE on the way, so the first
// "subscribe" confirmation read is its, or go-redis's resubscription on a new connection (as
// good). Nothing is owed across a reconnect (unreported by go-redis, which re-sends a SUBSCRIBE
// lost with a connection while the channel is in its set). One crossing remains: a
// resubscription sent just before a state was dropped, answered after a new state was made (a
// reconnect within a round trip of a linger's end), marks the new state ready early; its own
// confirmation then wakes its watchers (as on an active channel): a release is late, not lost.
//
// A state is kept unconfirmed only until unconfirmedKeep old, as some SUBSCRIBEs are never
// confirmed: Redis answers NOPERM to a user without the channel's permission (Redis 7's new
// ACL users: acl-pubsub-default resetchannels), and go-redis's reader drops that reply, keeping
// connection and channel. Kept for good, such states would grow one per key ever watched. A
// wrong guess (a link slower than unconfirmedKeep) is the crossing above: late, not lost.
type notifier struct {
	client          Client
	linger          time.Duration
	keepUnconfirmed time.Duration // unconfirmedKeep when the store was made

	mu       sync.Mutex
	ps       *redis.PubSub            // guarded by mu; nil until the first watch
	channels map[string]*channelState // guarded by mu
	closed   bool                     // guarded by mu
	reader   sync.WaitGroup           // the goroutine reading ps
}

// channelState is one subscribed channel. All fields are guarded by notifier.mu.
type channelState struct {
	watchers map[chan struct{}]struct{}
	linger   *time.Timer   // pending unsubscribe once nobody watches; nil while watched
	ready    chan struct{} // closed when Redis confirmed the SUBSCRIBE (the reader saw it)
	active   bool          // ready is closed
	created  time.Time     // when its SUBSCRIBE was sent
}

// signal wakes every watcher of the channel. notifier.mu must be held.
func (st *channelState) signal() {
	for c := range st.watchers {
		select {
		case c <- struct{}{}:
		default: // already signalled; one pending wake-up is enough
		}
	}
}

var errStoreClosed = errors.New("flightlock: store closed")

// watch returns once Redis confirmed the subscription, after subscribeWait, or when ctx ends:
// go-redis's Subscribe only writes it, and Redis orders nothing across connections, so a release
// sent after watch returned could otherwise run before the SUBSCRIBE and publish to nobody.
func (n *notifier) watch(ctx context.Context, channel string) (*lockstore.Watch, error) {
	c := make(chan struct{}, 1)

	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, errStoreClosed
	}
	if n.ps == nil {
		n.ps = n.client.Subscribe(ctx)
		msgs := n.ps.ChannelWithSubscriptions() // the confirmations too, for ready
		n.reader.Add(1)
		go n.read(msgs)
	}
	st := n.channels[channel]
	if st == nil {
		// Sent under mu, so that it cannot overtake a linger timer's UNSUBSCRIBE of it.
		if err := n.ps.Subscribe(ctx, channel); err != nil {
			// go-redis keeps the channel in its set even so, to subscribe on every later
			// connection. It failed unsent or its connection closed: nothing of it comes later.
			_ = n.ps.Unsubscribe(ctx, channel)
			n.mu.Unlock()
			return nil, fmt.Errorf("flightlock: subscribe %q: %w", channel, err)
		}
		st = &channelState{watchers: make(map[chan struct{}]struct{}), ready: make(chan struct{}),
			created: time.Now()}
		n.channels[channel] = st
	}
	if st.linger != nil {
		st.linger.Stop()
		st.linger = nil
	}
	st.watchers[c] = struct{}{}
	ready, active := st.ready, st.active
	n.mu.Unlock()

	// A channel confirmed before this call was heard all along; a new or unconfirmed one may
	// have missed a release since the caller's last look (lockstore.Watch.Fresh).
	stop := func() { n.unwatch(channel, c) }
	w := lockstore.NewWatch(c, stop)
	if !active {
		w = lockstore.NewFreshWatch(c, stop)
		select {
		case <-ready:
		case <-ctx.Done():
		case <-time.After(subscribeWait):
		}
	}
	return w, nil
}

// subscribeWait bounds watch's wait for a confirmation: a slow link is still heard, and a
// pub/sub connection that never answers delays a waiter by a few retry delays, once per wait.
const subscribeWait = 500 * time.Millisecond

// unconfirmedKeep is how long after its SUBSCRIBE an unconfirmed state outlives its linger (see
// notifier): far above a live round trip, yet no pile-up of keys watched once. Tests set it.
var unconfirmedKeep = time.Minute

func (n *notifier) unwatch(channel string, c chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if st := n.channels[channel]; st != nil {
		delete(st.watchers, c)
		if len(st.watchers) == 0 && !n.closed {
			n.startLinger(channel, st)
		}
	}
}

// startLinger unsubscribes the channel after the linger unless watched again. n.mu is held.
func (n *notifier) startLinger(channel string, st *channelState) {
	st.linger = time.AfterFunc(n.linger, func() { n.expire(channel, st) })
}

// expire unsubscribes a channel whose linger ran out, unless watched again or its SUBSCRIBE, sent
// under keepUnconfirmed ago, is unconfirmed (no UNSUBSCRIBE may cross it; see notifier): then the
// timer is reset to that age (not a linger, maybe zero), and the confirmation starts a linger.
func (n *notifier) expire(channel string, st *channelState) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed || n.channels[channel] != st || len(st.watchers) > 0 {
		return
	}
	if left := n.keepUnconfirmed - time.Since(st.created); !st.active && left > 0 {
		st.linger = time.AfterFunc(left, func() { n.expire(channel, st) })
		return
	}
	delete(n.channels, channel)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	// A failed UNSUBSCRIBE only leaves an idle subscription; messages for it are dropped.
	_ = n.ps.Unsubscribe(ctx, channel)
}

func (n *notifier) read(msgs <-chan any) {
	defer n.reader.Done()
	for m := range msgs {
		n.mu.Lock()
		switch m := m.(type) {
		case *redis.Subscription:
			if m.Kind != "subscribe" {
				break
			}
			st := n.channels[m.Channel]
			switch {
			case st == nil:
			case !st.active: // the confirmation watch waits for (or a resubscription's)
				st.active = true
				close(st.ready)
				if len(st.watchers) == 0 && st.linger != nil {
					// Unwatched: its timer (linger or keepUnconfirmed) becomes a linger from now.
					st.linger.Stop()
					n.startLinger(m.Channel, st)
				}
			default:
				// Resubscribed after a reconnect: the watchers look again for a release unheard.
				st.signal()
			}
		case *redis.Message:
			if st := n.channels[m.Channel]; st != nil {
				st.signal()
			}
		}
		n.mu.Unlock()
	}
}

func (n *notifier) close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	for _, st := range n.channels {
		if st.linger != nil {
			st.linger.Stop()
		}
	}
	n.channels = nil
	ps := n.ps
	n.mu.Unlock()

	var err error
	if ps != nil {
		err = ps.Close() // closes the message channel, which ends read
	}
	n.reader.Wait()
	return err
}
