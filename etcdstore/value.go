package etcdstore

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/flightlock/flightlock/lockstore"
)

// Prefixes of the store's own keys.
const (
	floorPrefix  = lockstore.FenceKeyPrefix + "etcd/floor/"
	waiterPrefix = lockstore.FenceKeyPrefix + "etcd/waiter/"
	writerPrefix = lockstore.FenceKeyPrefix + "etcd/writer/"
	sidePrefix   = lockstore.FenceKeyPrefix + "etcd/key/"
)

// FloorKey names the fence floor of lock key k, for tools that inspect locks: the largest fence
// of an earlier grant, when the next grant's revision alone might not exceed it (fenceShift).
func FloorKey(k string) string { return floorPrefix + k }

// WaiterKey names the waiter mark of lock key k, for tools that inspect locks: written, on the
// waiter's lease, by an acquisition that found k held by another owner; deleted by the release
// of k, which then reports one notified waiter (after an expiry, the next holder's: one
// needless yield).
func WaiterKey(k string) string { return waiterPrefix + k }

// writerKey names the writer mark of lock key k (markWriter, readwrite.go).
func writerKey(k string) string { return writerPrefix + k }

// sideDir is the directory of lock key k's read holds and fair-line places:
//
//	flightlock:fence:etcd/key/<len(k)>:<k>/
//
// The length keeps one key's directory from being a prefix of another's ("6:orders/" against
// "8:orders/0/"), whatever bytes keys and owners contain.
func sideDir(k string) string { return sidePrefix + strconv.Itoa(len(k)) + ":" + k + "/" }

// Kinds of the keys under a sideDir: read holds (readKey) and places in k's line (placeKey).
const (
	sideRead  = 'r'
	sidePlace = 'q'
)

func readDir(k string) string { return sideDir(k) + "r/" }

func readKey(k, owner string) string { return readDir(k) + owner }

func lineDir(k string) string { return sideDir(k) + "q/" }

func placeKey(k, owner string) string { return lineDir(k) + owner }

// parseSideKey splits a key under sidePrefix into the lock key, the kind and the owner.
func parseSideKey(full string) (k string, kind byte, owner string, ok bool) {
	rest, side := strings.CutPrefix(full, sidePrefix)
	n, rest, found := strings.Cut(rest, ":")
	size, err := strconv.Atoi(n)
	if !side || !found || err != nil || size <= 0 || size > len(rest) {
		return "", 0, "", false
	}
	k, rest = rest[:size], rest[size:]
	if len(rest) < 4 || rest[0] != '/' || rest[2] != '/' || rest[1] != sideRead && rest[1] != sidePlace {
		return "", 0, "", false
	}
	return k, rest[1], rest[3:], true
}

// readValue is the value of a read hold: "<lease seconds>[ <meta>]" (a writer it refuses waits
// at most that long); the owner is the key's last segment.
func readValue(secs int64, meta string) string {
	v := strconv.FormatInt(secs, 10)
	if meta != "" {
		v += " " + meta
	}
	return v
}

func parseReadValue(b []byte) (secs int64, meta string, ok bool) {
	n, meta, _ := strings.Cut(string(b), " ")
	secs, err := strconv.ParseInt(n, 10, 64)
	if err != nil || secs <= 0 {
		return 0, "", false
	}
	return secs, meta, true
}

// markValue is the value of a writer mark: "<deadline> <lease seconds>", the deadline in Unix
// milliseconds as 20 digits, so that etcd's byte-wise comparison orders deadlines.
func markValue(deadline time.Time, secs int64) string {
	return markClock(deadline) + " " + strconv.FormatInt(secs, 10)
}

func markClock(t time.Time) string { return fmt.Sprintf("%020d", t.UnixMilli()) }

func parseMarkValue(b []byte) (secs int64, ok bool) {
	_, n, found := strings.Cut(string(b), " ")
	secs, err := strconv.ParseInt(n, 10, 64)
	return secs, found && err == nil && secs > 0
}

// lockValue is the value of a lock key, "<owner> <lease seconds> <holds> <last>[ <meta>]":
// lease seconds is the TTL of the key's lease (which another process's re-entry keeps alive);
// holds are "1" (the acquisition's, "0" once released), then ",<id>" per named re-entry; last
// is the largest fence handed out under the grant, reported by a release that left other holds
// (0: none); meta is for operators. The fence derives from the key's create revision (fenceShift),
// which the acquiring transaction cannot know.
type lockValue struct {
	owner string
	secs  int64
	holds string
	last  int64
	meta  string
}

// newValue is the value of a fresh acquisition: one hold, the owner's.
func newValue(owner string, secs int64, meta string) string {
	return lockValue{owner: owner, secs: secs, holds: "1", meta: meta}.String()
}

// String builds the value in one allocation: it is on every acquisition's path.
func (v lockValue) String() string {
	sep := ""
	if v.meta != "" {
		sep = " "
	}
	return v.owner + " " + strconv.FormatInt(v.secs, 10) + " " + v.holds + " " + strconv.FormatInt(v.last, 10) + sep + v.meta
}

// parseValue reads a lock value; ok is false for a value this store did not write.
func parseValue(b []byte) (v lockValue, ok bool) {
	f := append(strings.SplitN(string(b), " ", 5), "")
	if len(f) < 5 || f[0] == "" || f[2] == "" {
		return lockValue{}, false
	}
	secs, err1 := strconv.ParseInt(f[1], 10, 64)
	last, err2 := strconv.ParseInt(f[3], 10, 64)
	if err1 != nil || err2 != nil || secs <= 0 || last < 0 || (f[2][0] != '0' && f[2][0] != '1') {
		return lockValue{}, false
	}
	return lockValue{owner: f[0], secs: secs, holds: f[2], last: last, meta: f[4]}, true
}

// ownedBy reports whether the lock value b starts with owner and a space (a token that is a
// prefix of the holder's does not pass).
func ownedBy(b []byte, owner string) bool {
	return len(b) > len(owner) && string(b[:len(owner)]) == owner && b[len(owner)] == ' '
}

// hasHold reports whether the hold named hold ("" for the acquisition's own) is listed.
func (v lockValue) hasHold(hold string) bool {
	if hold == "" {
		return v.holds[0] == '1'
	}
	return strings.Contains(v.holds[1:]+",", ","+hold+",")
}

// withHold lists hold (a named re-entry) once.
func (v lockValue) withHold(hold string) lockValue {
	if !v.hasHold(hold) {
		v.holds += "," + hold
	}
	return v
}

// withoutHold gives up hold, which must be listed, and reports whether any hold is left.
func (v lockValue) withoutHold(hold string) (lockValue, bool) {
	if hold == "" {
		v.holds = "0" + v.holds[1:]
	} else {
		list := strings.Replace(v.holds+",", ","+hold+",", ",", 1)
		v.holds = list[:len(list)-1]
	}
	return v, v.holds != "0"
}

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
