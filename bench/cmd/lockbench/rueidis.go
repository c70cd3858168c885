package main

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"
)

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
