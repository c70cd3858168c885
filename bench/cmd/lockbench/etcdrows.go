package main

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/bench/internal/contend"
	"github.com/flightlock/flightlock/bench/internal/guard"
	"github.com/flightlock/flightlock/bench/internal/memstat"
	"github.com/flightlock/flightlock/etcdstore"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Row names, as they appear in the report.
const (
	rowFloor  = "floor"
	rowFlight = "flightlock"
	rowMutex  = "mutex"
)

// flightTTL is the TTL of every flightlock lock here; the etcd leases of the floor and of
// concurrency.Mutex's sessions last flightTTL + 1s, as the store's own leases do (its default
// lease margin).
const flightTTL = 10 * time.Second

const leaseSeconds = 11

// rowResult is one row in one repetition.
type rowResult struct {
	ops             int64         // operations (scenario 1) or critical sections in the window
	window          time.Duration // the measured window
	rate            float64       // ops or critical sections per second
	p50, p99        time.Duration // scenario 1: lock + unlock latency; 2 and 3: Lock's wait
	errors          int64         // failed Locks (each under a bounded context)
	releaseErrors   int64         // failed Releases / Unlocks
	violations      int64         // a critical section that found another one inside
	fenceViolations int64         // flightlock: a fence not larger than the last one seen
	rpcPerOp        float64       // etcd unary RPCs per operation / critical section
	fsyncPerOp      float64       // etcd WAL fsyncs per operation / critical section
	etcdCPU         time.Duration // CPU of the etcd server per operation / critical section
	selfCPU         time.Duration // CPU of this process per operation (scenarios 1 and 2)
	perProc         []int64       // scenario 3: critical sections of each process
	retries         int64         // scenario 4, floor: put-if-absent attempts that found the key taken
}

type etcdBench struct {
	c     *config
	srv   *etcdServer
	cli   *clientv3.Client
	store *etcdstore.Store
	l     *flightlock.Locker

	floorLease clientv3.LeaseID
	floorValue string
	sess       *concurrency.Session   // scenario 1's Mutex session
	hotSess    []*concurrency.Session // scenarios 2 and 4: one per goroutine (a Mutex is one session's)
	kaCancel   context.CancelFunc
}

func newEtcdBench(c *config, srv *etcdServer) (*etcdBench, error) {
	cli, err := srv.client()
	if err != nil {
		return nil, err
	}
	b := &etcdBench{c: c, srv: srv, cli: cli}
	if b.store, b.l, err = newEtcdFlightlock(cli, c.lockTimeout); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Warm-up, and the value flightlock writes: the floor puts a value of the same bytes.
	lease, err := b.l.Lock(ctx, "warm")
	if err != nil {
		return nil, fmt.Errorf("warm-up lock: %w", err)
	}
	kv, err := cli.Get(ctx, "lock:warm")
	if err != nil || len(kv.Kvs) == 0 {
		return nil, fmt.Errorf("read the warm-up key: %v (%d keys)", err, len(kv.Kvs))
	}
	b.floorValue = string(kv.Kvs[0].Value)
	if err := lease.Release(ctx); err != nil {
		return nil, fmt.Errorf("warm-up release: %w", err)
	}
	g, err := cli.Grant(ctx, leaseSeconds)
	if err != nil {
		return nil, fmt.Errorf("grant the floor's lease: %w", err)
	}
	b.floorLease = g.ID
	kaCtx, kaCancel := context.WithCancel(context.Background())
	b.kaCancel = kaCancel
	ka, err := cli.KeepAlive(kaCtx, g.ID)
	if err != nil {
		return nil, fmt.Errorf("keep the floor's lease alive: %w", err)
	}
	go func() {
		for range ka {
		}
	}()
	if b.sess, err = concurrency.NewSession(cli, concurrency.WithTTL(leaseSeconds)); err != nil {
		return nil, fmt.Errorf("mutex session: %w", err)
	}
	for range hotGoroutines {
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(leaseSeconds))
		if err != nil {
			return nil, fmt.Errorf("mutex session: %w", err)
		}
		b.hotSess = append(b.hotSess, s)
	}
	// Warm the Mutex path too (one lock on a key of its own).
	m := concurrency.NewMutex(b.sess, "/mutex/warm")
	if err := m.Lock(ctx); err != nil {
		return nil, fmt.Errorf("mutex warm-up: %w", err)
	}
	_ = m.Unlock(ctx)
	return b, nil
}

