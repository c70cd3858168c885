package zkstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/testenv/poll"
	"github.com/flightlock/flightlock/internal/testenv/zktest"
	"github.com/flightlock/flightlock/lockstore"
)

// inside counts the live holders of a critical section and remembers the most seen at once.
type inside struct{ now, most atomic.Int64 }

func (c *inside) enter(lease *flightlock.Lease) bool {
	if lease.Context().Err() != nil {
		return false
	}
	n := c.now.Add(1)
	for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
	}
	return true
}

// Three processes (sessions) with goroutines each lock one key again and again: never two live
// holders, fences growing; keys that nest as paths ("orders", "orders/0") are separate locks.
func TestExclusionAcrossSessions(t *testing.T) {
	srv := zktest.Start(t)
	var lockers []*flightlock.Locker
	for range 3 {
		lockers = append(lockers, mustLocker(t, dial(t, srv.Addr), flightlock.WithWait(30*time.Second)))
	}
	var (
		c         inside
		wg        sync.WaitGroup
		mu        sync.Mutex
		lastFence int64
		fenceBack atomic.Int64
	)
	for _, l := range lockers {
		for range 4 {
			wg.Go(func() {
				for range 10 {
					lease, err := l.Lock(context.Background(), "orders")
					if err != nil {
						t.Error(err)
						return
					}
					if c.enter(lease) {
						mu.Lock()
						if lease.Fence() <= lastFence {
							fenceBack.Add(1)
						}
						lastFence = lease.Fence()
						mu.Unlock()
						time.Sleep(time.Millisecond)
						c.now.Add(-1)
					}
					_ = lease.Release(context.Background())
				}
			})
		}
	}
	wg.Wait()
	if c.most.Load() != 1 || fenceBack.Load() != 0 {
		t.Fatalf("%d live holders at once at most, %d fences not above the last", c.most.Load(), fenceBack.Load())
	}
	ctx := context.Background()
	a, err := lockers[0].Lock(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	b, err := lockers[1].TryLock(ctx, "orders/0")
	if err != nil {
		t.Fatalf("orders/0 while orders is held: %v; keys must not nest", err)
	}
	_ = b.Release(ctx)
	_ = a.Release(ctx)
	if _, err := lockers[2].TryLock(ctx, "orders"); err != nil {
		t.Fatalf("orders once released (orders/0 was locked meanwhile): %v", err)
	}
}

// Read-write locks, fair order and semaphores work on ZooKeeper as on the other stores.
func TestReadWriteFairAndPermitsOnZooKeeper(t *testing.T) {
	srv := zktest.Start(t)
	ctx := context.Background()
	w := mustLocker(t, dial(t, srv.Addr), flightlock.WithMode(flightlock.Reject))
	r, err := w.With(flightlock.WithRead())
	if err != nil {
		t.Fatal(err)
	}
	r2 := mustLocker(t, dial(t, srv.Addr), flightlock.WithRead(), flightlock.WithMode(flightlock.Reject))
	a, err := r.Lock(ctx, "doc")
	if err != nil {
		t.Fatal(err)
	}
	b, err := r2.Lock(ctx, "doc")
	if err != nil || b.Fence() != a.Fence() {
		t.Fatalf("a second reader in another session: %v, fences %d and %d", err, a.Fence(), b.Fence())
	}
	if _, err := w.Lock(ctx, "doc"); !errors.Is(err, flightlock.ErrBusy) {
		t.Fatalf("a write beside readers: %v, want ErrBusy", err)
	}
	// A reader of a third session (a reader of r2's would join b's hold within the handoff
	// window: the conformance suite proves that bound).
	r3 := mustLocker(t, dial(t, srv.Addr), flightlock.WithRead(), flightlock.WithMode(flightlock.Reject))
	if _, err := r3.Lock(ctx, "doc"); !errors.Is(err, flightlock.ErrBusy) {
		t.Fatalf("a new reader after a writer was refused: %v, want ErrBusy (writer preference)", err)
	}
	_ = a.Release(ctx)
	_ = b.Release(ctx)
	x, err := w.Lock(ctx, "doc")
	if err != nil || x.Fence() <= a.Fence() {
		t.Fatalf("the write after the readers: %v, fence %d, want above %d", err, x.Fence(), a.Fence())
	}
	_ = x.Release(ctx)

	// Fair: four sessions, waiters one after another; granted in the order they reached the
	// line.
	var fair []*flightlock.Locker
	for range 4 {
		fair = append(fair, mustLocker(t, dial(t, srv.Addr), flightlock.WithFair(), flightlock.WithWait(30*time.Second)))
	}
	h, err := fair[0].Lock(ctx, "line")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		granted []int
		wg      sync.WaitGroup
	)
	for i := range 8 {
		wg.Go(func() {
			lease, err := fair[i%4].Lock(ctx, "line")
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			granted = append(granted, i)
			mu.Unlock()
			_ = lease.Release(ctx)
		})
		time.Sleep(20 * time.Millisecond)
	}
	_ = h.Release(ctx)
	wg.Wait()
	if !slices.IsSorted(granted) || len(granted) != 8 {
		t.Fatalf("fair grants in order %v, want 0..7", granted)
	}

	// Permits: 2 holders at most.
	p := mustLocker(t, dial(t, srv.Addr), flightlock.WithPermits(2), flightlock.WithMode(flightlock.Reject))
	p1, err1 := p.Lock(ctx, "export")
	p2, err2 := p.Lock(ctx, "export")
	_, err3 := p.Lock(ctx, "export")
	if err1 != nil || err2 != nil || !errors.Is(err3, flightlock.ErrBusy) {
		t.Fatalf("permits: %v, %v, then %v; want two and busy", err1, err2, err3)
	}
	_ = p1.Release(ctx)
	_ = p2.Release(ctx)
}

