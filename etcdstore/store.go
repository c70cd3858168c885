package etcdstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/flightlock/flightlock/internal/mapshrink"
	"github.com/flightlock/flightlock/lockstore"
)

// DefaultLeaseMargin is how much longer than the lock TTL the store's etcd leases last.
const DefaultLeaseMargin = time.Second

// DefaultMaxTxnOps is etcd's default --max-txn-ops (operations per transaction branch).
const DefaultMaxTxnOps = 128

// errStoreClosed is returned by every call after Close.
var errStoreClosed = errors.New("flightlock: etcd store closed")

// Option configures a Store.
type Option func(*options)

type options struct {
	margin    time.Duration
	maxTxnOps int
}

// WithLeaseMargin sets how much longer than the lock TTL each etcd lease lasts: whole seconds,
// at least one (default DefaultLeaseMargin). Leases are kept alive four times per margin: a
// larger one tolerates slower keep-alives, and a crashed holder's locks last longer.
func WithLeaseMargin(d time.Duration) Option {
	return func(o *options) { o.margin = d }
}

// WithMaxTxnOps sets the cluster's --max-txn-ops (default DefaultMaxTxnOps): RefreshAll reads
// at most that many keys per transaction, and AcquireAll at most (n-4)/2 keys, 62 by default.
func WithMaxTxnOps(n int) Option {
	return func(o *options) { o.maxTxnOps = n }
}

// Store is the lockstore.Store on etcd. Create it with New; it is safe for concurrent use.
type Store struct {
	cli       *clientv3.Client
	margin    time.Duration
	maxTxnOps int

	ctx    context.Context // cancelled by Close: ends keep-alives and watches
	cancel context.CancelFunc

	mu       sync.Mutex
	leases   map[time.Duration]*lease    // guarded by mu: the lease of each lock TTL, pending until its ready is closed
	byID     map[clientv3.LeaseID]*lease // guarded by mu: the same leases by id, and retired ones until revoked
	held     map[entryKey]*heldKey       // guarded by mu: locks owners hold (or may) through this store
	heldPeak int                         // guarded by mu: len(held)'s peak, for applyLocked
	// The next four maps are guarded by mu and bounded (putBounded); an entry forgotten early
	// costs a round trip (a forgotten place: a refusal and a lease grant, never its rank).
	waitRev map[string]int64      // revision of the last busy reply per key, for Watch
	refused map[string]struct{}   // keys refused since this store last granted them: Pass releases
	unsent  map[entryKey]struct{} // acquisitions that gave up before sending (giveBackLater)
	places  map[entryKey]place    // this store's fair acquirers' places in line
	ticking bool                  // guarded by mu: the keep-alive loop runs (or, in tests, must not)
	reaping bool                  // guarded by mu: a reaper runs (startReaper)

	goMu   sync.Mutex     // guards closed and wg.Add, so nothing starts after Close waits
	closed bool           // guarded by goMu
	wg     sync.WaitGroup // every goroutine of the store
}

// entryKey names the entry of one owner's lock.
type entryKey struct{ key, owner string }

// heldKey is what the store knows of a lock one owner holds (or may hold) through it. Every
// write that relies on it is guarded by a compare in etcd: a stale entry costs a round trip,
// never a wrong write. until gives the lock a Redis key's life on a session lease the store
// keeps alive: the reaper releases, owner-checked, every entry past it (a lock no longer
// refreshed, a failed release, an acquisition whose reply never came).
type heldKey struct {
	lease     clientv3.LeaseID // the lease the key is on; 0 unknown (changed with relinkLocked, which counts entries per lease)
	createRev int64            // the grant's revision; 0 unknown (with lease 0: nothing of the key is known)
	modRev    int64            // the revision of the key's value when simple
	fence     int64            // the grant's fence
	hadFloor  bool             // the grant read a fence floor key
	simple    bool             // the key's value is Acquire's, at modRev: the one-transaction release applies
	contended bool             // the grant followed a refusal of this store (refused): Pass releases
	own       bool             // the acquisition's own hold is the owner's through this store
	holds     []string         // named holds (Reenter) this store added; never changed in place
	until     time.Time        // the holder counts on the lock until then; released once past it
	last      int64            // the largest fence known handed out under the grant (a pass's, or a failed release's lastFence)
	tries     int              // releases of it that failed in a row
	reaping   bool             // a release of it by the store is under way
}

