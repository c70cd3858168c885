package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/bench/internal/contend"
	"github.com/flightlock/flightlock/bench/internal/guard"
	"github.com/flightlock/flightlock/zkstore"
)

// The ZooKeeper rows (-store zookeeper): flightlock on zkstore, go-zookeeper's own lock recipe
// (zk.NewLock), and the floor, a bare Create + Delete of an ephemeral node. rowFloor and
// rowFlight are the etcd rows' names.
const (
	// rowZKLock is zk.NewLock on a lock node that exists: the recipe's steady state on a key
	// it has seen (it never deletes the node it locks under).
	rowZKLock = "zklock"
	// rowZKLockFresh is zk.NewLock on a path of its own per operation: the recipe's first use
	// of a key, which creates the lock node (and leaves it behind).
	rowZKLockFresh = "zklock-fresh"
)

// The nodes each row works under; flightlock's are zkstore's default root.
const (
	zkFloorRoot = "/floor"
	zkLockRoot  = "/zklock"
)

// zkResult is one row in one repetition.
type zkResult struct {
	ops             int64 // operations (scenario 1) or critical sections in the window
	window          time.Duration
	rate            float64       // ops or critical sections per second
	p50, p99        time.Duration // scenario 1: lock + unlock latency; 2 and 3: Lock's wait
	errors          int64         // failed Locks, and failed Releases / Unlocks
	violations      int64         // a critical section that found another one inside
	fenceViolations int64         // flightlock: a fence not larger than the last one seen
	packetsPerOp    float64       // requests (pings included) the server received per operation; -1: unknown
	fsyncsPerOp     float64       // fsyncs of the server's transaction log per operation; -1: unknown
	serverCPU       time.Duration // CPU of the server per operation
	selfCPU         time.Duration // CPU of this process per operation (scenarios 1 and 2)
	perProc         []int64       // scenario 3: critical sections of each process
	firstErr        string        // the first error, of any process
}

func (r *zkResult) setServer(st zkStats) {
	if !st.ok || r.ops == 0 {
		r.packetsPerOp, r.fsyncsPerOp = -1, -1
		return
	}
	r.packetsPerOp = st.packets / float64(r.ops)
	r.fsyncsPerOp = st.fsyncs / float64(r.ops)
	r.serverCPU = st.cpu / time.Duration(r.ops)
	r.selfCPU = st.self / time.Duration(r.ops)
}

type zkBench struct {
	c     *config
	srv   *zkServer
	conn  *zk.Conn // the floor's and zk.NewLock's session
	store *zkstore.Store
	l     *flightlock.Locker
	acl   []zk.ACL

	floorValue []byte   // the bytes flightlock writes in a key node
	s1Lock     *zk.Lock // scenario 1's zk.NewLock on a node that exists
}

// zkConnect opens a session on the server at addr and waits for it, as zkstore.Dial does; the
// client's log is discarded.
func zkConnect(addr string, session time.Duration) (*zk.Conn, error) {
	conn, events, err := zk.Connect([]string{addr}, session, zk.WithLogger(log.New(io.Discard, "", 0)))
	if err != nil {
		return nil, err
	}
	deadline := time.After(session)
	for up := false; !up; {
		select {
		case ev := <-events:
			up = ev.State == zk.StateHasSession
		case <-deadline:
			conn.Close()
			return nil, fmt.Errorf("no session with %s within %v", addr, session)
		}
	}
	go func() { // the client blocks on a full event channel: drain it for as long as it lives
		for range events {
		}
	}()
	return conn, nil
}

// newZKFlightlock dials zkstore and builds the Locker of every flightlock row: the TTL of the
// other stores' rows (which the session must keep: zkstore.Store.MaxTTL) and a wait budget as
// long as the Lock's context bound.
func newZKFlightlock(addr string, session, wait time.Duration) (*zkstore.Store, *flightlock.Locker, error) {
	store, err := zkstore.Dial(zkstore.Config{Hosts: []string{addr}, SessionTimeout: session})
	if err != nil {
		return nil, nil, err
	}
	l, err := flightlock.New(store, flightlock.WithTTL(flightTTL), flightlock.WithWait(wait))
	if err != nil {
		_ = store.Close()
		return nil, nil, fmt.Errorf("%w (zkstore's MaxTTL is %v with a %v session)", err, store.MaxTTL(), session)
	}
	return store, l, nil
}

