package etcdstore

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/flightlock/flightlock/lockstore"
)

// Read-write locks: an owner made by lockstore.ReadOwner takes a read hold of its own (readKey),
// shared with the key's other read holds. One transaction on each side decides exclusion: a write
// grant compares that the key does not exist and its read directory is empty (writable); a read
// grant, that the key does not exist and no writer mark is live. A read hold lives on its reader's
// session lease and in held like a lock; every waiter's Watch hears its end (a deletion).
//
// Writer preference: a write acquisition refused by read holds sets the writer mark
// (markWriter), which refuses read acquisitions until its deadline, one lease TTL of its
// writer after its last refusal: a writer that gave up holds readers off no longer.

// acquireReadOnce is one attempt of Acquire for a read owner, one transaction:
//
//	if   create_revision(read hold) > 0                        (the owner holds it: re-entry)
//	then get(read hold); get(floor)
//	else if   create_revision(key) == 0 && create_revision(mark) == 0
//	     then put(read hold, lease); get(floor)
//	     else if   create_revision(key) == 0 && value(mark) < now   (the mark's writer is gone)
//	          then put(read hold, lease); get(floor); delete(mark)
//	          else get(key); put(waiter, lease); get(mark)
//
// A read hold's fence is made as a write's (fenceShift): every write it follows was deleted at a
// lower revision, so it exceeds their fences (the floor covers those beyond the revision's room);
// the next write is granted after this hold's deletion, at a higher revision, with no floor
// written in between (only a write's release writes one), so its fence exceeds it.
func (s *Store) acquireReadOnce(ctx context.Context, a *attempt, key string) (lockstore.Acquisition, error) {
	rk, mark := readKey(key, a.owner), writerKey(key)
	grant := func(more ...clientv3.Op) []clientv3.Op {
		return append([]clientv3.Op{clientv3.OpPut(rk, a.value, clientv3.WithLease(a.l.id)), clientv3.OpGet(FloorKey(key))}, more...)
	}
	free := clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(rk), ">", 0)).
		Then(clientv3.OpGet(rk), clientv3.OpGet(FloorKey(key))).
		Else(clientv3.OpTxn(
			[]clientv3.Cmp{free, clientv3.Compare(clientv3.CreateRevision(mark), "=", 0)},
			grant(),
			[]clientv3.Op{clientv3.OpTxn(
				[]clientv3.Cmp{free, clientv3.Compare(clientv3.Value(mark), "<", markClock(time.Now()))},
				grant(clientv3.OpDelete(mark)),
				[]clientv3.Op{clientv3.OpGet(key), clientv3.OpPut(WaiterKey(key), "", clientv3.WithLease(a.l.id)), clientv3.OpGet(mark)},
			)},
		)).
		Commit()
	if err != nil {
		return lockstore.Acquisition{}, fmt.Errorf("flightlock: acquire %q: %w", key, s.acquireFailed(err, a, key))
	}
	if resp.Succeeded {
		kv := firstKV(resp.Responses[0])
		if kv == nil {
			return lockstore.Acquisition{}, nil // cannot happen within one transaction
		}
		return s.reentered(ctx, a, key, kv, firstKV(resp.Responses[1]))
	}
	txn := resp.Responses[0].GetResponseTxn()
	if !txn.Succeeded {
		txn = txn.Responses[0].GetResponseTxn() // a live mark, or a writer: is the mark past its deadline?
	}
	if txn.Succeeded {
		return s.granted(ctx, a, key, resp.Header.Revision, firstKV(txn.Responses[1]))
	}
	s.noteBusy(key, resp.Header.Revision)
	if kv := firstKV(txn.Responses[0]); kv != nil {
		return busy(kv), nil // a writer holds the key
	}
	// A writer that waits for the read holds takes the key next, for up to its TTL; it holds
	// nothing yet, so the reply names no holder.
	if kv := firstKV(txn.Responses[2]); kv != nil {
		secs, ok := parseMarkValue(kv.Value)
		return busyFor(secs, "", ok), nil
	}
	return lockstore.Acquisition{}, nil
}

// releaseShared ends owner's read hold of key, one transaction:
//
//	if   create_revision(read hold) > 0
//	then count(read holds); count(mark); delete(read hold)
//
// Read holds have no named holds and no fences beyond their own: hold must be "". It returns 1
// when it ended the last read hold while a writer waits (the writer mark).
func (s *Store) releaseShared(ctx context.Context, key, owner, hold string) (int, error) {
	if hold != "" {
		return 0, lockstore.ErrNotHeld
	}
	rk := readKey(key, owner)
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(rk), ">", 0)).
		Then(
			clientv3.OpGet(readDir(key), clientv3.WithPrefix(), clientv3.WithCountOnly()),
			clientv3.OpGet(writerKey(key), clientv3.WithCountOnly()),
			clientv3.OpDelete(rk),
		).
		Commit()
	if err != nil {
		return 0, fmt.Errorf("flightlock: release %q: %w", key, err)
	}
	s.forget(key, owner)
	if !resp.Succeeded {
		return 0, lockstore.ErrNotHeld
	}
	readers, marks := resp.Responses[0].GetResponseRange().Count, resp.Responses[1].GetResponseRange().Count
	if readers == 1 && marks > 0 {
		return 1, nil
	}
	return 0, nil
}

// holdKey is the etcd key of owner's hold of key: key itself, or a read owner's read hold.
func holdKey(key, owner string) string {
	if lockstore.IsReadOwner(owner) {
		return readKey(key, owner)
	}
	return key
}

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
		s.mu.Lock()
		p = s.places[entryKey{key, a.owner}]
		s.mu.Unlock()
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
				s.beside(ctx, func(ctx context.Context) { _ = s.LeaveQueue(ctx, key, a.owner) })
			}
			return s.reentered(ctx, a, key, kv, nil)
		}
		s.noteBusy(key, resp.Header.Revision)
		if queue == 0 {
			return out, nil
		}
		if p.lease == 0 {
			g, err := s.cli.Grant(ctx, int64((queue+time.Second-1)/time.Second))
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
