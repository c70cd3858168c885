package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/lockstore"
)

// shadowPrefix starts the keys of shadow rules (middleware: Prefix + "shadow:" + key).
const shadowPrefix = "shadow:"

// replayPrefix starts the keys of responses that share rules stored (Prefix + "replay:" +
// key): not locks, never listed.
const replayPrefix = "replay:"

// lockInfo is one lock as Redis holds it. The value a lockstore script writes is
// "<owner> <fence> <holds>[ <metadata>][ ~]" (lockstore/acquire.lua).
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
	Metadata  string   `json:"metadata,omitempty"` // metadata other than host, pid and trace
	Contended bool     `json:"contended"`          // a request was refused while it was held
	Waiters   int64    `json:"waiters"`            // processes subscribed to its release (waiting now)
	Shadow    bool     `json:"shadow,omitempty"`   // a shadow rule's lock: it holds nothing back
	// Unrecognized is the raw value of a key under the prefix that is not a flightlock lock.
	Unrecognized string `json:"unrecognized,omitempty"`

	// show only:
	FenceCounterKey string `json:"fence_counter_key,omitempty"` // counter of the key's hash slot (etcd: its fence floor key)
	FenceCounter    *int64 `json:"fence_counter,omitempty"`     // last fence handed out in that slot (etcd: the floor)

	// etcd only (see etcd.go). There Owner is empty and left out of the JSON, RedisKey too,
	// and Contended means the key's waiter mark is set; Waiters is not known.
	Store          string `json:"store,omitempty"`           // "etcd"; empty in Redis
	EtcdKey        string `json:"etcd_key,omitempty"`        // Etcd.Key + Prefix + key
	Lease          string `json:"lease,omitempty"`           // the etcd lease the key is on, in hex as etcdctl prints it
	CreateRevision int64  `json:"create_revision,omitempty"` // the grant's revision, from which its fence derives
	ModRevision    int64  `json:"mod_revision,omitempty"`    // revision of the value read: unlock removes only that
}

