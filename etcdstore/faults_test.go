package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/lockstore"
)

// fencedCounter is the resource the locks protect: it refuses a second writer inside, and a
// write whose fence is not above every fence seen (a fenced write, as fenced/ does).
type fencedCounter struct {
	inside atomic.Int32
	mu     sync.Mutex
	last   int64 // guarded by mu: the largest fence that wrote
	n      int   // guarded by mu: writes
	errs   []string
}

// enter runs one critical section under fence, then records handed, the largest fence handed
// out under the grant (fence itself, or the last of some simulated in-process handoffs).
func (c *fencedCounter) enter(fence, handed int64, hold time.Duration) {
	if n := c.inside.Add(1); n != 1 {
		c.fail("%d holders inside at once (fence %d)", n, fence)
	}
	c.mu.Lock()
	if fence <= c.last {
		c.errs = append(c.errs, fmt.Sprintf("fence %d after %d: not increasing", fence, c.last))
	}
	c.last = max(c.last, handed)
	c.n++
	c.mu.Unlock()
	time.Sleep(hold)
	c.inside.Add(-1)
}

func (c *fencedCounter) fail(format string, args ...any) {
	c.mu.Lock()
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
	c.mu.Unlock()
}

func (c *fencedCounter) check(t *testing.T) int {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, e := range c.errs {
		if i == 10 {
			t.Errorf("... and %d more", len(c.errs)-10)
			break
		}
		t.Error(e)
	}
	return c.n
}

// worker locks key on s again and again until stop, as flightlock's Locker does with one
// goroutine per process and key: a new owner token per acquisition, a wait for the watch (or
// a retry delay) when busy, a release with some handed-out fences. Store errors (a cluster
// that loses its leader) are retried; an acquisition whose reply was lost is given back, and a
// release that fails is left to the store.
func worker(ctx context.Context, s *Store, key string, ttl time.Duration, c *fencedCounter, served *atomic.Int64, stop <-chan struct{}) {
	var w *lockstore.Watch
	defer func() { w.Close() }()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		default:
		}
		owner := fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64())
		callCtx, cancel := context.WithTimeout(ctx, ttl)
		got, err := s.Acquire(callCtx, lockstore.Request{Key: key, Owner: owner, TTL: ttl, Meta: "w"})
		cancel()
		if err != nil {
			gctx, cancel := context.WithTimeout(ctx, time.Second)
			_, _ = s.Release(gctx, key, owner, "", 0) // it may have been taken unseen
			cancel()
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if !got.Acquired {
			if w == nil {
				w, _ = s.Watch(ctx, key)
			}
			select {
			case <-w.C():
			case <-time.After(100 * time.Millisecond):
			case <-stop:
				return
			}
			continue
		}
		handed := got.Fence + rand.Int64N(64)
		c.enter(got.Fence, handed, time.Duration(rand.IntN(500))*time.Microsecond)
		served.Add(1)
		rctx, cancel := context.WithTimeout(ctx, ttl)
		_, _ = s.Release(rctx, key, owner, "", handed)
		cancel()
	}
}

