package etcdstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/flightlock/flightlock/lockstore"
)

// Acquire implements lockstore.Store in one transaction while the lease of ttl is fresh (the
// keep-alives see to it): acquireWriteOnce, acquireReadOnce, or acquirePermitsOnce.
func (s *Store) Acquire(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	keys := []string{req.Key}
	if len(req.Permits) > 0 {
		if err := lockstore.CheckPermits(req); err != nil {
			return lockstore.Acquisition{}, err
		}
		if len(req.Permits)+permitLookOps > s.maxTxnOps {
			return lockstore.AcquireEach(ctx, req, s.Acquire)
		}
		keys = req.Permits
	}
	fair, read := !req.Asked.IsZero(), lockstore.IsReadOwner(req.Owner)
	if fair && read {
		return lockstore.Acquisition{}, errors.New("flightlock: read holds share a key, so they take no place in its fair line")
	}
	if err := s.check(req.Owner, req.TTL, keys...); err != nil {
		return lockstore.Acquisition{}, err
	}
	queue := time.Duration(0)
	if fair {
		queue = max(req.Queue, 0)
	}
	return resending(ctx, s, keys[0], req.Owner, req.TTL, req.Meta, keys, func(ctx context.Context, a *attempt) (lockstore.Acquisition, error) {
		switch {
		case len(req.Permits) > 0:
			return s.acquirePermitsOnce(ctx, a, keys, max(req.Want, 1))
		case read:
			return s.acquireReadOnce(ctx, a, req.Key)
		}
		return s.acquireWriteOnce(ctx, a, req.Key, fair, queue)
	})
}

// attempt is one attempt of owner's acquisition on the store's lease l of its TTL (pinned, and
// live at least ttl from start) with the value it writes.
type attempt struct {
	owner, value string
	ttl          time.Duration
	start        time.Time // when the acquisition began: its guarantees count from then
	again        bool      // a lease etcd no longer has may be dropped (errLeaseGone), once
	l            *lease
}

func (a *attempt) until() time.Time { return a.start.Add(a.ttl) }

// permitLookOps is what acquirePermitsOnce needs of --max-txn-ops beside one operation per
// permit: etcd counts nested operations against the parent branch, and a refusal (3) nests
// markWriter (2). A cluster that allows fewer is asked one permit at a time (AcquireEach).
const permitLookOps = 5