// A look at a semaphore's permits is one round trip however many there are, and one that finds
// a permit free costs one more, the acquisition; a re-sent request re-enters its permit even
// when an earlier one is free. Behind a proxy that holds every reply back d, one key at a time
// (lockstore.AcquireEach) the busy look would take two round trips per permit, 16d. Each bound
// leaves d of slack, and d is long enough that a loaded machine's scheduling stays inside it.
func TestPermitLookIsOneRoundTrip(t *testing.T) {
	srv := zktest.Start(t)
	proxy := startProxy(t, srv.Addr)
	s, other := dial(t, proxy.Addr), dial(t, srv.Addr)
	ctx := context.Background()
	const d, holder, taker = time.Second, "holder-token", "taker-token"
	keys := make([]string, 8)
	for i := range keys {
		keys[i] = flightlock.PermitKey("", "sem", i+1)
		if a, err := other.Acquire(ctx, lockstore.Request{Key: keys[i], Owner: holder, TTL: time.Second, Meta: "m"}); err != nil || !a.Acquired {
			t.Fatal(a, err)
		}
	}
	proxy.SetDelay(d)
	look := func(what string, within time.Duration) lockstore.Acquisition {
		t.Helper()
		start := time.Now()
		a, err := s.Acquire(ctx, lockstore.Request{Key: keys[0], Permits: keys, Owner: taker, TTL: time.Second})
		if took := time.Since(start); err != nil || took >= within {
			t.Fatalf("%s: %+v, %v after %v, want within %v", what, a, err, took, within)
		}
		return a
	}
	// The first look also marks the permits busy, all at once.
	for i, within := range []time.Duration{3 * d, 2 * d} {
		if a := look(fmt.Sprintf("look #%d at %d permits held elsewhere", i+1, len(keys)), within); a.Acquired || a.Holder != "m" {
			t.Fatalf("look #%d at permits held elsewhere: %+v, want busy with the holder's metadata", i+1, a)
		}
	}
	for _, k := range keys {
		if data, _, err := other.get(ctx, other.keyPath(k)); err != nil || !strings.HasSuffix(string(data), markSuffix) {
			t.Fatalf("permit %q after a refused look: %q, %v; want it marked", k, data, err)
		}
	}
	if _, err := other.Release(ctx, keys[6], holder, "", 0); err != nil {
		t.Fatal(err)
	}
	got := look("a look with one permit free", 3*d)
	if !got.Acquired || got.Reentered || got.Permit != 6 {
		t.Fatalf("a look with the seventh permit free: %+v, want it taken", got)
	}
	if _, err := other.Release(ctx, keys[0], holder, "", 0); err != nil {
		t.Fatal(err)
	}
	if a := look("a re-sent look", 4*d); !a.Acquired || !a.Reentered || a.Permit != 6 || a.Fence != got.Fence {
		t.Fatalf("a re-sent request with the first permit free: %+v, want the seventh re-entered with fence %d", a, got.Fence)
	}
}

