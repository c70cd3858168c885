package flightlock

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightlock/flightlock/internal/handover"
)

type leaseKey struct{}

// leaseContext is a lease's context: the Lease itself, seen through a type of its own so that
// Lease does not carry a context's methods in its API (no allocation and no field: issue 17,
// live heap per held lock). Its cancellation comes from the lease's ctx, and it answers the
// lease key itself, so a lease needs no extra context.WithValue. The leases of a context chain
// are linked by Lease.outer, innermost first. Only Lease.Context
// hands one out, once the lease's ctx is made and no longer changes.
type leaseContext Lease

func (c *leaseContext) Deadline() (time.Time, bool) { return c.ctx.Deadline() }
func (c *leaseContext) Done() <-chan struct{}       { return c.ctx.Done() }
func (c *leaseContext) Err() error                  { return c.ctx.Err() }

func (c *leaseContext) Value(key any) any {
	if key == (leaseKey{}) {
		return (*Lease)(c)
	}
	return c.ctx.Value(key)
}

// String names the context without printing the lease's fields (which its locks guard).
func (c *leaseContext) String() string { return "flightlock.Lease(" + c.h.key + ").Context" }

// FromContext returns the innermost lease held by ctx (a lease's Context, or a context derived
// from it), or nil.
func FromContext(ctx context.Context) *Lease {
	lease, _ := ctx.Value(leaseKey{}).(*Lease)
	return lease
}

// AllFromContext returns every lease that ctx holds and that is not released yet, innermost
// first, for propagation to a downstream service.
func AllFromContext(ctx context.Context) []*Lease {
	var out []*Lease
	for x := FromContext(ctx); x != nil; x = x.outer() {
		if x.active() {
			out = append(out, x)
		}
	}
	return out
}

// findLease returns the live lease of key taken through gate g in ctx, if any.
func findLease(ctx context.Context, g *gate, key string) *Lease {
	for x := FromContext(ctx); x != nil; x = x.outer() {
		if x.h.k.gate == g && x.h.key == key && x.active() {
			return x
		}
	}
	return nil
}

func init() {
	handover.Enter = enterForCall
	handover.EnterStream = enterForStream
}

// enterForCall is handover.Enter: before a unary call that hands the locks of ctx to another
// service, the calling goroutine re-enters each of them (the innermost live lease of each key)
// through its re-entry slot, as a Lock of the key by this goroutine would. The downstream
// handlers that re-enter through the handed owners are then inside one at a time per lease,
// as in-process re-entries are (DESIGN: re-entries of one hold exclude each other); before
// this, two goroutines of a holder that called a method locking the same key ran both
// downstream handlers at once (review 4: TestHandedOwnerReentriesExclude). Nested chains keep
// working: a downstream handler's own calls re-enter its borrowed or joined lease, whose slot
// is another one. A call through a re-entry the goroutine made itself takes that re-entry's
// slot (enterOwnSlot), so it excludes the goroutines it started that re-enter it.
//
// A call waits for a slot only while its goroutine is inside none: not through any re-entry
// (slotsHeld counts them per goroutine, whatever context the call is given), nor through a
// slot this call took already. Otherwise a busy slot's key is
// not handed over (the downstream service cannot re-enter it: it waits for the key, or answers
// that it is locked), because waiting while holding a slot can deadlock with a goroutine that
// holds that slot and waits for ours (review of d01fe15:
// TestReviewCallsFromReentriesOfTwoKeysDoNotDeadlock). Slots are taken in key order, so two
// calls that wait cannot each hold one the other needs.
func enterForCall(ctx context.Context) (owners []handover.Owner, withheld []string, release func(), err error) {
	return enterHeld(ctx, false)
}

// streamIDs names the slot entries of streams (enterForStream): negative, so never a
// goroutine's id.
var streamIDs atomic.Int64

