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

// Acquire implements lockstore.Store: one multi creates the key node and its "own" hold, and
// sets the node's data once more to read its creation zxid (the fence); see held for a key
// node that exists, and acquirePermits for a request with Permits.
func (s *Store) Acquire(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	if len(req.Permits) > 0 {
		return s.acquirePermits(ctx, req)
	}
	key, owner, meta := req.Key, req.Owner, req.Meta
	if err := s.check(key, owner, req.TTL); err != nil {
		return lockstore.Acquisition{}, err
	}
	if !req.Asked.IsZero() {
		return s.acquireFair(ctx, req)
	}
	return s.acquire(ctx, key, owner, meta, "")
}

// acquirePermits serves a request with Permits. It reads every permit's key node at once, in
// one round trip (the session's connection carries the reads together), then takes with
// takePermits every permit that owner holds already (a re-sent request re-enters them all and
// takes no more), else up to Want of those the read found free or without holds (acquire
// clears such a node). A read that fails fails the request: that permit may be owner's. Only
// when it takes none does it mark the busy ones, each as acquire marks a key it is refused,
// all at once.
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
		busy lockstore.Acquisition // set by refuse
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
	take := func(ctx context.Context, i int) (lockstore.Acquisition, error) {
		return s.acquire(ctx, req.Permits[i], req.Owner, req.Meta, "")
	}
	again := take
	if !lockstore.IsReadOwner(req.Owner) {
		// The look found owner's hold: answer that it holds it once the hold is adopted, in one
		// round trip rather than acquire's three.
		again = func(ctx context.Context, i int) (lockstore.Acquisition, error) {
			p, name := s.keyPath(req.Permits[i]), holdName(req.Owner, "")
			switch err := s.adopt(ctx, p, name); {
			case errors.Is(err, zk.ErrNoNode):
				return take(ctx, i) // given back or released meanwhile
			case err != nil:
				return lockstore.Acquisition{}, fmt.Errorf("flightlock: acquire %q: %w", req.Permits[i], err)
			}
			s.remember(p, req.Owner, name)
			return lockstore.Acquisition{Acquired: true, Reentered: true, Fence: fence(looks[i].stat.Czxid)}, nil
		}
	}
	busy, err := s.takePermits(ctx, req, mine, len(mine), again)
	if !busy.Acquired && err == nil {
		busy, err = s.takePermits(ctx, req, free, max(req.Want, 1), take)
	}
	if err != nil || busy.Acquired {
		if busy.Acquired && len(mine) == 0 && len(taken) > 0 {
			busy.Holder = holderMeta(looks[taken[0]].data) // a busy permit passed over
		}
		return busy, err
	}
	for _, i := range taken {
		n := &looks[i]
		wg.Go(func() { n.busy = s.refuse(ctx, s.keyPath(req.Permits[i]), n.data, n.stat, n.kids) })
	}
	wg.Wait()
	for _, i := range taken {
		busy.Holder = cmp.Or(busy.Holder, looks[i].busy.Holder)
	}
	return busy, nil // HolderTTL 0, as for one key: a hold lives as long as its session
}

// takePermits takes up to want of the permits at places idx of req.Permits, in order, each with
// take (acquire, or the re-entry of a hold the look found): they are different keys, so the takes of a round go out together. One taken since
// the look is refused (busy, marked by acquire) and the next is tried in its place. A take
// that fails ends the rounds, and its error is the reply only when none was granted: otherwise
// the grants are, and that permit, which the take may have got, goes back in the background
// (the caller holds only what the reply names).
func (s *Store) takePermits(ctx context.Context, req lockstore.Request, idx []int, want int,
	take func(ctx context.Context, i int) (lockstore.Acquisition, error),
) (lockstore.Acquisition, error) {
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
			wg.Go(func() { res[j], errs[j] = take(ctx, i) })
		}
		wg.Wait()
		for j, i := range round {
			switch {
			case errs[j] != nil:
				failed, err = append(failed, i), cmp.Or(err, errs[j])
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
		s.releaseLater(p, req.Owner, own, s.pend(p+"/"+own))
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
		s.tell(p + "/" + name)
		res, err := s.multi(ctx, s.giveBackIfTaken(p, name, func(res []zk.MultiResponse) (int64, int32) {
			return res[2].Stat.Mzxid, 0 // the hold's creation zxid: the multi's, as every op's in it
		}), ops...)
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
			return lockstore.Acquisition{}, fmt.Errorf("flightlock: acquire %q: %w", key, err)
		}
	}
	return lockstore.Acquisition{}, nil // busy: the key changed hands in every round
}

