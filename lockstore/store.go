// Package lockstore is the contract between the flightlock core and a lock store: Store (with
// what differs between stores as Capabilities data), its optional extension Passer, the
// Inspector tools use, and their shared types. Each store is its own package and owns its value
// format (lockstore/redisstore, lockstore/embedded, etcdstore, zkstore). It imports the
// standard library only.
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

// ErrOutcomeUnknown is wrapped by a store in the error of a request that may have taken effect
// unreported: the connection closed after it went out (ZooKeeper), or the server answered an
// error for a request it may apply all the same (an etcd leader change). As after a request its
// context cut short, the caller gives back what it may have taken, by the same owner, and sends
// nothing more as that owner (a later grant to it could be the one given back).
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
	// Holder is the current holder's Request.Meta when not acquired ("" for none); the go-zero
	// layer compares its trace id to tell a nested call of the same request. With Permits it
	// is also set when acquired, to the metadata of a busy permit passed over, so that holders
	// of another kind (a lock on permit 1, another count) show while permits are still free.
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
	// Asked, when not zero, makes the acquisition fair (granted in request order across
	// processes): it is when the caller's Lock began. Each fair acquirer takes a place in the
	// key's line, only the first in line may take the free key, and a grant leaves the line. A
	// store ranks places by Asked (Redis, clamped to its own clock less a bound on clock skew)
	// or by when the first fair Acquire reached it (etcd revisions, ZooKeeper sequence numbers:
	// no host's clock is trusted; the Locker sends that Acquire as soon as a fair Lock begins).
	Asked time.Time
	// Permits, when not empty, asks instead of Key for the first of several keys (a
	// semaphore's permits), in order, that Acquire of that key alone would grant;
	// Acquisition.Permit says which. A store looks at them all in one request where it can
	// (else AcquireEach), so a re-sent request re-enters what its first try took; the Locker
	// does not rely on that, but gives back every key of a request whose outcome it does not
	// know and asks again as a new owner. Owner is not a ReadOwner and Asked is zero.
	Permits []string
	// Want, with Permits, is how many of them the request may take at once (0 is 1): a process
	// whose goroutines wait for permits of one key asks for them together. A store may grant
	// fewer than Want, but at least one while one is free (Acquisition.More has the others).
	Want int
	// Queue, for a fair acquisition, is how long the caller's place lives without another
	// Acquire from it, so a waiter whose process died leaves the line by itself. 0 takes no
	// place and takes the key only when nobody is in line before the caller (a TryLock). A busy
	// reply has HolderTTL 0 when the key is free but others are first in line.
	Queue time.Duration
}