// enterForStream is handover.EnterStream: enterForCall for a stream, which outlives the call
// that opens it, so it cannot hold its slots as its goroutine: each stream takes them under an
// id of its own, and its goroutine is counted inside a slot until release, so that the
// goroutine never waits for a slot that its own open stream holds (its later calls and streams
// withhold the key instead). The release is the caller's to call once the stream is over.
func enterForStream(ctx context.Context) (owners []handover.Owner, withheld []string, release func(), err error) {
	return enterHeld(ctx, true)
}

func enterHeld(ctx context.Context, stream bool) (owners []handover.Owner, withheld []string, release func(), err error) {
	var leases []*Lease
	for _, x := range AllFromContext(ctx) { // innermost first: the first lease of a key is kept
		if !slices.ContainsFunc(leases, func(y *Lease) bool { return y.h.key == x.h.key }) {
			leases = append(leases, x)
		}
	}
	if len(leases) == 0 {
		return nil, nil, func() {}, nil
	}
	g := goid()
	id, opener := g, int64(0) // the slot entry's owner: the goroutine, or a stream it opens
	if stream {
		id, opener = -streamIDs.Add(1), g
	}
	// g is inside a slot: of any lease, whatever context it passes (slotsHeld), or through a
	// re-entry of its own in ctx (re is set when a re-entry is made, then fixed).
	holding := insideSlot(g)
	for _, x := range leases {
		if x.kind == GrantReentry && x.re.g == g {
			holding = true
		}
	}
	slices.SortFunc(leases, func(a, b *Lease) int { return strings.Compare(a.h.key, b.h.key) })
	b := budget{parent: ctx} // no deadline of its own: the call's context bounds the wait
	taken := make([]*Lease, 0, len(leases))
	releaseAll := func() {
		for i := len(taken) - 1; i >= 0; i-- {
			_ = taken[i].Release(context.Background())
		}
	}
	owners = make([]handover.Owner, 0, len(leases))
	for _, x := range leases {
		var (
			inSlot bool
			err    error
		)
		if x.kind == GrantReentry && x.re.g == g {
			// g's own re-entry: the call takes x's slot, which goroutines g started take to
			// re-enter x, and leaves x's key out when one of them is inside (no waiting: g is
			// inside its parent's slot).
			var ok bool
			if ok, err = x.enterOwnSlot(id, opener); err == nil && !ok {
				withheld = append(withheld, x.h.key)
				continue
			}
			inSlot = ok
		} else {
			inSlot, err = x.enterReentryAs(id, opener, !holding, &b)
		}
		if errors.Is(err, errGrantEnded) {
			continue // released meanwhile: its lock may be the next request's, not handed over
		}
		if err != nil {
			if ctx.Err() == nil && holding {
				withheld = append(withheld, x.h.key) // busy, and g may not wait: not handed over
				continue
			}
			releaseAll()
			if cerr := ctx.Err(); cerr != nil {
				return nil, nil, nil, cerr
			}
			return nil, nil, nil, err
		}
		r := newLease(ctx, x.h, GrantReentry, x.fence)
		if r.re == nil { // ctx carries x, so newLease made re for its outer lease
			r.re = &reentry{}
		}
		r.re.parent, r.re.g, r.inSlot = x, id, inSlot
		taken = append(taken, r)
		holding = holding || inSlot
		if owner, fence, ok := r.handover(); ok {
			owners = append(owners, handover.Owner{Key: r.h.key, Token: owner, Fence: fence})
		}
	}
	if stream && len(taken) > 0 {
		noteSlot(g, 1) // the opener is inside while its stream is (see enterForStream)
		inner := releaseAll
		releaseAll = func() {
			inner()
			noteSlot(g, -1)
		}
	}
	var once sync.Once
	return owners, withheld, func() { once.Do(releaseAll) }, nil
}

// withOwner is what the zrpc server interceptor does for a handed-over owner, for tests.
func withOwner(ctx context.Context, key, owner string) context.Context {
	return handover.With(ctx, handover.Owner{Key: key, Token: owner})
}
