package lockstore

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"time"
)

// Inspector reads and changes a store's locks for tools (the flightlock CLI), implemented beside
// the code writing them. Keys are as rendered, without its prefix; safe for concurrent use.
type Inspector interface {
	// List returns the held locks matching the glob pattern (*, ?, [set], \ escapes, as SCAN
	// MATCH), sorted, at most opts.Limit, and how many more; a non-lock has Unrecognized set.
	List(ctx context.Context, pattern string, opts ListOptions) (locks []LockInfo, more int, err error)
	// Lookup reads one lock in full, with its fence counter; ErrNotHeld (wrapped) if absent.
	Lookup(ctx context.Context, key string) (LockInfo, error)
	// ForceUnlock removes grant l (as read), whatever its holds, waking waiters as Release does;
	// notified is what Release reports for the same deletion.
	// If the key holds another grant now: nothing (a *ChangedError); the operator chose a holder.
	ForceUnlock(ctx context.Context, l LockInfo) (notified int, err error)
	// Watch reports to fn, one at a time on the calling goroutine, EventWatching with the locks
	// matching pattern, then their changes. It returns nil when ctx ends, or a read's error.
	Watch(ctx context.Context, pattern string, opts WatchOptions, fn func(Event)) error
}

// ListOptions are List's.
type ListOptions struct {
	Limit int // the most locks returned; 0 returns all
	// Skip, if set, leaves out (uncounted in more) the keys it is true for (other layers').
	Skip func(key string) bool
}

// WatchOptions are Watch's.
type WatchOptions struct {
	// Skip leaves out the keys it returns true for, as ListOptions.Skip. Nil skips none.
	Skip func(key string) bool
	// Interval is how often a watch reads the locks again, refreshing their TTLs and finding
	// changes the store does not send. Zero means DefaultWatchInterval.
	Interval time.Duration
	// Timeout bounds each call to the store, and how long a watch the store ended tries to
	// start again. Zero means DefaultWatchTimeout.
	Timeout time.Duration
}

// Defaults of WatchOptions.
const (
	DefaultWatchInterval = 500 * time.Millisecond
	DefaultWatchTimeout  = 10 * time.Second
)

// WithDefaults returns o with the defaults in place of an Interval or Timeout not positive.
func (o WatchOptions) WithDefaults() WatchOptions {
	if o.Interval <= 0 {
		o.Interval = DefaultWatchInterval
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultWatchTimeout
	}
	return o
}

// PollWatch runs a Watch calling read (which returns the matching locks, reporting changes
// itself with Changes) every opts.Interval, within opts.Timeout, reporting EventWatching (of
// mode) after the first read and EventRead after others; meanwhile it hands what heard
// delivers to on. It returns nil when ctx ends, else a read's or on's error, or heard's close.
func PollWatch[M any](ctx context.Context, opts WatchOptions, mode string, read func(ctx context.Context) ([]LockInfo, error),
	heard <-chan M, on func(context.Context, M) error, fn func(Event)) error {
	opts = opts.WithDefaults()
	poll := func() ([]LockInfo, error) {
		rctx, cancel := context.WithTimeout(ctx, opts.Timeout)
		defer cancel()
		return read(rctx)
	}
	locks, err := poll()
	if err == nil {
		fn(Event{Kind: EventWatching, Locks: locks, Mode: mode})
	}
	tick := time.NewTicker(opts.Interval)
	defer tick.Stop()
	for err == nil {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if locks, err = poll(); err == nil {
				fn(Event{Kind: EventRead, Locks: locks})
			}
		case m, ok := <-heard:
			if !ok {
				err = errors.New("subscription closed")
			} else {
				err = on(ctx, m)
			}
		}
	}
	if ctx.Err() != nil {
		return nil // ended on purpose
	}
	return err
}

// Changes reports to fn, alike for every polling store, how locks (a new read) differ from held
// (the last, by key): per lock EventAcquired for a new owner or fence, then EventContended if
// refused; EventChanged when Own, Borrowed or Readers changed; or EventContended at a first
// refusal. Then EventGone for each of held not read, by key. A nil held (no read before, or
// changes heard otherwise) reports nothing. It returns locks by key, and the keys gone.
func Changes(held map[string]LockInfo, locks []LockInfo, fn func(Event)) (now map[string]LockInfo, gone []string) {
	if held == nil {
		fn = func(Event) {}
	}
	now = make(map[string]LockInfo, len(locks))
	for _, l := range locks {
		now[l.Key] = l
		prev, seen := held[l.Key]
		switch {
		case !seen || prev.Owner != l.Owner || prev.Fence != l.Fence:
			fn(Event{Kind: EventAcquired, Lock: l})
			if l.Contended {
				fn(Event{Kind: EventContended, Lock: l})
			}
		case prev.Own != l.Own || prev.Readers != l.Readers || !slices.Equal(prev.Borrowed, l.Borrowed):
			fn(Event{Kind: EventChanged, Lock: l})
		case l.Contended && !prev.Contended:
			fn(Event{Kind: EventContended, Lock: l})
		}
	}
	for _, k := range slices.Sorted(maps.Keys(held)) {
		if _, ok := now[k]; !ok {
			fn(Event{Kind: EventGone, Lock: held[k]})
			gone = append(gone, k)
		}
	}
	return now, gone
}

