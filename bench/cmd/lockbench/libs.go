package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"
	"github.com/zeromicro/go-zero/core/logx"
	zeroredis "github.com/zeromicro/go-zero/core/stores/redis"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/bench/internal/httpbench"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/redisstore"
)

// lockTTL is the lease TTL every library gets; no critical section comes near it.
const lockTTL = 10 * time.Second

// waitBudget bounds one blocking acquisition for every library; a Lock that runs out of it is
// counted as an error in the tables.
const waitBudget = 30 * time.Second

// errBusy is what a single failed attempt (TryLock) returns, whatever the library says; the
// lock middleware of scenario 6's replaced rows answers 409 for it.
var errBusy = httpbench.ErrBusy

// tried is one attempt's outcome as a row returns it: the library's refusal (busy) is errBusy.
func tried[H any](h H, err error, busy error) (any, error) {
	if errors.Is(err, busy) {
		return nil, errBusy
	}
	return h, err
}

// impl is one row of a table: a library with one waiting strategy, or a floor.
type impl interface {
	// key maps a benchmark key to the key the row passes to its library, computed outside the
	// measured loops so that the row's own allocations are all the library's.
	key(base string) string
	// lock takes the key, waiting (by the library's own means or our polling loop) until it
	// is held or ctx ends.
	lock(ctx context.Context, key string) (any, error)
	// tryLock makes one attempt.
	tryLock(ctx context.Context, key string) (any, error)
	unlock(ctx context.Context, key string, h any) error
	// roundTrips counts the client-side round trips so far (go-redis hook).
	roundTrips() int64
	close()
}

// rowSpec names a row and builds it on a server address.
type rowSpec struct {
	id    string // stable identifier, used on the worker command line
	lib   string // library
	wait  string // how it waits for a busy key
	floor bool   // not a lock: a lower bound on cost
	// permits is how many holders of a key the row admits at once: 0 for a lock, n for a
	// semaphore's rows (scenario 10), whose guards then admit n.
	permits int
	// rw says the row is a read-write lock (scenario 11): its impl is an rwImpl, and its
	// holders draw reads and writes.
	rw bool
	// client is the setting of the row's go-redis client (tuned if empty); a row without a
	// go-redis client of ours ignores it.
	client clientSetting
	build  func(addr string, s clientSetting) (impl, error)
}

func (r rowSpec) label() string {
	if r.wait == "" {
		return r.lib
	}
	return r.lib + " (" + r.wait + ")"
}

// idiomatic polling intervals, from each library's own documentation.
const (
	redislockPoll = 100 * time.Millisecond // bsm/redislock's example: LinearBackoff(100ms)
	gozeroPoll    = 100 * time.Millisecond // go-zero RedisLock has no waiting; same as redislock's example
)

func allRows() []rowSpec {
	return []rowSpec{
		{id: "flightlock", lib: "flightlock", wait: "gate + release notification", build: func(a string, s clientSetting) (impl, error) { return newFlightlock(a, s) }},
		{id: "redislock", lib: "bsm/redislock", wait: "LinearBackoff 100ms", build: func(a string, s clientSetting) (impl, error) { return newRedislock(a, s, redislockPoll) }},
		{id: "redislock-1ms", lib: "bsm/redislock", wait: "LinearBackoff 1ms", build: func(a string, s clientSetting) (impl, error) { return newRedislock(a, s, time.Millisecond) }},
		{id: "redsync", lib: "redsync", wait: "built-in retry, 50-250ms random", build: func(a string, s clientSetting) (impl, error) { return newRedsync(a, s, 0) }},
		{id: "redsync-1ms", lib: "redsync", wait: "retry delay 1ms", build: func(a string, s clientSetting) (impl, error) { return newRedsync(a, s, time.Millisecond) }},
		{id: "gozero", lib: "go-zero RedisLock", wait: "poll 100ms", build: func(a string, _ clientSetting) (impl, error) { return newGozero(a, gozeroPoll) }},
		{id: "gozero-1ms", lib: "go-zero RedisLock", wait: "poll 1ms", build: func(a string, _ clientSetting) (impl, error) { return newGozero(a, time.Millisecond) }},
		{id: "rueidislock", lib: "rueidislock", wait: "client-side caching invalidation", build: newRueidislock},
		{id: "store", lib: "flightlock's RedisStore alone", wait: "scenario 1 only: its acquire and release scripts without the Locker (no gate, no lease, no watchdog), to split flightlock's cost", floor: true, build: newStoreRow},
		{id: "ping", lib: "floor: PING", floor: true, build: func(a string, s clientSetting) (impl, error) { return newFloor(a, s, true) }},
		{id: "setdel", lib: "floor: SET PX + DEL", floor: true, build: func(a string, s clientSetting) (impl, error) { return newFloor(a, s, false) }},
	}
}

