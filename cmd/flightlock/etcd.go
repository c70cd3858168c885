package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/flightlock/flightlock/etcdstore"
	"github.com/flightlock/flightlock/lockstore"
)

// The locks of an etcd store (etcdstore, issue 14), as this CLI reads them:
//   - a lock is the key Etcd.Key + Prefix + rendered key, on its holder's session lease, with
//     the value "<owner> <lease seconds> <holds> <last>[ <meta>]" (etcdstore/value.go); the
//     owner token is never read into lockInfo, so nothing prints it;
//   - its fence is the key's create revision shifted left by etcdFenceShift, plus the offset of
//     its fence floor (etcdstore.FloorKey, rare) as etcdstore/fence.go derives it;
//   - its waiter mark (etcdstore.WaiterKey) is set by every acquisition refused while it is
//     held (Contended here); waiters wait on a watch of the key's deletion, which etcd does
//     not let a client count, so Waiters stays 0;
//   - the store's own keys (floors, marks) live under lockstore.FenceKeyPrefix, outside the
//     default prefix; ls and watch skip them should the prefix cover them.

// etcdFenceShift is etcdstore's fenceShift (etcdstore/fence.go): fence = create revision <<
// 20 + floor offset. TestEtcdCommands checks that the fences printed are the leases' own.
const etcdFenceShift = 20

// etcdClient is a connection to the target's etcd.
type etcdClient struct {
	cli     *clientv3.Client
	target  target
	timeout time.Duration
}

// connectEtcd builds the client that the service's own store would build (EtcdConf.Client:
// hosts, account, TLS), with -timeout as its dial timeout and its logs dropped (failures reach
// the operator as errors), and reads the prefix once, so that a wrong address or account
// fails here with the address in the message.
func connectEtcd(ctx context.Context, t target, timeout time.Duration) (*etcdClient, error) {
	ec := t.etcd
	ec.DialTimeout = timeout
	cli, err := ec.Client()
	if err != nil {
		return nil, fmt.Errorf("cannot reach %s (from %s): %w", t.where(), t.from, err)
	}
	cli = cli.WithLogger(zap.NewNop())
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := cli.Get(pctx, t.keyPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("cannot reach %s (from %s): %w", t.where(), t.from, err)
	}
	return &etcdClient{cli: cli, target: t, timeout: timeout}, nil
}

func (e *etcdClient) close()            { _ = e.cli.Close() }
func (e *etcdClient) where() string     { return e.target.where() }
func (e *etcdClient) keyPrefix() string { return e.target.keyPrefix() }

// keyOf is the rendered key of the etcd key full when ls and watch show it: under the prefix,
// not one of the store's own keys nor a share rule's response, a shadow rule's lock only with
// withShadow, and matching pattern.
func (e *etcdClient) keyOf(full, pattern string, withShadow bool) (string, bool) {
	key, ok := strings.CutPrefix(full, e.keyPrefix())
	if !ok || strings.HasPrefix(full, lockstore.FenceKeyPrefix) || strings.HasPrefix(key, replayPrefix) ||
		!withShadow && strings.HasPrefix(key, shadowPrefix) || !globMatch(pattern, key) {
		return "", false
	}
	return key, true
}

// lockOf reads the lock key kv into a lockInfo without its owner: marked tells whether its
// waiter mark is set, floor is its fence floor key (nil: none). The TTL is left to leaseTTLs.
func (e *etcdClient) lockOf(key string, kv *mvccpb.KeyValue, marked bool, floor *mvccpb.KeyValue) lockInfo {
	l := lockInfo{Key: key, Store: storeEtcd, EtcdKey: string(kv.Key), TTLMillis: -1, Shadow: strings.HasPrefix(key, shadowPrefix),
		CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision, Contended: marked}
	if kv.Lease != 0 {
		l.Lease = strconv.FormatInt(kv.Lease, 16)
	}
	if !parseEtcdLock(&l, string(kv.Value)) {
		l.Unrecognized, l.Contended = string(kv.Value), false
		return l
	}
	l.Fence = kv.CreateRevision<<etcdFenceShift + floorOffset(floor)
	return l
}

// parseEtcdLock fills l from an etcdstore lock value, all but its owner token; false for a
// value etcdstore does not write.
func parseEtcdLock(l *lockInfo, value string) bool {
	f := strings.SplitN(value, " ", 5)
	if len(f) < 4 || f[0] == "" || f[2] == "" {
		return false
	}
	secs, err1 := strconv.ParseInt(f[1], 10, 64)
	last, err2 := strconv.ParseInt(f[3], 10, 64)
	holds := strings.Split(f[2], ",")
	if err1 != nil || err2 != nil || secs <= 0 || last < 0 || (holds[0] != "0" && holds[0] != "1") {
		return false
	}
	l.Own, l.Reentries = holds[0] == "1", holds[1:]
	if len(f) == 5 {
		parseMeta(l, f[4])
	}
	return true
}

