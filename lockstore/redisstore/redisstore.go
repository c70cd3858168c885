// Package redisstore keeps flightlock's locks in Redis: RedisStore implements lockstore.Store
// and Passer on go-redis v9 (single node, Sentinel failover or Cluster), with one Lua script
// per operation, release notifications over pub/sub, calls batched into pipelines per lane,
// and optional replica acknowledgement (WAIT). RedisInspector reads the values those scripts
// write, for tools. The package imports go-redis and the standard library only; see also
// lockstore/embedded (in-process miniredis) and middleware.NewStore (go-zero's RedisConf).
package redisstore

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/lockstore"
)

// scripts holds the Lua scripts, one operation a file, each opening with its contract.
//
//go:embed *.lua
var scripts embed.FS

// script is file's script after the helper files it calls (a script runs alone), run by EVALSHA.
func script(file string, helpers ...string) *redis.Script {
	var src []byte
	for _, f := range append(helpers, file) {
		b, err := scripts.ReadFile(f)
		if err != nil {
			panic(err) // embedded above: only a misspelt name fails
		}
		src = append(src, b...)
	}
	return redis.NewScript(string(src))
}

var (
	acquireScript     = script("acquire.lua")
	refreshScript     = script("refresh.lua")
	releaseScript     = script("release.lua", "publish.lua")
	reenterScript     = script("reenter.lua")
	readAcquireScript = script("readacquire.lua")
	readRefreshScript = script("readrefresh.lua")
	readReleaseScript = script("readrelease.lua", "publish.lua")
	fairAcquireScript = script("fairacquire.lua")
	leaveQueueScript  = script("leavequeue.lua", "publish.lua")
)

// Reply codes of acquire.lua.
const (
	acquireBusy      = 0
	acquireTaken     = 1
	acquireReentered = 2
	reenterFree      = 3 // reenter.lua: the key is free, nothing was taken
)

// Replies of release.lua other than a count of notified waiters.
const (
	releaseNotHeld   = -1
	releaseHoldsLeft = -2 // one hold given up; re-entries of other processes keep the key
	releaseKept      = 3  // {3, fence}: a pass kept the lock for its owner (Pass)
)

// DefaultChannelPrefix + a lock key names its release channel. With ACLs the user needs "&" +
// prefix + "*" (Redis 7 gives none), or releases wake nobody: waiters wait a retry delay.
const DefaultChannelPrefix = "flightlock:released:"

