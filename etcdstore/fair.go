package etcdstore

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/flightlock/flightlock/lockstore"
)

// A key's fair line is the directory lineDir(key): one key per waiting owner (placeKey), ranked
// by its create revision, that of the owner's first refused fair Acquire (kept across re-puts).
// Revisions, not clocks (Asked is unused), order the line: the Locker makes a fair Acquire as
// soon as a fair Lock begins, so first attempts reach etcd in the order the Locks began, up to
// their round trips. The granting transaction checks the rank with one range compare (every
// place's create revision >= mine), so only the first in line takes a free key.
//
// A place lives on a lease of the queue time (whole seconds, rounded up) that each fair Acquire
// of its owner keeps alive: a waiter that stops asking leaves the line one lease TTL later, and
// the deletion wakes the next in line. The grant deletes its place, LeaveQueue at once.

// place is one owner's place in a key's line, as the store knows it.
type place struct {
	lease clientv3.LeaseID // the lease it is on; 0 before the first refusal
	rev   int64            // its create revision, its rank; 0 unknown
}

// acquireWriteOnce is one attempt of Acquire for a write owner, one transaction (and, while a
// fair caller waits in line, a keep-alive of its place's lease before it):
//
//	if   create_revision(key) == 0 && no read holds
//	     && fair: (rank known: create_revision(place) == rank && every place's create revision >= rank
//	               else: the line is empty)
//	then put(key, value, lease); get(floor); delete(writer mark); fair: delete(place)
//	else get(key); put(waiter, lease); markWriter; fair, queued: put(place, place lease); get(place)
//
// The second branch is busy, or a re-entry. The waiter mark is written unconditionally: a
// nested transaction that writes it only when needed costs every acquisition more than a
// needless yield does. A fair caller with queue > 0 refused for the first time is given a place
// lease and tries once more at once, putting its place; queue 0 (TryLock) takes the key only
// when it is free and the line empty.
func (s *Store) acquireWriteOnce(ctx context.Context, a *attempt, key string, fair bool, queue time.Duration) (lockstore.Acquisition, error) {
	var p place
	if fair {
		p = s.placeOf(key, a.owner)
	}
	if queue > 0 && p.lease != 0 {
		// The place lives queue from now: this is the owner's latest fair Acquire.
		if _, err := s.cli.KeepAliveOnce(ctx, p.lease); isLeaseNotFound(err) {
			p = place{} // it ended with its lease: a new place, at the back of the line
		} else if err != nil {
			return lockstore.Acquisition{}, fmt.Errorf("flightlock: acquire %q: keep its place in line: %w", key, err)
		}
	}
	for {
		resp, err := s.writeTxn(ctx, key, a, fair, p, queue)
		if err != nil {
			// The session lease or the place's (kept alive at the start) may be gone: ask which.
			if isLeaseNotFound(err) && a.again && queue > 0 && p.lease != 0 {
				if _, kerr := s.cli.KeepAliveOnce(ctx, p.lease); isLeaseNotFound(kerr) {
					s.setPlace(key, a.owner, place{})
					return lockstore.Acquisition{}, errLeaseGone
				}
			}
			return lockstore.Acquisition{}, fmt.Errorf("flightlock: acquire %q: %w", key, s.acquireFailed(err, a, key))
		}
		if resp.Succeeded {
			if fair {
				s.setPlace(key, a.owner, place{})
			}
			return s.granted(ctx, a, key, resp.Header.Revision, firstKV(resp.Responses[1]))
		}
		kv, out := refusal(resp.Responses)
		if kv != nil && ownedBy(kv.Value, a.owner) {
			// A re-sent attempt: a place left over would hold up the line behind a caller that
			// no longer waits. One that cannot be deleted ends with its lease.
			if queue > 0 && p.lease != 0 {
				s.beside(func() {
					lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
					_ = s.LeaveQueue(lctx, key, a.owner)
					cancel()
				})
			}
			return s.reentered(ctx, a, key, kv, nil)
		}
		s.noteBusy(key, resp.Header.Revision)
		if queue == 0 {
			return out, nil
		}
		if p.lease == 0 {
			secs := int64((queue + time.Second - 1) / time.Second)
			g, err := s.cli.Grant(ctx, secs)
			if err != nil {
				return lockstore.Acquisition{}, fmt.Errorf("flightlock: acquire %q: lease of its place in line: %w", key, err)
			}
			p = place{lease: g.ID}
			s.setPlace(key, a.owner, p)
			continue
		}
		if mine := firstKV(resp.Responses[4]); mine != nil {
			p.rev = mine.CreateRevision
			s.setPlace(key, a.owner, p)
		}
		return out, nil
	}
}

// writeTxn is acquireWriteOnce's transaction: a fair writer, as any, holds new readers off.
func (s *Store) writeTxn(ctx context.Context, key string, a *attempt, fair bool, p place, queue time.Duration) (*clientv3.TxnResponse, error) {
	cmps, then, els := writeOps(key, a.value, a.l)
	if fair {
		pk := placeKey(key, a.owner)
		if p.rev > 0 {
			cmps = append(cmps,
				clientv3.Compare(clientv3.CreateRevision(pk), "=", p.rev),
				clientv3.Compare(clientv3.CreateRevision(lineDir(key)), ">", p.rev-1).WithPrefix())
		} else {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(lineDir(key)), "=", 0).WithPrefix())
		}
		then = append(then, clientv3.OpDelete(pk))
		if queue > 0 && p.lease != 0 {
			els = append(els, clientv3.OpPut(pk, "", clientv3.WithLease(p.lease)), clientv3.OpGet(pk))
		}
	}
	return s.cli.Txn(ctx).If(cmps...).Then(then...).Else(els...).Commit()
}

// LeaveQueue implements lockstore.Store: it deletes owner's place, which wakes the next in line.
func (s *Store) LeaveQueue(ctx context.Context, key, owner string) error {
	if err := s.check(owner, time.Second, key); err != nil { // any valid TTL: none is asked
		return err
	}
	s.setPlace(key, owner, place{})
	if _, err := s.cli.Delete(ctx, placeKey(key, owner)); err != nil {
		return fmt.Errorf("flightlock: leave the line of %q: %w", key, err)
	}
	return nil
}

func (s *Store) placeOf(key, owner string) place {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.places[entryKey{key, owner}]
}

// setPlace records owner's place in key's line; the zero place forgets it.
func (s *Store) setPlace(key, owner string, p place) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p == (place{}) {
		delete(s.places, entryKey{key, owner})
	} else {
		putBounded(s.places, entryKey{key, owner}, p)
	}
}