// held reads key node p that an acquisition of hold name for owner found: owner's already
// (Reentered), another's (busy, marked so that waiters know), readers' that a reader joins
// (with data, its value), or without holds (an expired session's: deleted, and again is true).
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
		switch err := s.adopt(ctx, p, name); {
		case errors.Is(err, zk.ErrNoNode):
			return lockstore.Acquisition{}, true, nil // given back meanwhile: take it afresh
		case err != nil:
			return lockstore.Acquisition{}, false, fmt.Errorf("re-enter %s/%s: %w", p, name, err)
		}
		s.remember(p, owner, name)
		return lockstore.Acquisition{Acquired: true, Reentered: true, Fence: fence(stat.Czxid)}, false, nil
	case reader:
		return s.joinReaders(ctx, p, owner, name, data, stat, kids)
	}
	return s.refuse(ctx, p, cur, stat, kids), false, nil
}

// refuse is the busy reply for key node p, read as data, stat and its holds kids, which holds
// another's grant: the holder's metadata, and the node marked as contended if it was not. The
// mark tells readers that a writer waits, and operators that the lock was contended. The multi
// checks one of the holds read, so a node the key got since keeps its data.
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

// giveBackIfTaken returns the late hook of a multi that created hold name under key node p:
// when the caller left before the answer and the multi went through, the hold, which at says
// the multi left at its creation zxid and version, is given back (giveBackUntold).
func (s *Store) giveBackIfTaken(p, name string, at func([]zk.MultiResponse) (czxid int64, version int32)) func([]zk.MultiResponse, error) {
	return func(res []zk.MultiResponse, err error) {
		if opError(res, err) == nil {
			czxid, version := at(res)
			s.giveBackUntold(p, name, czxid, version)
		}
	}
}

// giveBackUntold deletes hold name under key node p, made at zxid czxid and left at version by
// a request whose caller left before the answer, at once and, while that fails, in the
// background (later): nobody knows of the hold, which would keep the key from everyone for as
// long as the session lives. It deletes only that node at that version: a request re-sent by
// the same owner that found the hold wrote it (adopt) before answering that it holds it, and
// one that found it gone made another (a later creation zxid), so the hold is no longer this
// give-back's once that request was answered.
func (s *Store) giveBackUntold(p, name string, czxid int64, version int32) {
	untold := func(st *zk.Stat) bool { return st.Czxid == czxid && st.Version == version }
	try := func(ctx context.Context) bool { return s.giveBack(ctx, p, name, untold, func() {}) }
	ctx, cancel := context.WithTimeout(context.Background(), s.session)
	done := try(ctx)
	cancel()
	if !done {
		s.later(try)
	}
}

// adopt writes hold name under key node p, which a request of its owner found, before that
// request answers that its owner holds it: the write moves the hold past the version a
// give-back still pending deletes at (giveBackUntold), or finds it gone (zk.ErrNoNode: that
// give-back won, and the request takes the key afresh). A write that goes through after its
// caller left gives the hold back in turn: nobody was told of it.
func (s *Store) adopt(ctx context.Context, p, name string) error {
	path := p + "/" + name
	s.tell(path)
	set := func() (*zk.Stat, error) { return s.conn.Set(path, nil, -1) }
	_, err := call(ctx, set, func(st *zk.Stat, err error) {
		if err == nil {
			s.giveBackUntold(p, name, st.Czxid, st.Version)
		}
	})
	return err
}

