package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/flightlock/flightlock/internal/mapshrink"
)

// errNoAnswer: etcd did not answer a call the store bounds itself (transient: sent again).
var errNoAnswer = errors.New("flightlock: etcd did not answer in time")

// errLeaseGone reports a lease etcd no longer has: every key on it was deleted with it.
var errLeaseGone = errors.New("flightlock: etcd lease expired or revoked")

func isLeaseNotFound(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, rpctypes.ErrGRPCLeaseNotFound)
}

// lease is the store's etcd lease of ttl + margin seconds for every lock of one TTL, granted on
// first use and kept alive in the background and on demand. A retired lease (package doc) is
// kept alive until revoked, so its locks keep every guarantee.
type lease struct {
	ttl   time.Duration // the lock TTL it serves
	ready chan struct{} // closed once the grant set id, secs and fresh, or err
	id    clientv3.LeaseID
	secs  int64 // its TTL in etcd, in seconds: ttl + margin
	err   error // a TTL etcd refuses to honour; kept, so that later calls fail without a grant

	// Guarded by the store's mu, since entries changes with held.
	entries  int  // entries of held on this lease
	inflight int  // calls between choosing this lease and recording their outcome (pin)
	retired  bool // an acquisition on it had an unknown outcome: no new grant goes on it
	revoking bool // retired and unused: being revoked, no re-entry may record a key on it (updateOn)

	mu      sync.Mutex
	fresh   time.Time  // guarded by mu: send time of the last keep-alive (or grant) that succeeded
	gone    bool       // guarded by mu: etcd no longer has it
	next    *keepAlive // guarded by mu: the keep-alive to send when the one on the wire returns
	sending bool       // guarded by mu: a sender goroutine runs
}

// liveFor reports whether the lease lives at least d from now: to fresh + secs at the earliest.
func (l *lease) liveFor(now time.Time, d time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.gone && l.fresh.Add(time.Duration(l.secs)*time.Second).Sub(now) >= d
}

// leaseFor returns the store's lease for lock TTL ttl, pinned, granting it on first use. A TTL
// that etcd raises (below its minimum lease TTL) is refused, never rounded.
func (s *Store) leaseFor(ctx context.Context, ttl time.Duration) (*lease, error) {
	for {
		s.mu.Lock()
		l := s.leases[ttl]
		mine := l == nil
		if mine {
			l = &lease{ttl: ttl, ready: make(chan struct{})}
			s.leases[ttl] = l
		}
		s.mu.Unlock()
		if mine {
			s.grant(ctx, l)
		}
		select {
		case <-l.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if l.err != nil {
			return nil, l.err
		}
		l.mu.Lock()
		gone := l.gone
		l.mu.Unlock()
		if gone {
			s.dropLease(l) // leases may still name it: then the next round grants a new one
			continue
		}
		if s.pin(l) {
			return l, nil
		}
		// Retired (and so unlisted) since leases was read: the next round grants.
	}
}

// pin counts an acquisition about to write on l, until unpin, so that a retired l is not
// revoked under a key put on it before the store recorded it; false when l is retired.
func (s *Store) pin(l *lease) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.retired {
		return false
	}
	l.inflight++
	return true
}

// unpin ends what pin started, once the call's outcome is recorded in held.
func (s *Store) unpin(l *lease) {
	s.mu.Lock()
	l.inflight--
	s.revokeIfUnusedLocked(l)
	s.mu.Unlock()
}

// retire records that an acquisition on l had an unknown outcome: new grants of its TTL take a
// new lease, and l is revoked once unused. Its caller has l pinned.
func (s *Store) retire(l *lease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l.retired = true
	s.unlistLocked(l)
}

// unlistLocked removes l from leases: the next acquisition of its TTL grants anew. Holds s.mu.
func (s *Store) unlistLocked(l *lease) {
	if s.leases[l.ttl] == l {
		delete(s.leases, l.ttl)
	}
}

// relinkLocked moves one entry of held from lease from to lease to (0: none, or not the
// store's) in the leases' entry counts. s.mu must be held.
func (s *Store) relinkLocked(from, to clientv3.LeaseID) {
	if from == to {
		return
	}
	if l := s.byID[to]; l != nil {
		l.entries++
	}
	if l := s.byID[from]; l != nil {
		l.entries--
		s.revokeIfUnusedLocked(l)
	}
}

// revokeIfUnusedLocked starts the revocation of l when it is retired and nothing uses it; from
// then on l is gone to the store (only keys nobody holds are on it). s.mu must be held.
func (s *Store) revokeIfUnusedLocked(l *lease) {
	if !l.retired || l.revoking || l.inflight > 0 || l.entries > 0 || s.byID[l.id] != l {
		return
	}
	l.revoking = true
	l.mu.Lock() // lock order: s.mu, then a lease's mu
	l.gone = true
	l.mu.Unlock()
	// Left in byID until revoked, so that a Close meanwhile revokes it; one the store cannot
	// revoke expires unrenewed.
	s.spawn(func() {
		if err := s.revoke(s.ctx, l.id); err != nil && !isLeaseNotFound(err) && s.isClosed() {
			return
		}
		s.mu.Lock()
		if s.byID[l.id] == l {
			delete(s.byID, l.id)
		}
		s.mu.Unlock()
	})
}