// MarshalJSON leaves out, for an etcd lock, the owner and redis_key fields that it never
// fills; a Redis lock marshals as it always has.
func (l lockInfo) MarshalJSON() ([]byte, error) {
	type plain lockInfo // the fields without this method
	if l.Store != storeEtcd {
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

// parseLock fills l from the value of its Redis key.
func parseLock(l *lockInfo, value string) {
	fields := strings.SplitN(value, " ", 4)
	if len(fields) < 3 || fields[0] == "" {
		l.Unrecognized = value
		return
	}
	fence, err := strconv.ParseInt(fields[1], 10, 64)
	holds := strings.Split(fields[2], ",")
	if err != nil || fence < 0 || (holds[0] != "0" && holds[0] != "1") {
		l.Unrecognized = value
		return
	}
	l.Owner, l.Fence, l.Own, l.Reentries = fields[0], fence, holds[0] == "1", holds[1:]
	rest := ""
	if len(fields) == 4 {
		rest = fields[3]
	}
	if rest == "~" || strings.HasSuffix(rest, " ~") {
		l.Contended = true
		rest = strings.TrimSuffix(strings.TrimSuffix(rest, "~"), " ")
	}
	parseMeta(l, rest)
}

// parseMeta fills the holder fields of l from the metadata a holder wrote: host=, pid= and
// trace= (the first of each), the rest as Metadata.
func parseMeta(l *lockInfo, rest string) {
	var other []string
	for _, f := range strings.Fields(rest) {
		k, v, _ := strings.Cut(f, "=")
		switch {
		case k == "host" && l.Host == "":
			l.Host = v
		case k == "pid" && l.Pid == "":
			l.Pid = v
		case k == "trace" && l.Trace == "":
			l.Trace = v
		default:
			other = append(other, f)
		}
	}
	l.Metadata = strings.Join(other, " ")
}

// globEscape escapes the characters of s that a Redis MATCH pattern would read as a glob.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// scanKeys returns the lock keys (without the prefix) that match pattern, sorted, on every
// master of a cluster. The locks of shadow rules are left out unless withShadow.
func (c *client) scanKeys(ctx context.Context, pattern string, withShadow bool) ([]string, error) {
	match := globEscape(c.target.prefix) + pattern
	var (
		mu   sync.Mutex
		keys []string
	)
	scan := func(ctx context.Context, node redis.Cmdable) error {
		iter := node.Scan(ctx, 0, match, 1000).Iterator()
		for iter.Next(ctx) {
			k := strings.TrimPrefix(iter.Val(), c.target.prefix)
			if strings.HasPrefix(iter.Val(), lockstore.FenceKeyPrefix) || strings.HasPrefix(k, replayPrefix) ||
				!withShadow && strings.HasPrefix(k, shadowPrefix) {
				continue
			}
			mu.Lock()
			keys = append(keys, k)
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error { return scan(ctx, node) })
	} else {
		err = scan(ctx, c.rdb)
	}
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", match, err)
	}
	slices.Sort(keys)
	return slices.Compact(keys), nil
}

// inspect reads the locks of keys: value, TTL and waiters. Keys released since the scan are
// left out.
func (c *client) inspect(ctx context.Context, keys []string) ([]lockInfo, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	type reads struct {
		get  *redis.StringCmd
		pttl *redis.DurationCmd
	}
	rs := make([]reads, len(keys))
	_, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			rs[i] = reads{p.Get(ctx, c.redisKey(k)), p.PTTL(ctx, c.redisKey(k))}
		}
		return nil
	})
	// Pipelined reports the first command's error. A reply error of one key (nil for a key
	// released since the scan, WRONGTYPE for a key under the prefix that is not a lock) is
	// that key's business, handled below; only a failure to talk to Redis fails the listing
	// (review 4: one hash under the prefix made ls fail whenever its read came first).
	var replyErr redis.Error
	if err != nil && !errors.As(err, &replyErr) {
		return nil, fmt.Errorf("read locks: %w", err)
	}
	locks := make([]lockInfo, 0, len(keys))
	channels := make([]string, 0, len(keys))
	for i, k := range keys {
		v, err := rs[i].get.Result()
		if errors.Is(err, redis.Nil) {
			continue // released since the scan
		}
		if err != nil {
			// WRONGTYPE: a key under the prefix that is not a string, so not a lock.
			locks = append(locks, lockInfo{Key: k, RedisKey: c.redisKey(k), Unrecognized: "(" + err.Error() + ")"})
			continue
		}
		l := lockInfo{Key: k, RedisKey: c.redisKey(k), TTLMillis: -1, Shadow: strings.HasPrefix(k, shadowPrefix)}
		if d, err := rs[i].pttl.Result(); err == nil && d >= 0 {
			l.TTLMillis = d.Milliseconds()
		}
		parseLock(&l, v)
		locks = append(locks, l)
		channels = append(channels, c.channel(k))
	}
	subs, err := c.numSub(ctx, channels)
	if err != nil {
		return nil, err
	}
	for i := range locks {
		locks[i].Waiters = subs[c.channel(locks[i].Key)]
	}
	return locks, nil
}

// numSub counts the subscribers of each channel: the processes waiting for the release of a
// lock. On a cluster, where a SUBSCRIBE lands on one node, the counts of every node are added.
func (c *client) numSub(ctx context.Context, channels []string) (map[string]int64, error) {
	total := make(map[string]int64, len(channels))
	if len(channels) == 0 {
		return total, nil
	}
	var mu sync.Mutex
	count := func(ctx context.Context, node redis.Cmdable) error {
		for chunk := range slices.Chunk(channels, 500) {
			m, err := node.PubSubNumSub(ctx, chunk...).Result()
			if err != nil {
				return fmt.Errorf("count waiters: %w", err)
			}
			mu.Lock()
			for ch, n := range m {
				total[ch] += n
			}
			mu.Unlock()
		}
		return nil
	}
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		return total, cc.ForEachShard(ctx, func(ctx context.Context, node *redis.Client) error { return count(ctx, node) })
	}
	return total, count(ctx, c.rdb)
}

// lookup reads one lock in full, with the fence counter of its hash slot; errNotHeld when its key
// does not exist.
func (c *client) lookup(ctx context.Context, key string) (lockInfo, error) {
	locks, err := c.inspect(ctx, []string{key})
	if err != nil {
		return lockInfo{}, err
	}
	if len(locks) == 0 {
		return lockInfo{}, fmt.Errorf("%s (Redis key %q): %w", quoteIfOdd(key), c.redisKey(key), errNotHeld)
	}
	l := locks[0]
	l.FenceCounterKey = lockstore.FenceKey(l.RedisKey)
	if n, err := c.rdb.Get(ctx, l.FenceCounterKey).Int64(); err == nil {
		l.FenceCounter = &n
	}
	return l, nil
}
