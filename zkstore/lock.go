package zkstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/flightlock/flightlock/lockstore"
)

// attempts bounds the rounds of an operation that lost a race (a key node that changed between
// a read and the multi built on it): each lost round means someone else made progress.
const attempts = 8

// releaseRounds bounds the rounds of a release, which must not give up while others make
// progress (its hold would keep the key); past attempts, each round waits first.
const releaseRounds = 64

// Acquire implements lockstore.Store: one multi creates the key node and its "own" hold and
// sets the data again to read its creation zxid, the fence (see held, and acquirePermits).
func (s *Store) Acquire(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	if len(req.Permits) > 0 {
		return s.acquirePermits(ctx, req)
	}
	if err := s.check(req.Key, req.Owner, req.TTL); err != nil {
		return lockstore.Acquisition{}, err
	}
	if !req.Asked.IsZero() {
		return s.acquireFair(ctx, req)
	}
	return s.acquire(ctx, req.Key, req.Owner, req.Meta, "")
}

// acquirePermits reads every permit's key node in one round trip, then takes (takePermits)
// each one owner holds (a re-send re-enters all, taking no more), else up to Want free or
// holdless ones (acquire clears those). A failed read fails it (the permit may be owner's).
// Taking none, it marks the busy ones at once, as acquire marks a key it is refused.
func (s *Store) acquirePermits(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	if err := lockstore.CheckPermits(req); err != nil {
		return lockstore.Acquisition{}, err
	}
	if err := s.check(req.Permits[0], req.Owner, req.TTL); err != nil { // a closed store, a TTL above MaxTTL
		return lockstore.Acquisition{}, err
	}
	type look struct {
		data []byte
		stat *zk.Stat
		kids []string
		err  error
	}
	looks := make([]look, len(req.Permits))
	var wg sync.WaitGroup
	for i, k := range req.Permits {
		wg.Go(func() { looks[i].data, looks[i].stat, looks[i].kids, looks[i].err = s.node(ctx, s.keyPath(k)) })
	}
	wg.Wait()
	var mine, free, taken []int
	for i, n := range looks {
		switch {
		case errors.Is(n.err, zk.ErrNoNode) || n.err == nil && len(n.kids) == 0:
			free = append(free, i)
		case n.err != nil:
			return lockstore.Acquisition{}, fmt.Errorf("flightlock: acquire %q: %w", req.Permits[i], n.err)
		case slices.Contains(n.kids, holdName(req.Owner, "")):
			mine = append(mine, i)
		default:
			taken = append(taken, i)
		}
	}
	busy, err := s.takePermits(ctx, req, mine, len(mine))
	if !busy.Acquired && err == nil {
		busy, err = s.takePermits(ctx, req, free, max(req.Want, 1))
	}
	if err != nil || busy.Acquired {
		if busy.Acquired && len(mine) == 0 && len(taken) > 0 {
			busy.Holder = holderMeta(looks[taken[0]].data) // a busy permit passed over
		}
		return busy, err
	}
	for _, i := range taken {
		n := looks[i]
		wg.Go(func() { s.refuse(ctx, s.keyPath(req.Permits[i]), n.data, n.stat, n.kids) })
		busy.Holder = cmp.Or(busy.Holder, holderMeta(n.data)) // refuse's reply
	}
	wg.Wait()
	return busy, nil // HolderTTL 0, as for one key: a hold lives as long as its session
}

