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
type notifier struct {
	client Client
	linger time.Duration

	mu       sync.Mutex
	ps       *redis.PubSub            // guarded by mu; nil until the first watch
	channels map[string]*channelState // guarded by mu
	// unconfirmed counts, per channel, the SUBSCRIBEs sent and not yet confirmed (guarded by
	// mu): a channel state is ready only at its own SUBSCRIBE's confirmation, not at that of
	// an earlier subscription of the channel given up since.
	unconfirmed map[string]int
	closed      bool           // guarded by mu
	reader      sync.WaitGroup // the goroutine reading ps
}

// channelState is one subscribed channel. All fields are guarded by notifier.mu.
type channelState struct {
	watchers map[chan struct{}]struct{}
	linger   *time.Timer   // pending unsubscribe once nobody watches; nil while watched
	ready    chan struct{} // closed when Redis confirmed the SUBSCRIBE (the reader saw it)
	active   bool          // ready is closed
	skip     int           // confirmations of earlier SUBSCRIBEs still due before this one's
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

// watch returns once Redis has confirmed the channel's subscription, or after subscribeWait or
// when ctx ends, whichever comes first. go-redis's Subscribe only writes the command, and Redis
// orders nothing between the pub/sub connection and the others: without the wait, a release
// sent after watch returned could run before the SUBSCRIBE and publish to nobody.
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
			n.mu.Unlock()
			return nil, fmt.Errorf("flightlock: subscribe %q: %w", channel, err)
		}
		st = &channelState{watchers: make(map[chan struct{}]struct{}), ready: make(chan struct{}),
			skip: n.unconfirmed[channel]}
		n.unconfirmed[channel]++
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

// subscribeWait bounds how long watch waits for Redis to confirm a subscription: a slow link
// is still heard, and a pub/sub connection that never answers delays a waiter's next attempt
// by about a few retry delays, once per wait.
const subscribeWait = 500 * time.Millisecond

func (n *notifier) unwatch(channel string, c chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := n.channels[channel]
	if st == nil {
		return
	}
	delete(st.watchers, c)
	if len(st.watchers) > 0 || n.closed {
		return
	}
	st.linger = time.AfterFunc(n.linger, func() { n.expire(channel, st) })
}

// expire unsubscribes a channel whose linger ran out, unless someone started watching again.
func (n *notifier) expire(channel string, st *channelState) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed || n.channels[channel] != st || len(st.watchers) > 0 {
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
			if n.unconfirmed[m.Channel] > 0 {
				if n.unconfirmed[m.Channel]--; n.unconfirmed[m.Channel] == 0 {
					delete(n.unconfirmed, m.Channel)
				}
			}
			st := n.channels[m.Channel]
			switch {
			case st == nil:
			case st.skip > 0:
				st.skip-- // an earlier subscription's, given up and unsubscribed since
			case !st.active: // the confirmation watch waits for (or a resubscription's)
				st.active = true
				close(st.ready)
			default:
				// go-redis subscribed again after a reconnect: a release in between was not
				// heard, so the watchers look again.
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
