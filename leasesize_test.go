package flightlock

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"
)

// swapCtx is a context whose values change over time, as pooled framework contexts do (gin's
// Context with ContextWithFallback reads c.Request.Context(), and gin reuses a Context for the
// next request once the handler returned).
type swapCtx struct {
	mu    sync.Mutex
	inner context.Context
}

func (s *swapCtx) get() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inner
}
func (s *swapCtx) set(c context.Context) {
	s.mu.Lock()
	s.inner = c
	s.mu.Unlock()
}
func (s *swapCtx) Deadline() (time.Time, bool) { return s.get().Deadline() }
func (s *swapCtx) Done() <-chan struct{}       { return s.get().Done() }
func (s *swapCtx) Err() error                  { return s.get().Err() }
func (s *swapCtx) Value(k any) any             { return s.get().Value(k) }

// The outer lease of a lease is the one its parent context held when Lock was called, not
// whatever the parent context holds when the chain is walked: after a pooled context moved on
// to a request that holds B, work left over from the first request must wait for B, not
// re-enter the other request's lease (review of 79205c8, which looked the outer lease up again
// on every walk: two holders inside B, the re-entry with B's fence).
func TestOuterLeaseIsTheOneHeldAtLock(t *testing.T) {
	bg := context.Background()
	l := mustLocker(t, newMemStore())
	sc := &swapCtx{inner: bg}
	a, err := l.Lock(sc, "swap:A") // request 1, in the pooled context
	if err != nil {
		t.Fatal(err)
	}
	leftover := context.WithoutCancel(a.Context()) // request 1's background work
	_ = a.Release(bg)
	b, err := l.Lock(bg, "swap:B") // request 2
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(bg)
	sc.set(b.Context()) // the pooled context serves request 2 now

	ctx, cancel := context.WithTimeout(leftover, 100*time.Millisecond)
	defer cancel()
	if x, err := l.Lock(ctx, "swap:B"); err == nil {
		defer x.Release(bg)
		t.Fatalf("request 1's work got B while request 2 holds it: grant %v, fence %d (B's %d)", x.Grant(), x.Fence(), b.Fence())
	}
}

// The gate counts a run of handoffs in 16 bits: a larger WithHandoff bound counts as 65,535, so
// the count can never wrap around and hand a hot key on forever (which would also break the
// fence argument that bounds a run below the TTL's microseconds).
func TestHandoffRunIsBoundedBy16Bits(t *testing.T) {
	l := mustLocker(t, newMemStore(), WithHandoff(1<<30, time.Second), WithTTL(time.Hour))
	if l.k.handoff != maxHandoffRun {
		t.Fatalf("handoff bound %d, want %d (the gate's 16-bit count)", l.k.handoff, maxHandoffRun)
	}
	l = mustLocker(t, newMemStore(), WithHandoff(100, time.Second), WithTTL(time.Hour))
	if l.k.handoff != 100 {
		t.Fatalf("handoff bound %d, want the 100 asked for", l.k.handoff)
	}
}

// A lease finds the lease of the context it was locked in through that context (Lease.outer),
// before and after its own context is made, and AllFromContext lists the chain innermost first.
func TestOuterLeaseThroughTheParentContext(t *testing.T) {
	ctx := context.Background()
	l := mustLocker(t, newMemStore())
	a, err := l.Lock(ctx, "outer:a")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	b, err := l.Lock(a.Context(), "outer:b")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	if got := b.outer; got != a {
		t.Fatalf("before b's context is made: outer %p, want a %p", got, a)
	}
	all := AllFromContext(b.Context())
	if len(all) != 2 || all[0] != b || all[1] != a {
		t.Fatalf("AllFromContext = %v, want [b a]", all)
	}
	if got := b.outer; got != a {
		t.Fatalf("after b's context is made: outer %p, want a %p", got, a)
	}
	if a.outer != nil {
		t.Fatal("a was locked in a context without a lease, yet has an outer lease")
	}
}

// A lease's context prints its key, not the lease's fields (which its locks guard): printing it
// while the lease is released from another goroutine is no data race (go test -race).
func TestLeaseContextPrintsItsKey(t *testing.T) {
	ctx := context.Background()
	l := mustLocker(t, newMemStore())
	x, err := l.Lock(ctx, "print:me")
	if err != nil {
		t.Fatal(err)
	}
	lctx := x.Context()
	var wg sync.WaitGroup
	wg.Go(func() { _ = x.Release(ctx) })
	s := fmt.Sprint(lctx)
	wg.Wait()
	if !strings.Contains(s, "print:me") {
		t.Fatalf("the lease's context prints as %q, want its key", s)
	}
	if FromContext(lctx) != x || lctx.Err() == nil {
		t.Fatalf("released lease's context: lease %p (want %p), err %v (want cancelled)", FromContext(lctx), x, lctx.Err())
	}
}

// A hold keeps its owner token whatever its length: a token minted here lives in the hold
// itself, one handed over by another process (any length) and a borrowed hold's name apart.
func TestHoldKeepsOwnerTokensOfAnyLength(t *testing.T) {
	l := mustLocker(t, newMemStore())
	minted := newOwnerToken()
	for _, tc := range []struct{ owner, borrow string }{
		{minted, ""},
		{"short", ""},
		{strings.Repeat("o", 64), ""},
		{minted, "borrowname000000"},
	} {
		h := newHold(l.k, "owner:key", tc.owner, 1, tc.borrow, time.Now(), 0)
		if h.owner() != tc.owner || h.borrowName() != tc.borrow || h.borrowed() != (tc.borrow != "") {
			t.Errorf("hold of owner %q, borrow %q: owner %q, borrow %q, borrowed %v", tc.owner, tc.borrow, h.owner(), h.borrowName(), h.borrowed())
		}
		if tc.borrow == "" && len(tc.owner) == ownerTokenLen && h.ext.Load() != nil {
			t.Errorf("a minted token took a separate allocation (ext)")
		}
		h.stop()
	}
}

// The objects a held lock keeps stay in their size classes:
// a field added to one of them moves it to the next class for every held lock, which
// TestReleasingEverythingReturnsToBaseline sees only once the total crosses its bound.
func TestHeldLockObjectSizes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		size, max uintptr
	}{
		{"hold", unsafe.Sizeof(hold{}), 128},
		{"Lease", unsafe.Sizeof(Lease{}), 64},
		{"gateEntry", unsafe.Sizeof(gateEntry{}), 24},
	} {
		if tc.size > tc.max {
			t.Errorf("%s is %d bytes, at most %d wanted", tc.name, tc.size, tc.max)
		}
	}
}