// acquirePermitsOnce is one attempt of Acquire with Permits keys, of which it takes up to want,
// in one transaction that refuses each held key as acquireWriteOnce does (writeOps):
//
//	if   writable(keys[0])                        (unless owner may hold one of keys)
//	then grant(keys[0]); for each other k: writable(k)     (the looks with want > 1)
//	else for each k: if writable(k) then nothing else refusal(k)
//
// The permits owner holds (an earlier reply may be lost) are re-entered, all and nothing more,
// so keys[0] is granted at once only while the store knows no entry of owner's for keys. Else
// the free permits seen are taken on the one-key path, until want are held.
func (s *Store) acquirePermitsOnce(ctx context.Context, a *attempt, keys []string, want int) (lockstore.Acquisition, error) {
	mayHold := slices.ContainsFunc(keys, func(k string) bool { _, ok := s.entry(k, a.owner); return ok })
	looks := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		cmps, _, refused := writeOps(k, a.value, a.l)
		looks[i] = clientv3.OpTxn(cmps, nil, refused)
	}
	txn, taken := s.cli.Txn(ctx).Then(looks...), keys[:0]
	if !mayHold {
		cmps, grant, _ := writeOps(keys[0], a.value, a.l)
		if want > 1 { // which others are free; no marks, as a grant makes no busy reply
			for _, k := range keys[1:] {
				grant = append(grant, clientv3.OpTxn(writable(k), nil, nil))
			}
		}
		txn, taken = s.cli.Txn(ctx).If(cmps...).Then(grant...).Else(looks...), keys[:1]
	}
	resp, err := txn.Commit()
	if err != nil {
		return lockstore.Acquisition{}, fmt.Errorf("flightlock: acquire %q: %w", keys[0], s.acquireFailed(err, a, taken...))
	}
	var p permitReplies // each busy permit's reply, and the first permit if the look granted it
	var free, held []int
	ours := make([]*mvccpb.KeyValue, len(keys)) // the keys of the permits held
	if !mayHold && resp.Succeeded {
		g, err := s.granted(ctx, a, keys[0], resp.Header.Revision, firstKV(resp.Responses[1]))
		if err != nil {
			return lockstore.Acquisition{}, err
		}
		p.add(0, g)
		for i, r := range resp.Responses[3:] {
			if r.GetResponseTxn().Succeeded {
				free = append(free, i+1)
			}
		}
	} else {
		for i, k := range keys {
			t := resp.Responses[i].GetResponseTxn()
			if t.Succeeded {
				free = append(free, i)
				continue
			}
			if kv, b := refusal(t.Responses); kv != nil && ownedBy(kv.Value, a.owner) {
				held, ours[i] = append(held, i), kv
			} else {
				s.noteBusy(k, resp.Header.Revision)
				p.add(i, b)
			}
		}
	}
	if len(held) > 0 { // the permits held are the answer, busy or not
		p = permitReplies{}
		if err := p.each(held, func(i int) (lockstore.Acquisition, error) {
			return s.reentered(ctx, a, keys[i], ours[i], nil)
		}); err != nil {
			return lockstore.Acquisition{}, err
		}
		return p.out, nil
	}
	for len(free) > 0 && p.got < want {
		n := min(len(free), want-p.got)
		if err := p.each(free[:n], func(i int) (lockstore.Acquisition, error) {
			return s.acquireWriteOnce(ctx, a, keys[i], false, 0)
		}); err != nil {
			return lockstore.Acquisition{}, err
		}
		free = free[n:]
	}
	if p.out.Acquired {
		p.out.Holder = p.passed
	}
	return p.out, nil
}

// permitReplies gathers the outcomes of a permit request in permit order: the first grant,
// More, or the shortest busy reply.
type permitReplies struct {
	out    lockstore.Acquisition
	seen   bool   // out holds a busy reply
	got    int    // permits in out
	passed string // the first busy permit's holder (Acquisition.Holder of a grant)
}

func (p *permitReplies) add(i int, a lockstore.Acquisition) {
	if a.Acquired {
		p.got++
	} else if !p.seen {
		p.passed = a.Holder
	}
	switch {
	case a.Acquired && p.out.Acquired:
		p.out.More = append(p.out.More, lockstore.PermitGrant{Permit: i, Fence: a.Fence})
	case a.Acquired:
		p.out, p.out.Permit = a, i
	case !p.out.Acquired && (!p.seen || a.HolderTTL < p.out.HolderTTL):
		p.out, p.seen = a, true
	}
}

// each runs one for each permit of is at once (independent: a key each) and adds their
// outcomes. A failure is the error when nothing is granted or its lease is gone (taking the
// grants on it); else the one-key path cleans up. Of several, one that may have run (an unknown
// outcome, the caller's context) wins: the caller must then take a new owner.
func (p *permitReplies) each(is []int, one func(int) (lockstore.Acquisition, error)) error {
	as, errs := make([]lockstore.Acquisition, len(is)), make([]error, len(is))
	var wg sync.WaitGroup
	for j, i := range is {
		wg.Go(func() { as[j], errs[j] = one(i) })
	}
	wg.Wait()
	for j, i := range is {
		p.add(i, as[j])
	}
	var failed error
	for _, err := range errs {
		if err != nil && (p.got == 0 || errors.Is(err, errLeaseGone) || isLeaseNotFound(err)) &&
			(failed == nil || errors.Is(err, lockstore.ErrOutcomeUnknown) || callerEnded(err)) {
			failed = err
		}
	}
	return failed
}

// resendAfter bounds an attempt's wait for etcd (doubling, at most maxResendAfter): a proposal
// lost with a leader change is answered only at etcd's request timeout (5s plus two election
// timeouts), usually past the caller's deadline. Sending again is safe: an acquisition is
// idempotent for its owner, and an attempt cut short retires its lease (acquireFailed). The
// pause between attempts doubles from retryPauseMin to retryPauseMax.
const (
	resendAfter    = time.Second
	maxResendAfter = 4 * time.Second
	retryPauseMin  = 50 * time.Millisecond
	retryPauseMax  = 400 * time.Millisecond
)

