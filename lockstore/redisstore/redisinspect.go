package redisstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/internal/glob"
	"github.com/flightlock/flightlock/lockstore"
)

var forceReleaseScript = script("forcerelease.lua", "publish.lua")

// RedisInspector is the lockstore.Inspector of a RedisStore's locks under one prefix.
type RedisInspector struct {
	client redis.UniversalClient
	prefix string
}

var _ lockstore.Inspector = (*RedisInspector)(nil)

// NewInspector returns the inspector of the locks under prefix (the Locker's WithPrefix) on
// client, with DefaultChannelPrefix; on a Cluster it reads every master. It leaves client open.
func NewInspector(client redis.UniversalClient, prefix string) *RedisInspector {
	return &RedisInspector{client: client, prefix: prefix}
}

func (r *RedisInspector) storeKey(key string) string { return r.prefix + key }

func (r *RedisInspector) channel(key string) string {
	return DefaultChannelPrefix + r.storeKey(key)
}

// List implements lockstore.Inspector: a SCAN of every master, then the first opts.Limit locks.
func (r *RedisInspector) List(ctx context.Context, pattern string, opts lockstore.ListOptions) ([]lockstore.LockInfo, int, error) {
	keys, err := r.scanKeys(ctx, pattern, opts.Skip)
	if err != nil {
		return nil, 0, err
	}
	more := 0
	if opts.Limit > 0 && len(keys) > opts.Limit {
		keys, more = keys[:opts.Limit], len(keys)-opts.Limit
	}
	locks, err := r.read(ctx, keys)
	return locks, more, err
}

// Lookup implements lockstore.Inspector, with the fence counter of the key's hash slot.
func (r *RedisInspector) Lookup(ctx context.Context, key string) (lockstore.LockInfo, error) {
	locks, err := r.read(ctx, []string{key})
	if err != nil {
		return lockstore.LockInfo{}, err
	}
	if len(locks) == 0 {
		return lockstore.LockInfo{}, fmt.Errorf("Redis key %q: %w", r.storeKey(key), lockstore.ErrNotHeld)
	}
	l := locks[0]
	l.FenceCounterKey = lockstore.FenceKey(l.StoreKey)
	if n, err := r.client.Get(ctx, l.FenceCounterKey).Int64(); err == nil {
		l.FenceCounter = &n
	}
	return l, nil
}

// ForceUnlock implements lockstore.Inspector with forcerelease.lua of l's owner and fence: a
// lock whose holds changed since is still removed, one that changed hands not.
func (r *RedisInspector) ForceUnlock(ctx context.Context, l lockstore.LockInfo) (int, error) {
	if l.Owner == "" || l.Unrecognized != "" {
		return 0, fmt.Errorf("%q is not a flightlock lock", l.StoreKey)
	}
	reply, err := forceReleaseScript.Run(ctx, r.client, []string{r.storeKey(l.Key)},
		l.Owner+" "+strconv.FormatInt(l.Fence, 10)+" ", r.channel(l.Key)).Slice()
	if err != nil {
		return 0, err
	}
	if len(reply) != 2 {
		return 0, fmt.Errorf("unexpected reply %v", reply)
	}
	if done, _ := reply[0].(int64); done != 1 {
		changed := &lockstore.ChangedError{}
		if v, _ := reply[1].(string); v != "" {
			now := lockstore.LockInfo{Key: l.Key, StoreKey: l.StoreKey, TTL: lockstore.NoTTL}
			parseLock(&now, v)
			changed.Now = &now
		}
		return 0, changed
	}
	woken, _ := reply[1].(int64)
	return int(woken), nil
}

// Owners of a read-write lock's value between writers (readacquire.lua): held by readers, and
// left by the last of them to the writer that waited.
const (
	readersOwner  = "~r:" // then the stamp of the group of readers
	reservedOwner = "~w"
)

