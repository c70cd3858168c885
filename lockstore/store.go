// Package lockstore is the contract between the flightlock core and a lock store (Store,
// Capabilities, the optional Passer, the tools' Inspector, the go-zero layer's Driver, their
// types), on the standard library only. Each store is a package owning its value format
// (lockstore/redisstore, lockstore/embedded, etcdstore, zkstore).
package lockstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// ErrNotHeld is returned by Refresh and Release when the lock is not held by the given owner:
// it expired, was never taken, or belongs to someone else. Nothing was changed.
var ErrNotHeld = errors.New("flightlock: lock not held")

// ErrOutcomeUnknown is wrapped in the error of a request that may have run unreported
// (ZooKeeper: the connection closed after it went out; etcd: a leader change's error). As after
// a request its context cut short, the caller gives back what it may have taken, by the same
// owner, and sends nothing more as that owner: a later grant could be the one given back.
var ErrOutcomeUnknown = errors.New("flightlock: the request's outcome is unknown: it may have run")

// Acquisition is the outcome of one Acquire call.
type Acquisition struct {
	Acquired  bool // the caller holds the lock now
	Reentered bool // the owner held the lock already; Acquire only reset its TTL
	// Fence is the grant's fencing token, growing from owner to owner of a key; 0 if not acquired.
	Fence int64
	// Permit is, with Permits, the index of the key granted or re-entered; 0 otherwise.
	Permit int
	// More are, for a request with Permits and a Want above 1, the permits granted beside
	// Permit, each with its own fence; every one is held by the request's owner.
	More []PermitGrant
	// HolderTTL is the holder's time left when not acquired (with Permits, the busy keys' least).
	HolderTTL time.Duration
	// Holder is the holder's Request.Meta if not acquired, "" if it stored none (its trace id
	// tells a nested call). With Permits it is also set when acquired: the Meta of a busy permit
	// passed over, so that holders of another kind show while permits are still free.
	Holder string
}

// Request is one acquisition: what Store.Acquire is asked to take.
type Request struct {
	Key string // the full store key (prefix included)
	// Owner is the caller's token, without spaces. A token made by ReadOwner asks for a read
	// hold (see ReadOwner); any other, for the key itself.
	Owner string
	TTL   time.Duration // how long the lock lives without a refresh
	Meta  string        // optional text kept with the lock for operators (who holds it)
	// Asked, if set, is when the caller's Lock began, and makes the request fair (served in
	// request order across processes): it takes a place in the key's line, only the first in
	// line may take the free key, and a grant leaves the line. Redis ranks places by Asked,
	// clamped to its clock less a skew bound; etcd and ZooKeeper trust no clock and rank them by
	// the arrival of the first fair Acquire, which the Locker sends as Lock begins.
	Asked time.Time
	// Permits, if set, replaces Key with a semaphore's keys: Acquire grants the first of them
	// that it would grant alone (Acquisition.Permit). Where the store can, it looks at them all
	// in one request (else through AcquireEach), so that a re-sent request re-enters. After a
	// request of unknown outcome the Locker still gives back every key and asks again as a new
	// owner. A permit request's Owner is no ReadOwner, and its Asked is zero.
	Permits []string
	// Want, with Permits, is how many to take at once (0 is 1), for a process's waiting
	// goroutines; a store may grant fewer, but one while one is free (More has the rest).
	Want int
	// Queue, if fair, is how long the caller's place lives without another Acquire, so a dead
	// waiter leaves the line; 0 takes no place, only a key nobody is in line for (a TryLock).
	// A busy reply has HolderTTL 0 when the key is free but others are first in line.
	Queue time.Duration
}

// Capabilities states what differs between stores, as data the Locker reads once when it is
// made. The zero value is a store without limits that watches each key on its own.
type Capabilities struct {
	Name string // as rules and metrics spell it: "redis", "etcd", "zookeeper"
	// MaxHandoffs bounds the handoffs under one grant (0: no bound), fenced grant+1, grant+2,
	// ..., which the next grant must exceed even if the holder died without reporting the last
	// (etcd leaves 2^20 fences per grant, ZooKeeper 2^16). New refuses a WithHandoff above it.
	MaxHandoffs int
	// MaxTTL is the longest lock TTL kept (0: no bound); MaxTTLReason ends the refusal "a lock
	// TTL of 20s is longer than " + MaxTTLReason: what keeps it and what to do.
	MaxTTL       time.Duration
	MaxTTLReason string
	// SharedWatch reports that the watchers of a key share one subscription, so a watch costs
	// little (Redis). Only then do waiting semaphore takers watch every permit; on other stores
	// they try again after their retry delays.
	SharedWatch bool
}

// MaxKeyLen is the longest key a store (CheckArgs) and a Locker, prefix included, accept
// (flightlock.MaxKeyLen): a longer one almost always means a template took in a request body.
const MaxKeyLen = 1024

