// Package storetest is the conformance suite of the lockstore contract: one Run that every
// store package calls from its tests against its real server, with two or more stores on one
// server standing for processes of their own, so that a guarantee is proved once for every
// store. docs/stores.md ("Adding a store") lists what it proves; the subtests of Run name it.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/testenv/poll"
	"github.com/flightlock/flightlock/lockstore"
	"golang.org/x/sync/errgroup"
)

// Config describes the store under test.
type Config struct {
	// Open returns a new store on the server under test, as another process would have it,
	// closed when t ends.
	Open func(t testing.TB) lockstore.Store
	// TTL is the lock TTL the suite uses (default 2s); the store must keep locks of this TTL.
	TTL time.Duration
	// Sessions is true for a store whose locks live as long as their holder's session
	// (ZooKeeper): its busy replies may carry HolderTTL 0, its TTL is the longest a lock
	// outlives its holder, and a lock runs out when its holder's session ends.
	Sessions bool
	// Faulty, when set, returns a new store whose only path to the server is a fault proxy,
	// and the faults the test can put on that path, for the check that calls return by their
	// deadline through them. Nil skips that part.
	Faulty func(t testing.TB) (store lockstore.Store, faults []Fault)
	// Severable, when set, returns a new store whose only path to the server is link, for the
	// check that a request whose reply is lost with its connection leaves nothing held. It
	// needs a store that describes itself (lockstore.Describer), whose inspector sees the
	// request land. Nil skips that part.
	Severable func(t testing.TB) (store lockstore.Store, link Link)
}

// Link is the fault proxy on a Severable store's path.
type Link interface {
	SetDelay(d time.Duration) // holds back each reply for d (0: none)
	Cut() int                 // closes every open connection, dropping the bytes in flight
}

// Fault is one fault on the path of Config.Faulty's store.
type Fault struct {
	Name        string
	Start, Heal func()
	// Passable: a call may get through between the fault's strikes, so it need not fail.
	Passable bool
}

// Run runs the conformance suite against the store c describes.
func Run(t *testing.T, c Config) {
	if c.TTL <= 0 {
		c.TTL = 2 * time.Second
	}
	s := suite{Config: c}
	t.Run("ExclusionReentryAndWatch", s.exclusionReentryAndWatch)
	t.Run("RefreshAndReleaseAreOwnerChecked", s.refreshAndReleaseAreOwnerChecked)
	t.Run("TTLRunsOutUnlessRefreshed", s.ttlRunsOutUnlessRefreshed)
	t.Run("FencesGrowAboveTheLastFence", s.fencesGrowAboveTheLastFence)
	t.Run("HandedOverOwnerHoldsAreCounted", s.handedOverOwnerHoldsAreCounted)
	t.Run("BadArgumentsAreRefusedAndChangeNothing", s.badArgumentsAreRefusedAndChangeNothing)
	t.Run("PermitsNeverExceedTheirCount", s.permitsNeverExceedTheirCount)
	t.Run("SpentWaitIsBusy", s.spentWaitIsBusy)
	t.Run("PermitRequestTakesTheFirstFreeKey", s.permitRequestTakesTheFirstFreeKey)
	t.Run("PermitRequestTakesUpToWant", s.permitRequestTakesUpToWant)
	t.Run("PermitLookIsOneRequest", s.permitLookIsOneRequest)
	t.Run("ReadersShareAndWritersExclude", s.readersShareAndWritersExclude)
	t.Run("ReadersOfAProcessShareAndTakeTurns", s.readersOfAProcessShareAndTakeTurns)
	t.Run("RefusedWriterIsNotToldALeftReaderHolds", s.refusedWriterIsNotToldALeftReaderHolds)
	t.Run("FairLocksGrantInRequestOrder", s.fairLocksGrantInRequestOrder)
	t.Run("CallsReturnByTheirDeadlineThroughFaults", s.callsReturnByTheirDeadlineThroughFaults)
	t.Run("LostReplyLeavesNothingHeld", s.lostReplyLeavesNothingHeld)
}

type suite struct{ Config }

// Owner tokens without spaces, as the Locker mints them; each starts with "storetest-owner-".
const (
	ownerA = "storetest-owner-aaaaaaaaaaaaaaaa"
	ownerB = "storetest-owner-bbbbbbbbbbbbbbbb"
	ownerC = "storetest-owner-cccccccccccccccc"
)

var keySeq atomic.Int64

// key returns a key no other test of this run uses.
func key(t *testing.T) string {
	name := strings.NewReplacer("/", ":", " ", "_").Replace(t.Name())
	return fmt.Sprintf("lock:storetest:%s:%d:%d", name, time.Now().UnixNano(), keySeq.Add(1))
}

func ctxOf(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// acquire takes k for owner, failing the test unless it is granted with a fence above above.
func (s suite) acquire(t *testing.T, ctx context.Context, st lockstore.Store, k, owner, meta string, above int64) lockstore.Acquisition {
	t.Helper()
	got, err := st.Acquire(ctx, lockstore.Request{Key: k, Owner: owner, TTL: s.TTL, Meta: meta})
	if err != nil || !got.Acquired || got.Fence <= above {
		t.Fatalf("Acquire(%q, %q) = %+v, %v; want acquired with a fence above %d", k, owner, got, err, above)
	}
	return got
}

// wantErr asserts that err, what returned, is want (nil: no error).
func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: %v, want %v", what, err, want)
	}
}

// errOf returns a call's error without its value.
func errOf[T any](_ T, err error) error { return err }

// must fails the test when err is not nil.
func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// mustLock locks k with l, failing the test when it cannot.
func mustLock(t *testing.T, ctx context.Context, l *flightlock.Locker, k string) *flightlock.Lease {
	t.Helper()
	lease, err := l.Lock(ctx, k)
	wantErr(t, fmt.Sprintf("Lock(%q)", k), err, nil)
	return lease
}