// giveBack deletes hold name under key node p while ours reports that the node as read is the
// one to give back, and calls gone once the hold is gone. done is false when the store failed
// (try again), true when the hold is gone or no longer this give-back's.
func (s *Store) giveBack(ctx context.Context, p, name string, ours func(*zk.Stat) bool, gone func()) (done bool) {
	path := p + "/" + name
	for range attempts {
		ok, stat, err := call2(ctx, func() (bool, *zk.Stat, error) { return s.conn.Exists(path) })
		switch {
		case err != nil:
			return false
		case !ok:
			gone()
			return true
		case !ours(stat):
			return true
		}
		// At the version read: a write since (adopt) makes the delete fail, and the node read
		// again tells whether it is still this give-back's.
		_, err = s.releaseHold(ctx, p, name, stat.Version)
		switch {
		case err == nil, errors.Is(err, zk.ErrNoNode):
			gone()
			return true
		case !errors.Is(err, zk.ErrBadVersion):
			return false
		}
	}
	return false
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
		anchor := slices.IndexFunc(kids, func(k string) bool { return ofOwner(k, h) })
		if anchor < 0 {
			return lockstore.Acquisition{}, nil // another's, or nobody's: a handed token takes nothing
		}
		// The new hold goes in only while a hold of owner's is there: owner's grant holds it.
		// Writing it once reads its creation zxid and version for the late hook.
		path := p + "/" + name
		s.tell(path)
		_, err = s.multi(ctx, s.giveBackIfTaken(p, name, func(res []zk.MultiResponse) (int64, int32) {
			return res[2].Stat.Czxid, res[2].Stat.Version
		}),
			&zk.CheckVersionRequest{Path: p + "/" + kids[anchor], Version: -1},
			&zk.CreateRequest{Path: path, Acl: s.acl, Flags: zk.FlagEphemeral},
			&zk.SetDataRequest{Path: path, Version: 0})
		if errors.Is(err, zk.ErrNodeExists) { // a re-sent re-entry adds it once
			err = s.adopt(ctx, p, name)
		}
		switch {
		case err == nil:
			s.remember(p, owner, name)
			return lockstore.Acquisition{Acquired: true, Reentered: true, Fence: fence(stat.Czxid)}, nil
		case errors.Is(err, zk.ErrNoNode):
			continue // that hold, or the re-sent one, went meanwhile: read again
		default:
			return lockstore.Acquisition{}, fmt.Errorf("flightlock: re-enter %q: %w", key, err)
		}
	}
	return lockstore.Acquisition{}, nil
}

// Refresh implements lockstore.Store: a multi of existence checks of the holds this store made
// for owner under key, a write that the leader refuses once the session expired: success means
// the lock lives at least MaxTTL from the send (see the package doc).
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

// Release implements lockstore.Store: deletes owner's hold, and with the last hold the key
// node, in one multi that checks the node's version as read. It reports 1 notified when the
// lock was marked (someone was refused while it was held), else 0. A release that fails on the
// store's error is tried again in the background (releaseLater).
func (s *Store) Release(ctx context.Context, key, owner, hold string, lastFence int64) (int, error) {
	if err := cmp.Or(s.check(key, owner, time.Millisecond), lockstore.CheckHold(hold, true)); err != nil {
		return 0, err
	}
	p, name := s.keyPath(key), holdName(owner, hold)
	since := s.pend(p + "/" + name) // before the first try: a re-send after it is seen
	n, err := s.releaseHold(ctx, p, name, -1)
	n, err = s.released(p, owner, name, n, err)
	if err != nil && !errors.Is(err, lockstore.ErrNotHeld) {
		s.releaseLater(p, owner, name, since)
	} else {
		s.unpend(p + "/" + name)
	}
	return n, err
}

// releaseHold deletes hold name under key node p at version (-1: any), and with the last hold
// the key node (see Release). Every multi it sends deletes that hold, so it fails on a node the
// key got since (see the package doc). It returns the store's errors as they are: zk.ErrNoNode
// when the hold is gone, zk.ErrBadVersion only when the hold is at another version.
func (s *Store) releaseHold(ctx context.Context, p, name string, version int32) (int, error) {
	hold := &zk.DeleteRequest{Path: p + "/" + name, Version: version}
	reader := strings.HasPrefix(name, readerPre)
	if !reader {
		// The common case first, in one request: the grant's only hold goes with its node. A
		// node with other holds fails it whole, and the general case below reads it. It reads
		// no mark, so reports none notified; the waiters' watches hear the node go all the same.
		_, err := s.multi(ctx, nil, hold, &zk.DeleteRequest{Path: p, Version: -1})
		if !errors.Is(err, zk.ErrNotEmpty) {
			return 0, err
		}
	}
	for round := range releaseRounds {
		if round >= attempts {
			// Readers that come and go move the key node's version under every round: back off.
			select {
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-time.After(time.Duration(min(round-attempts+1, 20)) * time.Millisecond):
			}
		}
		data, stat, err := s.get(ctx, p)
		if err == nil && stat.NumChildren == 0 {
			err = zk.ErrNoNode // left by an expired session: not held
		}
		if err != nil {
			return 0, err
		}
		_, _, marked := parseValue(data)
		var (
			notified int
			res      []zk.MultiResponse
		)
		switch {
		case stat.NumChildren > 1:
			if reader { // the readers left are not named any more: the data may name this one
				data = []byte(readersTag)
				if marked {
					data = append(data, markSuffix...)
				}
			}
			res, err = s.releaseNotLast(ctx, p, name, version, data, stat)
		case reader && marked:
			// The last reader leaves it to writers: with no holds any writer clears and takes
			// it, while readers wait out writerReserve.
			res, err = s.multi(ctx, nil, hold, &zk.SetDataRequest{Path: p, Data: []byte(writerTag + markSuffix), Version: stat.Version})
			notified = 1
		default:
			res, err = s.multi(ctx, nil, hold, &zk.DeleteRequest{Path: p, Version: stat.Version})
			if errors.Is(err, zk.ErrNotEmpty) {
				continue // a hold came meanwhile (a re-entry, a reader): read again
			}
			if marked {
				notified = 1
			}
		}
		// The hold is the first operation of each multi: its bad version is the caller's to
		// hear, the key node's means it was marked, or another hold released, meanwhile.
		if !errors.Is(err, zk.ErrBadVersion) || len(res) > 0 && errors.Is(res[0].Error, zk.ErrBadVersion) {
			return notified, err
		}
	}
	return 0, errors.New("the key node kept changing")
}

