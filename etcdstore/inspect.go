package etcdstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/flightlock/flightlock/internal/glob"
	"github.com/flightlock/flightlock/lockstore"
)

// Inspector is the lockstore.Inspector of the locks a Store keeps under one prefix. Create it
// with NewInspector. It never reads an owner token into a LockInfo: a propagated token lets its
// bearer re-enter the lock, so tools cannot print what they are never given.
//
// Contended is the waiter mark. Waiters stays 0: etcd does not let a client count watches. The
// store's own keys are never listed. A key held for reading is listed from its read holds, with
// Readers their count and no owner; Queued counts the places in a held key's fair line.
type Inspector struct {
	cli    *clientv3.Client
	prefix string
}

var _ lockstore.Inspector = (*Inspector)(nil)

// NewInspector returns the Inspector of the locks under prefix (the Locker's WithPrefix; with
// the middleware, Etcd.Key + Prefix) on cli, which it leaves open.
func NewInspector(cli *clientv3.Client, prefix string) *Inspector {
	return &Inspector{cli: cli, prefix: prefix}
}

// keyOf is the rendered key of the etcd key full when it is listed: under the prefix, not the
// store's own nor refused by skip, and matching pattern.
func (in *Inspector) keyOf(full, pattern string, skip func(string) bool) (string, bool) {
	key, ok := strings.CutPrefix(full, in.prefix)
	if !ok || strings.HasPrefix(full, lockstore.FenceKeyPrefix) || skip != nil && skip(key) || !glob.Match(pattern, key) {
		return "", false
	}
	return key, true
}

// newInfo is the LockInfo of a grant at createRev that read the fence floor floor, TTL unread.
func newInfo(key, full string, lease, createRev, modRev int64, marked bool, floor *mvccpb.KeyValue) lockstore.LockInfo {
	d, _ := floorOffset(floor) // 0 for a floor that is not a fence: the next grant refuses it
	l := lockstore.LockInfo{Key: key, StoreKey: full, TTL: lockstore.NoTTL, CreateRevision: createRev, ModRevision: modRev,
		Contended: marked, Fence: createRev<<fenceShift + d}
	if lease != 0 {
		l.Lease = strconv.FormatInt(lease, 16)
	}
	return l
}

// lockOf reads the lock key kv, with its waiter mark (marked) and fence floor.
func lockOf(key string, kv *mvccpb.KeyValue, marked bool, floor *mvccpb.KeyValue) lockstore.LockInfo {
	v, ok := parseValue(kv.Value)
	holds := strings.Split(v.holds, ",")
	l := newInfo(key, string(kv.Key), kv.Lease, kv.CreateRevision, kv.ModRevision, marked, floor)
	if !ok || holds[0] != "0" && holds[0] != "1" {
		l.Unrecognized, l.Fence, l.Contended = cmp.Or(string(kv.Value), lockstore.EmptyValue), 0, false
		return l
	}
	l.Own, l.Borrowed = holds[0] == "1", holds[1:]
	l.ParseHolder(v.meta)
	return l
}

// leaseTTLs sets each lock's TTL to the whole seconds left on its lease (0 when etcd no longer
// has it), asking etcd once per lease.
func (in *Inspector) leaseTTLs(ctx context.Context, locks []lockstore.LockInfo) error {
	left := make(map[string]int64)
	for i, l := range locks {
		if l.Lease == "" {
			continue
		}
		secs, ok := left[l.Lease]
		if !ok {
			id, _ := strconv.ParseInt(l.Lease, 16, 64)
			resp, err := in.cli.TimeToLive(ctx, clientv3.LeaseID(id))
			if err != nil {
				return fmt.Errorf("read lease %s of %s: %w", l.Lease, l.StoreKey, err)
			}
			secs = max(resp.TTL, 0)
			left[l.Lease] = secs
		}
		locks[i].TTL = time.Duration(secs) * time.Second
	}
	return nil
}

// snapshot reads in one transaction the lock keys under the prefix (one: full alone, with its
// fence counter) with their marks, floors and side keys, and returns those keyOf lists, sorted by
// key: the first limit (0: all) with their TTLs, how many more there are, and the revision read.
func (in *Inspector) snapshot(ctx context.Context, full string, one bool, keyOf func(string) (string, bool), limit int) ([]lockstore.LockInfo, int, int64, error) {
	rng, side := []clientv3.OpOption{clientv3.WithPrefix()}, sidePrefix
	if one {
		rng, side = nil, sideDir(full)
	}
	resp, err := in.cli.Txn(ctx).Then(
		clientv3.OpGet(full, rng...),
		clientv3.OpGet(WaiterKey(full), append(rng, clientv3.WithKeysOnly())...),
		clientv3.OpGet(FloorKey(full), rng...),
		// Side directories start with the key's length, so the prefix's are not one range: all
		// are read, and other prefixes' left out here.
		clientv3.OpGet(side, clientv3.WithPrefix(), clientv3.WithKeysOnly()),
	).Commit()
	if err != nil {
		return nil, 0, 0, fmt.Errorf("read %s: %w", full, err)
	}
	marks, floors := make(map[string]bool), make(map[string]*mvccpb.KeyValue)
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		marks[strings.TrimPrefix(string(kv.Key), waiterPrefix)] = true
	}
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		floors[strings.TrimPrefix(string(kv.Key), floorPrefix)] = kv
	}
	sides := make(map[string]*sideCount)
	for _, kv := range resp.Responses[3].GetResponseRange().Kvs {
		full, kind, _, ok := parseSideKey(string(kv.Key))
		if !ok || !strings.HasPrefix(full, in.prefix) {
			continue
		}
		if sides[full] == nil {
			sides[full] = &sideCount{}
		}
		sides[full].add(kind, kv)
	}
	var locks []lockstore.LockInfo
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		key, ok := keyOf(string(kv.Key))
		if !ok {
			continue
		}
		l := lockOf(key, kv, marks[string(kv.Key)], floors[string(kv.Key)])
		if sc := sides[string(kv.Key)]; sc != nil && l.Unrecognized == "" {
			l.Readers, l.Queued = sc.readers, sc.queued
		}
		delete(sides, string(kv.Key))
		locks = append(locks, l)
	}
	for full, sc := range sides {
		key, ok := keyOf(full)
		if !ok || sc.readers == 0 {
			continue // a line of a free key is a moment between two grants
		}
		l := newInfo(key, full, sc.lease, sc.createRev, sc.modRev, marks[full], floors[full])
		l.Readers, l.Queued = sc.readers, sc.queued
		locks = append(locks, l)
	}
	// etcd returned the lock keys sorted; the keys held for reading come after them.
	slices.SortFunc(locks, func(a, b lockstore.LockInfo) int { return strings.Compare(a.Key, b.Key) })
	if one && len(locks) == 1 {
		locks[0].FenceCounterKey = FloorKey(full)
		if floor := floors[full]; floor != nil {
			if n, err := strconv.ParseInt(string(floor.Value), 10, 64); err == nil {
				locks[0].FenceCounter = &n
			}
		}
	}
	more := 0
	if limit > 0 && len(locks) > limit {
		locks, more = locks[:limit], len(locks)-limit
	}
	return locks, more, resp.Header.Revision, in.leaseTTLs(ctx, locks)
}

