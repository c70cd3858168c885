package main

import (
	"encoding/json"
	"strings"

	"github.com/flightlock/flightlock/lockstore"
)

// lockInfo is one lock as ls, show, unlock and watch print it in JSON: a lockstore.LockInfo
// (view) in the field names and units scripts read.
type lockInfo struct {
	Key       string   `json:"key"`       // as the rule rendered it, without the prefix
	RedisKey  string   `json:"redis_key"` // prefix + key
	Owner     string   `json:"owner"`     // owner token of the holder
	Fence     int64    `json:"fence"`     // fence of the Redis grant (in-process handoffs count up from it)
	TTLMillis int64    `json:"ttl_ms"`    // remaining; -1: no expiry (not written by flightlock)
	Own       bool     `json:"own_hold"`  // the acquisition's own hold is still held
	Reentries []string `json:"reentries"` // holds of re-entries from other processes
	Host      string   `json:"host,omitempty"`
	Pid       string   `json:"pid,omitempty"`
	Trace     string   `json:"trace,omitempty"`
	Metadata  string   `json:"metadata,omitempty"` // metadata other than host, pid, trace and kind
	Kind      string   `json:"kind,omitempty"`     // the holder's Locker.Kind: lock, read, fair, permits:N
	Contended bool     `json:"contended"`          // a request was refused while it was held
	Waiters   int64    `json:"waiters"`            // processes subscribed to its release (waiting now)
	Shadow    bool     `json:"shadow,omitempty"`   // a shadow rule's lock: it holds nothing back
	Readers   int      `json:"readers,omitempty"`  // read holds of a key held for reading (then owner is empty)
	Queued    int      `json:"queued,omitempty"`   // requests waiting in the key's fair line
	// Unrecognized is the raw value of a key under the prefix that is not a flightlock lock.
	Unrecognized string `json:"unrecognized,omitempty"`

	// show only:
	FenceCounterKey string `json:"fence_counter_key,omitempty"` // counter of the key's hash slot (etcd: its fence floor key)
	FenceCounter    *int64 `json:"fence_counter,omitempty"`     // last fence handed out in that slot (etcd: the floor)

	// etcd and ZooKeeper only. There Owner is empty and left out of the JSON, RedisKey too,
	// and Contended means the key's waiter mark is set; Waiters is not known. In ZooKeeper
	// there is no TTL (ttl_ms -1): a lock lives as long as its holder's session.
	Store          string `json:"store,omitempty"`           // "etcd" or "zookeeper"; empty in Redis
	EtcdKey        string `json:"etcd_key,omitempty"`        // Etcd.Key + Prefix + key
	ZNode          string `json:"znode,omitempty"`           // ZooKeeper: the key's node, Root + "/" + escaped Prefix + key
	Lease          string `json:"lease,omitempty"`           // the etcd lease the key is on, in hex as etcdctl prints it
	CreateRevision int64  `json:"create_revision,omitempty"` // the grant's revision, from which its fence derives
	ModRevision    int64  `json:"mod_revision,omitempty"`    // revision of the value read: unlock removes only that
}

// MarshalJSON leaves out, for an etcd or ZooKeeper lock, the owner and redis_key fields that
// it never fills; a Redis lock marshals as it always has.
func (l lockInfo) MarshalJSON() ([]byte, error) {
	type plain lockInfo // the fields without this method
	if l.Store == "" {
		return json.Marshal(plain(l))
	}
	// A field of the outer struct hides the embedded one of the same JSON name; omitempty
	// then drops both.
	return json.Marshal(struct {
		plain
		Owner    *struct{} `json:"owner,omitempty"`
		RedisKey *struct{} `json:"redis_key,omitempty"`
	}{plain: plain(l)})
}

// view is l as the CLI prints it, from the store named store.
func view(l lockstore.LockInfo, store string) lockInfo {
	v := lockInfo{Key: l.Key, Owner: l.Owner, Fence: l.Fence, TTLMillis: -1, Own: l.Own, Reentries: l.Borrowed,
		Host: l.Host, Pid: l.Pid, Trace: l.Trace, Metadata: l.Metadata, Kind: l.Kind, Contended: l.Contended, Waiters: l.Waiters,
		Shadow: strings.HasPrefix(l.Key, shadowPrefix), Unrecognized: l.Unrecognized,
		FenceCounterKey: l.FenceCounterKey, FenceCounter: l.FenceCounter,
		Lease: l.Lease, CreateRevision: l.CreateRevision, ModRevision: l.ModRevision, Readers: l.Readers, Queued: l.Queued}
	if v.Reentries == nil {
		v.Reentries = []string{} // [] in the JSON whatever the store, as scripts read it
	}
	if l.Readers > 0 {
		v.Owner = "" // each reader has its own token: the key has no one owner to print
	}
	if l.TTL >= 0 {
		v.TTLMillis = l.TTL.Milliseconds()
	}
	switch store {
	case storeEtcd:
		v.Store, v.EtcdKey = storeEtcd, l.StoreKey
	case storeZookeeper:
		v.Store, v.ZNode = storeZookeeper, l.StoreKey
	default:
		v.RedisKey = l.StoreKey
	}
	return v
}

// views is view of each of locks.
func views(locks []lockstore.LockInfo, store string) []lockInfo {
	vs := make([]lockInfo, len(locks))
	for i, l := range locks {
		vs[i] = view(l, store)
	}
	return vs
}