// rowByID is the Redis row id, among every scenario's.
func rowByID(id string) (rowSpec, bool) {
	rows := slices.Concat(allRows(), defaultClientRows(), semaphoreRows(), rwRows(), fairRows())
	if i := slices.IndexFunc(rows, func(r rowSpec) bool { return r.id == id }); i >= 0 {
		return rows[i], true
	}
	return rowSpec{}, false
}

// clientSetting is how a row's go-redis client is configured.
type clientSetting string

const (
	// tunedClient is the bench's own client: the identity handshake off (Debian's Redis 7.0
	// rejects CLIENT SETINFO) and context deadlines on socket I/O. Every row uses it unless it
	// says otherwise.
	tunedClient clientSetting = "tuned"
	// defaultClient is redis.Options{Addr} and nothing else, as a user who never read the
	// options would build it (pool 10 x GOMAXPROCS, no ContextTimeoutEnabled, CLIENT SETINFO
	// sent on every new connection): a benchmark written outside this repository uses such
	// clients, and its figures differ from the tuned rows', so scenario 13 runs both.
	defaultClient clientSetting = "default"
)

// goredisRow is what every row on a go-redis client of ours has: the client, one pool per
// row, the hook that counts its round trips, and the prefix of the row's keys.
type goredisRow struct {
	client *redis.Client
	rt     *rtCounter
	prefix string
}

// newClient is a row's go-redis client on setting s, for keys named after prefix.
func newClient(addr string, s clientSetting, prefix string) goredisRow {
	o := &redis.Options{Addr: addr}
	if s != defaultClient {
		o.DisableIdentity, o.ContextTimeoutEnabled = true, true
	}
	c := goredisRow{client: redis.NewClient(o), rt: &rtCounter{}, prefix: prefix}
	c.client.AddHook(c.rt)
	return c
}

func (g goredisRow) key(base string) string { return g.prefix + base }
func (g goredisRow) roundTrips() int64      { return g.rt.n.Load() }
func (g goredisRow) counter() *rtCounter    { return g.rt }
func (g goredisRow) close()                 { _ = g.client.Close() }

// lockerRow is a flightlock Locker as a row, on every store: lock is Lock, tryLock a TryLock
// of its Reject twin (which shares its gate), unlock the lease's Release. The Locker adds its
// own key prefix.
type lockerRow struct {
	locker, reject *flightlock.Locker
}

func newLockerRow(l *flightlock.Locker) (lockerRow, error) {
	r, err := l.With(flightlock.WithMode(flightlock.Reject))
	return lockerRow{locker: l, reject: r}, err
}

func (f lockerRow) key(base string) string { return base }

func (f lockerRow) lock(ctx context.Context, key string) (any, error) { return f.locker.Lock(ctx, key) }

func (f lockerRow) tryLock(ctx context.Context, key string) (any, error) {
	l, err := f.reject.TryLock(ctx, key)
	return tried(l, err, flightlock.ErrBusy)
}

func (f lockerRow) unlock(ctx context.Context, _ string, h any) error {
	return h.(*flightlock.Lease).Release(ctx)
}

func (f lockerRow) roundTrips() int64 { return 0 }
func (f lockerRow) close()            {}

type flightlockImpl struct {
	lockerRow
	goredisRow
	store *redisstore.RedisStore
}

// newFlightlock is the flightlock row on a client of setting s: the store with its defaults,
// the common TTL and wait, then opts (scenario 10's permits, scenario 12's fairness). On the
// tuned client the keys get a prefix; the default-client row is built as a benchmark written
// outside this repository builds it, with nothing more.
func newFlightlock(addr string, s clientSetting, opts ...flightlock.Option) (*flightlockImpl, error) {
	c := newClient(addr, s, "")
	store := redisstore.New(c.client)
	common := []flightlock.Option{flightlock.WithTTL(lockTTL), flightlock.WithWait(waitBudget)}
	if s != defaultClient {
		common = append(common, flightlock.WithPrefix("fl:"))
	}
	l, err := flightlock.New(store, append(common, opts...)...)
	if err != nil {
		return nil, err
	}
	row, err := newLockerRow(l)
	if err != nil {
		return nil, err
	}
	return &flightlockImpl{lockerRow: row, goredisRow: c, store: store}, nil
}