func newEtcdFlightlock(cli *clientv3.Client, wait time.Duration) (*etcdstore.Store, *flightlock.Locker, error) {
	store, err := etcdstore.New(cli)
	if err != nil {
		return nil, nil, err
	}
	// The wait budget is as long as the Lock's context bound, so a Lock ends on the bound (an
	// error counted), not on the default 2s budget. Handoff keeps its defaults (64, 20ms).
	l, err := flightlock.New(store, flightlock.WithTTL(flightTTL), flightlock.WithWait(wait))
	if err != nil {
		return nil, nil, err
	}
	return store, l, nil
}

func (b *etcdBench) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = b.l.Drain(ctx)
	_ = b.store.Close()
	for _, s := range append([]*concurrency.Session{b.sess}, b.hotSess...) {
		if s != nil {
			_ = s.Close()
		}
	}
	if b.kaCancel != nil {
		b.kaCancel()
	}
	_ = b.cli.Close()
}

// s1Slice is how long one row runs at a time in scenario 1: the rows take turns in slices of
// it, so that a drift of etcd's speed within a repetition (its WAL and backend commits, the
// tombstones piling up in its index) falls on every row alike instead of on whichever row ran
// when etcd was slower. A row's figures sum its slices.
const s1Slice = 200 * time.Millisecond

// uncontended runs scenario 1 for rows in one repetition, d per row, in turns of s1Slice in
// the order given.
func (b *etcdBench) uncontended(rows []string, rep int) map[string]rowResult {
	return b.uncontendedFor(rows, fmt.Sprint(rep), b.c.d1)
}

// warmUp runs every row of scenario 1 unmeasured for d each: a freshly started etcd commits
// its first writes more slowly, which would tilt the first repetition against its first row.
func (b *etcdBench) warmUp(d time.Duration) {
	b.uncontendedFor([]string{rowFloor, rowFlight, rowMutex}, "w", d)
}

// s1Op is one operation of scenario 1's row: lock and unlock the i-th key of repetition rep.
func (b *etcdBench) s1Op(row, rep string) func(ctx context.Context, i int) (releaseErr, err error) {
	switch row {
	case rowFloor:
		return func(ctx context.Context, i int) (error, error) {
			k := fmt.Sprintf("lock:f-%s-%d", rep, i)
			_, err := b.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
				Then(clientv3.OpPut(k, b.floorValue, clientv3.WithLease(b.floorLease))).Commit()
			if err != nil {
				return nil, err
			}
			_, err = b.cli.Delete(ctx, k)
			return err, nil
		}
	case rowFlight:
		return func(ctx context.Context, i int) (error, error) {
			lease, err := b.l.Lock(ctx, fmt.Sprintf("u-%s-%d", rep, i))
			if err != nil {
				return nil, err
			}
			return lease.Release(ctx), nil
		}
	case rowMutex:
		return func(ctx context.Context, i int) (error, error) {
			m := concurrency.NewMutex(b.sess, fmt.Sprintf("/mutex/u-%s-%d", rep, i))
			if err := m.Lock(ctx); err != nil {
				return nil, err
			}
			return m.Unlock(ctx), nil
		}
	}
	panic("scenario 1: no row " + row)
}

// s1Row is what a row of scenario 1 gathers over its slices.
type s1Row struct {
	op     func(ctx context.Context, i int) (releaseErr, err error)
	next   int // the index of the row's next key
	r      rowResult
	lats   []int64
	server serverStats // summed over the slices
}

