package etcdstore

import (
	"strconv"
	"strings"

	"github.com/flightlock/flightlock/lockstore"
)

// Key names of the store's own keys. They start with lockstore.FenceKeyPrefix, a namespace that
// flightlock's Locker refuses for lock keys and that this store refuses too, so a lock key can
// never be one of them.
const (
	floorPrefix  = lockstore.FenceKeyPrefix + "etcd/floor/"
	waiterPrefix = lockstore.FenceKeyPrefix + "etcd/waiter/"
)

// FloorKey names the fence floor of lock key k: the largest fence handed out under an earlier
// grant of k, written (without a lease) by a release only when the next grant's revision alone
// might not exceed it, and deleted by the first release that finds it obsolete (see fence.go).
// For tools that inspect locks.
func FloorKey(k string) string { return floorPrefix + k }

// WaiterKey names the waiter mark of lock key k: written, on the waiter's lease, by an
// acquisition that found k held by another owner; deleted by the grant and by the release of k
// (whose Release then reports one notified waiter). For tools that inspect locks.
func WaiterKey(k string) string { return waiterPrefix + k }

// lockValue is the value of a lock key:
//
//	"<owner> <lease seconds> <holds> <last>[ <meta>]"
//
// owner is the owner token (no spaces); lease seconds the TTL of the etcd lease the key is on,
// so that a re-entry from another process knows how long a keep-alive of it lasts; holds the
// holds of the owner token as in the Redis store: "1" (the acquisition's, "0" once released),
// then ",<id>" for each named re-entry (Reenter); last the largest fence handed out under the
// grant so far, reported by a release that left other holds (0 when none); meta what the
// holder said about itself, for operators. The fence is not in the value: it is derived from
// the key's create revision (fence.go), which the acquiring transaction cannot know before it
// commits.
type lockValue struct {
	owner string
	secs  int64
	holds string
	last  int64
	meta  string
}

// newValue is the value of a fresh acquisition: one hold, the owner's.
func newValue(owner string, secs int64, meta string) string {
	var b strings.Builder
	b.Grow(len(owner) + len(meta) + 16)
	b.WriteString(owner)
	b.WriteByte(' ')
	b.WriteString(strconv.FormatInt(secs, 10))
	b.WriteString(" 1 0")
	if meta != "" {
		b.WriteByte(' ')
		b.WriteString(meta)
	}
	return b.String()
}

func (v lockValue) String() string {
	s := v.owner + " " + strconv.FormatInt(v.secs, 10) + " " + v.holds + " " + strconv.FormatInt(v.last, 10)
	if v.meta != "" {
		s += " " + v.meta
	}
	return s
}

// parseValue reads a lock value; ok is false for a value this store did not write.
func parseValue(b []byte) (v lockValue, ok bool) {
	f := strings.SplitN(string(b), " ", 5)
	if len(f) < 4 || f[0] == "" || f[2] == "" {
		return lockValue{}, false
	}
	secs, err1 := strconv.ParseInt(f[1], 10, 64)
	last, err2 := strconv.ParseInt(f[3], 10, 64)
	if err1 != nil || err2 != nil || secs <= 0 || last < 0 || (f[2][0] != '0' && f[2][0] != '1') {
		return lockValue{}, false
	}
	v = lockValue{owner: f[0], secs: secs, holds: f[2], last: last}
	if len(f) == 5 {
		v.meta = f[4]
	}
	return v, true
}

// ownedBy reports whether the lock value b belongs to owner: it starts with the token and a
// space (a token that is a prefix of the holder's does not pass).
func ownedBy(b []byte, owner string) bool {
	return len(b) > len(owner) && string(b[:len(owner)]) == owner && b[len(owner)] == ' '
}

// simple reports whether the holds are the acquisition's own and nothing else: the value
// Acquire wrote, which the one-transaction release can delete.
func (v lockValue) simple() bool { return v.holds == "1" }

// hasHold reports whether the hold named hold ("" for the acquisition's own) is listed.
func (v lockValue) hasHold(hold string) bool {
	own, borrows := v.holds[:1], v.holds[1:]
	if hold == "" {
		return own == "1"
	}
	return strings.Contains(borrows+",", ","+hold+",")
}

// withHold lists hold (a named re-entry) once.
func (v lockValue) withHold(hold string) lockValue {
	if !v.hasHold(hold) {
		v.holds += "," + hold
	}
	return v
}

// withoutHold gives up hold ("" for the acquisition's own), which must be listed, and reports
// whether any hold is left.
func (v lockValue) withoutHold(hold string) (lockValue, bool) {
	own, borrows := v.holds[:1], v.holds[1:]
	if hold == "" {
		own = "0"
	} else {
		list := borrows + ","
		i := strings.Index(list, ","+hold+",")
		list = list[:i] + list[i+len(hold)+1:]
		borrows = list[:len(list)-1]
	}
	v.holds = own + borrows
	return v, own == "1" || borrows != ""
}