func (f *flightlockImpl) key(base string) string { return base } // the Locker adds its prefix
func (f *flightlockImpl) roundTrips() int64      { return f.goredisRow.roundTrips() }
func (f *flightlockImpl) close()                 { _ = f.store.Close(); _ = f.client.Close() }

// redislockImpl is bsm/redislock's row.
type redislockImpl struct {
	goredisRow
	lc   *redislock.Client
	poll time.Duration
}

func newRedislock(addr string, s clientSetting, poll time.Duration) (impl, error) {
	c := newClient(addr, s, "rl:")
	return &redislockImpl{goredisRow: c, lc: redislock.New(c.client), poll: poll}, nil
}

func (r *redislockImpl) lock(ctx context.Context, key string) (any, error) {
	// redislock's retry strategies keep state, so each Obtain gets its own (as its docs show).
	return r.lc.Obtain(ctx, key, lockTTL, &redislock.Options{RetryStrategy: redislock.LinearBackoff(r.poll)})
}

func (r *redislockImpl) tryLock(ctx context.Context, key string) (any, error) {
	l, err := r.lc.Obtain(ctx, key, lockTTL, nil)
	return tried(l, err, redislock.ErrNotObtained)
}

func (r *redislockImpl) unlock(ctx context.Context, _ string, h any) error {
	return h.(*redislock.Lock).Release(ctx)
}

// redsyncImpl is redsync's row.
type redsyncImpl struct {
	goredisRow
	rs   *redsync.Redsync
	opts []redsync.Option
}

func newRedsync(addr string, s clientSetting, delay time.Duration) (impl, error) {
	c := newClient(addr, s, "rs:")
	opts := []redsync.Option{redsync.WithExpiry(lockTTL), redsync.WithTries(math.MaxInt32)}
	if delay > 0 {
		opts = append(opts, redsync.WithRetryDelay(delay))
	}
	return &redsyncImpl{goredisRow: c, rs: redsync.New(redsyncgoredis.NewPool(c.client)), opts: opts}, nil
}

func (r *redsyncImpl) lock(ctx context.Context, key string) (any, error) {
	m := r.rs.NewMutex(key, r.opts...)
	return m, m.LockContext(ctx)
}

func (r *redsyncImpl) tryLock(ctx context.Context, key string) (any, error) {
	m := r.rs.NewMutex(key, r.opts...)
	err := m.TryLockContext(ctx)
	var taken *redsync.ErrTaken
	var nodeTaken *redsync.ErrNodeTaken
	if errors.Is(err, redsync.ErrFailed) || errors.As(err, &taken) || errors.As(err, &nodeTaken) {
		return nil, errBusy
	}
	return m, err
}

func (r *redsyncImpl) unlock(ctx context.Context, _ string, h any) error {
	ok, err := h.(*redsync.Mutex).UnlockContext(ctx)
	if err == nil && !ok {
		err = errors.New("redsync: unlock refused")
	}
	return err
}

// gozeroImpl is go-zero RedisLock's row.
type gozeroImpl struct {
	store *zeroredis.Redis
	rt    *rtCounter
	poll  time.Duration
}

// gozeroRT: go-zero keeps one client per address in a process-wide manager, so the hook
// passed to the first Redis built for an address counts every later one too.
var gozeroRT = map[string]*rtCounter{}

func newGozero(addr string, poll time.Duration) (impl, error) {
	logx.Disable()
	h := gozeroRT[addr]
	if h == nil {
		h = &rtCounter{}
		gozeroRT[addr] = h
	}
	// DisableIdentity (go-zero's WithIdentity option) keeps go-redis from sending CLIENT
	// SETINFO, which Redis 7.0 rejects and go-zero's breaker would count as a failure.
	store, err := zeroredis.NewRedis(zeroredis.RedisConf{Host: addr, Type: zeroredis.NodeType, DisableIdentity: true, NonBlock: true},
		zeroredis.WithHook(h))
	if err != nil {
		return nil, err
	}
	return &gozeroImpl{store: store, rt: h, poll: poll}, nil
}

func (g *gozeroImpl) key(base string) string { return "gz:" + base }

