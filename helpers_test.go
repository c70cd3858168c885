package flightlock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/internal/handover"
	"github.com/flightlock/flightlock/internal/testenv/poll"
	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/redisstore"
)

// miniStore returns a store on a fresh miniredis; RESP2 so pub/sub notifications arrive.
func miniStore(t testing.TB) (*redisstore.RedisStore, *miniredis.Miniredis, *redis.Client) {
	t.Helper()
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), Protocol: 2, DisableIdentity: true, ContextTimeoutEnabled: true})
	s := redisstore.New(c, redisstore.WithWatchLinger(0))
	t.Cleanup(func() { _ = s.Close(); _ = c.Close() })
	return s, mr, c
}

// realStore returns a store on a redis-server that the test started.
func realStore(t testing.TB) (*redisstore.RedisStore, *redistest.Server, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	c := srv.Client()
	s := redisstore.New(c, redisstore.WithWatchLinger(0))
	t.Cleanup(func() { _ = s.Close() })
	return s, srv, c
}

// clusterStore returns a store on a three-node Redis Cluster that the test started.
func clusterStore(t *testing.T) lockstore.Store {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a three-node Redis Cluster")
	}
	c := redistest.StartCluster(t, 3)
	client := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 c.Addrs,
		DisableIdentity:       true,
		ContextTimeoutEnabled: true,
	})
	s := redisstore.New(client)
	t.Cleanup(func() { _ = s.Close(); _ = client.Close() })
	return s
}

func mustLocker(t testing.TB, s lockstore.Store, opts ...Option) *Locker {
	t.Helper()
	l, err := New(s, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// faultStore wraps a Store and lets a test make calls fail and count them.
type faultStore struct {
	lockstore.Store
	failRefresh atomic.Pointer[error]
	failAcquire atomic.Pointer[error]
	slowKey     atomic.Pointer[string] // an Acquire of this key takes slowBy, or until its ctx ends
	slowBy      time.Duration
	hangRelease atomic.Bool // a Release waits for its context to end, as on a frozen Redis
	acquires    atomic.Int64
	refreshes   atomic.Int64
	releases    atomic.Int64
}

func (f *faultStore) Acquire(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	f.acquires.Add(1)
	if err := f.failAcquire.Load(); err != nil {
		return lockstore.Acquisition{}, *err
	}
	if k := f.slowKey.Load(); k != nil && *k == req.Key {
		select {
		case <-time.After(f.slowBy):
		case <-ctx.Done():
			return lockstore.Acquisition{}, ctx.Err()
		}
	}
	return f.Store.Acquire(ctx, req)
}

func (f *faultStore) RefreshAll(ctx context.Context, batch []lockstore.Renewal) []error {
	return refreshEach(ctx, f.Refresh, batch)
}

// refreshEach is RefreshAll for a test store that refreshes one lock at a time (so that its
// Refresh sees every renewal): each on a goroutine of its own, so that one refresh that hangs
// holds up none of the others.
func refreshEach(ctx context.Context, refresh func(context.Context, string, string, time.Duration) error, batch []lockstore.Renewal) []error {
	errs := make([]error, len(batch))
	var wg sync.WaitGroup
	for i, r := range batch {
		wg.Go(func() { errs[i] = refresh(ctx, r.Key, r.Owner, r.TTL) })
	}
	wg.Wait()
	return errs
}

func (f *faultStore) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	f.refreshes.Add(1)
	if err := f.failRefresh.Load(); err != nil {
		return *err
	}
	return f.Store.Refresh(ctx, key, owner, ttl)
}

func (f *faultStore) Release(ctx context.Context, key, owner, hold string, lastFence int64) (int, error) {
	f.releases.Add(1)
	if f.hangRelease.Load() {
		<-ctx.Done()
		return 0, ctx.Err()
	}
	return f.Store.Release(ctx, key, owner, hold, lastFence)
}

// memStore is an in-memory Store without expiry or notifications, fast enough to push a
// million keys through the gate.
type memStore struct {
	mu    sync.Mutex
	locks map[string]string // guarded by mu: key -> owner
	fence int64             // guarded by mu
}

func newMemStore() *memStore { return &memStore{locks: make(map[string]string)} }

func (m *memStore) Capabilities() lockstore.Capabilities {
	return lockstore.Capabilities{Name: "memory"}
}

func (m *memStore) Acquire(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	if len(req.Permits) > 0 {
		return lockstore.AcquireEach(ctx, req, m.Acquire)
	}
	key, owner := req.Key, req.Owner
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur, ok := m.locks[key]; ok {
		if cur == owner {
			return lockstore.Acquisition{Acquired: true, Reentered: true, Fence: m.fence}, nil
		}
		return lockstore.Acquisition{HolderTTL: time.Second}, nil
	}
	m.locks[key] = owner
	m.fence++
	return lockstore.Acquisition{Acquired: true, Fence: m.fence}, nil
}

func (m *memStore) Refresh(_ context.Context, key, owner string, _ time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.locks[key] != owner {
		return lockstore.ErrNotHeld
	}
	return nil
}

func (m *memStore) RefreshAll(ctx context.Context, batch []lockstore.Renewal) []error {
	return refreshEach(ctx, m.Refresh, batch)
}

func (m *memStore) LeaveQueue(context.Context, string, string) error { return nil }

func (m *memStore) Reenter(_ context.Context, key, owner, _ string, _ time.Duration) (lockstore.Acquisition, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.locks[key] != owner {
		return lockstore.Acquisition{}, nil
	}
	return lockstore.Acquisition{Acquired: true, Reentered: true, Fence: m.fence}, nil
}

func (m *memStore) Release(_ context.Context, key, owner, _ string, _ int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.locks[key] != owner {
		return 0, lockstore.ErrNotHeld
	}
	delete(m.locks, key)
	return 0, nil
}

func (m *memStore) TTL(_ context.Context, key string) (time.Duration, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.locks[key]; !ok {
		return 0, lockstore.ErrNotHeld
	}
	return time.Second, nil
}

func (m *memStore) Watch(context.Context, string) (*lockstore.Watch, error) {
	return nil, errors.New("memstore: no release notifications")
}

func (m *memStore) size() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.locks)
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, within, 2*time.Millisecond, what, cond)
}

// withOwner is what the zrpc server interceptor does for a handed-over owner.
func withOwner(ctx context.Context, key, owner string) context.Context {
	return handover.With(ctx, handover.Owner{Key: key, Token: owner})
}

// gateLen is the number of keys in the per-process gate.
func (l *Locker) gateLen() int {
	g := l.k.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.entries)
}

// isLost reports whether the lock can no longer be trusted.
func (h *hold) isLost() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.has(holdLost)
}

// queued is how many goroutines wait in the gate for key (a store key, prefix included).
func (l *Locker) queued(key string) int {
	l.k.gate.mu.Lock()
	defer l.k.gate.mu.Unlock()
	if e := l.k.gate.entries[key]; e != nil {
		return e.queued()
	}
	return 0
}

// withClock replaces the system clock of the watchdog and of lease expiry, for tests.
func withClock(c clock) Option {
	return func(cfg *config) { cfg.clock = c }
}