// takePermits takes up to want of the permits at places idx of req.Permits, in order, by
// acquire, a round's together (different keys); one taken since the look is refused (marked)
// and the next tried. A failed take ends the rounds; its error (of several, one of unknown
// outcome) is the reply only if nothing was granted, else its permit goes back in the
// background, as the caller holds only what the reply names.
func (s *Store) takePermits(ctx context.Context, req lockstore.Request, idx []int, want int) (lockstore.Acquisition, error) {
	var (
		grants      []lockstore.PermitGrant
		busy, first lockstore.Acquisition
		failed      []int
		err         error
	)
	for len(idx) > 0 && len(grants) < want && failed == nil {
		round := idx[:min(want-len(grants), len(idx))]
		idx = idx[len(round):]
		res, errs := make([]lockstore.Acquisition, len(round)), make([]error, len(round))
		var wg sync.WaitGroup
		for j, i := range round {
			wg.Go(func() { res[j], errs[j] = s.acquire(ctx, req.Permits[i], req.Owner, req.Meta, "") })
		}
		wg.Wait()
		for j, i := range round {
			switch {
			case errs[j] != nil:
				failed = append(failed, i)
				if err == nil || errors.Is(errs[j], lockstore.ErrOutcomeUnknown) {
					err = errs[j] // one that may have made a hold wins: the caller must give it back
				}
			case !res[j].Acquired:
				busy = res[j]
			default:
				if grants == nil {
					first = res[j]
				}
				grants = append(grants, lockstore.PermitGrant{Permit: i, Fence: res[j].Fence})
			}
		}
	}
	if grants == nil {
		return busy, err
	}
	for _, i := range failed {
		p, own := s.keyPath(req.Permits[i]), holdName(req.Owner, "")
		s.remember(p, req.Owner, own) // releaseLater gives back only what it finds remembered
		go s.releaseLater(p, req.Owner, own)
	}
	first.Permit, first.More = grants[0].Permit, grants[1:]
	return first, nil
}

// acquire takes key for owner, or a read hold of it for a read owner (see rwfair.go); place,
// when set, is owner's place in the key's fair line, which the same multi deletes.
func (s *Store) acquire(ctx context.Context, key, owner, meta, place string) (lockstore.Acquisition, error) {
	p, name, data := s.keyPath(key), holdName(owner, ""), value(ownerHash(owner), meta)
	if lockstore.IsReadOwner(owner) {
		data = value(readersTag, meta)
	}
	for range attempts {
		ops := []any{
			&zk.CreateRequest{Path: p, Data: data, Acl: s.acl, Flags: zk.FlagPersistent},
			&zk.CreateRequest{Path: p + "/" + name, Acl: s.acl, Flags: zk.FlagEphemeral},
			&zk.SetDataRequest{Path: p, Data: data, Version: 0},
		}
		if place != "" {
			ops = append(ops, &zk.DeleteRequest{Path: place, Version: -1})
		}
		res, err := s.multi(ctx, s.giveBackIfTaken(p, owner, name), ops...)
		switch {
		case err == nil:
			s.remember(p, owner, name)
			if place != "" {
				s.forget(s.linePath(key), owner, place)
			}
			return lockstore.Acquisition{Acquired: true, Fence: fence(res[2].Stat.Czxid)}, nil
		case errors.Is(err, zk.ErrNodeExists):
			a, again, err := s.held(ctx, p, owner, name, data)
			if a.Reentered && place != "" {
				_ = s.LeaveQueue(ctx, key, owner) // taken before: the place holds up the line
			}
			if err != nil {
				return a, fmt.Errorf("flightlock: acquire %q: %w", key, err)
			}
			if !again {
				return a, nil
			}
		case errors.Is(err, zk.ErrNoNode):
			if place != "" {
				s.forget(s.linePath(key), owner, place) // the place went with an expired session: take another
				return lockstore.Acquisition{}, nil
			}
			if err := s.ensurePath(ctx, s.root); err != nil {
				return lockstore.Acquisition{}, err
			}
		default:
			return lockstore.Acquisition{}, fmt.Errorf("flightlock: acquire %q: %w", key, s.mayHaveMade(p, owner, name, err))
		}
	}
	return lockstore.Acquisition{}, nil // busy: the key changed hands in every round
}