// floorOffset is the offset D that a fence floor adds to the fences of the grant that read it
// (etcdstore/fence.go): F - R_F<<etcdFenceShift for a floor F written at revision R_F, at
// least 0; 0 without a floor or for a value that is not a fence.
func floorOffset(floor *mvccpb.KeyValue) int64 {
	if floor == nil {
		return 0
	}
	f, err := strconv.ParseInt(string(floor.Value), 10, 64)
	if err != nil || f < 0 {
		return 0
	}
	return max(f-floor.ModRevision<<etcdFenceShift, 0)
}

// leaseTTLs sets the TTL of each lock to the time left on its lease (whole seconds), asking
// etcd once per lease: a session lease carries every lock of one TTL in one process. A lease
// that etcd no longer has (its keys are being deleted) leaves 0.
func (e *etcdClient) leaseTTLs(ctx context.Context, locks []lockInfo) error {
	left := make(map[string]int64)
	for i, l := range locks {
		if l.Lease == "" {
			continue
		}
		ms, ok := left[l.Lease]
		if !ok {
			id, _ := strconv.ParseInt(l.Lease, 16, 64)
			resp, err := e.cli.TimeToLive(ctx, clientv3.LeaseID(id))
			if err != nil {
				return fmt.Errorf("read lease %s of %s: %w", l.Lease, quoteIfOdd(l.EtcdKey), err)
			}
			ms = max(resp.TTL, 0) * 1000
			left[l.Lease] = ms
		}
		locks[i].TTLMillis = ms
	}
	return nil
}

// snapshot reads, in one transaction (one revision), the keys under the prefix, their waiter
// marks and fence floors, and returns the matching locks sorted by key (etcd's order) with the
// revision they were read at. TTLs are not read.
func (e *etcdClient) snapshot(ctx context.Context, pattern string, withShadow bool) ([]lockInfo, int64, error) {
	p := e.keyPrefix()
	resp, err := e.cli.Txn(ctx).Then(
		clientv3.OpGet(p, clientv3.WithPrefix()),
		clientv3.OpGet(etcdstore.WaiterKey(p), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(etcdstore.FloorKey(p), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", quoteIfOdd(p), err)
	}
	marks := make(map[string]bool)
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		marks[strings.TrimPrefix(string(kv.Key), etcdstore.WaiterKey(""))] = true
	}
	floors := make(map[string]*mvccpb.KeyValue)
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		floors[strings.TrimPrefix(string(kv.Key), etcdstore.FloorKey(""))] = kv
	}
	var locks []lockInfo
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		key, ok := e.keyOf(string(kv.Key), pattern, withShadow)
		if !ok {
			continue
		}
		locks = append(locks, e.lockOf(key, kv, marks[string(kv.Key)], floors[string(kv.Key)]))
	}
	return locks, resp.Header.Revision, nil
}

// list is one range read of the prefix (with the marks and floors), filtered by pattern here.
func (e *etcdClient) list(ctx context.Context, pattern string, withShadow bool, limit int) ([]lockInfo, int, error) {
	locks, _, err := e.snapshot(ctx, pattern, withShadow)
	if err != nil {
		return nil, 0, err
	}
	more := 0
	if limit > 0 && len(locks) > limit {
		locks, more = locks[:limit], len(locks)-limit
	}
	return locks, more, e.leaseTTLs(ctx, locks)
}

// lookup reads one lock in full: value, waiter mark and fence floor in one transaction, then
// the time left on its lease.
func (e *etcdClient) lookup(ctx context.Context, key string) (lockInfo, error) {
	full := e.keyPrefix() + key
	resp, err := e.cli.Txn(ctx).Then(
		clientv3.OpGet(full),
		clientv3.OpGet(etcdstore.WaiterKey(full), clientv3.WithKeysOnly()),
		clientv3.OpGet(etcdstore.FloorKey(full)),
	).Commit()
	if err != nil {
		return lockInfo{}, fmt.Errorf("read %s: %w", quoteIfOdd(full), err)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return lockInfo{}, fmt.Errorf("%s (etcd key %q): %w", quoteIfOdd(key), full, errNotHeld)
	}
	var floor *mvccpb.KeyValue
	if f := resp.Responses[2].GetResponseRange().Kvs; len(f) > 0 {
		floor = f[0]
	}
	l := e.lockOf(key, kvs[0], len(resp.Responses[1].GetResponseRange().Kvs) > 0, floor)
	l.FenceCounterKey = etcdstore.FloorKey(full)
	if floor != nil {
		if n, err := strconv.ParseInt(string(floor.Value), 10, 64); err == nil {
			l.FenceCounter = &n
		}
	}
	locks := []lockInfo{l}
	if err := e.leaseTTLs(ctx, locks); err != nil {
		return lockInfo{}, err
	}
	return locks[0], nil
}