// CheckKey refuses a key that names no lock on any store: empty, or over MaxKeyLen.
func CheckKey(key string) error {
	switch {
	case key == "":
		return errors.New("flightlock: empty lock key")
	case len(key) > MaxKeyLen:
		return fmt.Errorf("flightlock: lock key is %d bytes, at most %d allowed", len(key), MaxKeyLen)
	}
	return nil
}

// CheckArgs refuses what makes no lock on any store, though one might accept it: a key CheckKey
// refuses, an owner not told from what a store writes beside it (empty, a space), a TTL <= 0.
func CheckArgs(key, owner string, ttl time.Duration) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	switch {
	case owner == "" || strings.Contains(owner, " "):
		return errors.New("flightlock: owner token must be non-empty and without spaces")
	case ttl <= 0:
		return fmt.Errorf("flightlock: lock TTL must be positive, got %v", ttl)
	}
	return nil
}

// CheckHold refuses a hold name a store cannot list beside others: empty unless ownAllowed
// (Release's "" names the own hold), over 64 bytes, or with a space or comma.
func CheckHold(hold string, ownAllowed bool) error {
	if hold == "" && !ownAllowed || strings.ContainsAny(hold, " ,") || len(hold) > 64 {
		return fmt.Errorf("flightlock: hold name %q must be 1-64 bytes without spaces or commas", hold)
	}
	return nil
}

// CheckTTL returns why the store cannot keep a lock for ttl, or nil when it can.
func (c Capabilities) CheckTTL(ttl time.Duration) error {
	if c.MaxTTL > 0 && ttl > c.MaxTTL {
		return fmt.Errorf("a lock TTL of %v is longer than %s", ttl, c.MaxTTLReason)
	}
	return nil
}

// Store is what flightlock needs from a lock backend (differences: Capabilities), safe for
// concurrent use, on full keys (prefix included) and opaque space-free owners. The conformance
// suite that checks one is internal to this module (docs/stores.md).
type Store interface {
	// Capabilities describes the store; it does not change after the store is made.
	Capabilities() Capabilities
	// Acquire takes req.Key for req.Owner for req.TTL, or re-enters it if the owner holds it
	// (Reentered; the TTL is reset). It is idempotent per owner, so a request re-sent after a
	// timeout does no harm, unless the owner is spent: its Release or LeaveQueue failed, or a
	// request of it failed with ErrOutcomeUnknown or its context's error (the store may still
	// give that back). A ReadOwner takes a read hold, and a non-zero Asked a place in line.
	Acquire(ctx context.Context, req Request) (Acquisition, error)
	// Reenter re-enters key for owner, a token another process handed over, only while owner
	// holds it: it adds hold (once, so a re-send does no harm; Release of that name gives it up)
	// and raises the TTL to ttl if lower. It never takes a free key (Acquired false, HolderTTL 0).
	Reenter(ctx context.Context, key, owner, hold string, ttl time.Duration) (Acquisition, error)
	// Refresh makes key live at least ttl more (never less) if owner holds it; else ErrNotHeld.
	Refresh(ctx context.Context, key, owner string, ttl time.Duration) error
	// RefreshAll is Refresh of each lock (its errors in batch's order) in a round trip or a
	// few, so a slow store cannot cap how many locks a process keeps alive.
	RefreshAll(ctx context.Context, batch []Renewal) []error
	// Release gives up owner's hold of key (the own if hold is "", else the re-entry named
	// hold); the last deletes key and notifies waiters, returning how many elsewhere were told.
	// lastFence, the largest fence handed out under the lock (0: none beyond the grant's), is
	// exceeded by later grants. ErrNotHeld, changing nothing, if owner lacks that hold.
	//
	// A Release failing otherwise may still go through, late or by the store's retry, while
	// the store lives, so that owner and hold are sent no more (no Acquire, Reenter or Pass): a
	// grant they were told of could be the one it ends. The Locker takes a new owner per grant
	// and a new name per re-entry.
	Release(ctx context.Context, key, owner, hold string, lastFence int64) (notified int, err error)
	// LeaveQueue takes owner's place in key's line away (a fair waiter gives up) and wakes the
	// next in line if the key is free; no place, nothing done. A failed one may still go
	// through, late or by the store's retry (a ZooKeeper place lives with its session), so its
	// owner is spent as after a failed Release: a fair Acquire with it could keep the place only
	// to lose it, and its turn, to that retry. The Locker takes a new owner after each.
	LeaveQueue(ctx context.Context, key, owner string) error
	// TTL returns the remaining TTL of key; ErrNotHeld when nobody holds it.
	TTL(ctx context.Context, key string) (time.Duration, error)
	// Watch listens for releases of key (it must be closed): those after it returned, and before
	// it unless Watch.Fresh (then a refused caller tries once more before it sleeps).
	Watch(ctx context.Context, key string) (*Watch, error)
}