// held answers an acquisition of hold name for owner that found key node p already there, by
// whose the node is: owner's is re-entered (Reentered); another's is refused and marked; readers'
// are joined by a reader, with data; a holdless node is deleted, and again is true.
func (s *Store) held(ctx context.Context, p, owner, name string, data []byte) (a lockstore.Acquisition, again bool, err error) {
	cur, stat, kids, err := s.node(ctx, p)
	if errors.Is(err, zk.ErrNoNode) {
		return lockstore.Acquisition{}, true, nil // released meanwhile
	}
	if err != nil {
		return lockstore.Acquisition{}, false, fmt.Errorf("read %s: %w", p, err)
	}
	reader := strings.HasPrefix(name, readerPre)
	switch holder, _, marked := parseValue(cur); {
	case len(kids) == 0:
		if holder == writerTag && reader && s.reservedFor(p, stat.Mzxid) {
			return lockstore.Acquisition{}, false, nil // kept for the writer that waited
		}
		// The holds went with their sessions; a node that gained a hold since is not deleted.
		err := s.delete(ctx, p, stat.Version)
		if err != nil && !errors.Is(err, zk.ErrNoNode) && !errors.Is(err, zk.ErrNotEmpty) && !errors.Is(err, zk.ErrBadVersion) {
			return lockstore.Acquisition{}, false, fmt.Errorf("clear %s: %w", p, err)
		}
		return lockstore.Acquisition{}, true, nil
	case reader && (holder != readersTag || marked):
		// A writer's, or a writer waits: refused.
	case slices.Contains(kids, name):
		s.remember(p, owner, name)
		return lockstore.Acquisition{Acquired: true, Reentered: true, Fence: fence(stat.Czxid)}, false, nil
	case reader:
		return s.joinReaders(ctx, p, owner, name, data, stat, kids)
	}
	return s.refuse(ctx, p, cur, stat, kids), false, nil
}

// refuse returns the busy reply, with the holder's metadata, for key node p (read as data, stat
// and kids) of another's grant. It marks the node contended (a writer waits) in a multi that
// checks that a hold it read is still there, so a node the key got since is never marked.
func (s *Store) refuse(ctx context.Context, p string, data []byte, stat *zk.Stat, kids []string) lockstore.Acquisition {
	if _, _, marked := parseValue(data); !marked && len(kids) > 0 {
		_, _ = s.multi(ctx, nil,
			&zk.CheckVersionRequest{Path: p + "/" + kids[0], Version: -1},
			&zk.SetDataRequest{Path: p, Data: append(slices.Clip(data), markSuffix...), Version: stat.Version})
	}
	return lockstore.Acquisition{Holder: holderMeta(data)}
}

// holderMeta is the metadata of a key node's holder, as data says; none for readers.
func holderMeta(data []byte) string {
	if holder, meta, _ := parseValue(data); holder != readersTag && holder != writerTag {
		return meta
	}
	return ""
}

// reservedFor reports whether key node p, left by its last reader to a waiting writer at
// modification zxid mzxid, is still the writers' (writerReserve since this store first saw it).
func (s *Store) reservedFor(p string, mzxid int64) bool {
	now := time.Now()
	k := p + "@" + strconv.FormatInt(mzxid, 10)
	s.mu.Lock()
	defer s.mu.Unlock()
	seen, ok := s.reservedSeen[k]
	if !ok {
		// The map stays small.
		maps.DeleteFunc(s.reservedSeen, func(_ string, at time.Time) bool { return now.Sub(at) > 2*writerReserve })
		s.reservedSeen[k], seen = now, now
	}
	return now.Sub(seen) < writerReserve
}

// giveBackIfTaken is the late hook of a multi creating hold for owner under p: a hold made is
// released, one maybe made remembered (mayHaveMade), either retried till gone (owner spent).
func (s *Store) giveBackIfTaken(p, owner, hold string) func([]zk.MultiResponse, error) {
	return func(res []zk.MultiResponse, err error) {
		if errors.Is(s.mayHaveMade(p, owner, hold, err), lockstore.ErrOutcomeUnknown) {
			s.releaseLater(p, owner, hold)
			return
		}
		if opError(res, err) != nil {
			return
		}
		s.remember(p, owner, hold)
		ctx, cancel := context.WithTimeout(context.Background(), s.session)
		_, err = s.releaseHold(ctx, p, owner, hold)
		cancel()
		if err != nil && !errors.Is(err, lockstore.ErrNotHeld) {
			s.releaseLater(p, owner, hold)
		}
	}
}

// outcome is err, of a request that may have made a node, wrapping ErrOutcomeUnknown for
// zk.ErrConnectionClosed: in flight, it may have run, and the reconnected session keeps what it
// made. No other error leaves one: a failed write (net.Error) almost surely never arrived, one
// ignored (ErrSessionMoved) or never got (ErrNoServer) made nothing, nor one whose session
// ended; what a request its context cut short made is given back (giveBackIfTaken, caller).
func outcome(err error) error {
	if errors.Is(err, zk.ErrConnectionClosed) {
		return fmt.Errorf("%w (%w)", err, lockstore.ErrOutcomeUnknown)
	}
	return err
}

