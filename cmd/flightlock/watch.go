package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/lockstore"
)

// Kinds of watch events.
const (
	evAcquired  = "acquired"  // a new grant of the key (a new owner or fence)
	evChanged   = "changed"   // the same grant's holds changed (a re-entry came or went)
	evContended = "contended" // a request was refused while it was held
	evReleased  = "released"  // deleted by its holder (or by unlock)
	evExpired   = "expired"   // its TTL ran out: the holder died or lost Redis; etcd: its lease ended
	evResumed   = "resumed"   // etcd only, no lock: the watch started again after etcd ended it
	evGone      = "gone"      // polling only: released or expired, between two polls
)

// event is one change of a lock, as "watch" reports it.
type event struct {
	Time time.Time `json:"time"`
	Kind string    `json:"event"`
	Lock lockInfo  `json:"lock"`
}

// watcher follows the locks matching a pattern. All of its state belongs to the one goroutine
// of cmdWatch. The backend's watch fills held and calls emit and draw.
type watcher struct {
	b        backend
	o        options
	out      *printer
	pattern  string
	mode     string // how events are heard, for the header: "keyspace notifications", ...
	keyspace bool   // Redis: events from keyspace notifications; else from polling
	screen   bool   // a terminal: redraw a view in place; else print events as lines

	held   map[string]lockInfo // last seen, by key
	recent []event             // last events, for the screen
	counts map[string]int      // events by kind, for the screen
}

// keyspaceEnabled says whether the server publishes the keyspace notifications watch needs:
// K (keyspace channels) with string ($), generic (g) and expired (x) events, or A for all.
// A server that refuses CONFIG (managed Redis) is polled.
func keyspaceEnabled(ctx context.Context, rdb redis.UniversalClient) bool {
	if _, ok := rdb.(*redis.ClusterClient); ok {
		return false // notifications are per node; polling sees every master
	}
	m, err := rdb.ConfigGet(ctx, "notify-keyspace-events").Result()
	if err != nil {
		return false
	}
	f := m["notify-keyspace-events"]
	has := func(c string) bool { return strings.Contains(f, c) }
	return has("K") && (has("A") || has("$") && has("g") && has("x"))
}

// cmdWatch is "watch [pattern]": until ctx ends (or -for), report acquisitions, releases and
// contention of the matching locks.
func cmdWatch(ctx context.Context, c backend, out *printer, o options, pattern string) error {
	if o.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}
	w := &watcher{b: c, o: o, out: out, pattern: pattern, screen: !out.json && isTerminal(out.w),
		held: make(map[string]lockInfo), counts: make(map[string]int)}
	return c.watch(ctx, w)
}

// started prints the line that starts a watch printed as lines, once held has the locks
// already held.
func (w *watcher) started() {
	if !w.screen && !w.out.json {
		fmt.Fprintf(w.out.w, "watching %s on %s (%s); %d held\n", quoteIfOdd(w.b.keyPrefix()+w.pattern), w.b.where(), w.mode, len(w.held))
	}
}

// watch is Redis's: keyspace notifications when the server sends them, else polling.
func (c *client) watch(ctx context.Context, w *watcher) error {
	o := w.o
	rctx, cancel := context.WithTimeout(ctx, c.timeout)
	w.keyspace = keyspaceEnabled(rctx, c.rdb)
	cancel()
	w.mode = "keyspace notifications"
	if !w.keyspace {
		w.mode = "polling every " + o.interval.String()
	}

	// Keyspace mode hears every change; polling mode hears the releases of contended locks at
	// once (lockstore publishes those) and finds the rest by comparing polls.
	channel := lockstore.DefaultChannelPrefix + globEscape(c.target.prefix) + w.pattern
	if w.keyspace {
		channel = "__keyspace@*__:" + globEscape(c.target.prefix) + w.pattern
	}
	ps := c.rdb.PSubscribe(ctx, channel)
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil { // the subscription's confirmation
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("subscribe %s: %w", channel, err)
	}
	msgs := ps.Channel()

	if err := c.poll(ctx, w, !w.keyspace); err != nil {
		return quiet(ctx, err)
	}
	w.started()
	w.draw()
	tick := time.NewTicker(o.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if err := c.poll(ctx, w, !w.keyspace); err != nil {
				return quiet(ctx, err)
			}
			w.draw()
		case m, ok := <-msgs:
			if !ok {
				return quiet(ctx, errors.New("subscription closed"))
			}
			if err := c.notified(ctx, w, m); err != nil {
				return quiet(ctx, err)
			}
			w.draw()
		}
	}
}