// forceUnlock deletes the key only while it is still at the revision lookup read (the same
// grant with the same holds), with its waiter mark, in one transaction. Waiters elsewhere
// watch the key's deletion, so the delete wakes them; the mark goes as the store's own
// release deletes it. The holder learns of the loss at its next refresh (the key is gone).
//
// Like the death of a holder, a forced release writes no fence floor: the next grant's fence
// exceeds the holder's as long as it handed out fewer than 2^21 fences under its grant
// (etcdstore/fence.go), far above flightlock's handoff bound.
func (e *etcdClient) forceUnlock(ctx context.Context, l lockInfo) (unlockResult, error) {
	resp, err := e.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(l.EtcdKey), "=", l.ModRevision)).
		Then(clientv3.OpDelete(l.EtcdKey), clientv3.OpDelete(etcdstore.WaiterKey(l.EtcdKey))).
		Else(clientv3.OpGet(l.EtcdKey)).
		Commit()
	if err != nil {
		return unlockResult{}, fmt.Errorf("unlock %s: %w", quoteIfOdd(l.EtcdKey), err)
	}
	if !resp.Succeeded {
		now := "released since"
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			if kvs[0].CreateRevision == l.CreateRevision {
				now = "the same grant, its holds changed"
			} else {
				now = "now held by a new grant at revision " + strconv.FormatInt(kvs[0].CreateRevision, 10)
			}
		}
		return unlockResult{}, fmt.Errorf("%s changed after it was read (%s); nothing removed", quoteIfOdd(l.EtcdKey), now)
	}
	marked := resp.Responses[1].GetResponseDeleteRange().Deleted > 0
	return unlockResult{WaiterMark: &marked}, nil
}

// watch reads the matching locks, then watches the prefix and the waiter marks from the next
// revision, so nothing between the read and the watch is missed: a creation of a lock key is
// an acquisition, another put of it a change of its holds, a deletion a release or, when the
// key's lease is gone by then, an expiry (leaseEnd), a put of its waiter mark contention (every
// refused acquisition writes it; so does a re-entry by the holder's own owner). The two
// watches are separate streams: a contention may print before the acquisition it followed
// when both come within a moment.
//
// When etcd ends the watch (a compaction past the watch's revision, a member without a
// leader, a read that failed), watch resumes from a fresh read, reporting what changed
// meanwhile, and gives up only when etcd stays unreachable for -timeout.
func (e *etcdClient) watch(ctx context.Context, w *watcher) error {
	w.mode = "etcd watch"
	rctx, cancel := context.WithTimeout(ctx, e.timeout)
	locks, rev, err := e.snapshot(rctx, w.pattern, w.o.shadow)
	if err == nil {
		err = e.leaseTTLs(rctx, locks)
	}
	cancel()
	if err != nil {
		return quiet(ctx, err)
	}
	for _, l := range locks {
		w.held[l.Key] = l
	}
	w.started()
	w.draw()
	for {
		ended := e.follow(ctx, w, rev)
		if ctx.Err() != nil {
			return nil
		}
		if rev, err = e.resume(ctx, w, ended); err != nil {
			return quiet(ctx, err)
		}
	}
}

// follow watches from rev until ctx ends (nil) or etcd ends the watch (why it did).
func (e *etcdClient) follow(ctx context.Context, w *watcher, rev int64) error {
	// WithRequireLeader: a member cut off from its cluster ends the watch (etcdserver: no
	// leader) instead of going silent, so that resume can read from a member that has one.
	wctx, stop := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer stop()
	p := e.keyPrefix()
	lockEvents := e.cli.Watch(wctx, p, clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithPrevKV())
	markEvents := e.cli.Watch(wctx, etcdstore.WaiterKey(p), clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithFilterDelete())
	for {
		var (
			resp clientv3.WatchResponse
			ok   bool
			mark bool
		)
		select {
		case <-ctx.Done():
			return nil
		case resp, ok = <-lockEvents:
		case resp, ok = <-markEvents:
			mark = true
		}
		if !ok {
			return errors.New("etcd closed the watch")
		}
		if err := resp.Err(); err != nil {
			return err
		}
		ends := make(leaseEnds) // a lease's end deletes all of its keys in one response
		for _, ev := range resp.Events {
			if mark {
				e.marked(w, ev)
			} else if err := e.lockEvent(ctx, w, ev, ends); err != nil {
				return err
			}
		}
		w.draw()
	}
}