// parseLock fills l from its key's value, "<owner> <fence> <holds>[ <metadata>][ ~]"
// (acquire.lua); another value goes to l.Unrecognized (an empty one as EmptyValue).
func parseLock(l *lockstore.LockInfo, value string) {
	if value == "" {
		l.Unrecognized = lockstore.EmptyValue
		return
	}
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
	l.Owner, l.Fence, l.Own, l.Borrowed = fields[0], fence, holds[0] == "1", holds[1:]
	var meta string
	meta, l.Contended = valueMeta(value)
	l.ParseHolder(meta)
}

// scanKeys returns the lock keys (no prefix) matching pattern on every master, sorted, but
// not the fence counters nor what skip refuses.
func (r *RedisInspector) scanKeys(ctx context.Context, pattern string, skip func(string) bool) ([]string, error) {
	match := glob.Escape(r.prefix) + pattern
	var (
		mu   sync.Mutex
		keys []string
	)
	scan := func(ctx context.Context, node redis.Cmdable) error {
		iter := node.Scan(ctx, 0, match, 1000).Iterator()
		for iter.Next(ctx) {
			full := iter.Val()
			k := strings.TrimPrefix(full, r.prefix)
			if strings.HasPrefix(full, lockstore.FenceKeyPrefix) || skip != nil && skip(k) {
				continue
			}
			mu.Lock()
			keys = append(keys, k)
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	if cc, ok := r.client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error { return scan(ctx, node) })
	} else {
		err = scan(ctx, r.client)
	}
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", match, err)
	}
	slices.Sort(keys)
	return slices.Compact(keys), nil
}

// read reads keys' locks (value, TTL, waiters) in order, leaving out those released since.
func (r *RedisInspector) read(ctx context.Context, keys []string) ([]lockstore.LockInfo, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	type reads struct {
		get           *redis.StringCmd
		pttl          *redis.DurationCmd
		readers, line *redis.IntCmd
	}
	rs := make([]reads, len(keys))
	_, err := r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			full := r.storeKey(k)
			rs[i] = reads{p.Get(ctx, full), p.PTTL(ctx, full), p.ZCard(ctx, readersKey(full)), p.ZCard(ctx, lineKey(full))}
		}
		return nil
	})
	// Pipelined reports the first command's error. A key's own reply error (nil, WRONGTYPE) is
	// handled below, so one foreign key cannot hide the locks. A failure to talk to Redis fails
	// the read, as does any other reply error (NOAUTH, WRONGPASS, NOPERM, LOADING): it says
	// nothing of the key, and would show as a non-lock's value.
	var replyErr redis.Error
	if err != nil && !errors.As(err, &replyErr) {
		return nil, fmt.Errorf("read locks: %w", err)
	}
	locks := make([]lockstore.LockInfo, 0, len(keys))
	channels := make([]string, 0, len(keys))
	for i, k := range keys {
		v, err := rs[i].get.Result()
		switch {
		case errors.Is(err, redis.Nil):
			continue // released since the scan
		case redis.HasErrorPrefix(err, "WRONGTYPE"): // not a string, so not a lock
			locks = append(locks, lockstore.LockInfo{Key: k, StoreKey: r.storeKey(k), Unrecognized: "(" + err.Error() + ")"})
			continue
		case err != nil:
			return nil, fmt.Errorf("read locks: %w", err)
		}
		l := lockstore.LockInfo{Key: k, StoreKey: r.storeKey(k), TTL: lockstore.NoTTL}
		if d, err := rs[i].pttl.Result(); err == nil && d >= 0 {
			l.TTL = d
		}
		parseLock(&l, v)
		switch {
		case strings.HasPrefix(l.Owner, readersOwner):
			// Owner stays the readers' marker, naming with the fence this group for ForceUnlock.
			l.Readers = int(rs[i].readers.Val())
		case l.Owner == reservedOwner:
			l.Owner = "" // nobody's: kept for the writer that waited, for a second
		}
		l.Queued = int(rs[i].line.Val())
		locks = append(locks, l)
		channels = append(channels, r.channel(k))
	}
	subs, err := r.numSub(ctx, channels)
	if err != nil {
		return nil, err
	}
	for i := range locks {
		locks[i].Waiters = subs[r.channel(locks[i].Key)]
	}
	return locks, nil
}