// maxWaitRevs bounds waitRev and its kin: busy replies in Reject mode get no Watch.
const maxWaitRevs = 4096

// putBounded sets m[k] to v, first emptying m when it holds maxWaitRevs entries.
func putBounded[K comparable, V any](m map[K]V, k K, v V) {
	if len(m) >= maxWaitRevs {
		clear(m)
	}
	m[k] = v
}

// New returns a store on cli, which the caller owns: Close does not close it.
func New(cli *clientv3.Client, opts ...Option) (*Store, error) {
	if cli == nil {
		return nil, errors.New("flightlock: etcd store needs a client")
	}
	o := options{margin: DefaultLeaseMargin, maxTxnOps: DefaultMaxTxnOps}
	for _, opt := range opts {
		opt(&o)
	}
	if o.margin < time.Second || o.margin%time.Second != 0 {
		return nil, fmt.Errorf("flightlock: etcd lease margin must be whole seconds, at least 1s, got %v", o.margin)
	}
	if o.maxTxnOps < 3 {
		return nil, fmt.Errorf("flightlock: etcd max txn ops must be at least 3, got %d", o.maxTxnOps)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Store{
		cli:       cli,
		margin:    o.margin,
		maxTxnOps: o.maxTxnOps,
		ctx:       ctx,
		cancel:    cancel,
		leases:    make(map[time.Duration]*lease),
		byID:      make(map[clientv3.LeaseID]*lease),
		held:      make(map[entryKey]*heldKey),
		waitRev:   make(map[string]int64),
		refused:   make(map[string]struct{}),
		unsent:    make(map[entryKey]struct{}),
		places:    make(map[entryKey]place),
	}, nil
}

// Close stops the store's goroutines (keep-alives, watches, background releases) and refuses
// later calls; it is safe to call more than once. A lease that a lock or an acquisition in
// flight is on runs out one lease TTL after its last keep-alive, as a Redis key with its TTL:
// its holder may still run, and a second must not walk in while it writes. Other leases are
// revoked, each bounded by a second. Release the locks first (Locker.Drain) to free them.
func (s *Store) Close() error {
	s.goMu.Lock()
	if s.closed {
		s.goMu.Unlock()
		return nil
	}
	s.closed = true
	s.goMu.Unlock()
	s.cancel()
	s.wg.Wait()

	s.mu.Lock()
	ids := make([]clientv3.LeaseID, 0, len(s.byID))
	for id, l := range s.byID {
		if l.entries > 0 || l.inflight > 0 {
			continue // a holder may still count on it
		}
		l.retired, l.revoking = true, true // nothing records a key on it now (pin, updateOn)
		ids = append(ids, id)
	}
	clear(s.leases)
	clear(s.byID)
	clear(s.held)
	clear(s.waitRev)
	clear(s.refused)
	clear(s.unsent)
	clear(s.places)
	s.mu.Unlock()

	var errs []error
	for _, id := range ids {
		if err := s.revoke(context.Background(), id); err != nil && !isLeaseNotFound(err) {
			errs = append(errs, fmt.Errorf("flightlock: revoke etcd lease %x: %w", int64(id), err))
		}
	}
	return errors.Join(errs...)
}

// spawn runs f on a goroutine of the store unless the store is closed.
func (s *Store) spawn(f func()) bool {
	s.goMu.Lock()
	defer s.goMu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Go(f)
	return true
}

// beside runs f, a clean-up, on a goroutine of the store (Close waits for it; in line once closed)
// so that its caller returns by its deadline: f runs on ctx without its end, bounded by a second.
func (s *Store) beside(ctx context.Context, f func(ctx context.Context)) {
	g := func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		f(ctx)
	}
	if !s.spawn(g) {
		g()
	}
}