// Client is the part of go-redis RedisStore uses (redis.UniversalClient has it; tests wrap it).
type Client interface {
	redis.Scripter
	PTTL(ctx context.Context, key string) *redis.DurationCmd
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// Option configures a RedisStore.
type Option func(*RedisStore)

// WithChannelPrefix sets the prefix of release notification channels (default
// DefaultChannelPrefix). All processes that share locks must use the same prefix.
func WithChannelPrefix(p string) Option {
	return func(s *RedisStore) { s.channelPrefix = p }
}

// WithWatchLinger sets how long a subscription outlives its last watcher (default one second),
// so a key waited on again and again is not re-subscribed each time.
func WithWatchLinger(d time.Duration) Option {
	return func(s *RedisStore) {
		if d >= 0 {
			s.notify.linger = d
		}
	}
}

// WithLanes sets how many script calls go to Redis at once before further ones are batched into
// a pipeline per lane (default DefaultLanes). 0: no batching, a pooled connection per call.
func WithLanes(n int) Option {
	return func(s *RedisStore) {
		if n >= 0 {
			s.lanes = n
		}
	}
}

// WithOnClose adds fn to what Close runs once, last added first, after the notification
// subscriber, for a constructor's own client or server (else Close leaves them open).
func WithOnClose(fn func() error) Option {
	return func(s *RedisStore) {
		if fn != nil {
			s.closers = append(s.closers, fn)
		}
	}
}

// RedisStore is the lockstore.Store on Redis, made by New (or embedded.New,
// middleware.NewStore); it is safe for concurrent use.
type RedisStore struct {
	client        Client
	channelPrefix string
	lanes         int
	batch         *batcher // nil: every script call goes straight to the client
	// renewSlots bounds the RefreshAll pipelines on the wire to the lane count: each holds a
	// pooled connection, and the pool keeps the connections it grew to.
	renewSlots chan struct{}
	notify     *notifier
	closers    []func() error // run by Close, last first

	replicas       int           // WithReplicas: acknowledgements a grant or refresh needs; 0: none
	replicaTimeout time.Duration // WithReplicas: how long WAIT waits for them
}

// New returns a store on an existing go-redis client. Closing the store does not close client.
func New(client Client, opts ...Option) *RedisStore {
	s := &RedisStore{
		client:        client,
		channelPrefix: DefaultChannelPrefix,
		lanes:         DefaultLanes,
		notify: &notifier{client: client, linger: time.Second, keepUnconfirmed: unconfirmedKeep,
			channels: make(map[string]*channelState)},
	}
	for _, opt := range opts {
		opt(s)
	}
	s.batch = newBatcher(client, s.lanes)
	if s.batch != nil {
		s.renewSlots = make(chan struct{}, s.lanes)
	}
	return s
}

// Lanes returns how many script calls the store sends at once before it batches; 0 when it
// never batches (WithLanes(0), or a client without pipelines).
func (s *RedisStore) Lanes() int {
	if s.batch == nil {
		return 0
	}
	return s.batch.lanes
}

// run runs script through the batcher (see batcher.run for late), if the store batches.
func (s *RedisStore) run(ctx context.Context, script *redis.Script, keys []string, late func(*redis.Cmd), args ...any) *redis.Cmd {
	if s.batch == nil {
		return script.Run(ctx, s.client, keys, args...)
	}
	return s.batch.run(ctx, script, keys, late, args...)
}

// Client returns the go-redis client the store runs its commands on.
func (s *RedisStore) Client() Client { return s.client }

// Preload loads the scripts into the server's cache, so that the first calls do not get a
// NOSCRIPT reply (go-zero's breaker would count a failure). It is optional.
func (s *RedisStore) Preload(ctx context.Context) error {
	for _, script := range []*redis.Script{acquireScript, refreshScript, releaseScript, reenterScript,
		readAcquireScript, readRefreshScript, readReleaseScript, fairAcquireScript, leaveQueueScript} {
		if err := script.Load(ctx, s.client).Err(); err != nil {
			return fmt.Errorf("flightlock: load scripts: %w", err)
		}
	}
	return nil
}

// Acquire implements lockstore.Store: acquire.lua (for permits too, acquirePermits),
// readacquire.lua for a read owner, and fairacquire.lua for a fair request (acquireFair).
func (s *RedisStore) Acquire(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	if len(req.Permits) > 0 {
		return s.acquirePermits(ctx, req)
	}
	key, owner, ttl := req.Key, req.Owner, req.TTL
	if err := lockstore.CheckArgs(key, owner, ttl); err != nil {
		return lockstore.Acquisition{}, err
	}
	if !req.Asked.IsZero() {
		return s.acquireFair(ctx, req)
	}
	script, keys, args := acquireScript, []string{key, lockstore.FenceKey(key)}, []any{owner, ttlMillis(ttl), metaArg(req.Meta)}
	if lockstore.IsReadOwner(owner) {
		script, keys = readAcquireScript, []string{key, readersKey(key), lockstore.FenceKey(key)}
	}
	return s.acquire(ctx, "acquire", script, keys, args, keys[:1], owner, "", s.releaseOnReply(key, owner, "", acquireTaken))
}

// acquire runs an acquiring script and reads its reply; late is batcher.run's. permits is its
// one key or a run of a semaphore's permits in one hash slot (acquireRun).
func (s *RedisStore) acquire(ctx context.Context, op string, script *redis.Script, keys []string, args []any,
	permits []string, owner, hold string, late func(*redis.Cmd)) (lockstore.Acquisition, error) {
	cmd, acked := s.exec(ctx, script, keys, late, args...)
	code, first, more, value, err := permitReply(cmd, permits)
	if hold == "" && s.slotMoving(err) {
		// Nothing was taken: busy with no holder's TTL (a waiter retries, a rejecter answers
		// busy). A re-entry reports the error: its busy reply would say the grant is gone.
		return lockstore.Acquisition{}, nil
	}
	if err != nil {
		return lockstore.Acquisition{}, s.failed(op, permits[0], err)
	}
	meta, _ := valueMeta(value) // with permits, a grant's is that of a busy permit passed over
	switch code {
	case acquireTaken, acquireReentered:
		if s.unacked(acked) {
			err := s.notReplicated(acked)
			if !s.giveUpWithin(ctx, permits, append([]lockstore.PermitGrant{first}, more...), owner, hold) {
				// The give-up outlives this call: the grant may stand a while, and the owner is spent.
				err = fmt.Errorf("%w (%w)", err, lockstore.ErrOutcomeUnknown)
			}
			return lockstore.Acquisition{}, err
		}
		return lockstore.Acquisition{Acquired: true, Reentered: code == acquireReentered,
			Fence: first.Fence, Permit: first.Permit, More: more, Holder: meta}, nil
	case acquireBusy:
		// PTTL -1 (a key without expiry, not ours) is reported as unknown: 0.
		return lockstore.Acquisition{HolderTTL: time.Duration(max(first.Fence, 0)) * time.Millisecond, Holder: meta}, nil
	case reenterFree:
		return lockstore.Acquisition{}, nil
	}
	return lockstore.Acquisition{}, fmt.Errorf("flightlock: %s %q: unexpected reply code %d", op, permits[0], code)
}

// Reenter implements lockstore.Store.
func (s *RedisStore) Reenter(ctx context.Context, key, owner, hold string, ttl time.Duration) (lockstore.Acquisition, error) {
	if err := cmp.Or(lockstore.CheckArgs(key, owner, ttl), lockstore.CheckHold(hold, false)); err != nil {
		return lockstore.Acquisition{}, err
	}
	if lockstore.IsReadOwner(owner) {
		// Read holds are not handed over; "~r"/"~w" values must not be re-entered by a token.
		return lockstore.Acquisition{}, nil
	}
	keys, args := []string{key}, []any{owner, ttlMillis(ttl), hold}
	late := s.releaseOnReply(key, owner, hold, acquireReentered)
	return s.acquire(ctx, "re-enter", reenterScript, keys, args, keys, owner, hold, late)
}

// reply reads a script reply of two integers and, for a busy acquisition, the lock's value.
func reply(cmd *redis.Cmd) (int64, int64, string, error) {
	if fence, ok := cmd.Val().(int64); ok && cmd.Err() == nil {
		return acquireTaken, fence, "", nil // acquire.lua's common reply is the bare fence
	}
	r, err := cmd.Slice()
	if err != nil {
		return 0, 0, "", err
	}
	if len(r) < 2 || len(r) > 3 {
		return 0, 0, "", fmt.Errorf("unexpected reply %v", r)
	}
	code, ok1 := r[0].(int64)
	n, ok2 := r[1].(int64)
	if !ok1 || !ok2 {
		return 0, 0, "", fmt.Errorf("unexpected reply types %T, %T", r[0], r[1])
	}
	var value string
	if len(r) == 3 {
		value, _ = r[2].(string)
	}
	return code, n, value, nil
}

// valueMeta is the metadata of a lock's value ("<owner> <fence> <holds>[ <meta>][ ~]"), without
// the owner token (which must not leave the store), and whether it ends with the waiters mark.
func valueMeta(value string) (meta string, marked bool) {
	// Cut, not SplitN, which would allocate: acquire reads the value of every reply.
	_, rest, _ := strings.Cut(value, " ") // after the owner
	_, rest, _ = strings.Cut(rest, " ")   // after the fence
	_, rest, ok := strings.Cut(rest, " ") // after the holds
	if !ok {
		return "", false
	}
	if rest == "~" {
		return "", true
	}
	return strings.CutSuffix(rest, " ~")
}

// Refresh implements lockstore.Store.
func (s *RedisStore) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := lockstore.CheckArgs(key, owner, ttl); err != nil {
		return err
	}
	script, keys := refreshCall(key, owner)
	cmd, acked := s.exec(ctx, script, keys, nil, owner, ttlMillis(ttl))
	n, err := cmd.Int64()
	if err == nil && n == 1 && s.unacked(acked) {
		err = s.notReplicated(acked)
	}
	return s.refreshed(key, n, err)
}