// Capabilities states what differs between stores, as data the Locker reads once when it is
// made. The zero value is a store without limits that watches each key on its own.
type Capabilities struct {
	Name string // as rules and metrics spell it: "redis", "etcd", "zookeeper"
	// MaxHandoffs bounds the in-process handoffs under one grant (0: no bound): the Locker
	// hands a held lock on with fences grant+1, grant+2, ..., which the store's next grant must
	// exceed even when the holder dies without reporting the last (etcd leaves 2^20 fences per
	// grant, ZooKeeper 2^16). New refuses a WithHandoff above it.
	MaxHandoffs int
	// MaxTTL is the longest lock TTL the store keeps (0: no bound; ZooKeeper: a share of its
	// session timeout). MaxTTLReason ends the error that refuses a longer one, "a lock TTL of
	// 20s is longer than " + MaxTTLReason: what keeps it and what to do.
	MaxTTL       time.Duration
	MaxTTLReason string
	// SharedWatch is true when the Watch calls on a key share one subscription, so many
	// watchers cost about what one does (Redis). Only then does every waiting semaphore taker
	// watch every permit; elsewhere they look again at retry delays.
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

// CheckArgs refuses what makes no lock on any store, although a store might accept it: a key
// CheckKey refuses, an owner that cannot be told apart from what a store writes beside it
// (empty, or with a space), or a TTL that never runs out.
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

// CheckHold refuses a hold name (Reenter, Release) that a store cannot list beside others: empty
// unless ownAllowed (Release's "" names the acquisition's own hold), longer than 64 bytes, or
// with a space or comma.
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

// Store is what flightlock needs from a lock backend, the same for every store (what differs is
// in Capabilities). Implementations are safe for concurrent use. Keys are full backend keys
// (prefix included); owners are opaque tokens without spaces. Package storetest checks an
// implementation against this contract.
type Store interface {
	// Capabilities describes the store; it does not change after the store is made.
	Capabilities() Capabilities
	// Acquire takes req.Key for req.Owner for req.TTL, or re-enters it if the owner holds it
	// (Reentered; the TTL is reset). It is idempotent per owner, so a request re-sent after a
	// timeout does no harm, unless the owner is spent: its Release or LeaveQueue failed, or a
	// request of it failed with ErrOutcomeUnknown or its context's error (the store may still
	// give that back). A ReadOwner takes a read hold, and a non-zero Asked a place in line.
	Acquire(ctx context.Context, req Request) (Acquisition, error)
	// Reenter re-enters key for owner, a token handed over by another process, only while owner
	// holds key: it adds the hold named hold (given up by Release with that name; added once
	// however often named, so a re-sent call does no harm) and raises the TTL to ttl if the
	// lock had less. It never takes a free key: then Acquired is false and HolderTTL 0.
	Reenter(ctx context.Context, key, owner, hold string, ttl time.Duration) (Acquisition, error)
	// Refresh makes key live at least ttl more (never less) if owner holds it; else ErrNotHeld.
	Refresh(ctx context.Context, key, owner string, ttl time.Duration) error
	// RefreshAll refreshes each lock of batch as Refresh would, returning Refresh's errors in
	// batch's order, in one round trip or a few, so a slow store cannot cap how many locks a
	// process keeps alive.
	RefreshAll(ctx context.Context, batch []Renewal) []error
	// Release gives up one hold of key if owner holds it: the acquisition's own when hold is
	// "", else the re-entry named hold. The last hold deletes key and notifies waiters; the
	// count of waiters told elsewhere is returned. lastFence is the largest fence the caller
	// handed out under the lock (0 if none beyond the grant's): later grants exceed it.
	// ErrNotHeld, with nothing changed, when owner does not hold key or that hold is gone.
	//
	// A Release that fails otherwise may still go through, late or by the store's own retry,
	// while the store lives. So the caller sends that owner and hold no more (no Acquire,
	// Reenter or Pass): a grant it was told of could be the one the release ends. The Locker
	// takes a new owner for every grant and names every re-entry anew.
	Release(ctx context.Context, key, owner, hold string, lastFence int64) (notified int, err error)
	// LeaveQueue takes owner's place in key's line away (a fair waiter that gives up), and
	// wakes the next in line when the key is free. Leaving a line one is not in does nothing.
	// A failed LeaveQueue may still go through, late or by the store's own retry (a place
	// lives as long as a ZooKeeper session), so its owner is spent as after a failed Release:
	// a fair Acquire with it could keep the place only to lose it, and its turn, to that
	// retry. The Locker takes a new owner after every LeaveQueue.
	LeaveQueue(ctx context.Context, key, owner string) error
	// TTL returns the remaining TTL of key; ErrNotHeld when nobody holds it.
	TTL(ctx context.Context, key string) (time.Duration, error)
	// Watch starts listening for releases of key; the Watch must be closed. A release after
	// Watch returned is heard, and one before it too unless Watch.Fresh: a refused caller that
	// tries once more after a fresh Watch, before it sleeps, misses no release.
	Watch(ctx context.Context, key string) (*Watch, error)
}

// AcquireEach serves a request with Permits one key at a time through acquire (the store's
// Acquire of one key), in order, for a store that cannot look at several keys in one request.
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

// CheckPermits refuses a request with Permits that is a read or a fair one, or one of whose
// keys CheckArgs refuses with its owner and TTL.
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

// Passer is a Store that can keep a lock in its holder's process at the end of a turn (the
// WithHandoff bound) in one round trip instead of a release and a new acquisition, releasing
// only when a waiter elsewhere asked for the key meanwhile. It is optional because the store
// must tell that atomically with the end of the turn.
type Passer interface {
	// Pass ends a turn of owner's lock on key. When owner's acquisition is the lock's only
	// hold and no acquirer was refused while it was held, it keeps the lock for owner, living
	// at least ttl more, and returns kept true and a new fence, larger than lastFence and than
	// every earlier grant of key. Otherwise it does what Release(key, owner, "", lastFence)
	// does and returns its outcome (kept false). ErrNotHeld when owner does not hold key.
	Pass(ctx context.Context, key, owner string, ttl time.Duration, lastFence int64) (kept bool, fence int64, notified int, err error)
}

// ReadOwner returns the owner token of a read hold: token, marked. The mode lives in the owner
// because the owner names the hold in every later call (Refresh, RefreshAll, Release, a
// give-back of a lost reply), so a read hold is never released or refreshed as a write, nor
// the other way round. Store methods given such an owner act on the key's read holds:
//   - Acquire takes a read hold, shared with the key's other read holds. It is refused (with
//     the holder's TTL) while a write hold holds key, and, once a write Acquire was refused
//     for the read holds (it marks the key), until a writer had its turn (writer preference:
//     readers cannot starve a writer). Its Fence is the last fence the store handed out for
//     key's family: at least that of the write it follows and below that of every later
//     write. Acquiring again with the same owner re-enters (Reentered), as for a write.
//   - Refresh extends that read hold alone; Release (hold "", lastFence 0) ends it, and the end
//     of the last read hold notifies the key's watchers when a writer waits.
//   - Reenter never grants a read owner anything: read holds are not handed over.
//
// Every hold, read or write, has its own lease, expiring a TTL after its last refresh.
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

// Fresh reports whether the watch began to listen only now, so that a release between the
// caller's last look (a busy reply) and Watch may have gone unheard and a refused caller looks
// once more before it sleeps. False for a Redis channel subscribed already and for etcd, which
// watches from the revision of its last busy reply.
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