// releaseNotLast deletes hold name under key node p at version, read as data and stat with
// other holds beside it, and writes the data back at the version read: of two holders releasing
// at once from the same read, the second fails (a bad version), reads again and finds itself
// last.
func (s *Store) releaseNotLast(ctx context.Context, p, name string, version int32, data []byte, stat *zk.Stat) ([]zk.MultiResponse, error) {
	return s.multi(ctx, nil,
		&zk.DeleteRequest{Path: p + "/" + name, Version: version},
		&zk.SetDataRequest{Path: p, Data: data, Version: stat.Version})
}

// released is the outcome of releaseHold's multi that deleted hold name of owner under key
// node p and notified waiters, or failed with err: a hold that is gone is forgotten.
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

// releaseLater retries in the background (later) a release of hold name of owner under key
// node p that failed, until it goes through, the hold is gone, or the store closes; since is
// what pend returned before the release was first tried. The owner gave the hold up, but a
// request of the same owner answered since that it holds the hold (tell: one that adopted it,
// or made it anew) is a new grant after that release, which the release must not end: the
// give-back yields to it. The node is read, the answers counted, and the hold deleted at the
// version read, in that order, and such a request counts its answer before it writes the hold
// (adopt) or makes it: whichever comes first on the server, the release never deletes a hold
// that request was told of.
func (s *Store) releaseLater(p, owner, name string, since int) {
	path := p + "/" + name
	untold := func(*zk.Stat) bool { return !s.toldSince(path, since) }
	gone := func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if g := s.giving[path]; g == nil || g.told == since {
			s.forgetLocked(p, owner, name)
		}
	}
	s.later(func(ctx context.Context) bool {
		done := s.giveBack(ctx, p, name, untold, gone)
		if done {
			s.unpend(path)
		}
		return done
	})
}

// pend registers a give-back of hold path by its owner's Release, and returns the count of
// answers told of it so far, for toldSince; unpend ends it.
func (s *Store) pend(path string) (told int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.giving[path]
	if g == nil {
		g = &giving{}
		s.giving[path] = g
	}
	g.pending++
	return g.told
}

func (s *Store) unpend(path string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g := s.giving[path]; g != nil {
		if g.pending--; g.pending <= 0 {
			delete(s.giving, path)
		}
	}
}

// tell counts, before a request is sent whose success answers a caller that it holds hold
// path, that answer against the give-backs of path pending (see releaseLater).
func (s *Store) tell(path string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g := s.giving[path]; g != nil {
		g.told++
	}
}

// toldSince reports whether hold path was told of (tell) since pend returned since.
func (s *Store) toldSince(path string, since int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.giving[path]
	return g != nil && g.told != since
}

// later runs try on a goroutine of its own until it reports done or the store closes, each time
// after a pause that doubles from 100ms to 2s, with a session's length to answer. It retries a
// give-back that failed: a hold or a place nobody else knows of lives as long as the session,
// and would keep the key (or its line) from everyone until the process ends.
func (s *Store) later(try func(ctx context.Context) (done bool)) {
	s.laters.Add(1)
	go func() {
		defer s.laters.Add(-1)
		for delay := 100 * time.Millisecond; !s.closed.Load(); delay = min(2*delay, 2*time.Second) {
			time.Sleep(delay)
			ctx, cancel := context.WithTimeout(context.Background(), s.session)
			done := try(ctx)
			cancel()
			if done {
				return
			}
		}
	}()
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
// change until closed. It starts listening only now (lockstore.Watch.Fresh).
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