// mayHaveMade is outcome(err) for a multi creating hold name of owner under p, remembering a
// hold of a lost reply as unsure: if the caller's give-back fails (often, while the client
// reconnects) releaseLater retries until it is released or missing. The owner is spent
// (ErrOutcomeUnknown, Release), so the retry can end no grant the owner was told of.
func (s *Store) mayHaveMade(p, owner, name string, err error) error {
	err = outcome(err)
	if errors.Is(err, lockstore.ErrOutcomeUnknown) {
		s.rememberUnsure(p, owner, name)
	}
	return err
}

// Reenter implements lockstore.Store: while owner's grant holds key, one more hold "b-<hold>" on
// this session, created in a multi that checks the key node's version as read.
func (s *Store) Reenter(ctx context.Context, key, owner, hold string, ttl time.Duration) (lockstore.Acquisition, error) {
	if err := cmp.Or(s.check(key, owner, ttl), lockstore.CheckHold(hold, false)); err != nil {
		return lockstore.Acquisition{}, err
	}
	if lockstore.IsReadOwner(owner) {
		return lockstore.Acquisition{}, nil // read holds are not handed over
	}
	p, name, h := s.keyPath(key), holdName(owner, hold), ownerHash(owner)
	for range attempts {
		_, stat, kids, err := s.node(ctx, p)
		if errors.Is(err, zk.ErrNoNode) {
			return lockstore.Acquisition{}, nil
		}
		if err != nil {
			return lockstore.Acquisition{}, fmt.Errorf("flightlock: re-enter %q: %w", key, err)
		}
		anchor := slices.IndexFunc(kids, func(k string) bool { // the acquisition's or a re-entry's
			return k == ownPre+h || strings.HasPrefix(k, borrowPre+h+"-")
		})
		if anchor < 0 {
			return lockstore.Acquisition{}, nil // another's, or nobody's: a handed token takes nothing
		}
		// The new hold goes in only while a hold of owner's is there: owner's grant holds it.
		_, err = s.multi(ctx, s.giveBackIfTaken(p, owner, name),
			&zk.CheckVersionRequest{Path: p + "/" + kids[anchor], Version: -1},
			&zk.CreateRequest{Path: p + "/" + name, Acl: s.acl, Flags: zk.FlagEphemeral})
		switch {
		case err == nil, errors.Is(err, zk.ErrNodeExists): // a re-sent re-entry adds it once
			s.remember(p, owner, name)
			return lockstore.Acquisition{Acquired: true, Reentered: true, Fence: fence(stat.Czxid)}, nil
		case errors.Is(err, zk.ErrNoNode):
			continue // that hold went meanwhile: read again
		default:
			return lockstore.Acquisition{}, fmt.Errorf("flightlock: re-enter %q: %w", key, s.mayHaveMade(p, owner, name, err))
		}
	}
	return lockstore.Acquisition{}, nil
}

// Refresh implements lockstore.Store: a multi checking the holds made for owner under key, a
// write the leader refuses once the session expired: success proves MaxTTL past the send.
func (s *Store) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := s.check(key, owner, ttl); err != nil {
		return err
	}
	p := s.keyPath(key)
	holds := s.holdsOf(p, owner)
	if len(holds) == 0 {
		return lockstore.ErrNotHeld
	}
	_, err := s.multi(ctx, nil, checkHolds(nil, p, holds)...)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, zk.ErrNoNode):
		for _, h := range holds {
			s.forget(p, owner, h)
		}
		return lockstore.ErrNotHeld
	default:
		return fmt.Errorf("flightlock: refresh %q: %w", key, err)
	}
}

// checkHolds appends to ops the existence checks of holds under key node p.
func checkHolds(ops []any, p string, holds []string) []any {
	for _, h := range holds {
		ops = append(ops, &zk.CheckVersionRequest{Path: p + "/" + h, Version: -1})
	}
	return ops
}

// maxRefreshOps bounds the locks checked in one RefreshAll multi (each with its holds).
const maxRefreshOps = 512