// refreshed is the outcome of a refresh of key whose script replied n, or failed with err.
func (s *RedisStore) refreshed(key string, n int64, err error) error {
	if err != nil {
		return s.failed("refresh", key, err)
	}
	if n != 1 {
		return lockstore.ErrNotHeld
	}
	return nil
}

// RefreshAll implements lockstore.Store: one pipeline on a connection beside the lanes, or with
// WithReplicas (a WAIT each) or no pipelines, a Refresh per lock, all at once.
func (s *RedisStore) RefreshAll(ctx context.Context, batch []lockstore.Renewal) []error {
	errs := make([]error, len(batch))
	if s.replicas > 0 || s.batch == nil {
		var wg sync.WaitGroup
		for i, r := range batch {
			wg.Go(func() { errs[i] = s.Refresh(ctx, r.Key, r.Owner, r.TTL) })
		}
		wg.Wait()
		return errs
	}
	calls := make([]*queuedCall, 0, len(batch))
	index := make([]int, 0, len(batch)) // calls[j] refreshes batch[index[j]]
	for i, r := range batch {
		if errs[i] = lockstore.CheckArgs(r.Key, r.Owner, r.TTL); errs[i] != nil {
			continue
		}
		script, keys := refreshCall(r.Key, r.Owner)
		q := &queuedCall{script: script, keys: keys, args: []any{r.Owner, ttlMillis(r.TTL)}}
		q.state.Store(callSent)
		calls, index = append(calls, q), append(index, i)
	}
	if len(calls) == 0 {
		return errs
	}
	select {
	case s.renewSlots <- struct{}{}:
		defer func() { <-s.renewSlots }()
	case <-ctx.Done(): // nothing was sent
		err := fmt.Errorf("flightlock: refresh: waiting for a lane: %w", context.Cause(ctx))
		for _, i := range index {
			errs[i] = err
		}
		return errs
	}
	pipeline(ctx, s.batch.client, calls)
	for j, q := range calls {
		n, err := q.cmd.Int64()
		errs[index[j]] = s.refreshed(batch[index[j]].Key, n, err)
	}
	return errs
}