// resending runs once, each attempt on a fresh pinned lease of ttl for owner's acquisition of
// keys (what names them in errors), until it succeeds, fails for good (errLeaseGone once is not
// for good: attempt.again), or ctx ends, and returns the last outcome.
func resending[T any](ctx context.Context, s *Store, what any, owner string, ttl time.Duration, meta string, keys []string,
	once func(ctx context.Context, a *attempt) (T, error)) (T, error) {
	start := time.Now()
	try := func(ctx context.Context, again bool) (T, error) {
		// The lease as attempt.l needs it. Without it nothing was sent: noted in unsent
		// (giveBackLater) unless an entry of the key knows more.
		l, err := s.leaseFor(ctx, ttl)
		if err == nil && !l.liveFor(start, ttl) {
			if _, err = s.ownKeepAlive(l, start).wait(ctx); err != nil {
				s.unpin(l)
			}
		}
		if err != nil {
			s.mu.Lock()
			for _, k := range keys {
				if s.held[entryKey{k, owner}] == nil {
					putBounded(s.unsent, entryKey{k, owner}, struct{}{})
				}
			}
			s.mu.Unlock()
			return *new(T), fmt.Errorf("flightlock: acquire %q: %w", what, err)
		}
		defer s.unpin(l)
		a := &attempt{owner: owner, ttl: ttl, start: start, again: again, l: l}
		if lockstore.IsReadOwner(owner) {
			a.value = readValue(l.secs, meta)
		} else {
			a.value = newValue(owner, l.secs, meta)
		}
		return once(ctx, a)
	}
	bound, pause, again := resendAfter, retryPauseMin, true
	var unknown error // an earlier attempt's error whose outcome is unknown (acquireFailed)
	for {
		actx, cancel := context.WithTimeout(ctx, bound)
		v, err := try(actx, again)
		cut := actx.Err() != nil && ctx.Err() == nil
		cancel()
		switch {
		case errors.Is(err, lockstore.ErrOutcomeUnknown):
			unknown = err
		case err != nil && cut:
			// Cut by this loop's bound, not the caller's: acquireFailed recorded it as an
			// attempt that may have run.
			err = outcomeUnknown(err)
			unknown = err
		case err != nil && unknown != nil && !callerEnded(err):
			err = outcomeUnknown(err) // the failed attempt stays recorded
		}
		switch {
		case err == nil && unknown != nil && refused(v) && !s.dropUnknown(keys, owner):
			// The reaper has the record: its give-back could end a later grant to owner, so the
			// caller must hear that the owner is spent.
			return v, unknown
		case err == nil:
			return v, nil
		case errors.Is(err, errLeaseGone) && again:
			again = false // dropped with its locks: the next round grants a new lease
			continue
		case ctx.Err() != nil || s.isClosed() || !cut && !transient(err):
			return v, err
		}
		if !sleep(ctx.Done(), pause) {
			return v, err
		}
		pause, bound = min(2*pause, retryPauseMax), min(2*bound, maxResendAfter)
	}
}

// dropUnknown drops owner's records of keys made by an attempt of this call with an unknown
// outcome (acquireFailed), once a later attempt was answered busy, and reports whether none is
// left (false when the reaper has one: it cannot be called back). The busy answer settles the
// failed attempt up to then: etcd applies proposals in commit order, so had it taken a key the
// later one would have re-entered it. Without the record no give-back by owner can end owner's
// later grant. The cost: a commit later still (delayed in a partition) leaves the key on the
// retired lease with no record; owner re-enters it if it asks again, else it goes with the
// lease, once the locks on it at retirement have ended.
func (s *Store) dropUnknown(keys []string, owner string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	left := false
	for _, key := range keys {
		k := entryKey{key, owner}
		e := s.held[k]
		switch {
		case e == nil || e.createRev != 0 || len(e.holds) > 0:
		case e.reaping:
			left = true
		default:
			s.applyLocked(k, e, func(e *heldKey) { e.own = false })
		}
	}
	return !left
}