// RefreshAll implements lockstore.Store: the checks of many locks in one multi. When it fails
// (one lock is gone), each lock is refreshed on its own to tell which.
func (s *Store) RefreshAll(ctx context.Context, batch []lockstore.Renewal) []error {
	errs := make([]error, len(batch))
	for start := 0; start < len(batch); start += maxRefreshOps {
		part := batch[start:min(start+maxRefreshOps, len(batch))]
		var ops []any
		for i, r := range part {
			if errs[start+i] = s.check(r.Key, r.Owner, r.TTL); errs[start+i] != nil {
				continue
			}
			p := s.keyPath(r.Key)
			holds := s.holdsOf(p, r.Owner)
			if len(holds) == 0 {
				errs[start+i] = lockstore.ErrNotHeld
			}
			ops = checkHolds(ops, p, holds)
		}
		if len(ops) == 0 {
			continue
		}
		if _, err := s.multi(ctx, nil, ops...); err == nil {
			continue
		}
		var wg sync.WaitGroup
		for i, r := range part {
			if errs[start+i] == nil {
				wg.Go(func() { errs[start+i] = s.Refresh(ctx, r.Key, r.Owner, r.TTL) })
			}
		}
		wg.Wait()
	}
	return errs
}

// Release implements lockstore.Store: a multi deletes owner's hold and with the last the key
// node at the version read; 1 notified if marked, else 0. Store errors are retried later.
func (s *Store) Release(ctx context.Context, key, owner, hold string, lastFence int64) (int, error) {
	if err := cmp.Or(s.check(key, owner, time.Millisecond), lockstore.CheckHold(hold, true)); err != nil {
		return 0, err
	}
	p, name := s.keyPath(key), holdName(owner, hold)
	n, err := s.releaseHold(ctx, p, owner, name)
	if err != nil && !errors.Is(err, lockstore.ErrNotHeld) {
		go s.releaseLater(p, owner, name)
	}
	return n, err
}

// releaseHold deletes hold name of owner under key node p (see Release). Every multi it sends
// deletes that hold, so it fails on a node the key got since (see the package doc).
func (s *Store) releaseHold(ctx context.Context, p, owner, name string) (int, error) {
	hold := &zk.DeleteRequest{Path: p + "/" + name, Version: -1}
	reader := strings.HasPrefix(name, readerPre)
	if !reader {
		// The common case in one request: the grant's only hold with its node (other holds
		// fail it whole). It reads no mark, so none notified: watches hear the node go anyway.
		_, err := s.multi(ctx, nil, hold, &zk.DeleteRequest{Path: p, Version: -1})
		if !errors.Is(err, zk.ErrNotEmpty) {
			return s.released(p, owner, name, 0, err)
		}
	}
	for round := range releaseRounds {
		if round >= attempts {
			// Readers that come and go move the key node's version under every round: back off.
			select {
			case <-ctx.Done():
				return 0, fmt.Errorf("flightlock: release %s: %w", p, ctx.Err())
			case <-time.After(time.Duration(min(round-attempts+1, 20)) * time.Millisecond):
			}
		}
		data, stat, err := s.get(ctx, p)
		if err == nil && stat.NumChildren == 0 {
			err = zk.ErrNoNode // left by an expired session: not held
		}
		if err != nil {
			return s.released(p, owner, name, 0, err)
		}
		_, _, marked := parseValue(data)
		var notified int
		switch {
		case stat.NumChildren > 1:
			if reader { // the readers left are not named any more: the data may name this one
				data = []byte(readersTag)
				if marked {
					data = append(data, markSuffix...)
				}
			}
			err = s.releaseNotLast(ctx, p, name, data, stat)
		case reader && marked:
			// Left to writers: any clears and takes it; readers wait out writerReserve.
			_, err = s.multi(ctx, nil, hold, &zk.SetDataRequest{Path: p, Data: []byte(writerTag + markSuffix), Version: stat.Version})
			notified = 1
		default:
			_, err = s.multi(ctx, nil, hold, &zk.DeleteRequest{Path: p, Version: stat.Version})
			if errors.Is(err, zk.ErrNotEmpty) {
				continue // a hold came meanwhile (a re-entry, a reader): read again
			}
			if marked {
				notified = 1
			}
		}
		if !errors.Is(err, zk.ErrBadVersion) {
			return s.released(p, owner, name, notified, err)
		}
		// Marked, or another hold released, meanwhile: read again.
	}
	return 0, fmt.Errorf("flightlock: release %s: the key node kept changing", p)
}

