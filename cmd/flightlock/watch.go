package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

// Kinds of watch events, as printed: the store's (lockstore.EventKind), and resumed.
const (
	evAcquired  = string(lockstore.EventAcquired)  // a new grant of the key (a new owner or fence)
	evContended = string(lockstore.EventContended) // a request was refused while it was held
	evReleased  = string(lockstore.EventReleased)  // deleted by its holder (or by unlock)
	evExpired   = string(lockstore.EventExpired)   // its TTL ran out: the holder died or lost Redis; etcd: its lease ended
	evResumed   = string(lockstore.EventResumed)   // etcd only, no lock: the watch started again after etcd ended it
	evGone      = string(lockstore.EventGone)      // polling only: released or expired, between two polls
)

// event is one change of a lock, as "watch" reports it.
type event struct {
	Time time.Time `json:"time"`
	Kind string    `json:"event"`
	Lock lockInfo  `json:"lock"`
}

// watcher prints the events of a store's watch of the locks matching a pattern. All of its
// state belongs to the goroutine of cmdWatch, in which the store's Watch calls handle.
type watcher struct {
	b       *backend
	out     *printer
	pattern string
	mode    string // how events are heard, for the header: "keyspace notifications", ...
	screen  bool   // a terminal: redraw a view in place; else print events as lines

	held   map[string]lockInfo // last seen, by key
	recent []event             // last events, for the screen
	counts map[string]int      // events by kind, for the screen
}

// cmdWatch is "watch [pattern]": until ctx ends (or -for), report acquisitions, releases and
// contention of the matching locks.
func cmdWatch(ctx context.Context, c *backend, out *printer, o options, pattern string) error {
	if o.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}
	w := &watcher{b: c, out: out, pattern: pattern, screen: !out.json && isTerminal(out.w),
		held: make(map[string]lockInfo), counts: make(map[string]int)}
	return c.Watch(ctx, pattern, lockstore.WatchOptions{Skip: skipKeys(o.shadow), Interval: o.interval, Timeout: o.timeout}, w.handle)
}

// handle prints one event of the store's watch and keeps the screen's view of the held locks.
func (w *watcher) handle(e lockstore.Event) {
	switch e.Kind {
	case lockstore.EventWatching:
		w.mode = e.Mode
		w.hold(e.Locks)
		w.started()
	case lockstore.EventRead:
		w.hold(e.Locks)
	case lockstore.EventResumed:
		w.resumed(e.Reason, e.Revision, len(e.Locks))
		w.hold(e.Locks)
	default:
		l := view(e.Lock, w.b.store())
		switch e.Kind {
		case lockstore.EventReleased, lockstore.EventExpired, lockstore.EventGone:
			delete(w.held, l.Key)
		default:
			// A lock that an event names without having read it (released before the read)
			// has no grant and no value, and is not held.
			if e.Lock.Fence > 0 || e.Lock.Unrecognized != "" {
				w.held[l.Key] = l
			}
		}
		w.emit(string(e.Kind), l)
	}
	w.draw()
}

// hold makes locks the ones held.
func (w *watcher) hold(locks []lockstore.LockInfo) {
	clear(w.held)
	for _, l := range locks {
		w.held[l.Key] = view(l, w.b.store())
	}
}

// started prints the line that starts a watch printed as lines, once held has the locks
// already held.
func (w *watcher) started() {
	if !w.screen && !w.out.json {
		fmt.Fprintf(w.out.w, "watching %s on %s (%s); %d held\n", quoteIfOdd(w.b.keyPrefix()+w.pattern), w.b.where(), w.mode, len(w.held))
	}
}

// resumed tells the operator that the watch started again, and why: a line among the event
// lines (a JSON object among the JSON events), or in the screen's header.
func (w *watcher) resumed(ended error, rev int64, held int) {
	now := time.Now()
	switch {
	case w.out.json:
		b, _ := json.Marshal(struct {
			Time     time.Time `json:"time"`
			Kind     string    `json:"event"`
			Reason   string    `json:"reason"`
			Revision int64     `json:"revision"`
			Held     int       `json:"held"`
		}{now, evResumed, ended.Error(), rev, held})
		fmt.Fprintf(w.out.w, "%s\n", b)
	case w.screen:
		w.mode = fmt.Sprintf("etcd watch, resumed at %s after: %s", now.Format("15:04:05"), ended)
	default:
		fmt.Fprintf(w.out.w, "%s %-9s at revision %d (the watch ended: %v); %d held\n",
			now.Format("15:04:05.000"), evResumed, rev, ended, held)
	}
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
	case l.Readers > 0:
		line += fmt.Sprintf(" readers=%d ttl=%s waiting=%s", l.Readers, ttlCell(l), waitingString(l))
	case l.Store != "" && l.Fence > 0: // no owner token in etcd and ZooKeeper
		line += fmt.Sprintf(" fence=%d ttl=%s waiting=%s %s", l.Fence, ttlCell(l), waitingString(l), holderString(l))
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