// busy asserts that req is refused with the metadata of one of holders and a TTL within the
// holder's (none on a store of sessions), never an owner's token.
func (s suite) busy(t *testing.T, ctx context.Context, st lockstore.Store, req lockstore.Request, holders ...string) {
	t.Helper()
	got, err := st.Acquire(ctx, req)
	if err != nil || got.Acquired || got.Reentered || got.Fence != 0 {
		t.Fatalf("Acquire(%+v) of a key another owner holds = %+v, %v; want a busy reply", req, got, err)
	}
	if (got.HolderTTL <= 0 && !(s.Sessions && got.HolderTTL == 0)) || got.HolderTTL > s.TTL+2*time.Second {
		t.Fatalf("busy reply's HolderTTL %v, want within (0, %v] and a store's margin", got.HolderTTL, s.TTL)
	}
	if !slices.Contains(holders, got.Holder) {
		t.Fatalf("busy reply's Holder %q, want a holder's metadata %q", got.Holder, holders)
	}
	if strings.Contains(got.Holder, "storetest-owner-") {
		t.Fatal("an owner token left the store in a busy reply")
	}
}

// req is a plain request for k by owner with the suite's TTL.
func (s suite) req(k, owner string) lockstore.Request {
	return lockstore.Request{Key: k, Owner: owner, TTL: s.TTL}
}

// A held key refuses every other owner with a busy reply and re-enters its owner, through any
// store, with the same fence; a re-entry is no second hold: the owner's one release frees the
// key, a refused owner's watch hears it, and the next holder's fence is above.
func (s suite) exclusionReentryAndWatch(t *testing.T) {
	ctx, k := ctxOf(t), key(t)
	a, b := s.Open(t), s.Open(t)
	first := s.acquire(t, ctx, a, k, ownerA, "host=a pid=1", 0)
	for range 2 {
		s.busy(t, ctx, b, s.req(k, ownerB), "host=a pid=1")
	}
	// A token that is a prefix of the holder's is another owner.
	s.busy(t, ctx, b, s.req(k, ownerA[:10]), "host=a pid=1")
	for _, st := range []lockstore.Store{a, b} {
		again, err := st.Acquire(ctx, s.req(k, ownerA))
		if err != nil || !again.Acquired || !again.Reentered || again.Fence != first.Fence {
			t.Fatalf("re-entry = %+v, %v; want reentered with fence %d", again, err, first.Fence)
		}
	}
	w, err := b.Watch(ctx, k)
	must(t, err)
	defer w.Close()
	must(t, errOf(a.Release(ctx, k, ownerA, "", 0)))
	select {
	case <-w.C():
	case <-time.After(s.TTL):
		t.Fatal("the watch heard no release within a TTL")
	}
	s.acquire(t, ctx, b, k, ownerB, "", first.Fence)
	must(t, errOf(b.Release(ctx, k, ownerB, "", 0)))
}

func (s suite) refreshAndReleaseAreOwnerChecked(t *testing.T) {
	ctx, k := ctxOf(t), key(t)
	a, b := s.Open(t), s.Open(t)
	s.acquire(t, ctx, a, k, ownerA, "meta", 0)
	wantErr(t, "Refresh by another owner", b.Refresh(ctx, k, ownerB, s.TTL), lockstore.ErrNotHeld)
	wantErr(t, "Release by another owner", errOf(b.Release(ctx, k, ownerB, "", 0)), lockstore.ErrNotHeld)
	s.busy(t, ctx, b, s.req(k, ownerB), "meta") // still the holder's
	wantErr(t, "Refresh by the holder", a.Refresh(ctx, k, ownerA, s.TTL), nil)
	must(t, errOf(a.Release(ctx, k, ownerA, "", 0)))
	wantErr(t, "a second Release of one hold", errOf(a.Release(ctx, k, ownerA, "", 0)), lockstore.ErrNotHeld)
	wantErr(t, "Refresh after the release", a.Refresh(ctx, k, ownerA, s.TTL), lockstore.ErrNotHeld)
	// A stale release never frees the next owner's lock.
	s.acquire(t, ctx, b, k, ownerB, "next", 0)
	wantErr(t, "the previous owner's stale release", errOf(a.Release(ctx, k, ownerA, "", 0)), lockstore.ErrNotHeld)
	s.busy(t, ctx, a, s.req(k, ownerC), "next")
	must(t, errOf(b.Release(ctx, k, ownerB, "", 0)))
}

// A free key has no TTL and a held one the lock's; a lock nobody refreshes runs out.
func (s suite) ttlRunsOutUnlessRefreshed(t *testing.T) {
	ctx, k := ctxOf(t), key(t)
	a, b := s.Open(t), s.Open(t)
	wantErr(t, "TTL of a free key", errOf(a.TTL(ctx, k)), lockstore.ErrNotHeld)
	first := s.acquire(t, ctx, a, k, ownerA, "", 0)
	ttl, err := a.TTL(ctx, k)
	bound := s.TTL + 2*time.Second
	if s.Sessions {
		bound = 30 * time.Second // the longest a lock outlives its holder's session
	}
	if err != nil || ttl <= 0 || ttl > bound {
		t.Fatalf("TTL of a held key: %v, %v; want within (0, %v] and a store's margin", ttl, err, s.TTL)
	}
	// A refresh never shortens a lock: one with half the TTL leaves it held past that.
	must(t, a.Refresh(ctx, k, ownerA, s.TTL/2))
	time.Sleep(s.TTL/2 + s.TTL/5)
	s.busy(t, ctx, b, s.req(k, ownerB), "")
	if s.Sessions {
		// The holder's process ends: its session, and the lock with it.
		must(t, a.(interface{ Close() error }).Close())
	}
	// Nobody refreshes it: it runs out, and the next holder's fence is above.
	var next lockstore.Acquisition
	poll.Until(t, 3*s.TTL+5*time.Second, s.TTL/20, fmt.Sprintf("a lock nobody refreshed, of TTL %v, to run out", s.TTL), func() bool {
		next, err = b.Acquire(ctx, s.req(k, ownerB))
		return err == nil && next.Acquired
	})
	if next.Fence <= first.Fence {
		t.Fatalf("fence %d after the lock ran out, not above %d", next.Fence, first.Fence)
	}
	if err := a.Refresh(ctx, k, ownerA, s.TTL); !s.Sessions {
		wantErr(t, "Refresh of a lock that ran out and was taken", err, lockstore.ErrNotHeld)
	}
	must(t, errOf(b.Release(ctx, k, ownerB, "", 0)))
	wantErr(t, "TTL of a released key", errOf(b.TTL(ctx, k)), lockstore.ErrNotHeld)
}

