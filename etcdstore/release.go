package etcdstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flightlock/flightlock/lockstore"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Release implements lockstore.Store. The common release, of a lock this store acquired and
// nobody re-entered, is one transaction on the exact revision the store wrote:
//
//	if   mod_revision(key) == written
//	then delete(key); delete(waiter); [put or delete the fence floor]
//
// Else the key is read and rewritten, compared on the revision read, until that holds: giving
// up one hold rewrites the value (with lastFence when holds remain), the last deletes the key.
// When only other processes' re-entries remain, the key moves to a lease of its own that only
// their refreshes keep alive, so it does not outlive them on this session lease.
//
// It returns 1 when the deleted lock carried a waiter mark (its waiter's Watch fires), else 0.
// A failed release is retried in the background until etcd answers. Giving back an acquisition
// the store never saw granted costs no round trip (giveBackLater), so that it never holds the
// caller past the deadline that cut it short.
func (s *Store) Release(ctx context.Context, key, owner, hold string, lastFence int64) (int, error) {
	// Any valid TTL: none is asked.
	if err := cmp.Or(s.check(owner, time.Second, key), lockstore.CheckHold(hold, true)); err != nil {
		return 0, err
	}
	lastFence = max(lastFence, 0)
	if hold == "" {
		if given, err := s.giveBackLater(key, owner, lastFence); given {
			return 0, err
		}
	}
	return s.release(ctx, key, owner, hold, lastFence)
}

// giveBackLater gives back, with no round trip, owner's own hold on key when the store never
// saw it granted, and reports whether it did: ErrNotHeld when no request went out; nil when its
// outcome is unknown (no create revision, no named hold) or it is a failed release, made due at
// once for the reaper. A grant the store knows of, or a lock it did not take, goes on the wire.
func (s *Store) giveBackLater(key, owner string, lastFence int64) (bool, error) {
	k := entryKey{key, owner}
	s.mu.Lock()
	e := s.held[k]
	switch {
	case e == nil:
		_, unsent := s.unsent[k]
		delete(s.unsent, k)
		s.mu.Unlock()
		if unsent {
			return true, lockstore.ErrNotHeld
		}
		return false, nil
	case !e.own || e.createRev != 0 || len(e.holds) > 0:
		s.mu.Unlock()
		return false, nil
	}
	e.last = max(e.last, lastFence)
	e.until = time.Time{}
	s.mu.Unlock()
	s.startReaper(time.Now())
	return true, nil
}

// release is Release on the wire; a failure is recorded for the store to retry (releaseFailed).
func (s *Store) release(ctx context.Context, key, owner, hold string, lastFence int64) (n int, err error) {
	defer func() {
		if err != nil && !errors.Is(err, lockstore.ErrNotHeld) {
			s.releaseFailed(key, owner, hold, lastFence)
		}
	}()
	if lockstore.IsReadOwner(owner) {
		return s.releaseShared(ctx, key, owner, hold)
	}
	// The one-transaction release. No else branch: a read there costs every release, and the
	// compare fails only for a lock re-entered from elsewhere or lost, handled below.
	if e, ok := s.entry(key, owner); ok && hold == "" && e.simple && e.own && e.modRev != 0 {
		resp, err := s.atRevision(ctx, key, e.modRev, deleteOps(key, e.createRev, max(e.fence, e.last, lastFence), e.hadFloor), nil)
		if err != nil {
			return 0, fmt.Errorf("flightlock: release %q: %w", key, err)
		}
		if resp.Succeeded {
			s.forget(key, owner)
			return int(resp.Responses[1].GetResponseDeleteRange().Deleted), nil
		}
	}
	reads := []clientv3.Op{clientv3.OpGet(key), clientv3.OpGet(FloorKey(key))}
	var read *clientv3.TxnResponse // the key and its floor as last read (a failed compare's Else)
	var moved clientv3.LeaseID     // a lease granted to move the key onto; revoked if unused
	defer func() {
		if moved != 0 { // on a goroutine of the store; one it cannot revoke expires unused
			s.spawn(func() { _ = s.revoke(s.ctx, moved) })
		}
	}()
	for {
		if read == nil {
			if read, err = s.cli.Txn(ctx).Then(reads...).Commit(); err != nil {
				return 0, fmt.Errorf("flightlock: release %q: %w", key, err)
			}
		}
		kv, floor := firstKV(read.Responses[0]), firstKV(read.Responses[1])
		read = nil
		if kv == nil || !ownedBy(kv.Value, owner) {
			s.forget(key, owner)
			return 0, lockstore.ErrNotHeld
		}
		v, ok := parseValue(kv.Value)
		if !ok {
			return 0, fmt.Errorf("flightlock: release %q: unreadable lock value %q", key, kv.Value)
		}
		if !v.hasHold(hold) {
			s.released(key, owner, hold)
			return 0, lockstore.ErrNotHeld
		}
		ops, left, err := s.releaseOps(ctx, key, owner, hold, lastFence, v, kv, floor, &moved)
		if err != nil {
			return 0, err
		}
		resp, err := s.atRevision(ctx, key, kv.ModRevision, ops, reads)
		if err != nil {
			if left {
				moved = 0 // the key may be on the new lease now: keep it (unused, it expires on its own)
			}
			return 0, fmt.Errorf("flightlock: release %q: %w", key, err)
		}
		if !resp.Succeeded {
			read = resp
			continue
		}
		if !left {
			s.forget(key, owner)
			return int(resp.Responses[1].GetResponseDeleteRange().Deleted), nil
		}
		if moved != 0 {
			// A re-entry's refresh that read the key on the session lease before this commit
			// promised its TTL from its start, maybe later than the new lease's grant: a
			// keep-alive sent after the commit covers it.
			s.keepMovedAlive(moved, time.Now())
			moved = 0 // in use
		}
		s.released(key, owner, hold)
		return 0, nil
	}
}