// Backoff of resume's reads while etcd does not answer.
const (
	resumeFirstBackoff = 100 * time.Millisecond
	resumeMaxBackoff   = 2 * time.Second
)

// resume reads the matching locks again after etcd ended the watch for the reason ended,
// says that the watch resumed, reports how the locks differ from those held as last seen (the
// ends first, by key, then the grants in the read's order), and returns the revision read. It retries the read with a backoff and gives up after -timeout,
// the bound of the command's other etcd calls.
func (e *etcdClient) resume(ctx context.Context, w *watcher, ended error) (int64, error) {
	rctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	var (
		locks []lockInfo
		rev   int64
		err   error
	)
	for backoff := resumeFirstBackoff; ; backoff = min(2*backoff, resumeMaxBackoff) {
		locks, rev, err = e.snapshot(rctx, w.pattern, w.o.shadow)
		if err == nil {
			err = e.leaseTTLs(rctx, locks)
		}
		if err == nil {
			break
		}
		select {
		case <-rctx.Done():
			return 0, fmt.Errorf("resume the watch (it ended: %v): %w", ended, err)
		case <-time.After(backoff):
		}
	}

	now := make(map[string]lockInfo, len(locks))
	for _, l := range locks {
		now[l.Key] = l
	}
	e.resumed(w, ended, rev, len(now))
	ends := make(leaseEnds)
	for _, key := range slices.Sorted(maps.Keys(w.held)) {
		if _, ok := now[key]; !ok {
			w.emit(e.leaseEnd(ctx, w.held[key].Lease, ends), w.held[key])
		}
	}
	for _, l := range locks {
		prev, seen := w.held[l.Key]
		switch {
		case seen && prev.CreateRevision != l.CreateRevision:
			w.emit(e.leaseEnd(ctx, prev.Lease, ends), prev) // its grant ended, and another began
			fallthrough
		case !seen:
			w.emit(evAcquired, l)
			if l.Contended {
				w.emit(evContended, l)
			}
		case prev.ModRevision != l.ModRevision:
			w.emit(evChanged, l)
		case l.Contended && !prev.Contended:
			w.emit(evContended, l)
		}
	}
	w.held = now
	return rev, nil
}

// resumed tells the operator that the watch started again, and why: a line among the event
// lines (a JSON object among the JSON events), or in the screen's header.
func (e *etcdClient) resumed(w *watcher, ended error, rev int64, held int) {
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
		w.draw()
	default:
		fmt.Fprintf(w.out.w, "%s %-9s at revision %d (the watch ended: %v); %d held\n",
			now.Format("15:04:05.000"), evResumed, rev, ended, held)
	}
}

// leaseEnds caches leaseEnd's answers by lease for one batch of events.
type leaseEnds map[string]string

// leaseEnd tells how a deleted lock on lease (hex, as lockInfo has it; "" for none) ended:
// evExpired when etcd no longer has the lease (a TTL of -1: its holder's process stopped
// keeping it alive, or closed its store, which revokes it), else evReleased (by its holder,
// or by unlock). A holder that releases and closes its store within a moment reads as an
// expiry. When etcd does not answer within -timeout, it says evReleased, as it cannot tell.
func (e *etcdClient) leaseEnd(ctx context.Context, lease string, ends leaseEnds) string {
	if lease == "" {
		return evReleased
	}
	if kind, ok := ends[lease]; ok {
		return kind
	}
	id, err := strconv.ParseInt(lease, 16, 64)
	if err != nil {
		return evReleased
	}
	rctx, cancel := context.WithTimeout(ctx, e.timeout)
	resp, err := e.cli.TimeToLive(rctx, clientv3.LeaseID(id))
	cancel()
	kind := evReleased
	if err == nil && resp.TTL == -1 {
		kind = evExpired
	}
	ends[lease] = kind
	return kind
}