func newZKBench(c *config, srv *zkServer) (*zkBench, error) {
	b := &zkBench{c: c, srv: srv, acl: zk.WorldACL(zk.PermAll)}
	var err error
	if b.conn, err = zkConnect(srv.addr, c.zkSession); err != nil {
		return nil, err
	}
	if b.store, b.l, err = newZKFlightlock(srv.addr, c.zkSession, c.lockTimeout); err != nil {
		return nil, err
	}
	for _, p := range []string{zkFloorRoot, zkLockRoot} {
		if _, err := b.conn.Create(p, nil, 0, b.acl); err != nil {
			return nil, fmt.Errorf("create %s: %w", p, err)
		}
	}
	// The floor writes what flightlock writes in a key node: read it off a held lock.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lease, err := b.l.Lock(ctx, "warm")
	if err != nil {
		return nil, fmt.Errorf("warm-up lock: %w", err)
	}
	if b.floorValue, _, err = b.conn.Get(b.store.Root() + "/lock:warm"); err != nil { // the Locker's default key prefix
		return nil, fmt.Errorf("read the warm-up key node: %w", err)
	}
	if err := lease.Release(ctx); err != nil {
		return nil, fmt.Errorf("warm-up release: %w", err)
	}
	b.s1Lock = zk.NewLock(b.conn, zkLockRoot+"/s1", b.acl)
	return b, nil
}

func (b *zkBench) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = b.l.Drain(ctx)
	_ = b.store.Close()
	b.conn.Close()
}

// zkS1Op is one operation of scenario 1's row: lock and unlock the i-th key of repetition rep.
func (b *zkBench) s1Op(row, rep string) func(ctx context.Context, i int) (releaseErr, err error) {
	switch row {
	case rowFloor:
		return func(_ context.Context, i int) (error, error) {
			p := fmt.Sprintf("%s/f-%s-%d", zkFloorRoot, rep, i)
			if _, err := b.conn.Create(p, b.floorValue, zk.FlagEphemeral, b.acl); err != nil {
				return nil, err
			}
			return b.conn.Delete(p, -1), nil
		}
	case rowFlight:
		return func(ctx context.Context, i int) (error, error) {
			lease, err := b.l.Lock(ctx, fmt.Sprintf("u-%s-%d", rep, i))
			if err != nil {
				return nil, err
			}
			return lease.Release(ctx), nil
		}
	case rowZKLock:
		return func(context.Context, int) (error, error) {
			if err := b.s1Lock.Lock(); err != nil {
				return nil, err
			}
			return b.s1Lock.Unlock(), nil
		}
	case rowZKLockFresh:
		return func(_ context.Context, i int) (error, error) {
			l := zk.NewLock(b.conn, fmt.Sprintf("%s/u-%s-%d", zkLockRoot, rep, i), b.acl)
			if err := l.Lock(); err != nil {
				return nil, err
			}
			return l.Unlock(), nil
		}
	}
	panic("scenario 1: no row " + row)
}

// zkS1Row is what a row of scenario 1 gathers over its slices.
type zkS1Row struct {
	op     func(ctx context.Context, i int) (releaseErr, err error)
	next   int // the index of the row's next key
	r      zkResult
	lats   []int64
	server zkStats // summed over the slices
}

// uncontended runs scenario 1 for rows in one repetition, d per row, the rows taking turns in
// slices of s1Slice in the order given (as the etcd rows do, so that a server that speeds up
// or slows down within a repetition, a JVM still compiling, falls on every row alike).
func (b *zkBench) uncontended(rows []string, rep string, d time.Duration) map[string]zkResult {
	acc := make([]*zkS1Row, len(rows))
	for i, row := range rows {
		acc[i] = &zkS1Row{op: b.s1Op(row, rep), server: zkStats{ok: true}}
	}
	for left := d; left > 0; left -= s1Slice {
		slice := min(left, s1Slice)
		for _, a := range acc {
			a.runSlice(b, slice)
		}
	}
	out := make(map[string]zkResult, len(rows))
	for i, row := range rows {
		a := acc[i]
		a.r.ops = int64(len(a.lats))
		a.r.rate = float64(a.r.ops) / a.r.window.Seconds()
		a.r.p50, a.r.p99 = percentiles(a.lats)
		a.r.setServer(a.server)
		out[row] = a.r
	}
	return out
}

