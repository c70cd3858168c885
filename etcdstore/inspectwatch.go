package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/flightlock/flightlock/lockstore"
)

// Backoff of a resumed watch's reads while etcd does not answer.
const (
	resumeFirstBackoff = 100 * time.Millisecond
	resumeMaxBackoff   = 2 * time.Second
)

// Watch implements lockstore.Inspector. It reads the matching locks, then watches the prefix
// and the waiter marks from the next revision, so nothing in between is missed: a lock key's
// creation is an acquisition, another put a change of its holds, a deletion a release or an
// expiry (leaseEnd), a put of its waiter mark contention (the holder's own owner's re-entry
// writes it too). The two streams are separate: a contention may come before its acquisition.
//
// When etcd ends the watch (compaction, no leader, a failed read), Watch resumes from a fresh
// read (EventResumed) and reports what changed meanwhile; it gives up only when etcd stays
// unreachable for opts.Timeout. opts.Interval is unused: etcd tells every change.
func (in *Inspector) Watch(ctx context.Context, pattern string, opts lockstore.WatchOptions, fn func(lockstore.Event)) error {
	opts = opts.WithDefaults()
	w := &etcdWatch{in: in, pattern: pattern, skip: opts.Skip, fn: fn, timeout: opts.Timeout}
	var ended error // nil for the first read
	for {
		rev, err := w.read(ctx, ended)
		if err != nil {
			if ctx.Err() != nil {
				return nil // ended on purpose
			}
			return err
		}
		if ended = w.follow(ctx, rev); ctx.Err() != nil {
			return nil
		}
	}
}

// etcdWatch is the state of one Watch, owned by its goroutine.
type etcdWatch struct {
	in      *Inspector
	pattern string
	skip    func(string) bool
	fn      func(lockstore.Event)
	timeout time.Duration

	held map[string]lockstore.LockInfo // the matching locks as last seen, by key
}

func (w *etcdWatch) emit(kind lockstore.EventKind, l lockstore.LockInfo) {
	w.fn(lockstore.Event{Kind: kind, Lock: l})
}

// follow watches from rev until ctx ends (nil) or etcd ends the watch (why it did).
func (w *etcdWatch) follow(ctx context.Context, rev int64) error {
	// A member cut off from its leader then ends the watch instead of going silent.
	wctx, stop := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer stop()
	p := w.in.prefix
	watches := [2]clientv3.WatchChan{ // the locks, then their waiter marks
		w.in.cli.Watch(wctx, p, clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithPrevKV()),
		w.in.cli.Watch(wctx, WaiterKey(p), clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithFilterDelete()),
	}
	for {
		resp, i, ok := nextOf(ctx.Done(), watches)
		switch {
		case ctx.Err() != nil:
			return nil
		case !ok:
			return errors.New("etcd closed the watch")
		case resp.Err() != nil:
			return resp.Err()
		}
		ends := make(leaseEnds) // a lease's end deletes all of its keys in one response
		for _, ev := range resp.Events {
			if i == 1 {
				w.marked(ev)
			} else if err := w.lockEvent(ctx, ev, ends); err != nil {
				return err
			}
		}
	}
}