func (b *etcdBench) uncontendedFor(rows []string, rep string, d time.Duration) map[string]rowResult {
	acc := make([]*s1Row, len(rows))
	for i, row := range rows {
		acc[i] = &s1Row{op: b.s1Op(row, rep), server: serverStats{ok: true}}
	}
	for left := d; left > 0; left -= s1Slice {
		slice := min(left, s1Slice)
		for _, a := range acc {
			a.runSlice(b, slice)
		}
	}
	out := make(map[string]rowResult, len(rows))
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

// runSlice runs the row's operations for d. The etcd process's CPU is read before the
// closing scrape of /metrics, so that serving the scrape is not counted in the slice.
func (a *s1Row) runSlice(b *etcdBench, d time.Duration) {
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
		case err != nil:
			a.r.errors++
			time.Sleep(time.Millisecond)
		case rerr != nil:
			a.r.releaseErrors++
		default:
			a.lats = append(a.lats, int64(took))
		}
	}
	a.r.window += time.Since(start)
	a.server = a.server.add(b.srv.statsCPUFirst().sub(s0))
}

func (r *rowResult) setServer(st serverStats) {
	if !st.ok || r.ops == 0 {
		r.rpcPerOp, r.fsyncPerOp = -1, -1
		return
	}
	r.rpcPerOp = st.rpcs / float64(r.ops)
	r.fsyncPerOp = st.fsyncs / float64(r.ops)
	r.etcdCPU = st.cpu / time.Duration(r.ops)
	r.selfCPU = st.self / time.Duration(r.ops)
}

func percentiles(v []int64) (p50, p99 time.Duration) {
	if len(v) == 0 {
		return 0, 0
	}
	slices.Sort(v)
	at := func(p float64) time.Duration { return time.Duration(v[int(p*float64(len(v)-1))]) }
	return at(0.50), at(0.99)
}

// hotGoroutines contend for the hot key of scenario 2, and draw from the keys of scenario 4.
const hotGoroutines = 64

// lockerHolder is a goroutine's hold on a flightlock Locker, whatever its store (the etcd and
// ZooKeeper rows).
type lockerHolder struct {
	l     *flightlock.Locker
	keys  []string
	lease *flightlock.Lease
}

func (h *lockerHolder) Lock(ctx context.Context, k int) (int64, error) {
	lease, err := h.l.Lock(ctx, h.keys[k])
	if err != nil {
		return 0, err
	}
	h.lease = lease
	return lease.Fence(), nil
}

func (h *lockerHolder) Unlock(ctx context.Context) error { return h.lease.Release(ctx) }

// etcdMutexHolder holds one Mutex per key on its goroutine's own session (a Mutex belongs to
// one session, and two Mutexes of one session on one key would both be granted), made on the
// key's first use.
type etcdMutexHolder struct {
	sess *concurrency.Session
	keys []string
	ms   map[int]*concurrency.Mutex
	held *concurrency.Mutex
}

func (h *etcdMutexHolder) Lock(ctx context.Context, k int) (int64, error) {
	m := h.ms[k]
	if m == nil {
		m = concurrency.NewMutex(h.sess, h.keys[k])
		h.ms[k] = m
	}
	if err := m.Lock(ctx); err != nil {
		return 0, err
	}
	h.held = m
	return 0, nil
}

func (h *etcdMutexHolder) Unlock(ctx context.Context) error { return h.held.Unlock(ctx) }

// etcdFloorHolder is the floor: a transaction that puts the key on the pre-granted lease if
// its create revision is 0, retried at once while the key is taken (each such attempt counted
// in retries, not as a lock), then a delete.
type etcdFloorHolder struct {
	cli     *clientv3.Client
	lease   clientv3.LeaseID
	value   string
	keys    []string
	held    string
	retries *atomic.Int64
}

func (h *etcdFloorHolder) Lock(ctx context.Context, k int) (int64, error) {
	key := h.keys[k]
	for {
		resp, err := h.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, h.value, clientv3.WithLease(h.lease))).Commit()
		if err != nil {
			return 0, err
		}
		if resp.Succeeded {
			h.held = key
			return 0, nil
		}
		h.retries.Add(1)
	}
}

func (h *etcdFloorHolder) Unlock(ctx context.Context) error {
	_, err := h.cli.Delete(ctx, h.held)
	return err
}

// prefixed is keys, each behind prefix: the key names of one row.
func prefixed(prefix string, keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = prefix + k
	}
	return out
}

