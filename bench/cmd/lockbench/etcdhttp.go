package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/zeromicro/go-zero/rest"

	"github.com/flightlock/flightlock/bench/internal/cpustat"
	"github.com/flightlock/flightlock/bench/internal/httpbench"
	"github.com/flightlock/flightlock/bench/internal/redisserver"
	"github.com/flightlock/flightlock/bench/internal/stat"
	"github.com/flightlock/flightlock/example/app"
	flmw "github.com/flightlock/flightlock/middleware"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Scenario 6 on etcd, HTTP end to end, as for the Redis rows: the example's
// create-order endpoint under wrk, every request on a uid of its own, with the order API's
// lock on the benchmark's etcd:
//
//   - none: app.WithoutOrderLock();
//   - flightlock: the example's order rules (-example-config, the etcd example) with the
//     create-order rule moved to etcd (Store: etcd), its middleware built from Order.Lock and
//     installed with app.WithOrderLock like the other rows' (see startSystem);
//   - mutex: app.WithOrderLock(httpbench.OrderMiddleware(...)) around concurrency.Mutex's
//     TryLock on one session (11s lease, the store's TTL + margin), a plain go-zero middleware;
//   - floor: the same middleware with the raw floor of scenario 1 (a transaction that puts the
//     key on a lease if its create revision is 0, 409 otherwise; then a delete).
//
// The example keeps its state (stock, balances, orders) and its Redis locks (the inventory
// service's SKU lock) in Redis: a redis-server this command starts for the scenario, as
// the Redis rows'; the balance service locks its accounts in etcd, as the etcd example does. Each
// row is a whole system of its own in this process, started once; only the order API's lock
// differs between rows, and in every row the order is written unfenced.

// etcdHTTPRow is one lock of the order API; prefix starts the uids of its requests.
type etcdHTTPRow struct{ id, label, prefix string }

var etcdHTTPRows = []etcdHTTPRow{
	{"none", "no lock", "n"},
	{rowFlight, "flightlock (the example's order rules, create-order on etcd)", "f"},
	{rowMutex, "etcd concurrency.Mutex TryLock (plain go-zero middleware)", "m"},
	{rowFloor, "floor: txn put on a lease if absent + delete (plain middleware)", "s"},
}

// httpResults is scenario 6.
type httpResults struct {
	rows []etcdHTTPRow
	// low[row][k] is low-load round k (of every repetition); sat[row][rep] a saturation run.
	low, sat map[string][]map[string]float64
	getRT    []float64 // per low-load round: median latency of an etcd Get, ns
	idleCPU  float64   // cores this process used with every system up and no load
	conf     string
	note     string // why the scenario did not run
}

// The redis-server of the example's state, while scenario 6 runs; a signal ends it by pid.
var (
	stateRedisMu sync.Mutex
	stateRedis   *redisserver.Server
)

func stopStateRedis() {
	stateRedisMu.Lock()
	defer stateRedisMu.Unlock()
	stateRedis.Stop()
	stateRedis = nil
}

func (b *etcdBench) http() *httpResults {
	res := &httpResults{conf: b.c.exampleConf}
	if res.note = httpbench.NotRunnable(b.c.exampleConf); res.note != "" {
		return res
	}
	wrk, err := httpbench.NewWrk()
	if err != nil {
		fatalf("s8: %v", err)
	}
	defer wrk.Close()
	logf := func(format string, args ...any) { progress("  6 "+format, args...) }
	wrk.Track, wrk.Logf = workers.Track, logf

	rs, err := redisserver.Start("lockbench-etcd-state-redis-*.log")
	if err != nil {
		fatalf("s8: %v", err)
	}
	stateRedisMu.Lock()
	stateRedis = rs
	stateRedisMu.Unlock()
	defer stopStateRedis()
	logf("redis-server (the example's state) pid %d on %s", rs.Pid(), rs.Addr)

	res.rows = etcdHTTPRows
	var systems []*httpbench.System
	for _, r := range etcdHTTPRows {
		systems = append(systems, b.startSystem(r, rs.Addr))
	}
	defer httpbench.Stop(systems, logf)

	loads, err := httpbench.Schedule{
		Reps: b.c.reps,
		Low:  httpbench.WholeSeconds(b.c.d6low),
		Sat:  httpbench.WholeSeconds(b.c.d6),
		Measure: func(s *httpbench.System, conns int, d time.Duration, expect float64) (map[string]float64, error) {
			return b.wrkRun(wrk, s, conns, d, expect, rs.Pid())
		},
		RoundTrip: func() float64 { return b.getMedian(300 * time.Millisecond) },
		Logf:      logf,
		SatNote: func(m map[string]float64) string {
			return fmt.Sprintf("RPC/req %.2f cpu svc %.0f%% etcd %.0f%% redis %.0f%% wrk %.0f%% other %.0f%%", m["rpcs"],
				100*m["svc_share"], 100*m["etcd_share"], 100*m["redis_share"], 100*m["wrk_share"], 100*m["other_share"])
		},
	}.Run(systems)
	if err != nil {
		fatalf("s8 %v", err)
	}
	res.low, res.sat, res.getRT, res.idleCPU = loads.Low, loads.Sat, loads.RoundTrips, loads.IdleCPU
	return res
}