// A hot key hammered from several processes (stores on clients of their own), several
// goroutines each: no two holders at once, fences strictly increasing across grants and
// simulated handoffs, every goroutine served.
func TestHotKeyFromSeveralProcesses(t *testing.T) {
	c := etcdtest.Start(t)
	ctx := bg(t)
	const procs, perProc, want = 4, 5, 300
	var (
		counter fencedCounter
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		served  = make([]atomic.Int64, procs*perProc)
		total   atomic.Int64
	)
	for p := range procs {
		s := newStore(t, c.Client(t))
		for g := range perProc {
			wg.Go(func() { worker(ctx, s, "lock:hot", 2*time.Second, &counter, &served[p*perProc+g], stop) })
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		total.Store(0)
		for i := range served {
			total.Add(served[i].Load())
		}
		if total.Load() >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	// want is the sample the run aims at; a loaded machine may reach fewer within the minute,
	// and the checks hold on any sample that served every goroutine twice over.
	n := counter.check(t)
	t.Logf("%d critical sections checked", n)
	if n < 2*procs*perProc {
		t.Fatalf("%d critical sections in 60s, want at least %d", n, 2*procs*perProc)
	}
	for i := range served {
		if served[i].Load() == 0 {
			t.Errorf("goroutine %d of process %d was never served", i%perProc, i/perProc)
		}
	}
	t.Logf("%d critical sections", n)
}

// A three-member cluster whose leader is SIGKILLed while locks are held and waited on: the
// holders keep their locks through the new leader (refreshes succeed, nobody else is granted
// them), waiters get them with larger fences once released, and a hot key hammered across the
// failover never has two holders or a fence that goes back.
func TestLeaderKilledWhileLocksAreHeldAndWaitedOn(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	ctx := bg(t)
	holder := newStore(t, c.Client(t))
	waiter := newStore(t, c.Client(t))
	const ttl = 2 * time.Second // leases of 3s

	keys := []string{"lock:acct:1", "lock:acct:2", "lock:acct:3"}
	fences := map[string]int64{}
	var watches []*lockstore.Watch
	for _, k := range keys {
		got, err := holder.Acquire(ctx, lockstore.Request{Key: k, Owner: ownerA, TTL: ttl, Meta: "holder"})
		if err != nil || !got.Acquired {
			t.Fatal(got, err)
		}
		fences[k] = got.Fence
		if busy, err := waiter.Acquire(ctx, lockstore.Request{Key: k, Owner: ownerB, TTL: ttl}); err != nil || busy.Acquired {
			t.Fatal(busy, err)
		}
		w, err := waiter.Watch(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		watches = append(watches, w)
	}

	var (
		counter fencedCounter
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		served  atomic.Int64
	)
	for range 2 {
		s := newStore(t, c.Client(t))
		for range 2 {
			wg.Go(func() { worker(ctx, s, "lock:hot", ttl, &counter, &served, stop) })
		}
	}
	// The kill finds the hot key being served, however slow the workers' start.
	waitFor(t, 10*time.Second, "the hot key served before the kill", func() bool { return served.Load() > 0 })

	leader := c.Leader(5 * time.Second)
	leader.Kill()
	killed := time.Now()
	t.Logf("killed leader %s", leader)

	// For four seconds (more than a lease), and on until a refresh went through the new leader
	// (at most ten: on a loaded machine the election and the client's reconnection take
	// longer), the holder renews every 400ms and the waiter tries every 200ms: every refresh
	// that answers must keep every lock, and the waiter is always refused.
	renewals := make([]lockstore.Renewal, len(keys))
	for i, k := range keys {
		renewals[i] = lockstore.Renewal{Key: k, Owner: ownerA, TTL: ttl}
	}
	var lastOK time.Time
	var gap time.Duration // the longest time without a successful refresh
	for time.Since(killed) < 4*time.Second || (lastOK.Before(killed) && time.Since(killed) < 10*time.Second) {
		rctx, cancel := context.WithTimeout(ctx, 400*time.Millisecond)
		call := time.Now()
		errs := holder.RefreshAll(rctx, renewals)
		cancel()
		ok := true
		for i, err := range errs {
			if errors.Is(err, lockstore.ErrNotHeld) {
				t.Fatalf("%s lost during the failover: %v", keys[i], err)
			}
			ok = ok && err == nil
		}
		if ok {
			if !lastOK.IsZero() {
				gap = max(gap, call.Sub(lastOK))
			}
			lastOK = call
		}
		for _, k := range keys {
			actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			got, err := waiter.Acquire(actx, lockstore.Request{Key: k, Owner: ownerB, TTL: ttl})
			cancel()
			if err == nil && got.Acquired {
				t.Fatalf("%s granted to a second holder %v after the leader was killed", k, time.Since(killed))
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if lastOK.Before(killed) {
		t.Fatal("no refresh succeeded through the new leader")
	}
	// A gap longer than the lease (3s) is not a loss by itself: a new leader extends every
	// lease by an election timeout. A loss would have answered ErrNotHeld above.
	t.Logf("new leader %s; longest time without a successful refresh %v", c.Leader(5*time.Second), gap)

	for i, k := range keys {
		// Drain wake-ups from the failover (a watch ended by a lost leader signals).
		select {
		case <-watches[i].C():
		default:
		}
		_, err := holder.Release(ctx, k, ownerA, "", fences[k]+10)
		if errors.Is(err, lockstore.ErrNotHeld) && time.Since(lastOK) > ttl {
			// No refresh answered for longer than the lock's TTL (a loaded machine's failover):
			// the store gave the lock up, as it must; nobody else was granted it meanwhile.
			t.Logf("%s ran out: no refresh for %v", k, time.Since(lastOK))
			continue
		}
		if err != nil {
			t.Fatalf("release of %s through the new leader: %v", k, err)
		}
		select {
		case <-watches[i].C():
		case <-time.After(5 * time.Second):
			t.Fatalf("waiter on %s not woken by the release", k)
		}
		got, err := waiter.Acquire(ctx, lockstore.Request{Key: k, Owner: ownerB, TTL: ttl})
		if err != nil || !got.Acquired || got.Fence <= fences[k]+10 {
			t.Fatalf("waiter's acquisition of %s = %+v, %v; want a fence above %d", k, got, err, fences[k]+10)
		}
	}

	leader.Restart()
	c.WaitReady(20 * time.Second)
	before := served.Load()
	waitFor(t, 10*time.Second, "the hot key served after the restart", func() bool { return served.Load() > before+20 })
	close(stop)
	wg.Wait()
	t.Logf("%d critical sections on the hot key across the failover", counter.check(t))
}

// cutProxy is a TCP proxy between a client and an etcd member that the test can cut: every
// open connection is closed and new ones are refused until Heal.
type cutProxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu    sync.Mutex
	cut   bool                  // guarded by mu
	conns map[net.Conn]struct{} // guarded by mu: both sides of every open connection
}

func startCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.serve)
	t.Cleanup(p.close)
	return p
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

func (p *cutProxy) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		cut := p.cut
		p.mu.Unlock()
		if cut {
			_ = client.Close()
			continue
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		p.conns[client], p.conns[server] = struct{}{}, struct{}{}
		p.mu.Unlock()
		pump := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			_ = dst.Close()
			_ = src.Close()
			p.mu.Lock()
			delete(p.conns, dst)
			delete(p.conns, src)
			p.mu.Unlock()
		}
		p.wg.Go(func() { pump(server, client) })
		p.wg.Go(func() { pump(client, server) })
	}
}

// Cut closes every connection and refuses new ones.
func (p *cutProxy) Cut() {
	p.mu.Lock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
}

// Heal lets new connections through again.
func (p *cutProxy) Heal() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

func (p *cutProxy) close() {
	_ = p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

// A holder cut off from the cluster (its only connection runs through a proxy the test
// cuts): its refreshes fail, the lock is granted to the next holder (a client that is not
// cut off) only once the holder's lease may have expired, counted from the send time of its
// last keep-alive that succeeded, and with a larger fence; once the holder is back, its
// refresh and release answer ErrNotHeld and leave the new holder's lock alone.
func TestHolderCutOffFromTheCluster(t *testing.T) {
	c := etcdtest.Start(t)
	ctx := bg(t)
	member := strings.TrimPrefix(c.Members[0].ClientURL, "http://")
	p := startCutProxy(t, member)
	cut := newStore(t, etcdtest.NewClient(t, "http://"+p.addr()))
	direct := c.Client(t)
	next := newStore(t, direct)
	const ttl = 2 * time.Second // a lease of 3s

	first, err := cut.Acquire(ctx, lockstore.Request{Key: "lock:p", Owner: ownerA, TTL: ttl})
	if err != nil || !first.Acquired {
		t.Fatal(first, err)
	}
	time.Sleep(300 * time.Millisecond) // a background keep-alive or so
	p.Cut()
	l := cut.ourLease(clientv3.LeaseID(get(t, direct, "lock:p").Lease))
	l.mu.Lock()
	lastKeepAlive := l.fresh
	l.mu.Unlock()

	rctx, cancel := context.WithTimeout(ctx, time.Second)
	start := time.Now()
	err = cut.Refresh(rctx, "lock:p", ownerA, ttl)
	cancel()
	if err == nil || errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("refresh cut off from the cluster: %v, want a store error", err)
	}
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Fatalf("refresh took %v past its 1s deadline", d)
	}

	var got lockstore.Acquisition
	for {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		got, err = next.Acquire(actx, lockstore.Request{Key: "lock:p", Owner: ownerB, TTL: 10 * time.Second}) // unrefreshed: long enough for the test
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if got.Acquired {
			break
		}
		if time.Since(lastKeepAlive) > 10*time.Second {
			t.Fatal("the cut-off holder's lock never expired")
		}
		time.Sleep(100 * time.Millisecond)
	}
	granted := time.Now()
	// etcd keeps a lease its TTL from the renewal, which came after the keep-alive's send.
	if d := granted.Sub(lastKeepAlive); d < 3*time.Second {
		t.Fatalf("granted to the next holder %v after the cut-off holder's last keep-alive, before its 3s lease could expire", d)
	}
	if got.Fence <= first.Fence {
		t.Fatalf("next holder's fence %d, not above %d", got.Fence, first.Fence)
	}
	t.Logf("next holder granted %v after the last keep-alive of the cut-off one", granted.Sub(lastKeepAlive))

	p.Heal()
	waitFor(t, 15*time.Second, "the cut-off holder learns it lost the lock", func() bool {
		rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		return errors.Is(cut.Refresh(rctx, "lock:p", ownerA, ttl), lockstore.ErrNotHeld)
	})
	if _, err := cut.Release(ctx, "lock:p", ownerA, "", first.Fence+100); !errors.Is(err, lockstore.ErrNotHeld) {
		t.Fatalf("release by the cut-off holder: %v, want ErrNotHeld", err)
	}
	if kv := get(t, direct, "lock:p"); kv == nil || !ownedBy(kv.Value, ownerB) {
		t.Fatal("the cut-off holder's release touched the next holder's lock")
	}
	if cut.Held() != 0 {
		t.Fatalf("the cut-off store keeps %d entries", cut.Held())
	}
}

// Lock on a store whose only path to etcd is a faulty proxy returns by its context's
// deadline (plus scheduling slack), whatever the fault: a black hole, connections reset and
// refused, the member down, replies held back. The acquisition's outcome is unknown then, and
// its give-back must not hold the caller: the store finishes it in the background.
func TestLockReturnsByItsDeadlineThroughFaults(t *testing.T) {
	faults := proxiedFaults(t)
	const (
		budget = 600 * time.Millisecond
		slack  = 300 * time.Millisecond
	)
	for _, f := range faults {
		healthy(t, f.l)
		f.start()
		for i := range 3 {
			ctx, cancel := context.WithTimeout(context.Background(), budget)
			deadline, _ := ctx.Deadline()
			lease, err := f.l.Lock(ctx, "k")
			if over := time.Since(deadline); over > slack {
				t.Errorf("%s #%d: Lock returned %v past its deadline (%v)", f.name, i+1, over, err)
			}
			cancel()
			if err == nil {
				t.Errorf("%s #%d: Lock succeeded through the fault", f.name, i+1)
				_ = lease.Release(context.Background())
			}
		}
		f.heal()
		healthy(t, f.l)
	}
}

// healthy waits until l takes and releases a lock, failing t after 20s.
func healthy(t *testing.T, l *flightlock.Locker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		lease, err := l.Lock(ctx, "k")
		if err == nil {
			_ = lease.Release(ctx)
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("no lock once the fault healed: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Waiters queued on a key ride out the SIGKILL of the cluster's leader: a proposal the dead
// leader took with it is sent again once a new leader is elected, and a transient error is
// retried within the wait budget, so both waiters get the key in turn once the holder releases
// it, after its lock was renewed through the new leader, though each call of theirs is bounded
// by one TTL. The test waits for both waiters to be refused before the kill, and for the
// renewals before the release, not for fixed times.
func TestWaitersRideOutALeaderKill(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	locker := func(o flightlock.Observer) *flightlock.Locker {
		l, err := flightlock.New(newStore(t, c.Client(t)), flightlock.WithTTL(5*time.Second),
			flightlock.WithWait(20*time.Second), flightlock.WithObserver(o))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	var (
		elected    atomic.Bool  // set once the members agree on a new leader
		renewedNew atomic.Int32 // the holder's successful renewals answered since
	)
	holder := locker(flightlock.Observer{Renewed: func(_ string, err error) {
		if err == nil && elected.Load() {
			renewedNew.Add(1)
		}
	}})
	lease, err := holder.Lock(bg(t), "k")
	if err != nil {
		t.Fatal(err)
	}
	var counter fencedCounter
	errs := make(chan error, 2)
	var asked sync.WaitGroup // until each waiter was refused once, or its Do returned
	for range 2 {
		asked.Add(1)
		refused := sync.OnceFunc(asked.Done)
		w := locker(flightlock.Observer{Retry: func(context.Context, string, int, time.Duration) { refused() }})
		go func() {
			defer refused()
			ctx, cancel := context.WithTimeout(context.Background(), 18*time.Second)
			defer cancel()
			errs <- w.Do(ctx, "k", func(ctx context.Context) error {
				f := flightlock.FromContext(ctx).Fence()
				counter.enter(f, f, 100*time.Millisecond)
				return nil
			})
		}()
	}
	asked.Wait() // both waiters queued, watching the key
	leader := c.Leader(5 * time.Second)
	leader.Kill()
	killed := time.Now()
	t.Logf("new leader %s", c.Leader(20*time.Second))
	elected.Store(true)
	// The holder keeps working through the election: two renewals answered since the members
	// named a new leader, the second sent after the first's reply, so through that leader. A
	// lost lock is renewed no more.
	waitFor(t, 20*time.Second, "two renewals of the holder's lock through the new leader", func() bool {
		return lease.Lost() || renewedNew.Load() >= 2
	})
	if lease.Lost() {
		t.Fatalf("the holder's lock was lost through the election (%v since the kill)", time.Since(killed))
	}
	if err := lease.Release(bg(t)); err != nil {
		t.Fatalf("holder's release through the new leader: %v", err)
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("a queued waiter gave up %v after the leader was killed: %v", time.Since(killed), err)
		}
	}
	if n := counter.check(t); n != 2 {
		t.Errorf("%d waiters served, want 2", n)
	}
}

// Waiters queued on a key held through a leader that is then cut off (frozen: its
// connections stay open, nothing answers) keep waiting within their budget: the holder's
// lease runs out once nothing keeps it alive, and the waiters get the key one after the other,
// although some of their calls went to the frozen member and got no answer.
//
// The waiters' clients ping their connections (DialKeepAliveTime): the etcd client balances
// calls round robin over its members and keeps picking a member whose connection is open
// until a ping goes unanswered. Without pings, every third call of a client goes to the frozen
// member for as long as it stays frozen, whatever the store sends again, and a waiter whose
// calls fall into step with the rotation (each attempt a fixed number of calls) can meet the
// frozen member in every attempt until its wait runs out. The members accept pings every
// 500ms (etcd refuses pings more frequent than --grpc-keepalive-min-time, 5s by default).
func TestWaitersRideOutTheHoldersLeaderCutOff(t *testing.T) {
	c := etcdtest.StartCluster(t, 3, etcdtest.WithFlags("--grpc-keepalive-min-time", "500ms"))
	leader := c.Leader(5 * time.Second)
	const ttl = 3 * time.Second // a lease of 4s
	hs := newStore(t, etcdtest.NewClient(t, leader.ClientURL))
	holder, err := flightlock.New(hs, flightlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	lease, err := holder.Lock(bg(t), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		leader.Thaw()
		_ = lease.Release(context.Background())
	}()
	errs := make(chan error, 2)
	var released sync.WaitGroup
	defer released.Wait()
	var asked sync.WaitGroup // until each waiter was refused once, or its Lock returned
	for range 2 {
		asked.Add(1)
		refused := sync.OnceFunc(asked.Done)
		kcli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 2 * time.Second,
			DialKeepAliveTime: time.Second, DialKeepAliveTimeout: time.Second, PermitWithoutStream: true, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = kcli.Close() })
		w, err := flightlock.New(newStore(t, kcli), flightlock.WithTTL(ttl), flightlock.WithWait(20*time.Second),
			flightlock.WithObserver(flightlock.Observer{Retry: func(context.Context, string, int, time.Duration) { refused() }}))
		if err != nil {
			t.Fatal(err)
		}
		released.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 18*time.Second)
			defer cancel()
			l, err := w.Lock(ctx, "k")
			refused()
			errs <- err
			if err == nil {
				// The Locker bounds a release by one TTL, and a release that fails is retried
				// by the store: the other waiter's wait is what is under test.
				if err := l.Release(context.Background()); err != nil {
					t.Logf("release by a waiter: %v", err)
				}
			}
		})
	}
	asked.Wait() // both waiters queued, watching the key, however slow their first ask
	leader.Freeze()
	cut := time.Now()
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("a queued waiter gave up %v after the holder's leader was cut off: %v", time.Since(cut), err)
		}
	}
	if d := time.Since(cut); d < ttl {
		t.Errorf("a waiter got the key %v after the cut, before the holder's TTL", d)
	}
	select {
	case <-lease.Context().Done():
	default:
		t.Error("the cut-off holder's lease context is still live after another took the key")
	}
}

