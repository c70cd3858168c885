package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/flightlock/flightlock"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Scenario 4: c.hot goroutines of this process, each operation on a key drawn uniformly from
// c.keys. A guard per key; the floor retries at once when its put-if-absent finds the key
// taken (each such attempt is counted as a retry, not as a lock).

// keyedContender is one goroutine's way to take and give up key k of scenario 4.
type keyedContender interface {
	lock(ctx context.Context, k int) (fence, retries int64, err error) // fence 0: the lock has none
	unlock(ctx context.Context) error
}

type flightKeyed struct {
	l      *flightlock.Locker
	prefix string
	lease  *flightlock.Lease
}

func (c *flightKeyed) lock(ctx context.Context, k int) (int64, int64, error) {
	lease, err := c.l.Lock(ctx, fmt.Sprintf("%s%d", c.prefix, k))
	if err != nil {
		return 0, 0, err
	}
	c.lease = lease
	return lease.Fence(), 0, nil
}

func (c *flightKeyed) unlock(ctx context.Context) error { return c.lease.Release(ctx) }

// mutexKeyed holds one Mutex per key on its goroutine's own session (a Mutex belongs to one
// session), made on the key's first use.
type mutexKeyed struct {
	sess   *concurrency.Session
	prefix string
	ms     map[int]*concurrency.Mutex
	held   *concurrency.Mutex
}

func (c *mutexKeyed) lock(ctx context.Context, k int) (int64, int64, error) {
	m := c.ms[k]
	if m == nil {
		m = concurrency.NewMutex(c.sess, fmt.Sprintf("%s%d", c.prefix, k))
		c.ms[k] = m
	}
	if err := m.Lock(ctx); err != nil {
		return 0, 0, err
	}
	c.held = m
	return 0, 0, nil
}

func (c *mutexKeyed) unlock(ctx context.Context) error { return c.held.Unlock(ctx) }

// floorKeyed is the floor: a transaction that puts the key on the pre-granted lease if its
// create revision is 0 (retried at once while the key is taken), then a delete.
type floorKeyed struct {
	cli    *clientv3.Client
	lease  clientv3.LeaseID
	value  string
	prefix string
	held   string
}

func (c *floorKeyed) lock(ctx context.Context, k int) (int64, int64, error) {
	key := fmt.Sprintf("%s%d", c.prefix, k)
	var retries int64
	for {
		resp, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, c.value, clientv3.WithLease(c.lease))).Commit()
		if err != nil {
			return 0, retries, err
		}
		if resp.Succeeded {
			c.held = key
			return 0, retries, nil
		}
		retries++
	}
}

func (c *floorKeyed) unlock(ctx context.Context) error {
	_, err := c.cli.Delete(ctx, c.held)
	return err
}

type keysResult struct {
	contendResult
	retries int64
}

// contendKeys runs one goroutine per contender from start until end, each operation on a key
// drawn uniformly from nkeys, checked against that key's guard; an operation counts when its
// critical section ends inside the window.
func contendKeys(cs []keyedContender, gs []guard, start, end time.Time, lockTO time.Duration, seed uint64) keysResult {
	time.Sleep(time.Until(start))
	var (
		mu  sync.Mutex
		res keysResult
		wg  sync.WaitGroup
	)
	for i, c := range cs {
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		wg.Go(func() {
			var n, errs, rerrs, retries int64
			var waits []int64
			for time.Now().Before(end) {
				k := rng.IntN(len(gs))
				g := gs[k]
				ctx, cancel := context.WithTimeout(context.Background(), lockTO)
				t0 := time.Now()
				fence, rt, err := c.lock(ctx, k)
				retries += rt
				if err != nil {
					cancel()
					errs++
					time.Sleep(time.Millisecond)
					continue
				}
				wait := time.Since(t0)
				g.critical(fence)
				if !time.Now().After(end) {
					n++
					waits = append(waits, int64(wait))
				}
				if err := c.unlock(ctx); err != nil {
					rerrs++
				}
				cancel()
			}
			mu.Lock()
			res.CS += n
			res.Errors += errs
			res.ReleaseErrors += rerrs
			res.retries += retries
			res.Waits = append(res.Waits, waits...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return res
}

// manyKeys runs scenario 4 for one row: c.hot goroutines of this process over c.keys keys.
func (b *bench) manyKeys(row string, rep int) rowResult {
	return b.keysRun(row, fmt.Sprintf("k4-%d-", rep), b.c.keys, b.c.hot, b.c.d4, uint64(rep))
}

// keysRun runs n goroutines of this process for d, each operation on a key drawn uniformly
// from nkeys fresh keys named after prefix (scenario 4, and scenario 5's keys axis). A Mutex
// goroutine uses session i (b.sessions(n) must have made them).
func (b *bench) keysRun(row, prefix string, nkeys, n int, d time.Duration, seed uint64) rowResult {
	cs := make([]keyedContender, n)
	for i := range cs {
		switch row {
		case rowFlight:
			cs[i] = &flightKeyed{l: b.l, prefix: prefix}
		case rowMutex:
			cs[i] = &mutexKeyed{sess: b.hotSess[i], prefix: "/mutex/" + prefix, ms: map[int]*concurrency.Mutex{}}
		case rowFloor:
			cs[i] = &floorKeyed{cli: b.cli, lease: b.floorLease, value: b.floorValue, prefix: "lock:f" + prefix}
		}
	}
	gs := make([]guard, nkeys)
	for i := range gs {
		gs[i] = newLocalGuard()
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
	cr := contendKeys(cs, gs, start, end, b.c.lockTO, seed)
	<-statsDone
	r := rowResult{
		ops: cr.CS, window: d, rate: float64(cr.CS) / d.Seconds(),
		errors: cr.Errors, releaseErrors: cr.ReleaseErrors, retries: cr.retries,
	}
	for _, g := range gs {
		r.violations += *g.violations
		r.fenceViolations += *g.fenceViolations
	}
	r.p50, r.p99 = percentiles(cr.Waits)
	r.setServer(s1.sub(s0))
	return r
}
