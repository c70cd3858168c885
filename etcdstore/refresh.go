package etcdstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/flightlock/flightlock/lockstore"
)

// Refresh implements lockstore.Store: RefreshAll of one lock.
func (s *Store) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	return s.RefreshAll(ctx, []lockstore.Renewal{{Key: key, Owner: owner, TTL: ttl}})[0]
}

// RefreshAll implements lockstore.Store. When it returns nil for a lock, the lock lives at
// least its TTL from the call: a keep-alive of the key's lease sent after the call succeeded
// (one per lease, shared with the store's others), and a later read found the key the owner's
// and on that lease (one linearizable read per --max-txn-ops keys). A read owner's refresh
// covers its own read hold. A lease etcd no longer has lost every key on it: ErrNotHeld, as is
// a lock the reaper is releasing (its guarantee ran out). A lease the store did not know of (a
// lock another store wrote) is kept alive after the read. A TTL longer than the lease fails.
func (s *Store) RefreshAll(ctx context.Context, batch []lockstore.Renewal) []error {
	start := time.Now()
	errs := make([]error, len(batch))
	kas := make(map[clientv3.LeaseID]*keepAlive) // of known leases: sent at once, beside the reads
	var keys []string                            // the hold keys to read, each once after Compact
	for i, r := range batch {
		if errs[i] = s.check(r.Owner, r.TTL, r.Key); errs[i] != nil {
			continue
		}
		e, ok := s.touch(r.Key, r.Owner, start.Add(r.TTL), false)
		if e.reaping {
			errs[i] = lockstore.ErrNotHeld // the entry stays the reaper's, to retry a failed release
			continue
		}
		if ok && e.lease != 0 && kas[e.lease] == nil {
			kas[e.lease] = s.startKeepAlive(ctx, e.lease, start)
		}
		keys = append(keys, holdKey(r.Key, r.Owner))
	}
	slices.Sort(keys)
	kvs, readErrs := s.readKeys(ctx, slices.Compact(keys))
	for i, r := range batch {
		if errs[i] != nil {
			continue
		}
		hk := holdKey(r.Key, r.Owner)
		if err := readErrs[hk]; err != nil {
			errs[i] = fmt.Errorf("flightlock: refresh %q: %w", r.Key, err)
			continue
		}
		kv := kvs[hk]
		// A read hold's key names its owner; a lock key's value does.
		if kv == nil || !lockstore.IsReadOwner(r.Owner) && !ownedBy(kv.Value, r.Owner) {
			s.forget(r.Key, r.Owner)
			errs[i] = lockstore.ErrNotHeld
			continue
		}
		id := clientv3.LeaseID(kv.Lease)
		s.update(r.Key, r.Owner, func(e *heldKey) { e.lease = id }) // the owner's release may have moved it
		if kas[id] == nil {
			kas[id] = s.startKeepAlive(ctx, id, start) // sent now, after start
		}
	}
	for i, r := range batch {
		if errs[i] != nil {
			continue
		}
		secs, err := kas[clientv3.LeaseID(kvs[holdKey(r.Key, r.Owner)].Lease)].wait(ctx)
		switch {
		case errors.Is(err, errLeaseGone):
			s.forget(r.Key, r.Owner)
			errs[i] = lockstore.ErrNotHeld
		case err != nil:
			errs[i] = fmt.Errorf("flightlock: refresh %q: %w", r.Key, err)
		case time.Duration(secs)*time.Second < r.TTL:
			errs[i] = fmt.Errorf("flightlock: refresh %q for %v: its etcd lease lasts %ds, so this TTL cannot be honoured",
				r.Key, r.TTL, secs)
		}
	}
	for _, ka := range kas {
		ka.join()
	}
	return errs
}

// touch returns a copy of the entry of key for owner after moving its until to until (never
// back), before a refresh or pass goes on the wire, so that the reaper cannot release a lock
// whose refresh is on the wire, nor a pass report kept a lock the reaper deleted. ok is false
// (the copy's reaping set) when the reaper has the entry, whose release nothing calls back: a
// refresh is not held and a pass releases. A pass also fails when the guarantee ran out.
func (s *Store) touch(key, owner string, until time.Time, pass bool) (heldKey, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.held[entryKey{key, owner}]
	switch {
	case e == nil:
		return heldKey{}, false
	case e.reaping || pass && time.Now().After(e.until):
		return *e, false
	}
	e.until = later(e.until, until)
	return *e, true
}