func (a *zkS1Row) runSlice(b *zkBench, d time.Duration) {
	s0 := b.srv.stats()
	start := time.Now()
	end := start.Add(d)
	for time.Now().Before(end) {
		ctx, cancel := context.WithTimeout(context.Background(), b.c.lockTimeout)
		t0 := time.Now()
		rerr, err := a.op(ctx, a.next)
		took := time.Since(t0)
		cancel()
		a.next++
		switch {
		case err != nil, rerr != nil:
			a.r.errors++
			time.Sleep(time.Millisecond)
		default:
			a.lats = append(a.lats, int64(took))
		}
	}
	a.r.window += time.Since(start)
	a.server = a.server.add(b.srv.statsCPUFirst().sub(s0))
}

// zkLockHolder is a goroutine's zk.NewLock on each key it uses, made on the key's first use:
// a zk.Lock is one holder's (it remembers the node it created), and every holder of a process
// shares the process's session, as the goroutines of a service share its client.
type zkLockHolder struct {
	conn *zk.Conn
	acl  []zk.ACL
	keys []string
	ls   map[int]*zk.Lock
	held *zk.Lock
}

// Lock takes key k. The recipe takes no context: it waits until it holds the lock or the
// session fails, so the Lock's bound does not apply to this row.
func (h *zkLockHolder) Lock(_ context.Context, k int) (int64, error) {
	l := h.ls[k]
	if l == nil {
		l = zk.NewLock(h.conn, zkLockRoot+"/"+h.keys[k], h.acl)
		h.ls[k] = l
	}
	if err := l.Lock(); err != nil {
		return 0, err
	}
	h.held = l
	return 0, nil
}

func (h *zkLockHolder) Unlock(context.Context) error { return h.held.Unlock() }

// holders returns n holders of row on keys: flightlock on the benchmark's Locker, zk.NewLock
// on the benchmark's session.
func (b *zkBench) holders(row string, keys []string, n int) []contend.Holder {
	return zkHolders(row, b.l, b.conn, b.acl, keys, n)
}

func zkHolders(row string, l *flightlock.Locker, conn *zk.Conn, acl []zk.ACL, keys []string, n int) []contend.Holder {
	hs := make([]contend.Holder, n)
	for i := range hs {
		switch row {
		case rowFlight:
			hs[i] = &lockerHolder{l: l, keys: keys}
		case rowZKLock:
			hs[i] = &zkLockHolder{conn: conn, acl: acl, keys: keys, ls: map[int]*zk.Lock{}}
		default:
			fatalf("zookeeper: no contended row %q", row)
		}
	}
	return hs
}

// hotInProcess runs scenario 2 for one row: hotGoroutines goroutines of this process on one
// key, counted in one window (contend.Window, as the etcd rows), the server's counters read at
// its start and end.
func (b *zkBench) hotInProcess(row string, rep int) zkResult {
	keys := []string{fmt.Sprintf("hot-%d", rep)}
	hs := b.holders(row, keys, hotGoroutines)
	g := guard.New()
	d := b.c.d2
	start := time.Now().Add(20 * time.Millisecond)
	end := start.Add(d)
	var s0, s1 zkStats
	statsDone := make(chan struct{})
	go func() {
		time.Sleep(time.Until(start))
		s0 = b.srv.stats()
		time.Sleep(time.Until(end))
		s1 = b.srv.statsCPUFirst()
		close(statsDone)
	}()
	cr := contend.Run(hs, []guard.Guard{g}, start, 0, contend.Window(end, b.c.lockTimeout))
	<-statsDone
	r := zkResult{
		ops: cr.Ops, window: d, rate: float64(cr.Ops) / d.Seconds(), errors: cr.Errors + cr.ReleaseErrors,
		violations: g.Violations(), fenceViolations: g.FenceViolations(),
	}
	if r.firstErr = cr.FirstErr; r.firstErr != "" {
		progress("  2 %s: first error: %s", row, cr.FirstErr)
	}
	r.p50, r.p99 = percentiles(cr.Waits)
	r.setServer(s1.sub(s0))
	return r
}