// holders returns n holders of row on keys: flightlock on the benchmark's Locker, a Mutex
// goroutine on session i (b.sessions(n) must have made them), the floor on its lease.
func (b *etcdBench) holders(row string, keys []string, n int, retries *atomic.Int64) []contend.Holder {
	hs := make([]contend.Holder, n)
	for i := range hs {
		switch row {
		case rowFlight:
			hs[i] = &lockerHolder{l: b.l, keys: keys}
		case rowMutex:
			hs[i] = &etcdMutexHolder{sess: b.hotSess[i], keys: prefixed("/mutex/", keys), ms: map[int]*concurrency.Mutex{}}
		case rowFloor:
			hs[i] = &etcdFloorHolder{cli: b.cli, lease: b.floorLease, value: b.floorValue, keys: prefixed("lock:f", keys), retries: retries}
		default:
			fatalf("etcd: no row %q", row)
		}
	}
	return hs
}

// hotInProcess runs scenario 2 for one row: hotGoroutines goroutines of this process on one key.
func (b *etcdBench) hotInProcess(row string, rep int) rowResult {
	return b.contendRun(row, []string{fmt.Sprintf("hot-%d", rep)}, hotGoroutines, b.c.d2, 0)
}

// contendRun runs n goroutines of this process for d on keys, each operation on a key drawn
// uniformly (scenarios 2 and 4, and scenario 8's goroutines and keys axes): the shared loop
// under contend.Window, a critical section counting when it ends inside the window. The
// server's counters are read at the window's start and end.
func (b *etcdBench) contendRun(row string, keys []string, n int, d time.Duration, seed uint64) rowResult {
	var retries atomic.Int64
	hs := b.holders(row, keys, n, &retries)
	gs := make([]guard.Guard, len(keys))
	for i := range gs {
		gs[i] = guard.New()
	}
	start := time.Now().Add(20 * time.Millisecond)
	end := start.Add(d)
	var s0, s1 serverStats
	statsDone := make(chan struct{})
	go func() {
		time.Sleep(time.Until(start))
		s0 = b.srv.stats()
		time.Sleep(time.Until(end))
		s1 = b.srv.stats()
		close(statsDone)
	}()
	cr := contend.Run(hs, gs, start, seed, contend.Window(end, b.c.lockTimeout))
	<-statsDone
	r := rowResult{
		ops: cr.Ops, window: d, rate: float64(cr.Ops) / d.Seconds(),
		errors: cr.Errors, releaseErrors: cr.ReleaseErrors, retries: retries.Load(),
	}
	for _, g := range gs {
		r.violations += g.Violations()
		r.fenceViolations += g.FenceViolations()
	}
	r.p50, r.p99 = percentiles(cr.Waits)
	r.setServer(s1.sub(s0))
	return r
}

// sessions makes sure b.hotSess holds at least n Mutex sessions (a Mutex is one session's, so
// every goroutine contending for one key needs a session of its own). The new ones are
// granted sessionMakers at a time: one lease grant each, one Raft write.
func (b *etcdBench) sessions(n int) error {
	add := n - len(b.hotSess)
	if add <= 0 {
		return nil
	}
	made := make([]*concurrency.Session, add)
	errs, first := memstat.Parallel(add, sessionMakers, func(i int) (err error) {
		made[i], err = concurrency.NewSession(b.cli, concurrency.WithTTL(leaseSeconds))
		return err
	})
	for _, s := range made {
		if s != nil {
			b.hotSess = append(b.hotSess, s)
		}
	}
	if errs > 0 {
		return fmt.Errorf("%d of %d mutex sessions: %w", errs, add, first)
	}
	return nil
}

// closeSessionsBeyond closes the Mutex sessions past the first n (their leases' keep-alives
// would otherwise load etcd and this process in the scenarios that follow).
func (b *etcdBench) closeSessionsBeyond(n int) {
	if len(b.hotSess) <= n {
		return
	}
	extra := b.hotSess[n:]
	b.hotSess = b.hotSess[:n]
	memstat.Parallel(len(extra), sessionMakers, func(i int) error { return extra[i].Close() })
}

// sessionMakers is how many goroutines grant or revoke sessions at once.
const sessionMakers = 32