// releaseNotLast deletes hold name under p, beside others, writing data back at stat's version:
// of two holders releasing at once from one read, the second fails, reads again and is last.
func (s *Store) releaseNotLast(ctx context.Context, p, name string, data []byte, stat *zk.Stat) error {
	_, err := s.multi(ctx, nil,
		&zk.DeleteRequest{Path: p + "/" + name, Version: -1},
		&zk.SetDataRequest{Path: p, Data: data, Version: stat.Version})
	return err
}

// released is the outcome (notified, or err) of releaseHold's multi; a hold gone is forgotten.
func (s *Store) released(p, owner, name string, notified int, err error) (int, error) {
	switch {
	case err == nil:
		s.forget(p, owner, name)
		return notified, nil
	case errors.Is(err, zk.ErrNoNode):
		s.forget(p, owner, name)
		return 0, lockstore.ErrNotHeld
	}
	return 0, fmt.Errorf("flightlock: release %s: %w", p, err)
}

// releaseLater retries a failed release until it goes through, the hold is gone or not even
// maybe this store's (mayHold), or the store closes: the hold would keep the key from everyone.
func (s *Store) releaseLater(p, owner, name string) {
	s.retry(func(ctx context.Context) bool {
		if !s.mayHold(p, owner, name) {
			return true
		}
		_, err := s.releaseHold(ctx, p, owner, name)
		return err == nil || errors.Is(err, lockstore.ErrNotHeld)
	})
}

// retry runs try after pauses doubling from 100ms to 2s, a session's length each, until done or
// the store closes: a failed give-back's hold or place would keep the key (or line) from all.
func (s *Store) retry(try func(ctx context.Context) (done bool)) {
	for delay := 100 * time.Millisecond; !s.closed.Load(); delay = min(2*delay, 2*time.Second) {
		time.Sleep(delay)
		ctx, cancel := context.WithTimeout(context.Background(), s.session)
		done := try(ctx)
		cancel()
		if done {
			return
		}
	}
}

// TTL implements lockstore.Store: MaxTTL (the most a session keeps a lock) for a held key.
func (s *Store) TTL(ctx context.Context, key string) (time.Duration, error) {
	if err := lockstore.CheckKey(key); err != nil {
		return 0, err
	}
	_, stat, err := s.get(ctx, s.keyPath(key))
	if errors.Is(err, zk.ErrNoNode) || err == nil && stat.NumChildren == 0 {
		return 0, lockstore.ErrNotHeld
	}
	if err != nil {
		return 0, fmt.Errorf("flightlock: ttl %q: %w", key, err)
	}
	return s.maxTTL, nil
}

// Watch implements lockstore.Store: a watch of the key node's holds, set again after each
// change until closed; Fresh, as it starts listening only now.
func (s *Store) Watch(ctx context.Context, key string) (*lockstore.Watch, error) {
	if err := lockstore.CheckKey(key); err != nil {
		return nil, err
	}
	if s.closed.Load() {
		return nil, errStoreClosed
	}
	p := s.keyPath(key)
	c := make(chan struct{}, 1)
	stop := make(chan struct{})
	signal := func() {
		select {
		case c <- struct{}{}:
		default:
		}
	}
	arm := func() (<-chan zk.Event, error) {
		_, _, ev, err := s.conn.ChildrenW(p)
		if errors.Is(err, zk.ErrNoNode) {
			_, _, ev, err = s.conn.ExistsW(p) // free now: hear it being taken, then its holds
			signal()
		}
		return ev, err
	}
	ev, err := call(ctx, arm, nil)
	if err != nil {
		return nil, fmt.Errorf("flightlock: watch %q: %w", key, err)
	}
	go func() {
		for {
			select {
			case <-stop:
				return
			case e := <-ev:
				signal()
				if e.Type == zk.EventNotWatching || s.closed.Load() {
					return // the session ended: the waiters fall back on their retry delays
				}
				var err error
				if ev, err = arm(); err != nil {
					return
				}
			}
		}
	}()
	return lockstore.NewFreshWatch(c, func() { close(stop) }), nil
}
