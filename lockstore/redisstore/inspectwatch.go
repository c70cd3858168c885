package redisstore

import (
	"context"
	"fmt"
	"maps"
	"strings"

	"github.com/flightlock/flightlock/internal/glob"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/redis/go-redis/v9"
)

// Watch implements lockstore.Inspector by keyspace notifications if sent (per node: not on a
// Cluster), else by comparing reads and hearing release channels; TTLs read every Interval.
func (r *RedisInspector) Watch(ctx context.Context, pattern string, opts lockstore.WatchOptions, fn func(lockstore.Event)) error {
	opts = opts.WithDefaults()
	w := &redisWatch{r: r, pattern: pattern, opts: opts, fn: fn, gone: make(map[string]int)}
	rctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	w.keyspace = keyspaceEnabled(rctx, r.client)
	cancel()
	mode := "keyspace notifications"
	channel := "__keyspace@*__:" + glob.Escape(r.prefix) + pattern
	if !w.keyspace {
		mode = "polling every " + w.opts.Interval.String()
		channel = DefaultChannelPrefix + glob.Escape(r.prefix) + pattern
	}

	ps := r.client.PSubscribe(ctx, channel)
	defer ps.Close()
	// The subscription's confirmation, awaited no longer than any read. go-redis's Receive
	// heeds a deadline but not a cancellation (an operator's interrupt): closing ps ends it.
	rctx, cancel = context.WithTimeout(ctx, opts.Timeout)
	stop := context.AfterFunc(rctx, func() { _ = ps.Close() })
	_, err := ps.Receive(rctx)
	closed := !stop()
	if rerr := rctx.Err(); closed || err != nil && rerr != nil {
		err = rerr // the read's own error may be ps closed under it
	}
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil // ended on purpose
		}
		return fmt.Errorf("subscribe %s: %w", channel, err)
	}
	return lockstore.PollWatch(ctx, opts, mode, w.poll, ps.Channel(), w.notified, fn)
}

// keyspaceEnabled says whether the server publishes the notifications needed: K with $gx or A.
func keyspaceEnabled(ctx context.Context, client redis.UniversalClient) bool {
	if _, ok := client.(*redis.ClusterClient); ok {
		return false // notifications are per node; polling sees every master
	}
	m, err := client.ConfigGet(ctx, "notify-keyspace-events").Result()
	if err != nil {
		return false
	}
	f := m["notify-keyspace-events"]
	has := func(c string) bool { return strings.Contains(f, c) }
	return has("K") && (has("A") || has("$") && has("g") && has("x"))
}

// redisWatch is the state of one Watch call, owned by its goroutine.
type redisWatch struct {
	r        *RedisInspector
	pattern  string
	opts     lockstore.WatchOptions // with defaults
	fn       func(lockstore.Event)
	keyspace bool // events come from keyspace notifications; else from comparing reads

	held map[string]lockstore.LockInfo // the matching locks as last seen, by key; nil before the first poll
	// gone are the keys a recent poll reported gone, by poll number: a later notification of
	// that release is no second event. A mark lives goneMarkPolls polls, not to pile up.
	gone  map[string]int
	polls int
}

const goneMarkPolls = 3

// poll reads the matching locks and makes them the ones held, first reporting how they differ
// from the last read (lockstore.Changes) unless keyspace notifications report the changes.
func (w *redisWatch) poll(ctx context.Context) ([]lockstore.LockInfo, error) {
	locks, _, err := w.r.List(ctx, w.pattern, lockstore.ListOptions{Skip: w.opts.Skip})
	if err != nil {
		return nil, err
	}
	held := w.held
	if w.keyspace {
		held = nil
	}
	now, gone := lockstore.Changes(held, locks, w.fn)
	w.polls++
	maps.DeleteFunc(w.gone, func(k string, at int) bool {
		_, back := now[k]
		return back || w.polls-at >= goneMarkPolls
	})
	for _, k := range gone {
		w.gone[k] = w.polls
	}
	w.held = now
	return locks, nil
}

// keyspaceKinds are the keyspace events a watch reports (not pexpire, a renewal). A set is an
// acquisition or, of the same grant, a change: notified tells.
var keyspaceKinds = map[string]lockstore.EventKind{
	"set":     lockstore.EventAcquired,
	"append":  lockstore.EventContended,
	"del":     lockstore.EventReleased,
	"expired": lockstore.EventExpired,
}

// notified handles a keyspace event, or (polling) a release notification.
func (w *redisWatch) notified(ctx context.Context, m *redis.Message) error {
	storeKey, kind := strings.TrimPrefix(m.Channel, DefaultChannelPrefix), lockstore.EventReleased
	if w.keyspace {
		var ok bool
		if kind, ok = keyspaceKinds[m.Payload]; !ok {
			return nil
		}
		_, storeKey, _ = strings.Cut(m.Channel, "__:")
	}
	key, ok := strings.CutPrefix(storeKey, w.r.prefix)
	if !ok || strings.HasPrefix(storeKey, lockstore.FenceKeyPrefix) || w.opts.Skip != nil && w.opts.Skip(key) {
		return nil
	}

	if kind == lockstore.EventReleased || kind == lockstore.EventExpired {
		l, seen := w.held[key]
		if _, marked := w.gone[key]; !seen && marked {
			delete(w.gone, key) // reported gone by the poll that read it released
			return nil
		}
		if !seen {
			l = lockstore.LockInfo{Key: key, StoreKey: storeKey, TTL: lockstore.NoTTL}
		}
		delete(w.held, key)
		w.fn(lockstore.Event{Kind: kind, Lock: l})
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, w.opts.Timeout)
	defer cancel()
	locks, err := w.r.read(rctx, []string{key})
	if err != nil {
		return err
	}
	if len(locks) == 0 { // released before it could be read; its del event follows
		w.fn(lockstore.Event{Kind: kind, Lock: lockstore.LockInfo{Key: key, StoreKey: storeKey, TTL: lockstore.NoTTL}})
		return nil
	}
	l := locks[0]
	if prev, seen := w.held[key]; kind == lockstore.EventAcquired && seen && prev.Owner == l.Owner && prev.Fence == l.Fence {
		kind = lockstore.EventChanged
	}
	w.held[key] = l
	w.fn(lockstore.Event{Kind: kind, Lock: l})
	return nil
}