// grant asks etcd for l, which leases names, and fills it in. A failure other than a refusal
// unlists l, so the next call tries again.
func (s *Store) grant(ctx context.Context, l *lease) {
	defer close(l.ready)
	secs, sent := int64((l.ttl+s.margin)/time.Second), time.Now()
	resp, err := s.cli.Grant(ctx, secs)
	if err == nil && (resp.TTL != secs || s.isClosed()) {
		_ = s.revoke(context.Background(), resp.ID)
		if resp.TTL != secs {
			// etcd raises a TTL below its minimum (1.5 election timeouts) without an error.
			l.err = fmt.Errorf("flightlock: etcd granted a lease of %ds when asked for %ds (lock TTL %v + margin %v): "+
				"its minimum lease TTL is higher, so this lock TTL cannot be honoured", resp.TTL, secs, l.ttl, s.margin)
			return
		}
		err = errStoreClosed
	}
	if err != nil {
		l.err = fmt.Errorf("flightlock: grant etcd lease of %ds: %w", secs, err)
		s.mu.Lock()
		s.unlistLocked(l)
		s.mu.Unlock()
		return
	}
	l.id, l.secs, l.fresh = resp.ID, secs, sent // before byID and ready publish l
	s.mu.Lock()
	s.byID[l.id] = l
	startTicker := !s.ticking
	s.ticking = true
	s.mu.Unlock()
	if startTicker {
		s.spawn(s.keepAliveLoop)
	}
}

// revoke revokes lease id, bounded by a second.
func (s *Store) revoke(ctx context.Context, id clientv3.LeaseID) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err := s.cli.Revoke(ctx, id)
	return err
}

// dropLease forgets a lease etcd no longer has, and every lock on it (deleted with it).
func (s *Store) dropLease(l *lease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unlistLocked(l)
	if !l.revoking { // else revokeIfUnusedLocked removes it, once revoked (or Close does)
		delete(s.byID, l.id)
	}
	maps.DeleteFunc(s.held, func(_ entryKey, e *heldKey) bool { return e.lease == l.id })
	s.held, s.heldPeak = mapshrink.Shrink(s.held, s.heldPeak) // as in applyLocked
}

func (s *Store) ourLease(id clientv3.LeaseID) *lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byID[id]
}

// keepAliveLoop keeps every lease of the store alive four times per margin, so that an
// acquisition finds its lease fresh, and starts the reaper.
func (s *Store) keepAliveLoop() {
	period := s.margin / 4
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			now := time.Now() // the tick's time may be stale: it may have waited
			s.mu.Lock()
			ls := slices.Collect(maps.Values(s.byID))
			s.mu.Unlock()
			for _, l := range ls {
				l.mu.Lock()
				if !l.gone && now.Sub(l.fresh) >= period {
					s.queueLocked(l) // nobody waits for it
				}
				l.mu.Unlock()
			}
			s.startReaper(now)
		}
	}
}

// ownKeepAlive is a keep-alive of l sent at or after t (none if one succeeded already), after
// which l lives at least its TTL from t. Callers queued while one is on the wire share the next.
func (s *Store) ownKeepAlive(l *lease, t time.Time) *keepAlive {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.gone:
		return &keepAlive{err: errLeaseGone}
	case l.fresh.Before(t):
		return s.queueLocked(l)
	}
	return &keepAlive{secs: l.secs}
}

// queueLocked returns l's next keep-alive, starting a sender when none runs. Holds l.mu.
func (s *Store) queueLocked(l *lease) *keepAlive {
	if l.next == nil {
		l.next = &keepAlive{done: make(chan struct{}), shared: true, secs: l.secs}
	}
	r := l.next
	if !l.sending {
		// The sender waits for l.mu, held here, before it reads sending or next.
		if l.sending = s.spawn(func() { s.sendKeepAlives(l) }); !l.sending {
			l.next = nil
			r.err = errStoreClosed
			close(r.done)
		}
	}
	return r
}

// sendKeepAlives sends the queued keep-alives of l one at a time, and ends when none is queued.
func (s *Store) sendKeepAlives(l *lease) {
	for {
		l.mu.Lock()
		r := l.next
		l.next, l.sending = nil, r != nil
		l.mu.Unlock()
		if r == nil {
			return
		}

		sent := time.Now()
		// Bounded by resendAfter: one sent to a silent member would hold every caller queued
		// behind it, while the next may reach a member that answers.
		ctx, cancel := context.WithTimeout(s.ctx, min(time.Duration(l.secs)*time.Second, resendAfter))
		_, err := s.cli.KeepAliveOnce(ctx, l.id)
		cut := ctx.Err() != nil
		cancel()
		l.mu.Lock()
		switch {
		case err == nil:
			l.fresh = later(l.fresh, sent)
		case isLeaseNotFound(err):
			l.gone = true
			err = errLeaseGone
		case s.isClosed():
			err = errStoreClosed
		case cut:
			err = fmt.Errorf("flightlock: keep etcd lease %x alive: %w", int64(l.id), errNoAnswer)
		default:
			err = fmt.Errorf("flightlock: keep etcd lease %x alive: %w", int64(l.id), err)
		}
		gone := l.gone
		l.mu.Unlock()
		if gone {
			s.dropLease(l)
		}
		r.err = err
		close(r.done)
	}
}