// NoTTL is LockInfo.TTL of a key without an expiry, and of a lock an event names unread.
const NoTTL time.Duration = -1

// EmptyValue is LockInfo.Unrecognized of a key with an empty value (or a ZooKeeper node with no
// data and no hold), which no store writes: an empty Unrecognized would read as a lock.
const EmptyValue = "(empty value)"

// LockInfo is one lock as an Inspector reads it.
type LockInfo struct {
	// Key is the lock key as rendered, without the prefix; StoreKey is the key in the store.
	Key, StoreKey string
	// Owner is the holder's token; empty where the store hides it (it lets one re-enter).
	Owner string
	// Fence is the fence of the store's grant; in-process handoffs count up from it.
	Fence int64
	// TTL is the time left (etcd: the lease's, in seconds); NoTTL for none, or when not read.
	TTL time.Duration
	// Own reports that the acquisition's own hold is still held; Borrowed lists the named
	// holds of re-entries from other processes. The key goes with its last hold.
	Own      bool
	Borrowed []string
	// Host, Pid, Trace and Kind ("lock", "read", "fair", "permits:N") are what the holder
	// wrote of itself (see ParseHolder); Metadata is the rest of what it wrote.
	Host, Pid, Trace, Metadata string
	Kind                       string
	// Contended reports that a request was refused while the lock was held.
	Contended bool
	// Waiters counts the processes waiting for its release (Redis: its subscribers); 0 if unknown.
	Waiters int64
	// Readers counts the live read holds of a read-held key (0 for a writer's), whose Owner is
	// no token: Redis shows the readers' marker, which ForceUnlock needs, the others none.
	Readers int
	Queued  int // the places in the key's fair line
	// Unrecognized is the raw value (the read's error in parentheses; EmptyValue if empty) of a
	// key under the prefix that is no lock of this store; then only the keys and TTL are set.
	Unrecognized string

	// FenceCounterKey and FenceCounter (Lookup only) are the key bounding the next fence (Redis:
	// the slot's fence counter; etcd: the key's fence floor) and its value (nil: unset).
	FenceCounterKey string
	FenceCounter    *int64

	// Lease, CreateRevision and ModRevision are etcd's: the key's lease (hex, as etcdctl has
	// it), the grant's revision (its fence's source) and the value's (what ForceUnlock removes).
	Lease                       string
	CreateRevision, ModRevision int64
}

// ChangedError is ForceUnlock's error when the key no longer holds the grant to remove.
type ChangedError struct {
	Now *LockInfo // the lock the key holds now; nil when it was released since
}

func (e *ChangedError) Error() string {
	if e.Now == nil {
		return "flightlock: lock released since it was read"
	}
	return "flightlock: lock changed since it was read"
}

// EventKind says what an Event reports.
type EventKind string

// Kinds of Event. The values are the words the CLI prints.
const (
	EventWatching  EventKind = "watching"  // starts every watch: Locks are the matching locks held
	EventAcquired  EventKind = "acquired"  // a new grant of the key (a new owner or fence)
	EventChanged   EventKind = "changed"   // same grant, other holds (a re-entry came or went)
	EventContended EventKind = "contended" // a request was refused while the lock was held
	EventReleased  EventKind = "released"  // deleted by its holder or by ForceUnlock
	EventExpired   EventKind = "expired"   // its TTL (etcd: lease) ran out: holder dead or cut off
	EventGone      EventKind = "gone"      // released or expired between a polling watch's reads
	EventRead      EventKind = "read"      // a periodic read, not a change: Locks are those held
	// EventResumed: the store ended the watch (Reason); it began again from a fresh read at
	// Revision (Locks: held now), the changes between following (ends first, by key, then grants).
	EventResumed EventKind = "resumed"
)

// Event is one report of Watch.
type Event struct {
	Kind EventKind
	// Lock is the lock concerned, as read then (a release or expiry: as last seen; NoTTL and no
	// grant if never read). Locks are those held, for EventWatching, EventRead and EventResumed.
	Lock  LockInfo
	Locks []LockInfo
	Mode  string // for EventWatching, how the watch hears changes ("polling every 500ms", ...)
	// Reason and Revision are EventResumed's: why the store ended it, and the revision resumed from.
	Reason   error
	Revision int64
}

// ParseHolder fills Host, Pid, Trace and Kind from the first host=, pid=, trace= and kind= of
// the metadata a holder wrote (the Locker's WithMetadata), and Metadata with the rest, in order.
func (l *LockInfo) ParseHolder(meta string) {
	fields := map[string]*string{"host": &l.Host, "pid": &l.Pid, "trace": &l.Trace, "kind": &l.Kind}
	var other []string
	for _, f := range strings.Fields(meta) {
		k, v, _ := strings.Cut(f, "=")
		if field := fields[k]; field != nil && *field == "" {
			*field = v
		} else {
			other = append(other, f)
		}
	}
	l.Metadata = strings.Join(other, " ")
}