// Release implements lockstore.Store.
func (s *RedisStore) Release(ctx context.Context, key, owner, hold string, lastFence int64) (int, error) {
	if err := cmp.Or(lockstore.CheckArgs(key, owner, time.Millisecond), lockstore.CheckHold(hold, true)); err != nil {
		return 0, err
	}
	_, _, n, err := s.release(ctx, "release", key, owner, hold, lastFence, "")
	return n, err
}

// Pass implements lockstore.Passer. With WithReplicas it never keeps the lock: a kept lock would
// need a WAIT of its own.
func (s *RedisStore) Pass(ctx context.Context, key, owner string, ttl time.Duration, lastFence int64) (bool, int64, int, error) {
	if err := lockstore.CheckArgs(key, owner, ttl); err != nil {
		return false, 0, 0, err
	}
	if lockstore.IsReadOwner(owner) {
		return false, 0, 0, errors.New("flightlock: a read hold is never passed")
	}
	passTTL := strconv.FormatInt(ttlMillis(ttl), 10)
	if s.replicas > 0 {
		passTTL = ""
	}
	return s.release(ctx, "pass", key, owner, "", lastFence, passTTL)
}

// release runs releaseCall's script: a release of hold or, with passTTL, a pass (args checked).
func (s *RedisStore) release(ctx context.Context, op, key, owner, hold string, lastFence int64, passTTL string) (kept bool, fence int64, notified int, err error) {
	var cmd *redis.Cmd
	script, keys, args := s.releaseCall(key, owner, hold, lastFence, passTTL)
	for {
		cmd = s.run(ctx, script, keys, nil, args...)
		if err = cmd.Err(); !s.slotMoving(err) {
			break
		}
		// Nothing ran: again until the deadline, not to leave a lock to its TTL over a migration.
		select {
		case <-ctx.Done():
			return false, 0, 0, fmt.Errorf("flightlock: %s %q: %w (%w)", op, key, err, ctx.Err())
		case <-time.After(tryAgainPause):
		}
	}
	if err != nil {
		return false, 0, 0, s.failed(op, key, err)
	}
	n, ok := cmd.Val().(int64)
	if !ok {
		code, f, _, err := reply(cmd) // {3, fence}: kept (a pass)
		if err != nil || code != releaseKept {
			return false, 0, 0, fmt.Errorf("flightlock: %s %q: unexpected reply %v (%v)", op, key, cmd.Val(), err)
		}
		return true, f, 0, nil
	}
	switch n {
	case releaseNotHeld:
		return false, 0, 0, lockstore.ErrNotHeld
	case releaseHoldsLeft:
		return false, 0, 0, nil
	}
	return false, 0, int(n), nil
}