func (s suite) fencesGrowAboveTheLastFence(t *testing.T) {
	ctx, k := ctxOf(t), key(t)
	a, b := s.Open(t), s.Open(t)
	var last int64
	for i := range 6 {
		st, owner := a, ownerA
		if i%2 == 1 {
			st, owner = b, ownerB
		}
		// The holder handed out a few fences of its own under the grant: the next is above.
		last = s.acquire(t, ctx, st, k, owner, "", last).Fence + 3
		must(t, errOf(st.Release(ctx, k, owner, "", last)))
	}
}

func (s suite) handedOverOwnerHoldsAreCounted(t *testing.T) {
	ctx, k := ctxOf(t), key(t)
	a, b, c := s.Open(t), s.Open(t), s.Open(t)
	// A handed-over owner never takes a free key.
	if got, err := b.Reenter(ctx, k, ownerA, "hold-1", s.TTL); err != nil || got.Acquired || got.HolderTTL != 0 {
		t.Fatalf("Reenter of a free key = %+v, %v; want not acquired, HolderTTL 0", got, err)
	}
	wantErr(t, "TTL after a Reenter of a free key", errOf(c.TTL(ctx, k)), lockstore.ErrNotHeld)
	first := s.acquire(t, ctx, a, k, ownerA, "", 0)
	for range 2 { // naming a hold twice adds it once
		got, err := b.Reenter(ctx, k, ownerA, "hold-1", s.TTL)
		if err != nil || !got.Acquired || got.Fence != first.Fence {
			t.Fatalf("Reenter by the holder's token = %+v, %v; want acquired with fence %d", got, err, first.Fence)
		}
	}
	// Another owner's token re-enters nothing.
	if got, err := b.Reenter(ctx, k, ownerB, "hold-2", s.TTL); err != nil || got.Acquired {
		t.Fatalf("Reenter by another owner's token = %+v, %v; want refused", got, err)
	}
	// The acquisition's own hold ends; the named hold keeps the lock.
	must(t, errOf(a.Release(ctx, k, ownerA, "", 0)))
	s.busy(t, ctx, c, s.req(k, ownerC), "")
	must(t, errOf(b.Release(ctx, k, ownerA, "hold-1", 0)))
	wantErr(t, "a second release of a named hold", errOf(b.Release(ctx, k, ownerA, "hold-1", 0)), lockstore.ErrNotHeld)
	s.acquire(t, ctx, c, k, ownerC, "", first.Fence)
	must(t, errOf(c.Release(ctx, k, ownerC, "", 0)))
}