// quiet drops the error of a watch that was ended on purpose.
func quiet(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// poll reads the matching locks; with report, it reports the differences from the last poll.
func (c *client) poll(ctx context.Context, w *watcher, report bool) error {
	rctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	keys, err := c.scanKeys(rctx, w.pattern, w.o.shadow)
	if err != nil {
		return err
	}
	locks, err := c.inspect(rctx, keys)
	if err != nil {
		return err
	}
	now := make(map[string]lockInfo, len(locks))
	for _, l := range locks {
		now[l.Key] = l
		if !report {
			continue
		}
		prev, seen := w.held[l.Key]
		switch {
		case !seen || prev.Owner != l.Owner || prev.Fence != l.Fence:
			w.emit(evAcquired, l)
			if l.Contended {
				w.emit(evContended, l)
			}
		case holdsString(prev) != holdsString(l):
			w.emit(evChanged, l)
		case l.Contended && !prev.Contended:
			w.emit(evContended, l)
		}
	}
	if report {
		for k, prev := range w.held {
			if _, ok := now[k]; !ok {
				w.emit(evGone, prev)
			}
		}
	}
	w.held = now
	return nil
}

// notified handles a message: a keyspace event, or (polling) a release notification.
func (c *client) notified(ctx context.Context, w *watcher, m *redis.Message) error {
	var redisKey, kind string
	if w.keyspace {
		_, redisKey, _ = strings.Cut(m.Channel, "__:")
		switch m.Payload {
		case "set":
			kind = evAcquired // or evChanged: told apart below
		case "append":
			kind = evContended
		case "del":
			kind = evReleased
		case "expired":
			kind = evExpired
		default:
			return nil // pexpire (a renewal) and the like
		}
	} else {
		redisKey, kind = strings.TrimPrefix(m.Channel, lockstore.DefaultChannelPrefix), evReleased
	}
	key, ok := strings.CutPrefix(redisKey, c.target.prefix)
	if !ok || !w.o.shadow && strings.HasPrefix(key, shadowPrefix) {
		return nil
	}

	if kind == evReleased || kind == evExpired {
		l, seen := w.held[key]
		if !seen {
			l = lockInfo{Key: key, RedisKey: redisKey, TTLMillis: -1}
		}
		delete(w.held, key)
		w.emit(kind, l)
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	locks, err := c.inspect(rctx, []string{key})
	if err != nil {
		return err
	}
	if len(locks) == 0 {
		// Released before it could be read; its del event follows.
		w.emit(kind, lockInfo{Key: key, RedisKey: redisKey, TTLMillis: -1})
		return nil
	}
	l := locks[0]
	if prev, seen := w.held[key]; kind == evAcquired && seen && prev.Owner == l.Owner && prev.Fence == l.Fence {
		kind = evChanged
	}
	w.held[key] = l
	w.emit(kind, l)
	return nil
}

// emit reports an event: a JSON line, a text line, or a line of the screen's recent events.
func (w *watcher) emit(kind string, l lockInfo) {
	e := event{Time: time.Now(), Kind: kind, Lock: l}
	w.counts[kind]++
	switch {
	case w.out.json:
		b, _ := json.Marshal(e)
		fmt.Fprintf(w.out.w, "%s\n", b)
	case w.screen:
		w.recent = append(w.recent, e)
		if len(w.recent) > 15 {
			w.recent = w.recent[1:]
		}
	default:
		fmt.Fprintln(w.out.w, eventLine(e))
	}
}

func eventLine(e event) string {
	l := e.Lock
	line := fmt.Sprintf("%s %-9s %s", e.Time.Format("15:04:05.000"), e.Kind, quoteIfOdd(l.Key))
	switch {
	case l.Store == storeEtcd && l.Fence > 0: // no owner token in etcd
		line += fmt.Sprintf(" fence=%d ttl=%s waiting=%s %s", l.Fence, ttlString(l.TTLMillis), waitingString(l), holderString(l))
	case l.Owner != "":
		line += fmt.Sprintf(" owner=%s fence=%d ttl=%s waiting=%s %s", short(l.Owner), l.Fence, ttlString(l.TTLMillis),
			waitingString(l), holderString(l))
	}
	return strings.TrimRight(line, " ")
}

// draw repaints the terminal view: the held locks and the recent events.
func (w *watcher) draw() {
	if !w.screen {
		return
	}
	var b strings.Builder
	b.WriteString("\x1b[H\x1b[2J") // cursor home, clear screen
	fmt.Fprintf(&b, "flightlock watch %s on %s (%s)  %s\n\n", quoteIfOdd(w.b.keyPrefix()+w.pattern),
		w.b.where(), w.mode, time.Now().Format("15:04:05"))
	locks := make([]lockInfo, 0, len(w.held))
	for _, l := range w.held {
		locks = append(locks, l)
	}
	slices.SortFunc(locks, func(a, b lockInfo) int { return strings.Compare(a.Key, b.Key) })
	if len(locks) == 0 {
		b.WriteString("no lock held\n")
	} else {
		_ = lockTable(&b, locks)
	}
	fmt.Fprintf(&b, "\nsince start: %d acquired, %d released, %d expired, %d gone, %d contended\nrecent:\n",
		w.counts[evAcquired], w.counts[evReleased], w.counts[evExpired], w.counts[evGone], w.counts[evContended])
	for _, e := range w.recent {
		b.WriteString(eventLine(e) + "\n")
	}
	_, _ = io.WriteString(w.out.w, b.String())
}

// isTerminal says whether w is a terminal (a character device), where watch redraws in place.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