// lock polls every g.poll: go-zero's RedisLock has no waiting of its own. One RedisLock (one
// owner id) and one timer serve every poll of an acquisition, as a service would write it.
func (g *gozeroImpl) lock(ctx context.Context, key string) (any, error) {
	rl := zeroredis.NewRedisLock(g.store, key)
	rl.SetExpire(int(lockTTL / time.Second))
	var timer *time.Timer
	for {
		ok, err := rl.AcquireCtx(ctx)
		switch {
		case err != nil:
			return nil, err
		case ok:
			return rl, nil
		case timer == nil:
			timer = time.NewTimer(g.poll)
			defer timer.Stop() // once: the timer is made once
		default:
			timer.Reset(g.poll)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timer.C:
		}
	}
}

func (g *gozeroImpl) tryLock(ctx context.Context, key string) (any, error) {
	rl := zeroredis.NewRedisLock(g.store, key)
	rl.SetExpire(int(lockTTL / time.Second))
	ok, err := rl.AcquireCtx(ctx)
	if err == nil && !ok {
		err = errBusy
	}
	return rl, err
}

func (g *gozeroImpl) unlock(ctx context.Context, _ string, h any) error {
	ok, err := h.(*zeroredis.RedisLock).ReleaseCtx(ctx)
	if err == nil && !ok {
		err = errors.New("go-zero: release refused")
	}
	return err
}

func (g *gozeroImpl) roundTrips() int64 { return g.rt.n.Load() }
func (g *gozeroImpl) close()            {} // the client belongs to go-zero's process-wide manager

// floorImpl is a floor: PING (ping), or SET PX + DEL.
type floorImpl struct {
	goredisRow
	ping bool
}

func newFloor(addr string, s clientSetting, ping bool) (impl, error) {
	c := newClient(addr, s, "floor:")
	return &floorImpl{goredisRow: c, ping: ping}, nil
}

func (f *floorImpl) lock(ctx context.Context, key string) (any, error) {
	if f.ping {
		return nil, f.client.Ping(ctx).Err()
	}
	return nil, f.client.Set(ctx, key, "1", lockTTL).Err()
}

func (f *floorImpl) tryLock(ctx context.Context, key string) (any, error) { return f.lock(ctx, key) }

func (f *floorImpl) unlock(ctx context.Context, key string, _ any) error {
	if f.ping {
		return nil
	}
	return f.client.Del(ctx, key).Err()
}

// storeImpl drives flightlock's RedisStore directly, without the Locker: the same scripts,
// keys and arguments as the flightlock row, none of its client-side work (gate, hold, lease,
// watchdog). Scenario 1 runs it beside the flightlock row to split the cost of an uncontended
// lock between the store (scripts, round trips) and the Locker above it.
type storeImpl struct {
	goredisRow
	store *redisstore.RedisStore
}

func newStoreRow(addr string, s clientSetting) (impl, error) {
	c := newClient(addr, s, "fls:")
	return &storeImpl{goredisRow: c, store: redisstore.New(c.client)}, nil
}

func (s *storeImpl) lock(ctx context.Context, key string) (any, error) {
	owner := rand.Text()
	a, err := s.store.Acquire(ctx, lockstore.Request{Key: key, Owner: owner, TTL: lockTTL})
	if err == nil && !a.Acquired {
		err = errBusy
	}
	return owner, err
}

func (s *storeImpl) tryLock(ctx context.Context, key string) (any, error) { return s.lock(ctx, key) }

func (s *storeImpl) unlock(ctx context.Context, key string, h any) error {
	_, err := s.store.Release(ctx, key, h.(string), "", 0)
	return err
}

func (s *storeImpl) close() { _ = s.store.Close(); _ = s.client.Close() }

// rueidisWait bounds every blocking acquisition of the rueidislock row. rueidislock wakes a
// waiter only on a client-side-caching invalidation of the key (another process changed it) or
// on a release in its own process; a waiter that misses both sleeps, with the key free, until
// its context ends. Bounded, such a lost wake-up is a counted error ("no grant within ...")
// instead of a stalled run.
const rueidisWait = 5 * time.Second

// rueidisCounter wraps the rueidis.Client that rueidislock builds (LockerOption.ClientBuilder)
// and counts what it sends: one per Do (each script call, SET, ...), one per DoMulti, one per
// DoCache that missed the client-side cache. rueidis writes the commands of concurrent callers
// together on one connection (auto-pipelining), so this counts calls, as go-redis's hook counts
// one per command outside explicit pipelines.
type rueidisCounter struct {
	rueidis.Client
	n *atomic.Int64
}