// numSub counts each channel's subscribers (waiters), adding up a cluster's nodes (a SUBSCRIBE
// lands on one).
func (r *RedisInspector) numSub(ctx context.Context, channels []string) (map[string]int64, error) {
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
	if cc, ok := r.client.(*redis.ClusterClient); ok {
		return total, cc.ForEachShard(ctx, func(ctx context.Context, node *redis.Client) error { return count(ctx, node) })
	}
	return total, count(ctx, r.client)
}

// Watch implements lockstore.Inspector by keyspace notifications if sent (per node: not on a
// Cluster), else by comparing reads and hearing release channels; TTLs read every Interval.
func (r *RedisInspector) Watch(ctx context.Context, pattern string, opts lockstore.WatchOptions, fn func(lockstore.Event)) error {
	opts = opts.WithDefaults()
	w := &redisWatch{r: r, pattern: pattern, opts: opts, fn: fn, gone: make(map[string]int)}
	rctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	w.keyspace = keyspaceEnabled(rctx, r.client)
	cancel()
	mode := "keyspace notifications"
	channel := "__keyspace@*__:" + glob.Escape(r.prefix) + pattern
	if !w.keyspace {
		mode = "polling every " + w.opts.Interval.String()
		channel = DefaultChannelPrefix + glob.Escape(r.prefix) + pattern
	}

	ps := r.client.PSubscribe(ctx, channel)
	defer ps.Close()
	// The subscription's confirmation, awaited no longer than any read. go-redis's Receive
	// heeds a deadline but not a cancellation (an operator's interrupt): closing ps ends it.
	rctx, cancel = context.WithTimeout(ctx, opts.Timeout)
	stop := context.AfterFunc(rctx, func() { _ = ps.Close() })
	_, err := ps.Receive(rctx)
	closed := !stop()
	if rerr := rctx.Err(); closed || err != nil && rerr != nil {
		err = rerr // the read's own error may be ps closed under it
	}
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil // ended on purpose
		}
		return fmt.Errorf("subscribe %s: %w", channel, err)
	}
	return lockstore.PollWatch(ctx, opts, mode, w.poll, ps.Channel(), w.notified, fn)
}

// keyspaceEnabled says whether the server publishes the notifications needed: K with $gx or A.
func keyspaceEnabled(ctx context.Context, client redis.UniversalClient) bool {
	if _, ok := client.(*redis.ClusterClient); ok {
		return false // notifications are per node; polling sees every master
	}
	m, err := client.ConfigGet(ctx, "notify-keyspace-events").Result()
	if err != nil {
		return false
	}
	f := m["notify-keyspace-events"]
	has := func(c string) bool { return strings.Contains(f, c) }
	return has("K") && (has("A") || has("$") && has("g") && has("x"))
}

// redisWatch is the state of one Watch call, owned by its goroutine.
type redisWatch struct {
	r        *RedisInspector
	pattern  string
	opts     lockstore.WatchOptions // with defaults
	fn       func(lockstore.Event)
	keyspace bool // events come from keyspace notifications; else from comparing reads

	held map[string]lockstore.LockInfo // the matching locks as last seen, by key; nil before the first poll
	// gone are the keys a recent poll reported gone, by poll number: a later notification of
	// that release is no second event. A mark lives goneMarkPolls polls, not to pile up.
	gone  map[string]int
	polls int
}

const goneMarkPolls = 3

// poll reads the matching locks and makes them the ones held, first reporting how they differ
// from the last read (lockstore.Changes) unless keyspace notifications report the changes.
func (w *redisWatch) poll(ctx context.Context) ([]lockstore.LockInfo, error) {
	locks, _, err := w.r.List(ctx, w.pattern, lockstore.ListOptions{Skip: w.opts.Skip})
	if err != nil {
		return nil, err
	}
	held := w.held
	if w.keyspace {
		held = nil
	}
	now, gone := lockstore.Changes(held, locks, w.fn)
	w.polls++
	maps.DeleteFunc(w.gone, func(k string, at int) bool {
		_, back := now[k]
		return back || w.polls-at >= goneMarkPolls
	})
	for _, k := range gone {
		w.gone[k] = w.polls
	}
	w.held = now
	return locks, nil
}

