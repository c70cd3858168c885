package etcdstore

import (
	"fmt"
	"strconv"
	"strings"
	"time"

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
// of an earlier grant, when the next grant's revision alone might not exceed it (fence.go).
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
	rest, found := strings.CutPrefix(full, sidePrefix)
	if !found {
		return "", 0, "", false
	}
	n, rest, found := strings.Cut(rest, ":")
	size, err := strconv.Atoi(n)
	if !found || err != nil || size <= 0 || size > len(rest) {
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
// (0: none); meta is for operators. The fence derives from the key's create revision (fence.go),
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

// simple reports whether the holds are the acquisition's alone, which the one-transaction
// release can delete.
func (v lockValue) simple() bool { return v.holds == "1" }

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