// A call with a bad argument (lockstore.CheckArgs, CheckHold, CheckPermits) is refused with an
// error of its own, neither a success nor ErrNotHeld, which would say that the lock is not
// held, and it changes nothing: made with the holder's key and token, through the holder's
// store and another, none ends, shortens, re-enters, hands over or passes the holder's lock.
func (s suite) badArgumentsAreRefusedAndChangeNothing(t *testing.T) {
	ctx, k := ctxOf(t), key(t)
	a, b := s.Open(t), s.Open(t)
	held := s.acquire(t, ctx, a, k, ownerA, "holder", 0)
	type args struct {
		key, owner, hold string
		ttl              time.Duration
		permit           string    // a permit request's second key
		asked            time.Time // of a permit request
	}
	calls := map[string]func(st lockstore.Store, x args) error{
		"Acquire": func(st lockstore.Store, x args) error {
			return errOf(st.Acquire(ctx, lockstore.Request{Key: x.key, Owner: x.owner, TTL: x.ttl}))
		},
		"Acquire of permits": func(st lockstore.Store, x args) error {
			req := lockstore.Request{Key: x.key, Permits: []string{x.key, x.permit}, Owner: x.owner, TTL: x.ttl, Asked: x.asked}
			return errOf(st.Acquire(ctx, req))
		},
		"Refresh": func(st lockstore.Store, x args) error { return st.Refresh(ctx, x.key, x.owner, x.ttl) },
		"RefreshAll": func(st lockstore.Store, x args) error {
			return st.RefreshAll(ctx, []lockstore.Renewal{{Key: x.key, Owner: x.owner, TTL: x.ttl}})[0]
		},
		"Release": func(st lockstore.Store, x args) error { return errOf(st.Release(ctx, x.key, x.owner, x.hold, 0)) },
		"Reenter": func(st lockstore.Store, x args) error { return errOf(st.Reenter(ctx, x.key, x.owner, x.hold, x.ttl)) },
		"Pass": func(st lockstore.Store, x args) error {
			_, _, _, err := st.(lockstore.Passer).Pass(ctx, x.key, x.owner, x.ttl, 0)
			return err
		},
		"LeaveQueue": func(st lockstore.Store, x args) error { return st.LeaveQueue(ctx, x.key, x.owner) },
		"TTL":        func(st lockstore.Store, x args) error { return errOf(st.TTL(ctx, x.key)) },
		"Watch": func(st lockstore.Store, x args) error {
			w, err := st.Watch(ctx, x.key)
			w.Close()
			return err
		},
	}
	owned := []string{"Acquire", "Acquire of permits", "Refresh", "RefreshAll", "Release", "Reenter", "Pass", "LeaveQueue"}
	all := append(slices.Clone(owned), "TTL", "Watch")
	timed := slices.DeleteFunc(slices.Clone(owned), func(m string) bool { return m == "Release" || m == "LeaveQueue" })
	holds, permits := []string{"Release", "Reenter"}, []string{"Acquire of permits"}
	for _, c := range []struct {
		what    string
		bad     func(x *args)
		methods []string
	}{
		{"an empty key", func(x *args) { x.key = "" }, all},
		{"a key over MaxKeyLen", func(x *args) { x.key = strings.Repeat("k", lockstore.MaxKeyLen+1) }, all},
		{"an empty owner", func(x *args) { x.owner = "" }, owned},
		{"an owner with a space", func(x *args) { x.owner = ownerA + " x" }, owned},
		{"a zero TTL", func(x *args) { x.ttl = 0 }, timed},
		{"a negative TTL", func(x *args) { x.ttl = -s.TTL }, timed},
		{"an empty hold", func(x *args) { x.hold = "" }, []string{"Reenter"}},
		{"a hold with a space", func(x *args) { x.hold = "hold 1" }, holds},
		{"a hold with a comma", func(x *args) { x.hold = "hold,1" }, holds},
		{"a hold over 64 bytes", func(x *args) { x.hold = strings.Repeat("h", 65) }, holds},
		{"a read owner", func(x *args) { x.owner = lockstore.ReadOwner(ownerA) }, permits},
		{"a place in a fair line", func(x *args) { x.asked = time.Now() }, permits},
		{"an empty second permit key", func(x *args) { x.permit = "" }, permits},
	} {
		x := args{key: k, owner: ownerA, hold: "hold-1", ttl: s.TTL, permit: k + ":2"} // the holder's own, and a free second permit
		c.bad(&x)
		for _, m := range c.methods {
			for through, st := range map[string]lockstore.Store{"the holder's store": a, "another store": b} {
				if _, ok := st.(lockstore.Passer); m == "Pass" && !ok {
					continue
				}
				if err := calls[m](st, x); err == nil || errors.Is(err, lockstore.ErrNotHeld) {
					t.Errorf("%s with %s, through %s: %v, want the argument refused", m, c.what, through, err)
				}
			}
		}
	}
	// The holder's lock is as it was: refreshed by its owner, re-entered with its fence, busy
	// for others; its own release frees it (no call added a hold), and nobody took it meanwhile.
	must(t, a.Refresh(ctx, k, ownerA, s.TTL))
	if again, err := a.Acquire(ctx, s.req(k, ownerA)); err != nil || !again.Reentered || again.Fence != held.Fence {
		t.Fatalf("the holder's re-entry after the bad calls = %+v, %v; want reentered with fence %d", again, err, held.Fence)
	}
	s.busy(t, ctx, b, s.req(k, ownerB), "holder")
	must(t, errOf(a.Release(ctx, k, ownerA, "", 0)))
	s.acquire(t, ctx, b, k, ownerB, "", held.Fence)
	must(t, errOf(b.Release(ctx, k, ownerB, "", 0)))
}

// locker returns a Locker on st, with the suite's TTL.
func (s suite) locker(t *testing.T, st lockstore.Store, opts ...flightlock.Option) *flightlock.Locker {
	t.Helper()
	l, err := flightlock.New(st, append([]flightlock.Option{flightlock.WithTTL(s.TTL), flightlock.WithPrefix("storetest:")}, opts...)...)
	must(t, err)
	return l
}

func (s suite) permitsNeverExceedTheirCount(t *testing.T) {
	const permits, procs, perProc, rounds = 3, 3, 3, 6
	ctx, k := ctxOf(t), key(t)
	var lockers []*flightlock.Locker
	for range procs {
		l := s.locker(t, s.Open(t), flightlock.WithPermits(permits), flightlock.WithWait(20*time.Second))
		lockers = append(lockers, slices.Repeat([]*flightlock.Locker{l}, perProc)...)
	}
	var inside atomic.Int64
	contend(t, ctx, k, lockers, rounds, 2*time.Millisecond, func(int) func() {
		if n := inside.Add(1); n > permits {
			t.Errorf("%d holders inside at once, %d permits", n, permits)
		}
		return func() { inside.Add(-1) }
	})
}