// startSystem builds and starts the example for one row from the example's config file,
// its Redis pointed at redisAddr, its etcd sections at the benchmark's etcd, on free ports.
func (b *etcdBench) startSystem(r etcdHTTPRow, redisAddr string) *httpbench.System {
	c, ports, err := httpbench.Load(b.c.exampleConf)
	if err != nil {
		fatalf("s8: %v", err)
	}
	httpbench.PointRedis(&c, redisAddr)
	if len(c.Order.Lock.Etcd.Hosts) == 0 {
		fatalf("s8: %s: Order.Lock names no etcd (Etcd.Hosts): not the etcd example", b.c.exampleConf)
	}
	// The services' etcd sections (Order's, Balance's) go to the benchmark's etcd.
	host := strings.TrimPrefix(b.srv.clientURL, "http://")
	for _, ec := range []*flmw.EtcdConf{&c.Order.Lock.Etcd, &c.Inventory.Lock.Etcd, &c.Balance.Lock.Etcd} {
		if len(ec.Hosts) > 0 {
			ec.Hosts = []string{host}
		}
	}
	// The replaced rows lock the key flightlock would: Etcd.Key + Prefix + "order:" + uid.
	prefix := c.Order.Lock.Etcd.Key + c.Order.Lock.Prefix
	var (
		mw     rest.Middleware // nil: no lock (app.WithoutOrderLock)
		closes []func()
	)
	switch r.id {
	case rowFlight:
		// The order API's own rules with create-order moved to etcd (Store: etcd), in a
		// middleware of their own, as every other row installs its lock. Installed as shipped
		// (app.New builds it from Order.Lock) every create-order would answer 500: the example's
		// order logic looks for its fencing lease under Prefix + "order:" + uid, a Redis rule's
		// key, and an etcd lock's lease is Etcd.Key + Prefix + "order:" + uid. Installed this way
		// the order is written unfenced, as in the other rows. Its Redis rules (place-order) go to
		// the benchmark's redis-server.
		lc := etcdOrderLock(c.Order.Lock, redisAddr)
		var closeMW func()
		if mw, closeMW, err = httpbench.OrderRules(lc, func(r *flmw.Rule) { r.Store = "etcd" }, flmw.WithServerTimeout(c.Order.Timeout)); err != nil {
			fatalf("s8 %s: %v", r.id, err)
		}
		closes = append(closes, closeMW)
	case rowMutex:
		mw = httpbench.OrderMiddleware(mutexTryLock(b.sess), prefix, c.Order.Lock.TTL)
	case rowFloor:
		mw = httpbench.OrderMiddleware(b.floorLock, prefix, c.Order.Lock.TTL)
	}
	s, err := httpbench.Start(r.id, r.prefix, c, ports, closes, app.WithOrderLock(mw))
	if err != nil {
		fatalf("s8 %s: %v", r.id, err)
	}
	return s
}