// listed is snapshot of the locks that pattern and skip list (keyOf).
func (in *Inspector) listed(ctx context.Context, pattern string, skip func(string) bool, limit int) ([]lockstore.LockInfo, int, int64, error) {
	return in.snapshot(ctx, in.prefix, false, func(full string) (string, bool) { return in.keyOf(full, pattern, skip) }, limit)
}

// sideCount sums up the side keys of one lock key: its read holds and places in line.
type sideCount struct {
	readers, queued int
	lease           int64 // the lease of one read hold
	// createRev and modRev are the largest of the read holds': the fence of the latest read
	// grant, and the revision ForceUnlock removes the read holds up to.
	createRev, modRev int64
}

func (c *sideCount) add(kind byte, kv *mvccpb.KeyValue) {
	switch kind {
	case sideRead:
		c.readers++
		c.lease = cmp.Or(c.lease, kv.Lease)
		c.createRev, c.modRev = max(c.createRev, kv.CreateRevision), max(c.modRev, kv.ModRevision)
	case sidePlace:
		c.queued++
	}
}

// List implements lockstore.Inspector: one snapshot, then the leases of the first opts.Limit.
func (in *Inspector) List(ctx context.Context, pattern string, opts lockstore.ListOptions) ([]lockstore.LockInfo, int, error) {
	locks, more, _, err := in.listed(ctx, pattern, opts.Skip, opts.Limit)
	return locks, more, err
}

// Lookup implements lockstore.Inspector: a snapshot of key alone.
func (in *Inspector) Lookup(ctx context.Context, key string) (lockstore.LockInfo, error) {
	full := in.prefix + key
	locks, _, _, err := in.snapshot(ctx, full, true, func(string) (string, bool) { return key, true }, 0)
	switch {
	case err != nil:
		return lockstore.LockInfo{}, err
	case len(locks) == 0:
		return lockstore.LockInfo{}, fmt.Errorf("etcd key %q: %w", full, lockstore.ErrNotHeld)
	}
	return locks[0], nil
}

// ForceUnlock implements lockstore.Inspector: it deletes the key and its waiter mark in one
// transaction, only while the key is at the revision l was read at (the same grant and holds).
// The deletion wakes the waiters; the holder learns of the loss at its next refresh. Like a
// holder's death, it writes no fence floor (the Locker's handoff bound keeps the next grant's
// fence above the holder's). A key held for reading loses every read hold instead, only while
// no writer holds it and no read hold is newer than l (one the operator did not agree to
// remove). When nothing is removed, a Lookup tells what the key holds now.
func (in *Inspector) ForceUnlock(ctx context.Context, l lockstore.LockInfo) (int, error) {
	if l.ModRevision == 0 || l.Unrecognized != "" {
		return 0, fmt.Errorf("%q is not a flightlock lock", l.StoreKey)
	}
	// A key held for reading has no lock key, only read holds.
	read, rd := l.Readers > 0 && !l.Own && len(l.Borrowed) == 0, readDir(l.StoreKey)
	cmps, del := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(l.StoreKey), "=", l.ModRevision)}, clientv3.OpDelete(l.StoreKey)
	if read {
		cmps = []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(l.StoreKey), "=", 0),
			clientv3.Compare(clientv3.ModRevision(rd), "<", l.ModRevision+1).WithPrefix()}
		del = clientv3.OpDelete(rd, clientv3.WithPrefix())
	}
	resp, err := in.cli.Txn(ctx).If(cmps...).Then(del, clientv3.OpDelete(WaiterKey(l.StoreKey))).Commit()
	switch {
	case err != nil:
		return 0, err
	case !resp.Succeeded || read && resp.Responses[0].GetResponseDeleteRange().Deleted == 0: // every read hold ended since
		changed := &lockstore.ChangedError{}
		if now, err := in.Lookup(ctx, l.Key); err == nil {
			changed.Now = &now
		}
		return 0, changed
	}
	return int(resp.Responses[1].GetResponseDeleteRange().Deleted), nil // one mark at most
}