// releaseCall is the script (readrelease.lua for a read owner), keys and arguments of release.
func (s *RedisStore) releaseCall(key, owner, hold string, lastFence int64, passTTL string) (*redis.Script, []string, []any) {
	if lockstore.IsReadOwner(owner) {
		return readReleaseScript, []string{key, readersKey(key)}, []any{owner, s.channelPrefix, writerReserveMillis}
	}
	return releaseScript, []string{key, lockstore.FenceKey(key)},
		[]any{owner, s.channelPrefix, strconv.FormatInt(max(lastFence, 0), 10), hold, passTTL}
}

// TTL implements lockstore.Store.
func (s *RedisStore) TTL(ctx context.Context, key string) (time.Duration, error) {
	if err := lockstore.CheckKey(key); err != nil {
		return 0, err
	}
	d, err := s.client.PTTL(ctx, key).Result()
	if err != nil {
		return 0, fmt.Errorf("flightlock: ttl %q: %w", key, err)
	}
	// go-redis reports PTTL's -2 (no key) and -1 (no expiry) as those numbers of nanoseconds.
	if d == -2 {
		return 0, lockstore.ErrNotHeld
	}
	return max(d, 0), nil
}

// Watch implements lockstore.Store.
func (s *RedisStore) Watch(ctx context.Context, key string) (*lockstore.Watch, error) {
	if err := lockstore.CheckKey(key); err != nil {
		return nil, err
	}
	return s.notify.watch(ctx, s.channelPrefix+key)
}

// Capabilities implements lockstore.Store: no bound on TTLs or handoffs (fences come from a
// hybrid clock); the watches of a key share a subscription.
func (s *RedisStore) Capabilities() lockstore.Capabilities {
	return lockstore.Capabilities{Name: "redis", SharedWatch: true}
}

// Close stops the notification subscriber, then runs the WithOnClose functions, last first.
func (s *RedisStore) Close() error {
	err := s.notify.close()
	for i := len(s.closers) - 1; i >= 0; i-- {
		err = errors.Join(err, s.closers[i]())
	}
	s.closers = nil
	return err
}

// metaArg is meta as the scripts take it, "" or " <meta>", without acquire.lua's waiters mark " ~".
func metaArg(meta string) string {
	if meta = strings.TrimRight(meta, " ~"); meta != "" {
		return " " + meta
	}
	return ""
}

// ttlMillis rounds ttl up to milliseconds: never 0 (which Redis rejects), never shorter.
func ttlMillis(ttl time.Duration) int64 {
	return int64((ttl + time.Millisecond - 1) / time.Millisecond)
}

// readersKey names the sorted set of key's read holds (readacquire.lua).
func readersKey(key string) string { return lockstore.SideKey("readers", key) }

// lineKey and lineDueKey name key's fair line and its places' deadlines (fairacquire.lua).
func lineKey(key string) string    { return lockstore.SideKey("line", key) }
func lineDueKey(key string) string { return lockstore.SideKey("linedue", key) }