// refused reports whether v, an outcome of resending, is an Acquire that did not take its key.
func refused(v any) bool {
	a, ok := v.(lockstore.Acquisition)
	return ok && !a.Acquired
}

// transient reports whether err is a failure the cluster recovers from by itself: no leader, a
// leader change, a proposal that timed out, an unreachable member (codes.Unavailable for each),
// too many requests waiting, or errNoAnswer; never the caller's own end.
func transient(err error) bool {
	var ee rpctypes.EtcdError
	switch {
	case errors.Is(err, errNoAnswer):
		return true
	case callerEnded(err):
		return false
	case errors.As(err, &ee):
		return ee.Code() == codes.Unavailable || ee == rpctypes.ErrTooManyRequests
	}
	return status.Code(err) == codes.Unavailable
}

// writable is the compare of a write grant of key: no writer holds it (it does not exist) and
// no reader does (a compare over an empty range holds).
func writable(key string) []clientv3.Cmp {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(key), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(readDir(key)), "=", 0).WithPrefix(),
	}
}

// writeOps are a write acquisition of key with value on lease l, as acquireWriteOnce draws it:
// the compare, the grant (floor read second) and the refusal (holder read first, markWriter third).
func writeOps(key, value string, l *lease) (cmps []clientv3.Cmp, grant, refused []clientv3.Op) {
	return writable(key),
		[]clientv3.Op{clientv3.OpPut(key, value, clientv3.WithLease(l.id)), clientv3.OpGet(FloorKey(key)),
			clientv3.OpDelete(writerKey(key))},
		[]clientv3.Op{clientv3.OpGet(key), clientv3.OpPut(WaiterKey(key), "", clientv3.WithLease(l.id)), markWriter(key, l)}
}

// refusal reads the replies rs of writeOps' refusal: the holder's key (nil: no writer) and the
// busy reply, the holder's; else that of the read hold markWriter read, or, for a free key with
// others first in its fair line, HolderTTL 0.
func refusal(rs []*pb.ResponseOp) (*mvccpb.KeyValue, lockstore.Acquisition) {
	if kv := firstKV(rs[0]); kv != nil {
		return kv, busy(kv)
	}
	if t := rs[2].GetResponseTxn(); t != nil && t.Succeeded && len(t.Responses) >= 2 {
		if kv := firstKV(t.Responses[1]); kv != nil {
			return nil, busyFor(parseReadValue(kv.Value))
		}
	}
	return nil, lockstore.Acquisition{}
}

// markWriter keeps readers from starving a refused writer: when key has read holds, it sets
// the writer mark on lease l, due one lease TTL away (the writer asks again before it, at each
// read hold's end), and reads one read hold for the busy reply.
func markWriter(key string, l *lease) clientv3.Op {
	life := time.Duration(l.secs) * time.Second
	return clientv3.OpTxn(
		[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(readDir(key)), ">", 0).WithPrefix()},
		[]clientv3.Op{
			clientv3.OpPut(writerKey(key), markValue(time.Now().Add(life), l.secs), clientv3.WithLease(l.id)),
			clientv3.OpGet(readDir(key), clientv3.WithPrefix(), clientv3.WithLimit(1)),
		},
		nil)
}

// markWaiter is AcquireAll's mark: a nested transaction that sets key's waiter mark on the
// waiter's lease when key is held by someone other than owner and the mark is not set.
func markWaiter(key, owner string, id clientv3.LeaseID) clientv3.Op {
	w := WaiterKey(key)
	return clientv3.OpTxn(
		valueIn(key, owner+" ", owner+"!"), // key's value starts with "<owner> "
		nil,
		[]clientv3.Op{clientv3.OpTxn(
			[]clientv3.Cmp{
				clientv3.Compare(clientv3.CreateRevision(w), "=", 0),
				clientv3.Compare(clientv3.CreateRevision(key), ">", 0),
			},
			[]clientv3.Op{clientv3.OpPut(w, "", clientv3.WithLease(id))},
			nil)})
}