// read reads the matching locks within the watch's timeout and returns the revision read. The
// first read reports them (EventWatching). After etcd ended the watch (ended), a failed read is
// retried with a backoff, and the read reports how the locks differ from those last seen: the
// ends first, by key, then the grants in the read's order.
func (w *etcdWatch) read(ctx context.Context, ended error) (int64, error) {
	rctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	locks, _, rev, err := w.in.listed(rctx, w.pattern, w.skip, 0)
	for backoff := resumeFirstBackoff; err != nil; backoff = min(2*backoff, resumeMaxBackoff) {
		if ended == nil {
			return 0, err // the first read is not made again
		}
		if !sleep(rctx.Done(), backoff) {
			return 0, fmt.Errorf("resume the watch (it ended: %v): %w", ended, err)
		}
		locks, _, rev, err = w.in.listed(rctx, w.pattern, w.skip, 0)
	}
	now := make(map[string]lockstore.LockInfo, len(locks))
	for _, l := range locks {
		now[l.Key] = l
	}
	if ended == nil {
		w.held = now
		w.fn(lockstore.Event{Kind: lockstore.EventWatching, Locks: locks, Mode: "etcd watch"})
		return rev, nil
	}
	w.fn(lockstore.Event{Kind: lockstore.EventResumed, Locks: locks, Reason: ended, Revision: rev})
	ends := make(leaseEnds)
	for _, key := range slices.Sorted(maps.Keys(w.held)) {
		if _, ok := now[key]; !ok {
			w.emit(w.leaseEnd(ctx, w.held[key].Lease, ends), w.held[key])
		}
	}
	for _, l := range locks {
		prev, seen := w.held[l.Key]
		switch {
		case seen && prev.CreateRevision != l.CreateRevision:
			w.emit(w.leaseEnd(ctx, prev.Lease, ends), prev) // its grant ended, and another began
			fallthrough
		case !seen:
			w.emit(lockstore.EventAcquired, l)
			if l.Contended {
				w.emit(lockstore.EventContended, l)
			}
		case prev.ModRevision != l.ModRevision:
			w.emit(lockstore.EventChanged, l)
		case l.Contended && !prev.Contended:
			w.emit(lockstore.EventContended, l)
		}
	}
	w.held = now
	return rev, nil
}

// leaseEnds caches leaseEnd's answers by lease for one batch of events.
type leaseEnds map[string]lockstore.EventKind

// leaseEnd tells how a deleted lock on lease (hex, as in LockInfo; "" for none) ended:
// EventExpired when etcd no longer has the lease (expired or revoked: a holder that releases
// and closes its store at once reads as one), else EventReleased, also when etcd does not
// answer within the watch's timeout.
func (w *etcdWatch) leaseEnd(ctx context.Context, lease string, ends leaseEnds) lockstore.EventKind {
	if kind, ok := ends[lease]; ok {
		return kind
	}
	id, err := strconv.ParseInt(lease, 16, 64)
	if err != nil { // "": no lease
		return lockstore.EventReleased
	}
	rctx, cancel := context.WithTimeout(ctx, w.timeout)
	resp, err := w.in.cli.TimeToLive(rctx, clientv3.LeaseID(id))
	cancel()
	kind := lockstore.EventReleased
	if err == nil && resp.TTL == -1 {
		kind = lockstore.EventExpired
	}
	ends[lease] = kind
	return kind
}

// lockEvent reports a put or deletion of a key under the prefix.
func (w *etcdWatch) lockEvent(ctx context.Context, ev *clientv3.Event, ends leaseEnds) error {
	key, ok := w.in.keyOf(string(ev.Kv.Key), w.pattern, w.skip)
	if !ok {
		return nil
	}
	prev, seen := w.held[key]
	if ev.Type == clientv3.EventTypeDelete {
		l := prev
		if ev.PrevKv != nil && (!seen || prev.CreateRevision != ev.PrevKv.CreateRevision) {
			l = lockOf(key, ev.PrevKv, false, nil)
		} else if !seen {
			l = lockstore.LockInfo{Key: key, StoreKey: string(ev.Kv.Key), TTL: lockstore.NoTTL}
		}
		delete(w.held, key)
		w.emit(w.leaseEnd(ctx, l.Lease, ends), l)
		return nil
	}

	kind := lockstore.EventChanged
	if ev.IsCreate() {
		kind, seen = lockstore.EventAcquired, false
	}
	rctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	var floor *mvccpb.KeyValue
	if !seen || prev.CreateRevision != ev.Kv.CreateRevision {
		// The floor the grant read (it changes only with a deletion of the key).
		fk := FloorKey(string(ev.Kv.Key))
		var err error
		floor, err = getKV(rctx, w.in.cli, fk, clientv3.WithRev(ev.Kv.CreateRevision))
		if err != nil { // compacted: the floor now is the same while the grant lasts
			floor, err = getKV(rctx, w.in.cli, fk)
		}
		if err != nil {
			return fmt.Errorf("read the fence floor of %s: %w", ev.Kv.Key, err)
		}
	}
	l := lockOf(key, ev.Kv, seen && prev.Contended, floor)
	if seen && prev.CreateRevision == ev.Kv.CreateRevision {
		l.Fence = prev.Fence
	}
	locks := []lockstore.LockInfo{l}
	if err := w.in.leaseTTLs(rctx, locks); err != nil {
		return err
	}
	w.held[key] = locks[0]
	w.emit(kind, locks[0])
	return nil
}

