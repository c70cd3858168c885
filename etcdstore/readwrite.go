package etcdstore

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/flightlock/flightlock/lockstore"
)

// Read-write locks: an owner made by lockstore.ReadOwner takes a read hold of its own
// (readKey), shared with the key's other read holds. One transaction on each side decides
// exclusion: a write grant compares that the key does not exist and its read directory is
// empty (writable); a read grant, that the key does not exist and no writer mark is live. A
// read hold lives on its reader's session lease and in held like a lock; its end deletes its
// key, which every waiter's Watch hears.
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
// lower revision, so it exceeds their fences (the floor covers those beyond the revision's
// room); the next write is granted after this hold's deletion, at a higher revision, with no
// floor written in between (only a write's release writes one), so its fence exceeds it.
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