// valueIn is the compare that key's value lies strictly between lo and hi, as bytes: false for a
// missing key.
func valueIn(key, lo, hi string) []clientv3.Cmp {
	v := clientv3.Value(key)
	return []clientv3.Cmp{clientv3.Compare(v, ">", lo), clientv3.Compare(v, "<", hi)}
}

// acquireFailed answers a transaction of attempt a on keys that failed with err: errLeaseGone
// when etcd no longer had a's lease and a.again is set; err when etcd refused it (rejected).
// Else etcd may have applied it: each put is recorded as maybe made (the reaper releases it
// past a.until unless refreshed), and the lease retired, so that a later commit goes with it.
// Unless the caller's own end, the error wraps lockstore.ErrOutcomeUnknown: the caller must
// take a new owner, or the reaper's give-back could end the next grant.
func (s *Store) acquireFailed(err error, a *attempt, keys ...string) error {
	if isLeaseNotFound(err) && a.again {
		a.l.mu.Lock()
		a.l.gone = true
		a.l.mu.Unlock()
		s.dropLease(a.l)
		return errLeaseGone
	}
	if rejected(err) {
		return err
	}
	for _, key := range keys {
		s.update(key, a.owner, func(e *heldKey) {
			e.own = true
			if e.lease == 0 && e.createRev == 0 {
				e.lease = a.l.id
			}
			e.until = later(e.until, a.until())
		})
	}
	s.retire(a.l)
	if callerEnded(err) {
		return err
	}
	return outcomeUnknown(err)
}

// outcomeUnknown marks err as the failure of a request etcd may have applied.
func outcomeUnknown(err error) error { return fmt.Errorf("%w (%w)", err, lockstore.ErrOutcomeUnknown) }

// callerEnded reports whether err is the end of the caller's context.
func callerEnded(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// sleep waits d, and reports false when done is closed first.
func sleep(done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return false
	case <-t.C:
		return true
	}
}