// atRevision commits then when key is still at the mod revision rev (and more hold), else els:
// no write of the store goes to a key that changed since the store wrote or read it.
func (s *Store) atRevision(ctx context.Context, key string, rev int64, then, els []clientv3.Op, more ...clientv3.Cmp) (*clientv3.TxnResponse, error) {
	cmps := append(make([]clientv3.Cmp, 0, 1+len(more)), clientv3.Compare(clientv3.ModRevision(key), "=", rev))
	return s.cli.Txn(ctx).If(append(cmps, more...)...).Then(then...).Else(els...).Commit()
}

// releaseOps are the writes of one round of Release's rewrite of hold ("": the owner's own) from
// the value v read in kv; left reports a hold left, and *moved is granted here once per release.
func (s *Store) releaseOps(ctx context.Context, key, owner, hold string, lastFence int64, v lockValue, kv, floor *mvccpb.KeyValue, moved *clientv3.LeaseID) (ops []clientv3.Op, left bool, err error) {
	nv, left := v.withoutHold(hold)
	e, _ := s.entry(key, owner)
	nv.last = max(nv.last, lastFence, e.last)
	switch {
	case left && hold == "":
		if *moved == 0 {
			l, err := s.cli.Grant(ctx, v.secs)
			if err != nil {
				return nil, true, fmt.Errorf("flightlock: release %q: lease for the re-entries left: %w", key, err)
			}
			*moved = l.ID
		}
		return []clientv3.Op{clientv3.OpPut(key, nv.String(), clientv3.WithLease(*moved))}, true, nil
	case left:
		return []clientv3.Op{clientv3.OpPut(key, nv.String(), clientv3.WithIgnoreLease())}, true, nil
	}
	// An unreadable floor (written by hand) is left for the next grant to refuse.
	fence, ferr := fenceOf(kv.CreateRevision, floor)
	if ferr == nil {
		fence = max(fence, nv.last)
	}
	return deleteOps(key, kv.CreateRevision, fence, ferr == nil && floor != nil), false, nil
}

// releaseFailed records a release that may not have happened, for the reaper to retry.
func (s *Store) releaseFailed(key, owner, hold string, lastFence int64) {
	s.update(key, owner, func(e *heldKey) {
		if hold == "" {
			e.own = true
			e.last = max(e.last, lastFence)
		} else {
			e.holds = withHold(e.holds, hold)
		}
		e.tries++
		// A quarter second, doubling, at most a second: given back soon after etcd answers.
		retry := time.Now().Add(min(250*time.Millisecond<<min(e.tries-1, 2), time.Second))
		if len(e.holds) == 0 {
			e.until = retry // nobody here counts on the lock any more
			return
		}
		// Never earlier: the reaper releases every hold of the entry once until passes, which
		// would take away the other holds' refreshed guarantee.
		e.until = later(e.until, retry)
	})
}

