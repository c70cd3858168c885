package etcdstore

import (
	"fmt"
	"strconv"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/flightlock/flightlock/lockstore"
)

// Fences come from the cluster's revision, never from a clock. A grant of key k is the
// transaction that created k, at revision R (k's create revision). Its fence is
//
//	fence = R<<fenceShift + D
//
// where D is the offset of k's fence floor (FloorKey(k)) as the granting transaction read it:
// D = F - R_F<<fenceShift for a floor holding F written at revision R_F, else 0. A process that
// holds k hands the lock on with the fences fence+1, fence+2, ... and reports the largest, top,
// as Release's lastFence.
//
// Why fences strictly increase. Let grant g be at revision R with fence f and its successor g'
// at R'. k was deleted in between at a revision of its own, so R' >= R+2; the floor is written
// only by the release that deletes k, so g' reads the floor g read, or the one g's release wrote:
//   - same floor: f' = f + (R'-R)<<fenceShift >= f + 2<<fenceShift, above every fence g handed
//     out as long as it handed out fewer than 2<<fenceShift (2,097,152) beyond f;
//   - floor F = top written at the release's revision Rd (R < Rd < R'): f' = R'<<fenceShift +
//     top - Rd<<fenceShift >= top + 1<<fenceShift > top.
//
// The release writes the floor exactly when the first case could fail, top >= (R+2)<<fenceShift,
// and otherwise deletes a floor read at the grant. Through the Locker, top - f stays below
// 2<<fenceShift (Pass keeps a grant while under half its room is used, and a run has at most
// 65,535 handoffs), so no floor is written.
//
// The remaining gap: a holder that hands out 2<<fenceShift or more fences under one grant and
// never releases may see the next grant's fence at or below its own. Only the core counts its
// fences, so the store states its bound (Capabilities.MaxHandoffs), and flightlock.New and With
// refuse a WithHandoff above it.
//
// Fences stay below 2^63 while the cluster's revision is below 2^(63-fenceShift) = 2^43 (8.8e12
// writes); a grant beyond that is refused, never wrapped.
const fenceShift = 20

// Capabilities implements lockstore.Store. MaxHandoffs is half of the 2<<fenceShift fences a
// grant has room for (a handoff hands out one). Watches are not shared: each costs a goroutine.
func (s *Store) Capabilities() lockstore.Capabilities {
	return lockstore.Capabilities{Name: "etcd", MaxHandoffs: 1 << fenceShift}
}

// maxGrantRevision is the largest create revision that still makes a fence (with room for a
// floor offset of up to 2^62).
const maxGrantRevision = 1<<(62-fenceShift) - 1

// floorOffset returns D for the floor key kv (nil: none).
func floorOffset(kv *mvccpb.KeyValue) (int64, error) {
	if kv == nil {
		return 0, nil
	}
	f, err := strconv.ParseInt(string(kv.Value), 10, 64)
	if err != nil || f < 0 || f >= 1<<62 {
		return 0, fmt.Errorf("flightlock: etcd fence floor %q holds %q, not a fence", kv.Key, kv.Value)
	}
	if kv.ModRevision > maxGrantRevision {
		return 0, fmt.Errorf("flightlock: etcd revision %d is beyond the fence space", kv.ModRevision)
	}
	return max(f-kv.ModRevision<<fenceShift, 0), nil
}

// fenceOf is the fence of a grant at revision rev that read the floor key floor (nil: none).
func fenceOf(rev int64, floor *mvccpb.KeyValue) (int64, error) {
	d, err := floorOffset(floor)
	if err != nil {
		return 0, err
	}
	if rev <= 0 || rev > maxGrantRevision {
		return 0, fmt.Errorf("flightlock: etcd revision %d is beyond the fence space (2^%d)", rev, 62-fenceShift)
	}
	return rev<<fenceShift + d, nil
}

// deleteOps are the release that deletes k and its waiter mark, for a grant at revision rev
// under which top is the largest fence, that read a floor when hadFloor: it writes top as the
// floor when the next grant's revision alone might not exceed it, else deletes an obsolete one.
func deleteOps(k string, rev, top int64, hadFloor bool) []clientv3.Op {
	ops := []clientv3.Op{clientv3.OpDelete(k), clientv3.OpDelete(WaiterKey(k))}
	switch {
	case top >= (rev+2)<<fenceShift:
		ops = append(ops, clientv3.OpPut(FloorKey(k), strconv.FormatInt(top, 10)))
	case hadFloor:
		ops = append(ops, clientv3.OpDelete(FloorKey(k)))
	}
	return ops
}