// mutexTryLock is one concurrency.Mutex TryLock on session s (the example's OnBusy: reject);
// the lock lives as long as the session's lease is kept alive, whatever ttl says.
func mutexTryLock(s *concurrency.Session) httpbench.LockFunc {
	return func(ctx context.Context, key string, _ time.Duration) (func(context.Context) error, error) {
		m := concurrency.NewMutex(s, key)
		if err := m.TryLock(ctx); err != nil {
			if errors.Is(err, concurrency.ErrLocked) {
				return nil, httpbench.ErrBusy
			}
			return nil, err
		}
		return m.Unlock, nil
	}
}

// floorLock is the raw floor in a lock's place: put the key on the floor's lease if its
// create revision is 0 (busy otherwise), then delete it. No owner check on the delete.
func (b *etcdBench) floorLock(ctx context.Context, key string, _ time.Duration) (func(context.Context) error, error) {
	resp, err := b.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, b.floorValue, clientv3.WithLease(b.floorLease))).Commit()
	if err != nil {
		return nil, err
	}
	if !resp.Succeeded {
		return nil, httpbench.ErrBusy
	}
	return func(ctx context.Context) error {
		_, err := b.cli.Delete(ctx, key)
		return err
	}, nil
}

// wrkRun runs wrk against s and returns the run's figures (httpbench.Run.Metrics) with, per
// request, the etcd unary RPCs and fsyncs, the CPU µs of the service (this process), etcd and
// redis-server (pid redisPid); and their shares of the cores over the run, with the rest of the
// machine's busy time as "other".
func (b *etcdBench) wrkRun(wrk *httpbench.Wrk, s *httpbench.System, conns int, d time.Duration, expect float64, redisPid int) (map[string]float64, error) {
	var (
		st0           serverStats
		redis0, busy0 time.Duration
	)
	run, err := wrk.Run(s, conns, d, expect, func() {
		st0, redis0, busy0 = b.srv.stats(), cpustat.Proc(redisPid), cpustat.MachineBusy()
	})
	if err != nil {
		return nil, err
	}
	st := b.srv.stats().sub(st0)
	redisCPU, busy := cpustat.Proc(redisPid)-redis0, cpustat.MachineBusy()-busy0
	n := float64(run.Requests)
	m := run.Metrics()
	m["rpcs"], m["fsyncs"] = st.rpcs/n, st.fsyncs/n
	m["svc_cpu"] = float64(st.self.Microseconds()) / n
	m["etcd_cpu"] = float64(st.cpu.Microseconds()) / n
	m["redis_cpu"] = float64(redisCPU.Microseconds()) / n
	m["svc_share"], m["etcd_share"], m["redis_share"] = run.Share(st.self), run.Share(st.cpu), run.Share(redisCPU)
	m["other_share"] = run.Share(max(busy-st.self-st.cpu-redisCPU-run.CPU, 0))
	return m, nil
}

// getMedian is the median latency of an etcd Get (linearizable, the client's default) of one
// absent key from the benchmark's client over d: the round trip that scenario 6's added
// latency is counted in, as lockbench counts it in PINGs.
func (b *etcdBench) getMedian(d time.Duration) float64 {
	var lat []float64
	for deadline := time.Now().Add(d); time.Now().Before(deadline); {
		ctx, cancel := context.WithTimeout(context.Background(), b.c.lockTimeout)
		t0 := time.Now()
		_, err := b.cli.Get(ctx, "lockbench/get-floor")
		lat = append(lat, float64(time.Since(t0)))
		cancel()
		if err != nil {
			fatalf("s8: etcd Get: %v", err)
		}
	}
	return stat.Median(lat)
}

// etcdOrderLock is the etcd example's order Lock section with the benchmark's Redis added for
// its Redis rules (place-order). The section names etcd alone, so a rule without a Store locks
// in etcd; once it names a Redis too, such a rule must say so (the withdraw rule), or the
// section does not compile.
func etcdOrderLock(lc flmw.LockConf, redisAddr string) flmw.LockConf {
	lc.Rules = slices.Clone(lc.Rules)
	for i := range lc.Rules {
		if lc.Rules[i].Store == "" {
			lc.Rules[i].Store = "etcd"
		}
	}
	lc.Redis = flmw.RedisConf{Host: redisAddr, Type: "node"}
	return lc
}