// startReaper releases, owner-checked, every entry past its until at now (heldKey), unless a
// reaper runs: on a goroutine of the store, one at a time (releaseBounded).
func (s *Store) startReaper(now time.Time) {
	type job struct {
		entryKey
		heldKey // a copy, as the entry was when due
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reaping {
		return
	}
	var jobs []job
	for k, e := range s.held {
		if !e.reaping && now.After(e.until) {
			e.reaping = true
			jobs = append(jobs, job{k, *e})
		}
	}
	s.reaping = len(jobs) > 0 && s.spawn(func() {
		for _, j := range jobs {
			if s.isClosed() {
				break
			}
			for _, h := range j.holds {
				s.releaseBounded(s.ctx, j.key, j.owner, h, 0)
			}
			if j.own {
				s.releaseBounded(s.ctx, j.key, j.owner, "", j.last)
			}
			s.mu.Lock()
			if e := s.held[j.entryKey]; e != nil {
				e.reaping = false
			}
			s.mu.Unlock()
		}
		s.mu.Lock()
		s.reaping = false
		s.mu.Unlock()
	})
}

// releaseBounded is release on ctx, bounded by a second.
func (s *Store) releaseBounded(ctx context.Context, key, owner, hold string, lastFence int64) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, _ = s.release(ctx, key, owner, hold, lastFence)
}

// Pass implements lockstore.Passer. The turn of a lock this store acquired, that no other
// process re-entered and nobody was refused while held (no waiter mark) goes on under the same
// grant: the lock is refreshed, and the next local grant gets the fence after every fence
// handed out under it (fenceShift), for a read-only transaction and the refresh instead of two
// Raft writes. Pass releases as Release does when the lock is marked, re-entered or not this
// store's, when the grant has used half its fence room (so the next turn's handoffs still
// fit), or when it followed a refusal of this store (contended).
func (s *Store) Pass(ctx context.Context, key, owner string, ttl time.Duration, lastFence int64) (bool, int64, int, error) {
	if err := s.check(owner, ttl, key); err != nil {
		return false, 0, 0, err
	}
	lastFence = max(lastFence, 0)
	// A contended grant is released without the read that would find the mark. A read hold is
	// never simple, so never passed: the Locker takes reads outside its gate.
	if e, ok := s.touch(key, owner, time.Now().Add(ttl), true); ok && e.simple && e.own && len(e.holds) == 0 && e.fence > 0 && !e.contended {
		top := max(e.fence, e.last, lastFence)
		if top-e.fence < 1<<fenceShift-1 {
			resp, err := s.atRevision(ctx, key, e.modRev, nil, nil, clientv3.Compare(clientv3.CreateRevision(WaiterKey(key)), "=", 0))
			if err != nil {
				return false, 0, 0, fmt.Errorf("flightlock: pass %q: %w", key, err)
			}
			if resp.Succeeded {
				if err := s.Refresh(ctx, key, owner, ttl); err != nil {
					return false, 0, 0, err
				}
				// The store reports it on release, so that the floor covers it (deleteOps).
				s.update(key, owner, func(e *heldKey) { e.last = max(e.last, top+1) })
				return true, top + 1, 0, nil
			}
		}
	}
	n, err := s.Release(ctx, key, owner, "", lastFence)
	return false, 0, n, err
}

// keepMovedAlive sends a keep-alive of lease id after t on a goroutine of the store, every
// 100 ms until one succeeds, the lease is gone or the store closes.
func (s *Store) keepMovedAlive(id clientv3.LeaseID, t time.Time) {
	s.spawn(func() {
		for {
			ctx, cancel := context.WithTimeout(s.ctx, time.Second)
			_, err := s.startKeepAlive(ctx, id, t).wait(ctx)
			cancel()
			if err == nil || errors.Is(err, errLeaseGone) || !sleep(s.ctx.Done(), 100*time.Millisecond) {
				return
			}
		}
	})
}