// A look with Want 3 at 5 permits of which 3 are free takes those 3, each the owner's with a
// fence, in the look's two round trips (the reads, then the takes together); sent again, it
// re-enters all 3 and takes nothing more, though another permit was freed meanwhile. Round
// trips are told by a delay d on the path: one more would cost d more, so each bound leaves d
// of slack, and d is long enough that a loaded machine's scheduling stays inside it.
func TestPermitLookTakesUpToWantAndASentAgainReentersThemAll(t *testing.T) {
	srv := zktest.Start(t)
	proxy := startProxy(t, srv.Addr)
	s, other := dial(t, proxy.Addr), dial(t, srv.Addr)
	ctx := context.Background()
	const d, holder, taker = time.Second, "holder-token", "taker-token"
	keys := make([]string, 5)
	for i := range keys {
		keys[i] = flightlock.PermitKey("", "sem-want", i+1)
	}
	for _, i := range []int{1, 3} {
		if a, err := other.Acquire(ctx, lockstore.Request{Key: keys[i], Owner: holder, TTL: time.Second}); err != nil || !a.Acquired {
			t.Fatal(a, err)
		}
	}
	proxy.SetDelay(d)
	look := func(what string, within time.Duration) lockstore.Acquisition {
		t.Helper()
		start := time.Now()
		a, err := s.Acquire(ctx, lockstore.Request{Key: keys[0], Permits: keys, Want: 3, Owner: taker, TTL: time.Second})
		if took := time.Since(start); err != nil || took >= within {
			t.Fatalf("%s: %+v, %v after %v, want within %v", what, a, err, took, within)
		}
		return a
	}
	grants := func(a lockstore.Acquisition) []lockstore.PermitGrant {
		return append([]lockstore.PermitGrant{{Permit: a.Permit, Fence: a.Fence}}, a.More...)
	}
	got := look("a look with Want 3 and 3 permits free", 3*d)
	if !got.Acquired || got.Reentered || len(got.More) != 2 {
		t.Fatalf("a look with Want 3 and 3 permits free: %+v, want all 3 taken", got)
	}
	for j, g := range grants(got) {
		if want := []int{0, 2, 4}[j]; g.Permit != want || g.Fence <= 0 {
			t.Fatalf("grant #%d of %+v: %+v, want permit %d with a fence", j, got, g, want)
		}
		if err := s.Refresh(ctx, keys[g.Permit], taker, time.Second); err != nil {
			t.Fatalf("permit %d granted is not the owner's: Refresh = %v", g.Permit, err)
		}
	}
	if _, err := other.Release(ctx, keys[1], holder, "", 0); err != nil {
		t.Fatal(err)
	}
	again := look("a re-sent look", 4*d)
	if !again.Acquired || !again.Reentered || !slices.Equal(grants(again), grants(got)) {
		t.Fatalf("a re-sent look: %+v, want %+v re-entered", again, got)
	}
	if _, err := other.TTL(ctx, keys[1]); !errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("a re-sent look took a permit freed since: TTL = %v, want ErrNotHeld", err)
	}
}