// rejected reports an error with which etcd refuses a request before applying any of it: too
// many proposals waiting (transient), one the client's user may not make, or a malformed one.
// Not NOSPACE: the transaction that crosses the quota is applied, then answered with it.
func rejected(err error) bool {
	var ee rpctypes.EtcdError
	return errors.As(err, &ee) && slices.Contains([]error{rpctypes.ErrTooManyRequests, rpctypes.ErrRequestTooLarge,
		rpctypes.ErrTooManyOps, rpctypes.ErrDuplicateKey, rpctypes.ErrPermissionDenied, rpctypes.ErrInvalidAuthToken,
		rpctypes.ErrUserEmpty}, error(ee))
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// granted records a grant of key to attempt a at revision rev and returns its fence. A read
// hold is never simple (the one-transaction release and Pass are a write's) and leaves refused
// to writes. A floor that makes no fence (written by hand) gives the grant back rather than
// hand out a fence that may repeat.
func (s *Store) granted(ctx context.Context, a *attempt, key string, rev int64, floor *mvccpb.KeyValue) (lockstore.Acquisition, error) {
	fence, err := fenceOf(rev, floor)
	if err != nil {
		s.giveBack(ctx, holdKey(key, a.owner), a.value)
		return lockstore.Acquisition{}, fmt.Errorf("flightlock: acquire %q: %w", key, err)
	}
	read := lockstore.IsReadOwner(a.owner)
	s.update(key, a.owner, func(e *heldKey) {
		e.lease, e.createRev, e.modRev, e.fence, e.hadFloor = a.l.id, rev, rev, fence, floor != nil
		e.simple, e.own, e.tries = !read, true, 0
		e.until = later(e.until, a.until())
		if !read {
			_, e.contended = s.refused[key] // update holds s.mu
			delete(s.refused, key)
		}
	})
	return lockstore.Acquisition{Acquired: true, Fence: fence}, nil
}

// giveBack deletes key if it still holds value (a grant the store cannot use), beside the caller.
func (s *Store) giveBack(ctx context.Context, key, value string) {
	s.beside(ctx, func(ctx context.Context) {
		_, _ = s.cli.Txn(ctx).If(clientv3.Compare(clientv3.Value(key), "=", value)).Then(clientv3.OpDelete(key)).Commit()
	})
}

// reentered answers attempt a of a key its owner holds already (kv: the lock key, or a read
// owner's read hold): its fence, once it lives at least a.ttl from a.start (its lease is a's,
// or is kept alive now). A write's nil floor is read here; a read's comes from its transaction.
func (s *Store) reentered(ctx context.Context, a *attempt, key string, kv, floor *mvccpb.KeyValue) (lockstore.Acquisition, error) {
	read := lockstore.IsReadOwner(a.owner)
	simple, what := false, "read hold"
	if !read {
		v, ok := parseValue(kv.Value)
		if !ok {
			return lockstore.Acquisition{}, fmt.Errorf("flightlock: acquire %q: unreadable lock value %q", key, kv.Value)
		}
		simple, what = v.holds == "1", "held" // the acquisition's hold alone (heldKey.simple)
	}
	var err error
	if floor == nil && !read {
		if floor, err = getKV(ctx, s.cli, FloorKey(key)); err != nil {
			return lockstore.Acquisition{}, fmt.Errorf("flightlock: acquire %q: %w", key, err)
		}
	}
	fence, err := fenceOf(kv.CreateRevision, floor)
	if err != nil {
		return lockstore.Acquisition{}, fmt.Errorf("flightlock: acquire %q: %w", key, err)
	}
	// Looked up before the keep-alive: a retired lease may be revoked meanwhile (updateOn).
	id := clientv3.LeaseID(kv.Lease)
	kl := s.ourLease(id)
	if id != a.l.id {
		switch secs, err := s.startKeepAlive(ctx, id, a.start).wait(ctx); {
		case errors.Is(err, errLeaseGone):
			return lockstore.Acquisition{}, nil // deleted with its lease: free now, try again
		case err != nil:
			return lockstore.Acquisition{}, fmt.Errorf("flightlock: acquire %q: %w", key, err)
		case time.Duration(secs)*time.Second < a.ttl:
			return lockstore.Acquisition{}, fmt.Errorf("flightlock: acquire %q: %s on an etcd lease of %ds, "+
				"shorter than the lock TTL %v", key, what, secs, a.ttl)
		}
	}
	if !s.updateOn(kl, key, a.owner, func(e *heldKey) {
		e.lease, e.createRev, e.modRev, e.fence, e.hadFloor = id, kv.CreateRevision, kv.ModRevision, fence, floor != nil
		e.simple, e.own, e.tries = simple, true, 0
		e.until = later(e.until, a.until())
	}) {
		return lockstore.Acquisition{}, nil // going with its retired lease: free soon, try again
	}
	return lockstore.Acquisition{Acquired: true, Reentered: true, Fence: fence}, nil
}

// busy is the refusal by the holder of kv: its lease TTL (how long the lock lasts should its
// holder stop now) and metadata.
func busy(kv *mvccpb.KeyValue) lockstore.Acquisition {
	v, ok := parseValue(kv.Value)
	return busyFor(v.secs, v.meta, ok)
}

// busyFor is a refusal by a holder whose lease lasts secs, with metadata meta; empty unless ok.
func busyFor(secs int64, meta string, ok bool) lockstore.Acquisition {
	if !ok {
		return lockstore.Acquisition{}
	}
	return lockstore.Acquisition{HolderTTL: time.Duration(secs) * time.Second, Holder: meta}
}

// AcquireAll takes every key of keys (distinct, at most (n-4)/2 under --max-txn-ops n) for owner
// in one transaction, all or none: free keys are taken, or all re-entered when owner holds them
// all; else the keys held by others are marked waited on, their Acquisitions (in keys' order)
// carrying HolderTTL and Holder. Each key is released on its own.
func (s *Store) AcquireAll(ctx context.Context, keys []string, owner string, ttl time.Duration, meta string) ([]lockstore.Acquisition, error) {
	// Two operations a key in each branch, and etcd counts markWaiter's two levels against it.
	most := (s.maxTxnOps - 4) / 2
	switch {
	case len(keys) == 0:
		return nil, errors.New("flightlock: no keys")
	case len(keys) > most:
		return nil, fmt.Errorf("flightlock: %d keys in one etcd transaction, at most %d (--max-txn-ops %d)",
			len(keys), most, s.maxTxnOps)
	case lockstore.IsReadOwner(owner):
		return nil, errors.New("flightlock: AcquireAll takes write locks only, not read holds")
	case len(slices.Compact(slices.Sorted(slices.Values(keys)))) != len(keys):
		return nil, errors.New("flightlock: duplicate key in AcquireAll")
	}
	if err := s.check(owner, ttl, keys...); err != nil {
		return nil, err
	}
	return resending(ctx, s, keys, owner, ttl, meta, keys, func(ctx context.Context, a *attempt) ([]lockstore.Acquisition, error) {
		return s.acquireAllOnce(ctx, a, keys)
	})
}

// acquireAllOnce is one attempt of AcquireAll, as acquireWriteOnce is of Acquire.
func (s *Store) acquireAllOnce(ctx context.Context, a *attempt, keys []string) ([]lockstore.Acquisition, error) {
	cmps := make([]clientv3.Cmp, 0, 2*len(keys))
	then := make([]clientv3.Op, 0, 2*len(keys))
	els := make([]clientv3.Op, 0, 2*len(keys))
	for _, k := range keys {
		// Read holds refuse the grant too; no writer mark (it would not fit --max-txn-ops),
		// so a stream of readers can hold AcquireAll off.
		cmps = append(cmps, writable(k)...)
		then = append(then, clientv3.OpPut(k, a.value, clientv3.WithLease(a.l.id)), clientv3.OpGet(FloorKey(k)))
		els = append(els, clientv3.OpGet(k), markWaiter(k, a.owner, a.l.id))
	}
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(then...).Else(els...).Commit()
	if err != nil {
		return nil, fmt.Errorf("flightlock: acquire %q: %w", keys, s.acquireFailed(err, a, keys...))
	}
	out := make([]lockstore.Acquisition, len(keys))
	if resp.Succeeded {
		for i, k := range keys {
			g, err := s.granted(ctx, a, k, resp.Header.Revision, firstKV(resp.Responses[2*i+1]))
			if err != nil {
				for j, g := range keys { // granted gave back keys[i], and recorded keys[:i]
					if j != i {
						s.giveBack(ctx, g, a.value)
						s.released(g, a.owner, "")
					}
				}
				return nil, err
			}
			out[i] = g
		}
		return out, nil
	}
	ours := 0
	for i, k := range keys {
		kv := firstKV(resp.Responses[2*i])
		if kv != nil && ownedBy(kv.Value, a.owner) {
			ours++
			continue
		}
		s.noteBusy(k, resp.Header.Revision)
		if kv != nil { // else free of writers, so held by readers: no writer to wait for
			out[i] = busy(kv)
		}
	}
	if ours < len(keys) {
		return out, nil
	}
	for i, k := range keys {
		g, err := s.reentered(ctx, a, k, firstKV(resp.Responses[2*i]), nil)
		if err != nil || !g.Acquired {
			return make([]lockstore.Acquisition, len(keys)), err
		}
		out[i] = g
	}
	return out, nil
}

// Reenter implements lockstore.Store: owner, a token another process holds key with, adds the
// hold named hold: a read, then a write compared on the revision read (a re-sent call finds the
// hold listed), beside a keep-alive of the key's lease sent after the call started. A ttl
// longer than the holder's lease is refused.
func (s *Store) Reenter(ctx context.Context, key, owner, hold string, ttl time.Duration) (lockstore.Acquisition, error) {
	if err := cmp.Or(s.check(owner, ttl, key), lockstore.CheckHold(hold, false)); err != nil {
		return lockstore.Acquisition{}, err
	}
	if lockstore.IsReadOwner(owner) {
		return lockstore.Acquisition{}, nil // read holds are not handed to other processes
	}
	start := time.Now()
	for {
		resp, err := s.cli.Txn(ctx).Then(clientv3.OpGet(key), clientv3.OpGet(FloorKey(key))).Commit()
		if err != nil {
			return lockstore.Acquisition{}, fmt.Errorf("flightlock: re-enter %q: %w", key, err)
		}
		kv, floor := firstKV(resp.Responses[0]), firstKV(resp.Responses[1])
		switch {
		case kv == nil:
			return lockstore.Acquisition{}, nil // free: a handed-over token takes nothing
		case !ownedBy(kv.Value, owner):
			return lockstore.Acquisition{HolderTTL: busy(kv).HolderTTL}, nil // no holder, as the Redis store
		}
		v, ok := parseValue(kv.Value)
		if !ok {
			return lockstore.Acquisition{}, fmt.Errorf("flightlock: re-enter %q: unreadable lock value %q", key, kv.Value)
		}
		if time.Duration(v.secs)*time.Second < ttl {
			return lockstore.Acquisition{}, fmt.Errorf("flightlock: re-enter %q for %v: its holder's etcd lease lasts %ds, "+
				"so this TTL cannot be honoured", key, ttl, v.secs)
		}
		fence, err := fenceOf(kv.CreateRevision, floor)
		if err != nil {
			return lockstore.Acquisition{}, fmt.Errorf("flightlock: re-enter %q: %w", key, err)
		}
		id := clientv3.LeaseID(kv.Lease)
		kl := s.ourLease(id) // before the keep-alive, as in reentered
		ka, written := s.startKeepAlive(ctx, id, start), true
		if nv := v.withHold(hold); nv.holds != v.holds {
			put, err := s.atRevision(ctx, key, kv.ModRevision, []clientv3.Op{clientv3.OpPut(key, nv.String(), clientv3.WithIgnoreLease())}, nil)
			if err != nil {
				ka.join()
				// The hold may be written: the store gives it up once ttl passes unrefreshed.
				s.update(key, owner, func(e *heldKey) {
					e.holds = withHold(e.holds, hold)
					e.until = later(e.until, start.Add(ttl))
				})
				return lockstore.Acquisition{}, fmt.Errorf("flightlock: re-enter %q: %w", key, err)
			}
			written = put.Succeeded
		}
		secs, kaErr := ka.wait(ctx) // joins it
		if !written {
			continue // the lock changed since it was read: read it again
		}
		switch {
		case errors.Is(kaErr, errLeaseGone):
			return lockstore.Acquisition{}, nil // the key went with its lease: nothing is held
		case kaErr != nil: // added, but not reported: given back beside the caller
			s.beside(ctx, func(ctx context.Context) { _, _ = s.release(ctx, key, owner, hold, 0) })
			return lockstore.Acquisition{}, fmt.Errorf("flightlock: re-enter %q: %w", key, kaErr)
		case time.Duration(secs)*time.Second < ttl:
			s.beside(ctx, func(ctx context.Context) { _, _ = s.release(ctx, key, owner, hold, 0) })
			return lockstore.Acquisition{}, fmt.Errorf("flightlock: re-enter %q for %v: its etcd lease lasts %ds", key, ttl, secs)
		}
		if !s.updateOn(kl, key, owner, func(e *heldKey) {
			e.lease, e.createRev, e.fence, e.hadFloor = id, kv.CreateRevision, fence, floor != nil
			e.modRev, e.simple, e.tries = 0, false, 0
			e.holds = withHold(e.holds, hold)
			e.until = later(e.until, start.Add(ttl))
		}) {
			return lockstore.Acquisition{}, nil // the key goes with its lease: nothing is held
		}
		return lockstore.Acquisition{Acquired: true, Reentered: true, Fence: fence}, nil
	}
}

// getKV reads key (with opts, as clientv3.KV.Get); nil when it does not exist.
func getKV(ctx context.Context, kv clientv3.KV, key string, opts ...clientv3.OpOption) (*mvccpb.KeyValue, error) {
	resp, err := kv.Get(ctx, key, opts...)
	if err != nil || len(resp.Kvs) == 0 {
		return nil, err
	}
	return resp.Kvs[0], nil
}

func firstKV(r *pb.ResponseOp) *mvccpb.KeyValue {
	if rr := r.GetResponseRange(); rr != nil && len(rr.Kvs) > 0 {
		return rr.Kvs[0]
	}
	return nil
}