// lockEvent reports a put or deletion of a key under the prefix.
func (e *etcdClient) lockEvent(ctx context.Context, w *watcher, ev *clientv3.Event, ends leaseEnds) error {
	key, ok := e.keyOf(string(ev.Kv.Key), w.pattern, w.o.shadow)
	if !ok {
		return nil
	}
	prev, seen := w.held[key]
	if ev.Type == clientv3.EventTypeDelete {
		l := prev
		if ev.PrevKv != nil && (!seen || prev.CreateRevision != ev.PrevKv.CreateRevision) {
			l = e.lockOf(key, ev.PrevKv, false, nil)
		} else if !seen {
			l = lockInfo{Key: key, Store: storeEtcd, EtcdKey: string(ev.Kv.Key), TTLMillis: -1}
		}
		delete(w.held, key)
		w.emit(e.leaseEnd(ctx, l.Lease, ends), l)
		return nil
	}

	kind := evChanged
	if ev.IsCreate() {
		kind, seen = evAcquired, false
	}
	var floor *mvccpb.KeyValue
	if !seen || prev.CreateRevision != ev.Kv.CreateRevision {
		// The floor the grant read: the one at its revision (a floor changes only with a
		// deletion of the key).
		rctx, cancel := context.WithTimeout(ctx, e.timeout)
		resp, err := e.cli.Get(rctx, etcdstore.FloorKey(string(ev.Kv.Key)), clientv3.WithRev(ev.Kv.CreateRevision))
		if err != nil { // compacted: the floor now is the same while the grant lasts
			resp, err = e.cli.Get(rctx, etcdstore.FloorKey(string(ev.Kv.Key)))
		}
		cancel()
		if err != nil {
			return fmt.Errorf("read the fence floor of %s: %w", quoteIfOdd(string(ev.Kv.Key)), err)
		}
		if len(resp.Kvs) > 0 {
			floor = resp.Kvs[0]
		}
	}
	l := e.lockOf(key, ev.Kv, seen && prev.Contended, floor)
	if seen && prev.CreateRevision == ev.Kv.CreateRevision {
		l.Fence = prev.Fence
	}
	rctx, cancel := context.WithTimeout(ctx, e.timeout)
	locks := []lockInfo{l}
	err := e.leaseTTLs(rctx, locks)
	cancel()
	if err != nil {
		return err
	}
	w.held[key] = locks[0]
	w.emit(kind, locks[0])
	return nil
}

// marked reports a put of a waiter mark: a request was refused the lock.
func (e *etcdClient) marked(w *watcher, ev *clientv3.Event) {
	full := strings.TrimPrefix(string(ev.Kv.Key), etcdstore.WaiterKey(""))
	key, ok := e.keyOf(full, w.pattern, w.o.shadow)
	if !ok {
		return
	}
	l, seen := w.held[key]
	if !seen {
		l = lockInfo{Key: key, Store: storeEtcd, EtcdKey: full, TTLMillis: -1}
	}
	l.Contended = true
	if seen {
		w.held[key] = l
	}
	w.emit(evContended, l)
}

// globMatch reports whether s matches pattern as Redis's SCAN MATCH reads it (stringmatchlen,
// byte by byte): * any run, ? one byte, [abc], [^abc] and [a-z] sets, \ escapes the next
// byte; an unterminated [ set ends the pattern.
func globMatch(pattern, s string) bool {
	for len(pattern) > 0 {
		switch pattern[0] {
		case '*':
			for len(pattern) > 1 && pattern[1] == '*' {
				pattern = pattern[1:]
			}
			if len(pattern) == 1 {
				return true
			}
			for i := 0; i <= len(s); i++ {
				if globMatch(pattern[1:], s[i:]) {
					return true
				}
			}
			return false
		case '?':
			if len(s) == 0 {
				return false
			}
			s = s[1:]
		case '[':
			if len(s) == 0 {
				return false
			}
			pattern = pattern[1:]
			not := len(pattern) > 0 && pattern[0] == '^'
			if not {
				pattern = pattern[1:]
			}
			match := false
			for {
				if len(pattern) == 0 {
					break // unterminated: as Redis, the set ends the pattern
				}
				if pattern[0] == '\\' && len(pattern) >= 2 {
					pattern = pattern[1:]
					match = match || pattern[0] == s[0]
				} else if pattern[0] == ']' {
					break
				} else if len(pattern) >= 3 && pattern[1] == '-' {
					lo, hi := pattern[0], pattern[2]
					if lo > hi {
						lo, hi = hi, lo
					}
					match = match || lo <= s[0] && s[0] <= hi
					pattern = pattern[2:]
				} else {
					match = match || pattern[0] == s[0]
				}
				pattern = pattern[1:]
			}
			if match == not {
				return false
			}
			s = s[1:]
			if len(pattern) == 0 {
				return len(s) == 0
			}
		case '\\':
			if len(pattern) >= 2 {
				pattern = pattern[1:]
			}
			fallthrough
		default:
			if len(s) == 0 || pattern[0] != s[0] {
				return false
			}
			s = s[1:]
		}
		pattern = pattern[1:]
	}
	return len(s) == 0
}