// contend locks k rounds times with each of lockers (i), in a goroutine and as an owner of its
// own, and holds each lease for hold between enter(i) and the call enter returned.
func contend(t *testing.T, ctx context.Context, k string, lockers []*flightlock.Locker, rounds int, hold time.Duration, enter func(i int) (leave func())) {
	var wg sync.WaitGroup
	for i, l := range lockers {
		wg.Go(func() {
			for range rounds {
				lease, err := l.Lock(flightlock.NewOwner(ctx), k)
				if err != nil {
					t.Errorf("Lock by locker %d: %v", i, err)
					return
				}
				leave := enter(i)
				time.Sleep(hold)
				leave()
				if err := lease.Release(ctx); err != nil {
					t.Errorf("Release: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// A wait that ends while a look is on its way is busy (409 / Aborted) once the store has
// answered a look of that wait, for every primitive: the store is healthy, only slower than the
// time left. A wait whose first look, made at its start, the store did not answer is the store's
// error. Each taker's store serves its first look or none (servesLooks), so the verdict follows
// from what the store did, not from its pace.
func (s suite) spentWaitIsBusy(t *testing.T) {
	const permits = 3
	ctx := ctxOf(t)
	for _, c := range []struct {
		name          string
		holder, taker []flightlock.Option
		holds         int
	}{
		{"Lock", nil, nil, 1},
		{"Permits", []flightlock.Option{flightlock.WithPermits(permits)}, []flightlock.Option{flightlock.WithPermits(permits)}, permits},
		{"Read", nil, []flightlock.Option{flightlock.WithRead()}, 1},
		{"Fair", []flightlock.Option{flightlock.WithFair()}, []flightlock.Option{flightlock.WithFair()}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := key(t)
			defer s.holdElsewhere(t, k, c.holds, c.holder...)()
			for _, wait := range []time.Duration{150 * time.Millisecond, 400 * time.Millisecond} {
				for _, serve := range []int64{1, 0} {
					what := fmt.Sprintf("wait %v, %d looks served: a spent wait for a key held elsewhere", wait, serve)
					st := &servesLooks{Store: s.Open(t), serve: serve, hold: wait + 10*time.Second}
					taker := s.locker(t, st, append([]flightlock.Option{flightlock.WithWait(wait)}, c.taker...)...)
					start := time.Now()
					lease, err := taker.Lock(context.Background(), k)
					if lease != nil {
						_ = lease.Release(ctx)
						t.Fatalf("%s: granted while the key is held", what)
					}
					switch sentAt := st.sentAt.Load(); {
					case st.answered.Load() || sentAt != nil && sentAt.Sub(start) > wait/2:
						wantErr(t, what+", the store answered the first look (or it left late)", err, flightlock.ErrBusy)
					case errors.Is(err, flightlock.ErrBusy) || !errors.Is(err, context.DeadlineExceeded):
						t.Fatalf("%s, and the store did not answer the first look: %v, want the store's deadline error", what, err)
					}
				}
			}
		})
	}
}

// servesLooks is a store that counts the Acquires made through it, serves the first serve of
// them and holds every later one until its context ends (or hold passes, an error), so that a
// wait always ends while a look is on its way, whatever the machine's pace.
type servesLooks struct {
	lockstore.Store
	serve int64
	hold  time.Duration

	calls    atomic.Int64
	sentAt   atomic.Pointer[time.Time] // when the first Acquire was made
	answered atomic.Bool               // the first Acquire returned a reply, not an error
}

func (s *servesLooks) Acquire(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	call := s.calls.Add(1)
	if call == 1 {
		now := time.Now()
		s.sentAt.Store(&now)
	}
	if call > s.serve {
		select {
		case <-ctx.Done():
			return lockstore.Acquisition{}, ctx.Err()
		case <-time.After(s.hold):
			return lockstore.Acquisition{}, errors.New("storetest: a look's context did not end with its wait")
		}
	}
	got, err := s.Store.Acquire(ctx, req)
	if call == 1 {
		s.answered.Store(err == nil)
	}
	return got, err
}

func (s suite) permitRequestTakesTheFirstFreeKey(t *testing.T) {
	ctx, st, k := ctxOf(t), s.Open(t), key(t)
	keys := []string{k + ":1", k + ":2", k + ":3"}
	held := s.acquire(t, ctx, st, keys[0], ownerA, "meta-a", 0)
	req := func(owner string) lockstore.Request {
		return lockstore.Request{Key: keys[0], Permits: keys, Owner: owner, TTL: s.TTL, Meta: "meta-" + owner[len(owner)-1:]}
	}
	// take fails the test unless owner is granted permit with a fence above above.
	take := func(owner string, permit int, above int64) lockstore.Acquisition {
		t.Helper()
		got, err := st.Acquire(ctx, req(owner))
		if err != nil || !got.Acquired || got.Reentered || got.Permit != permit || got.Fence <= above {
			t.Fatalf("Acquire of permits %q for %s = %+v, %v; want permit %d with a fence above %d", keys, owner, got, err, permit, above)
		}
		return got
	}
	if got := take(ownerB, 1, 0); got.Holder != "meta-a" {
		t.Fatalf("a grant that passed over a busy permit says its holder is %q, want the first's metadata %q", got.Holder, "meta-a")
	}
	wantErr(t, "Refresh of the permit granted, by its owner", st.Refresh(ctx, keys[1], ownerB, s.TTL), nil)
	wantErr(t, "TTL of a permit after the one granted", errOf(st.TTL(ctx, keys[2])), lockstore.ErrNotHeld)
	take(ownerC, 2, 0)
	// All held: busy, with the shortest time a holder has left and one holder's metadata.
	const ownerD = "storetest-owner-dddddddddddddddd"
	s.busy(t, ctx, st, req(ownerD), "meta-a", "meta-b", "meta-c")
	// The first freed is the next taker's, with a fence above its last holder's.
	must(t, errOf(st.Release(ctx, keys[0], ownerA, "", 0)))
	take(ownerD, 0, held.Fence)
}

func (s suite) permitRequestTakesUpToWant(t *testing.T) {
	ctx, st, k := ctxOf(t), s.Open(t), key(t)
	// At least one permit while one is free, at most Want, each the owner's with a fence.
	wide := []string{k + ":w1", k + ":w2", k + ":w3"}
	const ownerE = "storetest-owner-eeeeeeeeeeeeeeee"
	many, err := st.Acquire(ctx, lockstore.Request{Key: wide[0], Permits: wide, Want: 2, Owner: ownerE, TTL: s.TTL})
	if err != nil || !many.Acquired || len(many.More) > 1 {
		t.Fatalf("Want 2 of 3 free permits = %+v, %v; want one or two granted", many, err)
	}
	for _, g := range append([]lockstore.PermitGrant{{Permit: many.Permit, Fence: many.Fence}}, many.More...) {
		if g.Fence <= 0 {
			t.Fatalf("grant %+v of %+v has no fence", g, many)
		}
		wantErr(t, fmt.Sprintf("Refresh of permit %d granted with Want, by its owner", g.Permit), st.Refresh(ctx, wide[g.Permit], ownerE, s.TTL), nil)
	}
	if len(many.More) == 1 && many.More[0].Permit == many.Permit {
		t.Fatalf("one permit granted twice: %+v", many)
	}
}

func (s suite) permitLookIsOneRequest(t *testing.T) {
	const permits = 8
	ctx, k := ctxOf(t), key(t)
	release := s.holdElsewhere(t, k, permits, flightlock.WithPermits(permits))
	defer release()
	cs := &servesLooks{Store: s.Open(t), serve: math.MaxInt}
	taker := s.locker(t, cs, flightlock.WithPermits(permits))
	wantErr(t, "TryLock with every permit held elsewhere", errOf(taker.TryLock(ctx, k)), flightlock.ErrBusy)
	if n := cs.calls.Load(); n != 1 {
		t.Fatalf("a look at %d permits held elsewhere made %d store requests, want 1", permits, n)
	}
	release()
	must(t, mustLock(t, ctx, taker, k).Release(ctx))
}

// readWrite returns a writer's and a reader's Locker on a store of its own.
func (s suite) readWrite(t *testing.T, opts ...flightlock.Option) (w, r *flightlock.Locker) {
	t.Helper()
	w = s.locker(t, s.Open(t), opts...)
	r, err := w.With(flightlock.WithRead())
	must(t, err)
	return w, r
}

// Readers share a key. A writer, fair or not, is refused beside them and holds new readers off
// (writer preference), so that a stream of readers cannot starve it: a reader of a third
// process is refused at once; a reader of a process that holds a read joins its hold only
// within the handoff window, and past it is refused. The writer takes the key when they leave,
// with a fence above theirs, and excludes readers in turn.
func (s suite) readersShareAndWritersExclude(t *testing.T) {
	for _, writer := range []string{"Writer", "FairWriter"} {
		t.Run(writer, func(t *testing.T) {
			ctx, k := ctxOf(t), key(t)
			w, r := s.readWrite(t, flightlock.WithMode(flightlock.Reject))
			if writer == "FairWriter" { // in a process of its own
				w = s.locker(t, s.Open(t), flightlock.WithFair(), flightlock.WithMode(flightlock.Reject))
			}
			_, r2 := s.readWrite(t, flightlock.WithMode(flightlock.Reject))
			a := mustLock(t, ctx, r, k)
			b := mustLock(t, ctx, r2, k)
			wantErr(t, "a write beside readers", errOf(w.Lock(ctx, k)), flightlock.ErrBusy)
			_, r3 := s.readWrite(t, flightlock.WithMode(flightlock.Reject))
			wantErr(t, "a new reader after a writer was refused (writer preference)", errOf(r3.Lock(ctx, k)), flightlock.ErrBusy)
			time.Sleep(2 * flightlock.DefaultHandoffWindow)
			wantErr(t, "a new reader of a reading process, past the handoff window, after a writer was refused", errOf(r2.Lock(flightlock.NewOwner(ctx), k)), flightlock.ErrBusy)
			_ = a.Release(ctx)
			_ = b.Release(ctx)
			x, err := w.Lock(ctx, k)
			if err != nil || x.Fence() <= max(a.Fence(), b.Fence()) {
				t.Fatalf("the write after the readers: %v, fence %d, want above the readers' %d", err, x.Fence(), max(a.Fence(), b.Fence()))
			}
			wantErr(t, "a read beside a writer", errOf(r.Lock(flightlock.NewOwner(ctx), k)), flightlock.ErrBusy)
			_ = x.Release(ctx)
		})
	}
}

// The readers of one process share one store read hold: a second reader joins the first's with
// its fence and no store call, and a writer elsewhere still waits for both. The readers and
// writers of a process take turns on one store lock: readers that wait behind a writer of the
// process share one grant after it, with one fence at least the write's, while a writer
// elsewhere is refused; it takes the key after them with a larger fence. Across two processes
// that each read and write the key, no write overlaps a read or another write.
func (s suite) readersOfAProcessShareAndTakeTurns(t *testing.T) {
	ctx, k, shared := ctxOf(t), key(t), key(t)
	w, r := s.readWrite(t, flightlock.WithWait(10*time.Second), flightlock.WithHandoff(flightlock.DefaultHandoff, time.Hour))
	elsewhere := s.locker(t, s.Open(t), flightlock.WithMode(flightlock.Reject))
	a := mustLock(t, flightlock.NewOwner(ctx), r, shared)
	b := mustLock(t, flightlock.NewOwner(ctx), r, shared)
	if b.Grant() != flightlock.GrantShared || b.Fence() != a.Fence() {
		t.Fatalf("a second reader of the process: grant %v fence %d, want shared with fence %d", b.Grant(), b.Fence(), a.Fence())
	}
	_ = a.Release(ctx)
	wantErr(t, "a write while one of two sharing readers holds", errOf(elsewhere.Lock(ctx, shared)), flightlock.ErrBusy)
	_ = b.Release(ctx)
	first := mustLock(t, flightlock.NewOwner(ctx), w, k)
	leases := make([]*flightlock.Lease, 4)
	var readers errgroup.Group
	for i := range leases {
		readers.Go(func() (err error) {
			leases[i], err = r.Lock(flightlock.NewOwner(ctx), k)
			return err
		})
	}
	time.Sleep(100 * time.Millisecond) // they wait behind the writer; a late one joins them
	must(t, first.Release(ctx))
	must(t, readers.Wait())
	for _, lease := range leases {
		if lease.Fence() != leases[0].Fence() || lease.Fence() < first.Fence() {
			t.Fatalf("reader fences %d and %d, want one fence at least the write's %d", leases[0].Fence(), lease.Fence(), first.Fence())
		}
	}
	wantErr(t, "a write elsewhere beside the readers of a process", errOf(elsewhere.Lock(ctx, k)), flightlock.ErrBusy)
	for _, l := range leases {
		must(t, l.Release(ctx))
	}
	x := lockWithin(t, elsewhere, k, 5*time.Second)
	if x.Fence() <= leases[0].Fence() {
		t.Fatalf("the write elsewhere after the readers: fence %d, want above theirs %d", x.Fence(), leases[0].Fence())
	}
	_ = x.Release(ctx)

	// Two processes of three readers and a writer (the fourth) each.
	var lockers []*flightlock.Locker
	for range 2 {
		w, r := s.readWrite(t, flightlock.WithWait(30*time.Second))
		lockers = append(lockers, r, r, r, w)
	}
	var reading, writing atomic.Int64
	contend(t, ctx, k, lockers, 15, time.Millisecond, func(i int) func() {
		if i%4 == 3 {
			if w, r := writing.Add(1), reading.Load(); w > 1 || r > 0 {
				t.Errorf("a write overlapped %d reads and %d other writes", r, w-1)
			}
			return func() { writing.Add(-1) }
		}
		if reading.Add(1); writing.Load() > 0 {
			t.Error("a read overlapped a write")
		}
		return func() { reading.Add(-1) }
	})
}

// A writer refused by readers is told the metadata of a reader that holds the key, never of
// one that left: the go-zero layer refuses a write at once when the holder has its own trace.
func (s suite) refusedWriterIsNotToldALeftReaderHolds(t *testing.T) {
	ctx, k := ctxOf(t), key(t)
	meta := func(m string) flightlock.Option {
		return flightlock.WithMetadata(func(context.Context) string { return m })
	}
	_, r1 := s.readWrite(t, meta("trace=T1"), flightlock.WithMode(flightlock.Reject))
	_, r2 := s.readWrite(t, meta("trace=T2"), flightlock.WithMode(flightlock.Reject))
	var told []string
	w, _ := s.readWrite(t, meta("trace=T1"), flightlock.WithMode(flightlock.Reject), flightlock.WithHolderCheck(func(_ context.Context, holder string) error {
		told = append(told, holder)
		return nil
	}))
	a := mustLock(t, ctx, r1, k)
	b := mustLock(t, ctx, r2, k)
	must(t, a.Release(ctx))
	wantErr(t, "a write beside a reader", errOf(w.Lock(ctx, k)), flightlock.ErrBusy)
	if slices.Contains(told, "trace=T1") {
		t.Fatalf("the refused writer was told the holder is %q, the reader that left (holders told: %q)", "trace=T1", told)
	}
	_ = b.Release(ctx)
}

// Fair order is the store's line, not which waiter asks first after a release: the waiters
// take their places one after another, each from a process of its own, and after the release
// each round lets every one still waiting ask again, the last in line first.
func (s suite) fairLocksGrantInRequestOrder(t *testing.T) {
	ctx, k := ctxOf(t), key(t)
	const waiters = 4
	stores := make([]lockstore.Store, 1+waiters) // the holder's, then each waiter's
	for i := range stores {
		stores[i] = s.Open(t)
	}
	base := time.Now().Add(-500 * time.Millisecond) // within any store's clamp of a caller's clock
	// place is the fair request of process i, which asked after i others, 20ms apart.
	place := func(i int) lockstore.Request {
		owner := fmt.Sprintf("storetest-fair-%d-xxxxxxxxxxxxxxx", i)
		return lockstore.Request{Key: k, Owner: owner, TTL: s.TTL, Asked: base.Add(time.Duration(i) * 20 * time.Millisecond), Queue: 3 * s.TTL}
	}
	for i, st := range stores { // the first is granted, each waiter while the key is held a place in line
		if got, err := st.Acquire(ctx, place(i)); err != nil || got.Acquired != (i == 0) {
			t.Fatalf("fair request %d: %+v, %v; want granted for the first and a place in line for a waiter", i, got, err)
		}
	}
	must(t, errOf(stores[0].Release(ctx, k, place(0).Owner, "", 0)))
	var order []int
	for len(order) < waiters {
		var granted []int
		for i := waiters; i >= 1; i-- {
			if slices.Contains(order, i) {
				continue
			}
			got, err := stores[i].Acquire(ctx, place(i))
			must(t, err)
			if got.Acquired {
				granted = append(granted, i)
			}
		}
		if len(granted) != 1 {
			t.Fatalf("waiters %v of the line granted the free key in one round, want one (granted so far %v)", granted, order)
		}
		order = append(order, granted[0])
		must(t, errOf(stores[granted[0]].Release(ctx, k, place(granted[0]).Owner, "", 0)))
	}
	if !slices.IsSorted(order) {
		t.Fatalf("fair grants in the order %v, want the order of asking 1..%d", order, waiters)
	}
}

// Through each fault, Release of a held lock, permit or read and new Locks of them, also of
// keys held elsewhere, return by the caller's deadline, and once it heals the keys are taken.
func (s suite) callsReturnByTheirDeadlineThroughFaults(t *testing.T) {
	if s.Faulty == nil {
		t.Skip("the store's test gives no fault proxy (Config.Faulty)")
	}
	ctx := context.Background()
	var worst time.Duration // the latest return past a deadline, for the log
	probe := poll.StartLagProbe(t)
	// within makes call with a deadline 600ms away and asserts that it returned by then.
	within := func(t *testing.T, what string, call func(context.Context) error) error {
		t.Helper()
		probe.Lag()
		cctx, cancel := context.WithTimeout(ctx, 600*time.Millisecond)
		defer cancel()
		deadline, _ := cctx.Deadline()
		err := call(cctx)
		if over, lag := time.Since(deadline), probe.Lag(); over > poll.DeadlineSlack+lag {
			t.Errorf("%s returned %v past its deadline, the machine's scheduling lagging %v meanwhile (%v)", what, over, lag, err)
		} else {
			worst = max(worst, over)
		}
		return err
	}
	for _, kind := range []struct {
		name      string
		opts      []flightlock.Option
		elsewhere int                 // locks of the key another process holds through the faults
		other     []flightlock.Option // of what kind (none: writers)
	}{
		{"lock", nil, 0, nil},
		{"permits", []flightlock.Option{flightlock.WithPermits(3)}, 0, nil},
		{"read", []flightlock.Option{flightlock.WithRead()}, 0, nil},
		{"permits held elsewhere", []flightlock.Option{flightlock.WithPermits(2)}, 2, []flightlock.Option{flightlock.WithPermits(2)}},
		{"read behind a writer elsewhere", []flightlock.Option{flightlock.WithRead()}, 1, nil},
	} {
		store, faults := s.Faulty(t)
		l := s.locker(t, store, append([]flightlock.Option{flightlock.WithWait(20 * time.Second)}, kind.opts...)...)
		key := "faults-" + strings.ReplaceAll(kind.name, " ", "-")
		for _, f := range faults {
			t.Run(kind.name+"/"+f.Name, func(t *testing.T) {
				_ = lockWithin(t, l, key, 30*time.Second).Release(ctx)
				var held *flightlock.Lease
				if kind.elsewhere == 0 {
					held = lockWithin(t, l, key, 30*time.Second)
				} else {
					defer s.holdElsewhere(t, key, kind.elsewhere, kind.other...)()
				}
				f.Start()
				defer f.Heal()
				if held != nil {
					within(t, "Release", held.Release)
				}
				for i := range 2 {
					var lease *flightlock.Lease
					err := within(t, fmt.Sprintf("Lock #%d", i+1), func(ctx context.Context) (err error) {
						lease, err = l.Lock(ctx, key)
						return err
					})
					if err == nil {
						if !f.Passable {
							t.Errorf("Lock #%d succeeded through the fault", i+1)
						}
						_ = lease.Release(ctx)
					}
				}
			})
		}
		_ = lockWithin(t, l, key, 30*time.Second).Release(ctx)
	}
	t.Logf("latest return past a deadline: %v", worst)
}

// holdElsewhere takes n locks of key, of opts' kind, in another process, and returns what
// gives them back.
func (s suite) holdElsewhere(t *testing.T, key string, n int, opts ...flightlock.Option) func() {
	t.Helper()
	other := s.locker(t, s.Open(t), opts...)
	var leases []*flightlock.Lease
	for range n {
		leases = append(leases, lockWithin(t, other, key, 30*time.Second))
	}
	return func() {
		for _, lease := range leases {
			_ = lease.Release(context.Background())
		}
	}
}

// lockWithin locks key with l, trying again until within has passed (a store that heals
// after a fault reconnects first).
func lockWithin(t *testing.T, l *flightlock.Locker, key string, within time.Duration) *flightlock.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	for {
		lease, err := l.Lock(ctx, key)
		if err == nil {
			return lease
		}
		if ctx.Err() != nil {
			t.Fatalf("no lock of %s within %v: %v", key, within, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// lostReplyLeavesNothingHeld: a lock, permit or read hold whose request landed but whose reply
// was lost with its connection is held by nobody once the store answers again: the store's
// resend re-enters it (and the caller has it), or the Locker gives it back
// (lockstore.ErrOutcomeUnknown). Its TTL is far longer than the wait for another process to
// take the key (all its permits, or a write of it).
func (s suite) lostReplyLeavesNothingHeld(t *testing.T) {
	if s.Severable == nil {
		t.Skip("the store's test gives no link to cut (Config.Severable)")
	}
	healthy := s.Open(t)
	d, ok := healthy.(lockstore.Describer)
	if !ok || d.Describe("storetest:").Inspector == nil {
		t.Skip("the store has no inspector to see the request land")
	}
	inspector, ttl := d.Describe("storetest:").Inspector, 30*time.Second
	if s.Sessions {
		ttl = s.TTL // a hold lives as long as its session, which lives on
	}
	for _, kind := range []struct {
		name   string
		opts   []flightlock.Option
		others int // the locks another process takes once the key is free: all its permits
	}{
		{"lock", nil, 1},
		{"permits", []flightlock.Option{flightlock.WithPermits(2)}, 2},
		{"read", []flightlock.Option{flightlock.WithRead()}, 1},
	} {
		t.Run(kind.name, func(t *testing.T) {
			ctx, k := ctxOf(t), "lost-reply-"+kind.name
			store, link := s.Severable(t)
			l := s.locker(t, store, append([]flightlock.Option{flightlock.WithTTL(ttl)}, kind.opts...)...)
			var otherOpts []flightlock.Option // a writer, or a taker of the same permits
			if kind.others > 1 {
				otherOpts = kind.opts
			}
			other := s.locker(t, healthy, append([]flightlock.Option{flightlock.WithTTL(ttl)}, otherOpts...)...)
			must(t, mustLock(t, ctx, l, k).Release(ctx)) // the connection and what the store sets up are in place
			link.SetDelay(time.Hour)
			defer link.SetDelay(0)
			type result struct {
				lease *flightlock.Lease
				err   error
			}
			out := make(chan result, 1)
			go func() {
				lease, err := l.TryLock(ctx, k)
				out <- result{lease, err}
			}()
			landed := func() bool {
				locks, _, err := inspector.List(ctx, k+"*", lockstore.ListOptions{})
				return err == nil && len(locks) > 0
			}
			for end := time.Now().Add(5 * time.Second); !landed(); time.Sleep(5 * time.Millisecond) {
				if time.Now().After(end) {
					// ZooKeeper reads the permits before it takes one: that read's reply is held.
					t.Logf("the request did not land with its replies held back (it waits for a reply before it writes): this only shows that nothing is left held")
					break
				}
			}
			link.SetDelay(0)
			link.Cut()
			if r := <-out; r.lease != nil {
				must(t, r.lease.Release(ctx))
			} else {
				t.Logf("TryLock whose reply was lost: %v", r.err)
			}
			poll.Until(t, 10*time.Second, 50*time.Millisecond, "another process takes the key", func() bool {
				var leases []*flightlock.Lease
				for range kind.others {
					if lease, err := other.TryLock(ctx, k); err == nil {
						leases = append(leases, lease)
					}
				}
				for _, lease := range leases {
					must(t, lease.Release(ctx))
				}
				return len(leases) == kind.others
			})
		})
	}
}