// AcquireEach serves Permits one key at a time, in order, through acquire (the store's Acquire
// of one key), for a store that cannot look at several in one request.
func AcquireEach(ctx context.Context, req Request, acquire func(context.Context, Request) (Acquisition, error)) (Acquisition, error) {
	var busy Acquisition
	for i, key := range req.Permits {
		one := req
		one.Key, one.Permits = key, nil
		res, err := acquire(ctx, one)
		if err != nil || res.Acquired {
			res.Permit, res.Holder = i, busy.Holder
			return res, err
		}
		if i == 0 || res.HolderTTL < busy.HolderTTL {
			busy.HolderTTL, busy.Holder = res.HolderTTL, res.Holder
		}
	}
	return busy, nil
}

// CheckPermits refuses a permit request that is a read or fair one, or has a key CheckArgs refuses.
func CheckPermits(req Request) error {
	if IsReadOwner(req.Owner) || !req.Asked.IsZero() {
		return errors.New("flightlock: a permit request cannot be a read or a fair one")
	}
	for _, k := range req.Permits {
		if err := CheckArgs(k, req.Owner, req.TTL); err != nil {
			return err
		}
	}
	return nil
}

// PermitGrant is one permit of Acquisition.More: its index in Request.Permits and its fence.
type PermitGrant struct {
	Permit int
	Fence  int64
}

// Renewal is one lock of a RefreshAll call: Refresh's arguments.
type Renewal struct {
	Key, Owner string
	TTL        time.Duration
}

// Passer is a Store that can keep a lock in its holder's process at a turn's end (WithHandoff)
// in one round trip, unless a waiter elsewhere asked meanwhile. It is optional because the store
// must tell that atomically with the turn's end.
type Passer interface {
	// Pass ends a turn of owner's lock on key. If owner's acquisition is its only hold and none
	// was refused meanwhile, it keeps the lock at least ttl more: kept, with a new fence above
	// lastFence and every earlier grant. Else it does Release(key, owner, "", lastFence) and
	// returns its outcome, kept false. ErrNotHeld when owner does not hold key.
	Pass(ctx context.Context, key, owner string, ttl time.Duration, lastFence int64) (kept bool, fence int64, notified int, err error)
}

// ReadOwner returns the owner token of a read hold: token, marked. The mode lives in the owner,
// which names the hold in every later call (Refresh, RefreshAll, Release, a lost reply's
// give-back), so a read hold is never released or refreshed as a write, nor the other way
// round. Store methods given one act on the key's read holds, each a lease (as a write hold
// is) expiring a TTL after its last refresh:
//   - Acquire takes a read hold, shared with the key's others. It is refused (with the holder's
//     TTL) while a write hold holds key and, once a write Acquire was refused for the readers
//     (marking the key), until a writer had its turn (writers are not starved). Its Fence is
//     the last handed out for key's family: at least the write's it follows, below every later
//     write's. Acquiring again with the same owner re-enters (Reentered), as for a write.
//   - Refresh extends that read hold alone; Release (hold "", lastFence 0) ends it, the last
//     one notifying the key's watchers when a writer waits. Reenter grants a read owner nothing.
func ReadOwner(token string) string { return readOwnerMark + token }

// IsReadOwner reports whether owner was made by ReadOwner.
func IsReadOwner(owner string) bool { return strings.HasPrefix(owner, readOwnerMark) }

// readOwnerMark starts a read hold's owner token; flightlock's tokens (base64url) never have it.
const readOwnerMark = "~"

// Watch delivers release notifications of one key. C receives a value after each release
// (coalesced: a waiter only needs to know that it should try again). Close stops it.
type Watch struct {
	c     chan struct{}
	close func()
	fresh bool
}

// Fresh reports a watch begun only now (not a subscribed Redis channel; not etcd, watching from
// the busy reply's revision): it may miss a release since, so the caller looks once more.
func (w *Watch) Fresh() bool { return w != nil && w.fresh }

// NewWatch returns a Watch for Store implementations: c is signalled on each release (never
// closed), and stop is called once by Close.
func NewWatch(c chan struct{}, stop func()) *Watch {
	return &Watch{c: c, close: sync.OnceFunc(stop)}
}

// NewFreshWatch is NewWatch for a watch that starts listening only now (see Watch.Fresh).
func NewFreshWatch(c chan struct{}, stop func()) *Watch {
	return &Watch{c: c, close: sync.OnceFunc(stop), fresh: true}
}

// C returns the channel signalled when the key is released; nil (never delivering) for a nil Watch.
func (w *Watch) C() <-chan struct{} {
	if w == nil {
		return nil
	}
	return w.c
}

// Close stops the watch. It is safe to call more than once, and on a nil Watch.
func (w *Watch) Close() {
	if w != nil && w.close != nil {
		w.close()
	}
}