// keyspaceKinds are the keyspace events a watch reports (not pexpire, a renewal). A set is an
// acquisition or, of the same grant, a change: notified tells.
var keyspaceKinds = map[string]lockstore.EventKind{
	"set":     lockstore.EventAcquired,
	"append":  lockstore.EventContended,
	"del":     lockstore.EventReleased,
	"expired": lockstore.EventExpired,
}

// notified handles a keyspace event, or (polling) a release notification.
func (w *redisWatch) notified(ctx context.Context, m *redis.Message) error {
	storeKey, kind := strings.TrimPrefix(m.Channel, DefaultChannelPrefix), lockstore.EventReleased
	if w.keyspace {
		var ok bool
		if kind, ok = keyspaceKinds[m.Payload]; !ok {
			return nil
		}
		_, storeKey, _ = strings.Cut(m.Channel, "__:")
	}
	key, ok := strings.CutPrefix(storeKey, w.r.prefix)
	if !ok || strings.HasPrefix(storeKey, lockstore.FenceKeyPrefix) || w.opts.Skip != nil && w.opts.Skip(key) {
		return nil
	}

	if kind == lockstore.EventReleased || kind == lockstore.EventExpired {
		l, seen := w.held[key]
		if _, marked := w.gone[key]; !seen && marked {
			delete(w.gone, key) // reported gone by the poll that read it released
			return nil
		}
		if !seen {
			l = lockstore.LockInfo{Key: key, StoreKey: storeKey, TTL: lockstore.NoTTL}
		}
		delete(w.held, key)
		w.fn(lockstore.Event{Kind: kind, Lock: l})
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, w.opts.Timeout)
	defer cancel()
	locks, err := w.r.read(rctx, []string{key})
	if err != nil {
		return err
	}
	if len(locks) == 0 { // released before it could be read; its del event follows
		w.fn(lockstore.Event{Kind: kind, Lock: lockstore.LockInfo{Key: key, StoreKey: storeKey, TTL: lockstore.NoTTL}})
		return nil
	}
	l := locks[0]
	if prev, seen := w.held[key]; kind == lockstore.EventAcquired && seen && prev.Owner == l.Owner && prev.Fence == l.Fence {
		kind = lockstore.EventChanged
	}
	w.held[key] = l
	w.fn(lockstore.Event{Kind: kind, Lock: l})
	return nil
}

// The middleware finds a store's name and response store through Describer, at run time.
var _ lockstore.Describer = (*RedisStore)(nil)

// Describe implements lockstore.Describer: "redis", the inspector (on a UniversalClient) and
// the response store, for keys under prefix.
func (s *RedisStore) Describe(prefix string) *lockstore.Backend {
	b := &lockstore.Backend{Name: "redis", Store: s, Prefix: prefix, Responses: &responses{client: s.client, prefix: prefix}}
	if uc, ok := s.client.(redis.UniversalClient); ok {
		b.Inspector = NewInspector(uc, prefix)
	}
	return b
}

// Scripts on the store's client: GET and SET through scripts work on every go-redis client.
var (
	responseGet = redis.NewScript(`return redis.call('GET', KEYS[1])`)
	responseSet = script("saveresponse.lua")
)

// saveBound bounds a save, which runs under the lock uncancelled: a slow Redis must not hold it.
const saveBound = time.Second

// responses keeps share rules' responses in Redis, on the lock store's client.
type responses struct {
	client Client
	prefix string
}

func (s *responses) Load(ctx context.Context, key string) ([]byte, error) {
	v, err := responseGet.Run(ctx, s.client, []string{s.prefix + key}).Text()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return []byte(v), nil
}

// Save stores record under key for ttl, in milliseconds.
func (s *responses) Save(ctx context.Context, key string, record []byte, fence int64, ttl time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, saveBound)
	defer cancel()
	return responseSet.Run(ctx, s.client, []string{s.prefix + key}, record, max(ttl.Milliseconds(), 1), fence).Err()
}