func (s *Store) isClosed() bool { return s.ctx.Err() != nil }

// entry returns a copy of the entry of key for owner.
func (s *Store) entry(key, owner string) (heldKey, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.held[entryKey{key, owner}]; e != nil {
		return *e, true
	}
	return heldKey{}, false
}

// update runs f on the entry of key for owner (a new one when there is none) and drops the
// entry when f leaves it holding nothing.
func (s *Store) update(key, owner string, f func(e *heldKey)) {
	s.updateOn(nil, key, owner, f)
}

// updateOn is update for a re-entry that found the key on lease l (nil: not the store's) and
// kept it alive; false, recording nothing, when l is being revoked since (taking the key).
// Once recorded, the entry keeps l from being revoked.
func (s *Store) updateOn(l *lease, key, owner string, f func(e *heldKey)) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l != nil && l.revoking {
		return false
	}
	k := entryKey{key, owner}
	e := s.held[k]
	if e == nil {
		e = &heldKey{}
		s.held[k] = e
		s.heldPeak = max(s.heldPeak, len(s.held))
	}
	delete(s.unsent, k) // the store knows more of it now
	s.applyLocked(k, e, f)
	return true
}

// applyLocked runs f on the entry e of k and counts it on the lease f left it on. An entry left
// holding nothing is dropped, and held rebuilt once it falls to a quarter of its peak
// (mapshrink: Go maps never give their buckets back). s.mu must be held.
func (s *Store) applyLocked(k entryKey, e *heldKey, f func(e *heldKey)) {
	was := e.lease
	f(e)
	if e.own || len(e.holds) > 0 {
		s.relinkLocked(was, e.lease)
		return
	}
	delete(s.held, k)
	s.held, s.heldPeak = mapshrink.Shrink(s.held, s.heldPeak)
	s.relinkLocked(was, 0)
}

// forget drops the entry of key for owner: the key is gone or another owner's.
func (s *Store) forget(key, owner string) {
	s.update(key, owner, func(e *heldKey) { e.own, e.holds = false, nil })
}

// released records that hold ("" the acquisition's own) of key was given up for owner.
func (s *Store) released(key, owner, hold string) {
	s.update(key, owner, func(e *heldKey) {
		if hold == "" {
			e.own, e.simple = false, false
		} else {
			e.holds = slices.DeleteFunc(slices.Clone(e.holds), func(h string) bool { return h == hold })
		}
	})
}

// withHold returns holds with hold added once (a new slice).
func withHold(holds []string, hold string) []string {
	if slices.Contains(holds, hold) {
		return holds
	}
	return append(slices.Clone(holds), hold)
}

// noteBusy records the revision at which key was seen held, so that a Watch that follows
// starts there and misses no release in between.
func (s *Store) noteBusy(key string, rev int64) {
	s.mu.Lock()
	putBounded(s.waitRev, key, rev)
	putBounded(s.refused, key, struct{}{})
	s.mu.Unlock()
}

// check is lockstore.CheckArgs of each key, then etcd's own refusals: a key among the store's
// own keys, a TTL of a fraction of a second, and any call after Close.
func (s *Store) check(owner string, ttl time.Duration, keys ...string) error {
	var fraction error // a TTL etcd cannot honour
	if ttl%time.Second != 0 {
		fraction = fmt.Errorf("flightlock: etcd leases last whole seconds: a lock TTL of %v cannot be honoured", ttl)
	}
	for _, key := range keys {
		if err := cmp.Or(lockstore.CheckArgs(key, owner, ttl), fraction, checkKey(key)); err != nil {
			return err
		}
	}
	if s.isClosed() {
		return errStoreClosed
	}
	return nil
}

// checkKey is lockstore.CheckKey, refusing also the store's own keys.
func checkKey(key string) error {
	if strings.HasPrefix(key, lockstore.FenceKeyPrefix) {
		return fmt.Errorf("flightlock: lock key %q falls among the store's own keys (%s*)", key, lockstore.FenceKeyPrefix)
	}
	return lockstore.CheckKey(key)
}