func (c rueidisCounter) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	c.n.Add(1)
	return c.Client.Do(ctx, cmd)
}

func (c rueidisCounter) DoMulti(ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
	c.n.Add(1)
	return c.Client.DoMulti(ctx, multi...)
}

func (c rueidisCounter) DoCache(ctx context.Context, cmd rueidis.Cacheable, ttl time.Duration) rueidis.RedisResult {
	r := c.Client.DoCache(ctx, cmd, ttl)
	if !r.IsCacheHit() {
		c.n.Add(1)
	}
	return r
}

func (c rueidisCounter) DoMultiCache(ctx context.Context, multi ...rueidis.CacheableTTL) []rueidis.RedisResult {
	rs := c.Client.DoMultiCache(ctx, multi...)
	for _, r := range rs {
		if !r.IsCacheHit() {
			c.n.Add(1)
			break
		}
	}
	return rs
}

type rueidisImpl struct {
	locker rueidislock.Locker
	rt     *atomic.Int64
}

// newRueidislock builds rueidislock at its strongest honest settings: one key per lock
// (KeyMajority 1, a single Redis), CLIENT TRACKING with NOLOOP (Redis >= 7.0.5), and the
// common TTL as its KeyValidity (renewed every KeyValidity/2 while held).
func newRueidislock(addr string, _ clientSetting) (impl, error) {
	n := &atomic.Int64{}
	l, err := rueidislock.NewLocker(rueidislock.LockerOption{
		ClientOption: rueidis.ClientOption{
			InitAddress:   []string{addr},
			ClientSetInfo: rueidis.DisableClientSetInfo, // as DisableIdentity on the go-redis rows
		},
		ClientBuilder: func(o rueidis.ClientOption) (rueidis.Client, error) {
			c, err := rueidis.NewClient(o)
			if err != nil {
				return nil, err
			}
			return rueidisCounter{Client: c, n: n}, nil
		},
		KeyPrefix:      "rd",
		KeyMajority:    1,
		NoLoopTracking: true,
		KeyValidity:    lockTTL,
	})
	if err != nil {
		return nil, err
	}
	return &rueidisImpl{locker: l, rt: n}, nil
}

func (r *rueidisImpl) key(base string) string { return base } // the Locker adds its prefix

// rueidisHold is a held rueidislock lock: cancel releases it (and waits for the DEL).
type rueidisHold struct {
	cancel context.CancelFunc
}

func (r *rueidisImpl) lock(ctx context.Context, key string) (any, error) {
	// rueidislock ties the lock to the context passed in: it is released when that context
	// ends, and its validity is cut to the context's deadline. So the wait is bounded by a
	// timer on a context of its own (no deadline), which the caller's end also cancels, and the
	// hold is detached from both once granted.
	wctx, wcancel := context.WithCancel(context.WithoutCancel(ctx))
	stopParent := context.AfterFunc(ctx, wcancel)
	bound := time.AfterFunc(rueidisWait, wcancel)
	_, cancel, err := r.locker.WithContext(wctx, key)
	boundOK := bound.Stop()
	parentOK := stopParent()
	if err == nil && boundOK && parentOK {
		return rueidisHold{cancel: func() { cancel(); wcancel() }}, nil
	}
	if err == nil {
		cancel() // granted as the bound or the caller's context ran out: the lock goes with it
		err = ctx.Err()
	}
	wcancel()
	if !boundOK {
		return nil, fmt.Errorf("rueidislock: no grant within %v", rueidisWait)
	}
	return nil, err
}

func (r *rueidisImpl) tryLock(ctx context.Context, key string) (any, error) {
	_, cancel, err := r.locker.TryWithContext(context.WithoutCancel(ctx), key)
	return tried(rueidisHold{cancel: cancel}, err, rueidislock.ErrNotLocked)
}

func (r *rueidisImpl) unlock(_ context.Context, _ string, h any) error {
	h.(rueidisHold).cancel()
	return nil
}

func (r *rueidisImpl) roundTrips() int64 { return r.rt.Load() }
func (r *rueidisImpl) close()            { r.locker.Close() }

// rueidisVersion is the rueidis module version this binary was built with.
func rueidisVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/redis/rueidis" {
				return d.Version
			}
		}
	}
	return "version unknown"
}