// Release returns by its context's deadline whatever etcd does: the black hole, resets, the
// member down, replies held back. What it could not finish goes on in the background, bounded
// by one TTL, and nobody else's lock is touched: once the fault heals the key is taken again.
func TestReleaseReturnsByItsDeadlineThroughFaults(t *testing.T) {
	faults := proxiedFaults(t)
	const (
		budget = 600 * time.Millisecond
		slack  = 300 * time.Millisecond
	)
	for _, f := range faults {
		healthy(t, f.l)
		lease, err := f.l.Lock(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		f.start()
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		deadline, _ := ctx.Deadline()
		err = lease.Release(ctx)
		if over := time.Since(deadline); over > slack {
			t.Errorf("%s: Release returned %v past its deadline (%v)", f.name, over, err)
		}
		cancel()
		f.heal()
		healthy(t, f.l)
	}
}

// proxiedFault is one fault between a Locker and its only etcd member, with how to start and
// heal it.
type proxiedFault struct {
	name        string
	l           *flightlock.Locker
	start, heal func()
}

// proxiedFaults starts one member and returns the faults a Locker of its own (2s TTL, 20s
// wait) meets on its way to that member: a black hole, connections reset and refused, the
// member down, replies held back.
func proxiedFaults(t *testing.T) []proxiedFault {
	c := etcdtest.Start(t)
	member := strings.TrimPrefix(c.Members[0].ClientURL, "http://")
	p := redistest.StartProxy(t, member)
	rp := startCutProxy(t, member)
	locker := func(addr string) *flightlock.Locker {
		l, err := flightlock.New(newStore(t, etcdtest.NewClient(t, addr)), flightlock.WithTTL(2*time.Second),
			flightlock.WithWait(20*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	return []proxiedFault{
		{"black hole", locker(p.Addr), func() { p.Stall(time.Hour) }, func() { p.Cut() }},
		{"resets", locker(rp.addr()), rp.Cut, rp.Heal},
		{"member down", locker(p.Addr), c.Members[0].Kill, c.Members[0].Restart},
		{"replies held back", locker(p.Addr), func() { p.SetDelay(time.Hour) }, func() { p.SetDelay(0); p.Cut() }},
	}
}