// keepAlive is one keep-alive of a lease: for the store's own, shared by every caller that
// queued before it was sent; for another's, a call of its own on a goroutine.
type keepAlive struct {
	done   chan struct{} // closed once secs and err are set; nil when none is sent
	shared bool
	secs   int64
	err    error
}

// startKeepAlive starts a keep-alive of id sent after t.
func (s *Store) startKeepAlive(ctx context.Context, id clientv3.LeaseID, t time.Time) *keepAlive {
	if l := s.ourLease(id); l != nil {
		return s.ownKeepAlive(l, t)
	}
	k := &keepAlive{done: make(chan struct{})}
	go func() {
		defer close(k.done)
		resp, err := s.cli.KeepAliveOnce(ctx, id)
		switch {
		case err == nil:
			k.secs = resp.TTL
		case isLeaseNotFound(err):
			k.err = errLeaseGone
		default:
			k.err = fmt.Errorf("flightlock: keep etcd lease %x alive: %w", int64(id), err)
		}
	}()
	return k
}

// wait returns the lease's TTL in seconds once the keep-alive succeeded; a shared one is given
// up when ctx ends (a call of its own is bounded by ctx already).
func (k *keepAlive) wait(ctx context.Context) (int64, error) {
	if k.shared {
		select {
		case <-k.done:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	k.join()
	return k.secs, k.err
}

// join waits for a call's goroutine, so that none outlives its caller.
func (k *keepAlive) join() {
	if !k.shared && k.done != nil {
		<-k.done
	}
}

// readKeys reads keys with concurrent read transactions of at most maxTxnOps gets each; a
// transaction that fails sets the error of each of its keys.
func (s *Store) readKeys(ctx context.Context, keys []string) (map[string]*mvccpb.KeyValue, map[string]error) {
	kvs, errs := make(map[string]*mvccpb.KeyValue, len(keys)), make(map[string]error)
	var mu sync.Mutex // guards kvs and errs
	var wg sync.WaitGroup
	for chunk := range slices.Chunk(keys, s.maxTxnOps) {
		wg.Go(func() {
			ops := make([]clientv3.Op, len(chunk))
			for i, k := range chunk {
				ops[i] = clientv3.OpGet(k)
			}
			resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
			mu.Lock()
			defer mu.Unlock()
			for i, k := range chunk {
				if err != nil {
					errs[k] = err
				} else {
					kvs[k] = firstKV(resp.Responses[i])
				}
			}
		})
	}
	wg.Wait()
	return kvs, errs
}

// TTL implements lockstore.Store: the whole seconds left on key's lease (its first read
// hold's, when held for reading); ErrNotHeld when nobody holds key. Two round trips: for operators.
func (s *Store) TTL(ctx context.Context, key string) (time.Duration, error) {
	if err := checkKey(key); err != nil {
		return 0, err
	}
	resp, err := s.cli.Txn(ctx).Then(
		clientv3.OpGet(key),
		clientv3.OpGet(readDir(key), clientv3.WithPrefix(), clientv3.WithLimit(1)),
	).Commit()
	if err != nil {
		return 0, fmt.Errorf("flightlock: ttl %q: %w", key, err)
	}
	kv := cmp.Or(firstKV(resp.Responses[0]), firstKV(resp.Responses[1]))
	if kv == nil {
		return 0, lockstore.ErrNotHeld
	}
	id := clientv3.LeaseID(kv.Lease)
	if id == clientv3.NoLease {
		return 0, nil // no expiry: not written by this store
	}
	ttl, err := s.cli.TimeToLive(ctx, id)
	if err != nil {
		return 0, fmt.Errorf("flightlock: ttl %q: %w", key, err)
	}
	if ttl.TTL < 0 {
		return 0, lockstore.ErrNotHeld // the lease expired since the read
	}
	return time.Duration(ttl.TTL) * time.Second, nil
}