// Fences strictly grow across a leader change, and a holder keeps its lock through one: its
// session outlives the election, and the refreshes that fail while no leader serves are
// retried until the new leader answers. The lock's TTL (10s, on a 20s session) gives the
// election and the client's reconnection to the quorum about 9s from the kill (the loss
// deadline is a TTL less a tenth from the last renewal sent); they take about a second, a few
// on a loaded machine. A TTL near that (mustLocker's 2s) would make the verdict the machine's
// speed, not the store's: a loss must prove a fault of the store or the watchdog.
// The test waits for the renewals it checks, not for a fixed time.
func TestFencesGrowAndHoldsSurviveALeaderChange(t *testing.T) {
	const session, ttl = 20 * time.Second, 10 * time.Second // MaxTTL is 10.3s
	ens := zktest.StartEnsemble(t, 3)
	s := dialSession(t, session, ens.Addrs()...)
	var renewed renewals
	l := mustLocker(t, s, flightlock.WithTTL(ttl), flightlock.WithWait(20*time.Second),
		flightlock.WithObserver(flightlock.Observer{Renewed: renewed.add}))
	ctx := context.Background()
	before, err := l.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	held, err := l.Lock(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	_ = before.Release(ctx)
	ens.Leader().Stop()
	killed := time.Now()
	ens.WaitReady(20 * time.Second)
	elected := time.Now()
	after, err := l.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if after.Fence() <= before.Fence() {
		t.Fatalf("fence after the leader change %d, not above %d", after.Fence(), before.Fence())
	}
	_ = after.Release(ctx)
	// Two renewals of "other" answered after the election: the second was sent after the
	// first's reply, so through the new leader. A lost lock is renewed no more.
	waitFor(t, 2*ttl, "two renewals through the new leader", func() bool {
		return held.Lost() || renewed.okSince(held.Key(), elected) >= 2
	})
	if held.Lost() {
		t.Fatalf("a lock held through the leader change was lost; the session survived it (a leader again %v after the kill; renewals since the kill:%s)",
			elected.Sub(killed).Round(time.Millisecond), renewed.since(held.Key(), killed))
	}
	_ = held.Release(ctx)
}

// toldLostBeforeGranted has holder lock key, cuts holder off (cut), has other lock key, and fails
// unless holder's lease was told lost before other was granted. The Locker ends a lease's
// context, with ErrLost, in the step that decides the loss, so the context has ended by the
// time other's Lock returns; a comparison of clocks read by a goroutine that waits for the end
// would also measure how late that goroutine was scheduled.
func toldLostBeforeGranted(t *testing.T, round int, holder, other *flightlock.Locker, key string, cut func()) {
	t.Helper()
	ctx := context.Background()
	lease, err := holder.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	cut()
	got, err := other.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if cause := context.Cause(lease.Context()); !errors.Is(cause, flightlock.ErrLost) {
		t.Fatalf("round %d: the other session got the key while the holder was not told lost (its lease's context: %v)", round, cause)
	}
	_ = got.Release(ctx)
}

// A holder whose link stalls past its session is told lost before another session is granted
// the key: its lease counts only what the leader confirmed.
func TestStalledHolderIsToldLostBeforeAnotherIsGranted(t *testing.T) {
	srv := zktest.Start(t)
	for round := range 2 {
		proxy := startProxy(t, srv.Addr)
		holder := mustLocker(t, dial(t, proxy.Addr))
		other := mustLocker(t, dial(t, srv.Addr), flightlock.WithWait(30*time.Second))
		toldLostBeforeGranted(t, round, holder, other, "stalled-"+string(rune('a'+round)), func() {
			proxy.SetDelay(time.Hour)
			proxy.Stall(time.Hour)
		})
		proxy.SetDelay(0)
		_ = proxy.Close()
	}
}

// A holder talking to a follower that is cut off from the quorum (which goes on answering its
// clients for syncLimit x tickTime) is told lost before a session elsewhere gets the key.
func TestHolderOnACutOffFollowerIsToldLostFirst(t *testing.T) {
	ens := zktest.StartEnsemble(t, 3)
	for round := range 2 {
		follower := ens.Followers()[0]
		leader := ens.Leader()
		holder := mustLocker(t, dial(t, follower.Addr))
		other := mustLocker(t, dial(t, leader.Addr), flightlock.WithWait(30*time.Second))
		toldLostBeforeGranted(t, round, holder, other, "cut-"+string(rune('a'+round)), func() { ens.Isolate(follower) })
		ens.Heal(follower)
		ens.WaitReady(20 * time.Second)
	}
}

// A Lock whose calls stall returns by its deadline, and what its late calls took is given back:
// no hold of it is left on the key.
func TestTimedOutLockReturnsByItsDeadlineAndLeavesNoHold(t *testing.T) {
	srv := zktest.Start(t)
	proxy := startProxy(t, srv.Addr)
	s := dial(t, proxy.Addr)
	l := mustLocker(t, s)
	direct := dial(t, srv.Addr)
	proxy.SetDelay(time.Second) // every call takes a second each way
	probe := poll.StartLagProbe(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	deadline, _ := ctx.Deadline()
	_, err := l.Lock(ctx, "slow")
	over, lag := time.Since(deadline), probe.Lag()
	cancel()
	if err == nil || over > poll.DeadlineSlack+lag {
		t.Fatalf("a Lock with a 300ms deadline on a stalled link: %v, %v past its deadline, the machine's scheduling lagging %v meanwhile", err, over, lag)
	}
	t.Logf("returned %v past its deadline (scheduling lag %v)", over, lag)
	proxy.SetDelay(0)
	// The acquisition went through late: its late hook gives it back.
	waitFor(t, 10*time.Second, "the late acquisition to be given back", func() bool {
		kids, err := direct.children(context.Background(), direct.keyPath("lock:slow"))
		return err != nil || len(kids) == 0
	})
}

// A release that fails while no server answers is retried in the background once one does:
// the hold does not keep the key until the process ends.
func TestFailedReleaseIsRetriedWhenTheServerIsBack(t *testing.T) {
	srv := zktest.Start(t)
	s := dial(t, srv.Addr)
	l := mustLocker(t, s)
	ctx := context.Background()
	lease, err := l.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err = lease.Release(rctx)
	cancel()
	if err == nil {
		t.Fatal("a release with no server up succeeded")
	}
	srv.Restart()
	other := mustLocker(t, dial(t, srv.Addr), flightlock.WithWait(testSession))
	x, err := other.Lock(ctx, "k")
	if err != nil {
		t.Fatalf("the key after the server came back: %v (the failed release was not retried)", err)
	}
	_ = x.Release(ctx)
}

// A TTL longer than the session keeps a lock is refused when the Locker is made, and so are
// session timeouts the servers would change.
func TestTTLAndSessionTimeoutAreCheckedAtStartUp(t *testing.T) {
	srv := zktest.Start(t)
	s := dial(t, srv.Addr)
	if _, err := flightlock.New(s, flightlock.WithTTL(10*time.Second)); !errors.Is(err, flightlock.ErrConfig) || !strings.Contains(err.Error(), "session timeout") {
		t.Fatalf("a 10s TTL on a 6s session: %v, want ErrConfig naming the session timeout", err)
	}
	if _, err := Dial(Config{Hosts: []string{srv.Addr}, SessionTimeout: 2 * time.Minute}); err == nil || !strings.Contains(err.Error(), "clamp") {
		t.Fatalf("a session timeout above the servers' maximum: %v", err)
	}
	if _, err := Dial(Config{Hosts: []string{srv.Addr}, SessionTimeout: 1200 * time.Millisecond}); err == nil {
		t.Fatal("a session timeout too short for any lock TTL was accepted")
	}
}

// The inspector lists the locks with their holds, readers and lines, never the owner token,
// and force-unlocks one grant only.
func TestInspectorListsAndForceUnlocks(t *testing.T) {
	srv := zktest.Start(t)
	s := dial(t, srv.Addr)
	ctx := context.Background()
	l := mustLocker(t, s)
	x, err := l.Lock(ctx, "orders/0")
	if err != nil {
		t.Fatal(err)
	}
	r, _ := l.With(flightlock.WithRead())
	y, err := r.Lock(ctx, "doc")
	if err != nil {
		t.Fatal(err)
	}
	in := NewInspector(s, "lock:")
	locks, _, err := in.List(ctx, "*", lockstore.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(locks) != 2 || locks[0].Key != "doc" || locks[0].Readers != 1 || locks[1].Key != "orders/0" || !locks[1].Own || locks[1].Owner != "" || locks[1].Host == "" {
		t.Fatalf("listed %+v", locks)
	}
	if _, err := in.ForceUnlock(ctx, locks[1]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the forced-out holder to be told", func() bool { return x.Lost() })
	if _, err := in.ForceUnlock(ctx, locks[1]); err == nil {
		t.Fatal("a second force unlock of the same grant succeeded")
	}
	_ = y.Release(ctx)
}

// The server a holder talks to dies: the client moves to another server within the session, the
// holder keeps its lock (its renewals go through the new server), and the key stays excluded.
func TestHolderKeepsItsLockWhenItsServerDies(t *testing.T) {
	ens := zktest.StartEnsemble(t, 3)
	s := dial(t, ens.Addrs()...)
	ctx := context.Background()
	lease, err := mustLocker(t, s).Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	talksTo := s.Conn().Server()
	for _, srv := range ens.Servers {
		if srv.Addr == talksTo {
			srv.Stop()
		}
	}
	other := mustLocker(t, dial(t, ens.Addrs()...), flightlock.WithMode(flightlock.Reject))
	waitFor(t, 20*time.Second, "the holder's client on another server", func() bool {
		return s.Conn().Server() != talksTo && s.Conn().State() == zk.StateHasSession
	})
	time.Sleep(2 * time.Second) // two renewals through the new server
	if lease.Lost() {
		t.Fatal("the holder lost its lock when its server died; its session lives on another")
	}
	if _, err := other.Lock(ctx, "k"); !errors.Is(err, flightlock.ErrBusy) {
		t.Fatalf("another session while the holder holds: %v, want ErrBusy", err)
	}
	_ = lease.Release(ctx)
}

// A RefreshAll whose multi fails (one lock's hold is gone) while another lock of the batch was
// refused before the multi (this store holds it not) returns, with ErrNotHeld for both.
func TestRefreshAllWithAnUnheldLockAndAGoneHoldReturns(t *testing.T) {
	a, _ := forcedOut(t)
	ctx := context.Background()
	batch := []lockstore.Renewal{{Key: "never", Owner: "ownerZ", TTL: 2 * time.Second}, {Key: "k", Owner: "ownerX", TTL: 2 * time.Second}}
	done := make(chan []error, 1)
	go func() { done <- a.RefreshAll(ctx, batch) }()
	select {
	case errs := <-done:
		for i, err := range errs {
			if !errors.Is(err, lockstore.ErrNotHeld) {
				t.Errorf("lock %d: %v, want ErrNotHeld", i, err)
			}
		}
	case <-time.After(10 * time.Second):
		t.Fatal("RefreshAll did not return within 10s")
	}
}