// writerReserve is how long the last reader keeps a key for its waiting writer (readrelease.lua),
// to beat the readers it held back; at most this, a departed writer holds new readers back.
const writerReserve = time.Second

var writerReserveMillis = strconv.FormatInt(writerReserve.Milliseconds(), 10)

// refreshCall is the script and keys of a refresh of owner's hold of key.
func refreshCall(key, owner string) (*redis.Script, []string) {
	if lockstore.IsReadOwner(owner) {
		return readRefreshScript, []string{key, readersKey(key)}
	}
	return refreshScript, []string{key}
}

// acquireFair is Acquire of a fair request, with fairacquire.lua. Acquire checked the arguments.
func (s *RedisStore) acquireFair(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	key, owner, ttl := req.Key, req.Owner, req.TTL
	if lockstore.IsReadOwner(owner) {
		return lockstore.Acquisition{}, fmt.Errorf("flightlock: fair acquire %q: read holds share and keep no line", key)
	}
	keys := []string{key, lineKey(key), lineDueKey(key), lockstore.FenceKey(key)}
	args := []any{owner, ttlMillis(ttl), metaArg(req.Meta), strconv.FormatInt(req.Asked.UnixMicro(), 10), strconv.FormatInt(ttlMillis(max(req.Queue, 0)), 10)}
	taken := s.releaseOnReply(key, owner, "", acquireTaken)
	late := func(cmd *redis.Cmd) {
		// The caller left: a grant is given back, and a place left, so nobody waits behind it.
		taken(cmd)
		if code, _, _, err := reply(cmd); err == nil && code == acquireBusy {
			ctx, cancel := context.WithTimeout(context.Background(), orphanReleaseTimeout)
			defer cancel()
			_ = s.LeaveQueue(ctx, key, owner)
		}
	}
	return s.acquire(ctx, "fair acquire", fairAcquireScript, keys, args, keys[:1], owner, "", late)
}

// LeaveQueue implements lockstore.Store with leavequeue.lua.
func (s *RedisStore) LeaveQueue(ctx context.Context, key, owner string) error {
	if err := lockstore.CheckArgs(key, owner, time.Millisecond); err != nil {
		return err
	}
	keys := []string{key, lineKey(key), lineDueKey(key)}
	if err := s.run(ctx, leaveQueueScript, keys, nil, owner, s.channelPrefix).Err(); err != nil {
		return s.failed("leave the line of", key, err)
	}
	return nil
}

// acquirePermits is one acquire.lua call over Permits, or on a Cluster one per run in a slot
// (lockstore.PermitKey keeps them in one, unless the key has a "{" opening no hash tag).
func (s *RedisStore) acquirePermits(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	if err := lockstore.CheckPermits(req); err != nil {
		return lockstore.Acquisition{}, err
	}
	_, cluster := s.client.(*redis.ClusterClient)
	var busy lockstore.Acquisition
	for from := 0; from < len(req.Permits); {
		to := from + 1
		for to < len(req.Permits) && (!cluster || lockstore.KeySlot(req.Permits[to]) == lockstore.KeySlot(req.Permits[from])) {
			to++
		}
		res, err := s.acquireRun(ctx, req, req.Permits[from:to])
		res.Permit += from
		for i := range res.More {
			res.More[i].Permit += from
		}
		if err != nil || res.Acquired {
			res.Holder = cmp.Or(res.Holder, busy.Holder)
			return res, err
		}
		if from == 0 || res.HolderTTL < busy.HolderTTL {
			busy.HolderTTL, busy.Holder = res.HolderTTL, res.Holder
		}
		from = to
	}
	return busy, nil
}

// acquireRun is one acquire.lua call over permits, which share a hash slot.
func (s *RedisStore) acquireRun(ctx context.Context, req lockstore.Request, permits []string) (lockstore.Acquisition, error) {
	keys := make([]string, 0, 2*len(permits))
	for _, k := range permits {
		keys = append(keys, k, lockstore.FenceKey(k))
	}
	args := []any{req.Owner, ttlMillis(req.TTL), metaArg(req.Meta), max(req.Want, 1)}
	late := func(cmd *redis.Cmd) {
		// An orphan: whichever permits the call took go back.
		if code, first, more, _, err := permitReply(cmd, permits); err == nil && code != acquireBusy {
			s.giveUpWithin(context.Background(), permits, append([]lockstore.PermitGrant{first}, more...), req.Owner, "")
		}
	}
	return s.acquire(ctx, "acquire", acquireScript, keys, args, permits, req.Owner, "", late)
}