// marked reports a put of a waiter mark: a request was refused the lock. Only the first put of
// a grant's mark is reported (a waiter puts it again at each retry), as lockstore.Changes does.
func (w *etcdWatch) marked(ev *clientv3.Event) {
	full := strings.TrimPrefix(string(ev.Kv.Key), waiterPrefix)
	key, ok := w.in.keyOf(full, w.pattern, w.skip)
	if !ok {
		return
	}
	l, seen := w.held[key]
	switch {
	case seen && l.Contended:
		return
	case seen:
		l.Contended = true
		w.held[key] = l
	default:
		l = lockstore.LockInfo{Key: key, StoreKey: full, TTL: lockstore.NoTTL, Contended: true}
	}
	w.emit(lockstore.EventContended, l)
}

// rewatchPause is Store.Watch's pause before it watches again (the waiter, signalled, retries).
const rewatchPause = 100 * time.Millisecond

// Watch implements lockstore.Store: one goroutine's etcd watches signal each deletion of key (a
// release or an expiry) and of any key in its side directory (a read hold's end, which a writer
// waits for; a place leaving the line), from this store's last busy reply for key, so that no
// release in between is missed. When etcd ends the watch (no leader, compaction), the channel is
// signalled and the watch starts again. It ends with ctx, its Close, or the store's.
func (s *Store) Watch(ctx context.Context, key string) (*lockstore.Watch, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	s.mu.Lock()
	rev := s.waitRev[key]
	delete(s.waitRev, key)
	s.mu.Unlock()
	if rev > 0 {
		rev++ // the first revision after the one that found the key held
	}
	c := make(chan struct{}, 1)
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.ctx, cancel) // Close of the store ends it too
	if !s.spawn(func() {
		defer stop()
		defer cancel()
		s.watch(wctx, key, rev, c)
	}) {
		stop()
		cancel()
		return nil, errStoreClosed
	}
	if rev == 0 {
		// No busy reply to start from: a release before now may have gone unheard.
		return lockstore.NewFreshWatch(c, cancel), nil
	}
	return lockstore.NewWatch(c, cancel), nil
}

// watch signals c on each deletion of key or of a key in its side directory from revision rev
// (0: from now) until ctx ends.
func (s *Store) watch(ctx context.Context, key string, rev int64, c chan struct{}) {
	signal := func() {
		select {
		case c <- struct{}{}:
		default: // one pending wake-up is enough
		}
	}
	// A member without a leader cannot tell deletions: it ends the watch rather than go silent.
	lctx := clientv3.WithRequireLeader(ctx)
	revs := [2]int64{rev, rev} // where the watches of key and of its side directory go on (0: now)
	for {
		rctx, cancel := context.WithCancel(lctx)
		watches := [2]clientv3.WatchChan{
			s.cli.Watch(rctx, key, clientv3.WithFilterPut(), clientv3.WithRev(revs[0])),
			s.cli.Watch(rctx, sideDir(key), clientv3.WithFilterPut(), clientv3.WithRev(revs[1]), clientv3.WithPrefix()),
		}
		for {
			resp, i, ok := nextOf(nil, watches)
			if !ok {
				break // a cancelled watch is followed by the channel's close: both start again
			}
			if resp.CompactRevision != 0 {
				revs[i] = 0 // deletions up to the compaction are unknown: assume one
				signal()
			}
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypeDelete {
					signal()
				}
				revs[i] = ev.Kv.ModRevision + 1
			}
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		signal() // etcd ended the watch: the key may have been released meanwhile
		if !sleep(ctx.Done(), rewatchPause) {
			return
		}
	}
}

// nextOf receives the next response of either watch of ws, and which one sent it; ok is false
// when that watch is closed, or when done is closed first (a nil done never is).
func nextOf(done <-chan struct{}, ws [2]clientv3.WatchChan) (resp clientv3.WatchResponse, i int, ok bool) {
	select {
	case <-done:
	case resp, ok = <-ws[0]:
	case resp, ok = <-ws[1]:
		i = 1
	}
	return resp, i, ok
}