// permitReply reads acquire.lua's reply over permits: reply's for one, else {1 or 2, a value,
// then a fence and a place from 1 per permit taken or re-entered} or {0, pttl, value}. first
// is the first permit taken (a busy reply's pttl in its Fence), more the others; a grant's
// value is that of a busy permit it passed over.
func permitReply(cmd *redis.Cmd, permits []string) (code int64, first lockstore.PermitGrant, more []lockstore.PermitGrant, value string, err error) {
	if len(permits) == 1 {
		code, first.Fence, value, err = reply(cmd)
		return code, first, nil, value, err
	}
	r, err := cmd.Slice()
	if err != nil {
		return 0, first, nil, "", err
	}
	code, ok := r[0].(int64)
	if code == acquireBusy && ok && len(r) == 3 {
		first.Fence, _ = r[1].(int64)
		value, _ = r[2].(string)
		return code, first, nil, value, nil
	}
	if !ok || len(r) < 4 || len(r)%2 != 0 {
		return 0, first, nil, "", fmt.Errorf("unexpected reply %v", r)
	}
	value, _ = r[1].(string)
	var grants []lockstore.PermitGrant
	for j := 2; j < len(r); j += 2 {
		fence, ok1 := r[j].(int64)
		place, ok2 := r[j+1].(int64)
		if !ok1 || !ok2 || place < 1 || int(place) > len(permits) {
			return 0, first, nil, "", fmt.Errorf("unexpected permit reply %v of %d permits", r, len(permits))
		}
		grants = append(grants, lockstore.PermitGrant{Permit: int(place) - 1, Fence: fence})
	}
	return code, grants[0], grants[1:], value, nil
}

// orphanReleaseTimeout bounds the release of an orphan's lock, else left to its TTL.
const orphanReleaseTimeout = time.Second

// releaseOnReply is the late hook (batcher.run) of a call taking hold ("": the own) of key for
// owner: a reply with code, counting a hold for this very call (acquireTaken for an acquire),
// names a hold nobody knows of, given up, not left to its TTL. Busy took nothing, an error tells
// nothing, and re-entered means a hold counted on (or go-redis re-sent this call, which the
// store cannot tell; the Locker gives back an acquisition it gave up on).
func (s *RedisStore) releaseOnReply(key, owner, hold string, code int64) func(*redis.Cmd) {
	return func(cmd *redis.Cmd) {
		if got, _, _, err := reply(cmd); err != nil || got != code {
			return
		}
		_ = s.giveUp(key, owner, hold)
	}
}

// giveUp releases a hold nobody will use (an orphan's, one not replicated) on the client, not
// a lane, bounded (else left to its TTL), with lastFence 0: it handed out no further fence.
func (s *RedisStore) giveUp(key, owner, hold string) error {
	ctx, cancel := context.WithTimeout(context.Background(), orphanReleaseTimeout)
	defer cancel()
	script, keys, args := s.releaseCall(key, owner, hold, 0, "")
	return script.Run(ctx, s.client, keys, args...).Err()
}

// giveUpWithin gives up owner's grants of permits (hold) at once, reporting whether all were by
// ctx's end; the rest goes on in the background, or is left to its TTL.
func (s *RedisStore) giveUpWithin(ctx context.Context, permits []string, grants []lockstore.PermitGrant, owner, hold string) bool {
	errs := make(chan error, len(grants))
	for _, g := range grants {
		go func() { errs <- s.giveUp(permits[g.Permit], owner, hold) }()
	}
	for range grants {
		select {
		case err := <-errs:
			if err != nil && !errors.Is(err, redis.Nil) {
				return false
			}
		case <-ctx.Done():
			return false
		}
	}
	return true
}
