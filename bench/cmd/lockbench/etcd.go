package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/zeromicro/go-zero/rest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/bench/internal/httpbench"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
	"github.com/flightlock/flightlock/bench/internal/memstat"
	"github.com/flightlock/flightlock/bench/internal/redisserver"
	"github.com/flightlock/flightlock/etcdstore"
	"github.com/flightlock/flightlock/example/app"
	flmw "github.com/flightlock/flightlock/middleware"
)

// The etcd rows (-store etcd): flightlock on etcdstore, etcd's own concurrency.Mutex (the
// peer), and the floor, a transaction that puts the key on a lease if its create revision is
// 0, then a delete; on one private etcd member started here: a fresh data directory (fsync on,
// etcd's default), free loopback ports, killed by its pid at the end. They run scenarios 1-9.

// rowMutex is concurrency.Mutex's row.
const rowMutex = "mutex"

// leaseSeconds is the lease of the floor and of concurrency.Mutex's sessions: flightTTL + 1s,
// as the store's own leases are (its default lease margin).
const leaseSeconds = 11

type etcdBackend struct {
	procBackend
	clientURL string
	version   string // first line of `etcd --version`

	cli        *clientv3.Client
	floorSess  *concurrency.Session   // its lease is the floor's, kept alive by the client
	floorValue string                 // what flightlock writes in a key: the floor puts a value of the same bytes
	sess       *concurrency.Session   // the process's own Mutex session (lockOf(row, -1))
	hotSess    []*concurrency.Session // one per goroutine (a Mutex is one session's)
	// floorRetries counts the floor's put-if-absent attempts that found the key taken.
	floorRetries atomic.Int64
}

// rows are the floor (where it locks a key of its own: scenarios 1 and 4), flightlock and
// the Mutex.
func (e *etcdBackend) rows(scenario int) []string {
	if scenario == 1 || scenario == 4 {
		return []string{rowFloor, rowFlight, rowMutex}
	}
	return []string{rowFlight, rowMutex}
}
func (e *etcdBackend) describe() string {
	return fmt.Sprintf("etcd %s (pid %d) on %s, data in %s (%s)", e.version, e.Pid(), e.clientURL, e.Dir, e.fsType)
}

func (e *etcdBackend) workerArgs(*config) []string { return []string{"-addr", e.clientURL} }
func (e *etcdBackend) attach(addr string)          { e.clientURL = addr }

// start starts the server on free ports.
func (e *etcdBackend) start(c *config) error {
	out, err := exec.Command(c.etcdBin, "--version").Output()
	if err != nil {
		return fmt.Errorf("%s --version: %v (apt-get install etcd-server)", c.etcdBin, err)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	e.version = strings.TrimPrefix(strings.TrimSpace(first), "etcd Version: ")
	if err := e.makeDir(c.dataDir, "etcd"); err != nil {
		return err
	}
	addrs := freeAddrs(2) // the client's port and the peers', distinct
	e.clientURL = "http://" + addrs[0]
	peer := "http://" + addrs[1]
	cli, err := etcdClient(e.clientURL)
	if err != nil {
		_ = os.RemoveAll(e.Dir)
		return err
	}
	defer cli.Close()
	return e.Run("etcd", exec.Command(c.etcdBin,
		"--name", "bench",
		"--data-dir", filepath.Join(e.Dir, "data"),
		"--listen-client-urls", e.clientURL,
		"--advertise-client-urls", e.clientURL,
		"--listen-peer-urls", peer,
		"--initial-advertise-peer-urls", peer,
		"--initial-cluster", "bench="+peer,
		"--initial-cluster-state", "new",
		"--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn",
	), 20*time.Second, func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		st, err := cli.Status(ctx, e.clientURL)
		return err == nil && st.Leader != 0, err
	})
}

func etcdClient(endpoint string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
}

// counters reads etcd's /metrics.
func (e *etcdBackend) counters() serverStats {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(e.clientURL + "/metrics")
	if err != nil {
		return serverStats{}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return serverStats{}
	}
	var st serverStats
	figures(string(body), func(name string, v float64) {
		switch {
		case strings.HasPrefix(name, "grpc_server_handled_total{") && strings.Contains(name, `grpc_type="unary"`):
			st.reqs += v
			st.ok = true
		case strings.HasPrefix(name, "grpc_server_msg_received_total{") && strings.Contains(name, `grpc_method="LeaseKeepAlive"`):
			st.keepAlives += v
		case strings.HasPrefix(name, "etcd_disk_wal_fsync_duration_seconds_count"):
			st.fsyncs += v
		}
	})
	return st
}

func (e *etcdBackend) open(*config) error {
	cli, err := etcdClient(e.clientURL)
	if err != nil {
		return err
	}
	e.cli = cli
	if e.floorSess, err = concurrency.NewSession(cli, concurrency.WithTTL(leaseSeconds)); err != nil {
		return fmt.Errorf("the floor's lease: %w", err)
	}
	if e.sess, err = concurrency.NewSession(cli, concurrency.WithTTL(leaseSeconds)); err != nil {
		return fmt.Errorf("mutex session: %w", err)
	}
	return nil
}

func (e *etcdBackend) newStore() (closingStore, error) { return etcdstore.New(e.cli) }

func (e *etcdBackend) floorFrom(key string) error {
	kv, err := e.cli.Get(context.Background(), key)
	if err != nil || len(kv.Kvs) == 0 {
		return cmp.Or(err, errors.New("not found"))
	}
	e.floorValue = string(kv.Kvs[0].Value)
	return nil
}

func (e *etcdBackend) close() {
	for _, s := range append([]*concurrency.Session{e.floorSess, e.sess}, e.hotSess...) {
		if s != nil {
			_ = s.Close()
		}
	}
	if e.cli != nil {
		_ = e.cli.Close()
	}
}

// floorPut is the floor's lock: a transaction that puts key on the floor's lease if its
// create revision is 0; false when the key is taken.
func (e *etcdBackend) floorPut(ctx context.Context, key string) (bool, error) {
	resp, err := e.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, e.floorValue, clientv3.WithLease(e.floorSess.Lease()))).Commit()
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

// lockOf is the floor, or a Mutex on session i (peerGoroutines must have made it; i < 0: e.sess):
// a Mutex belongs to one session, and two Mutexes of one session on one key would both be
// granted, so every goroutine contending for a key needs a session of its own.
func (e *etcdBackend) lockOf(row string, i int) impl {
	switch {
	case row == rowFloor:
		return etcdFloor{e}
	case i < 0:
		return mutexRow{e.sess}
	}
	return mutexRow{e.hotSess[i]}
}

// mutexRow is concurrency.Mutex on one session, a Mutex made per Lock (NewMutex sends nothing).
type mutexRow struct{ sess *concurrency.Session }

func (m mutexRow) key(base string) string { return "/mutex/" + base }

func (m mutexRow) lock(ctx context.Context, key string) (any, error) {
	mu := concurrency.NewMutex(m.sess, key)
	return mu, mu.Lock(ctx)
}

func (m mutexRow) tryLock(ctx context.Context, key string) (any, error) {
	mu := concurrency.NewMutex(m.sess, key)
	return tried(mu, mu.TryLock(ctx), concurrency.ErrLocked)
}

func (m mutexRow) unlock(ctx context.Context, _ string, h any) error {
	return h.(*concurrency.Mutex).Unlock(ctx)
}

func (mutexRow) roundTrips() int64 { return 0 }
func (mutexRow) close()            {}

// etcdFloor is the floor: floorPut, retried at once while the key is taken (each such attempt
// counted in retries, not as a lock), then a delete, with no owner check.
type etcdFloor struct{ e *etcdBackend }

func (f etcdFloor) key(base string) string { return "lock:f" + base }

func (f etcdFloor) lock(ctx context.Context, key string) (any, error) {
	for {
		if ok, err := f.e.floorPut(ctx, key); err != nil || ok {
			return nil, err
		}
		f.e.floorRetries.Add(1)
	}
}

func (f etcdFloor) tryLock(ctx context.Context, key string) (any, error) {
	ok, err := f.e.floorPut(ctx, key)
	if err == nil && !ok {
		return nil, errBusy
	}
	return nil, err
}

func (f etcdFloor) unlock(ctx context.Context, key string, _ any) error {
	_, err := f.e.cli.Delete(ctx, key)
	return err
}

func (f etcdFloor) retried() int64  { return f.e.floorRetries.Load() }
func (etcdFloor) roundTrips() int64 { return 0 }
func (etcdFloor) close()            {}

// peerGoroutines makes sure n Mutex goroutines can run at once: e.hotSess holds at least n
// Mutex sessions. The new ones are granted sessionMakers at a time: one lease grant each, one
// Raft write.
func (e *etcdBackend) peerGoroutines(n int) error {
	add := n - len(e.hotSess)
	if add <= 0 {
		return nil
	}
	made := make([]*concurrency.Session, add)
	errs, first := memstat.Parallel(add, sessionMakers, func(i int) (err error) {
		made[i], err = concurrency.NewSession(e.cli, concurrency.WithTTL(leaseSeconds))
		return err
	})
	e.hotSess = append(e.hotSess, slices.DeleteFunc(made, func(s *concurrency.Session) bool { return s == nil })...)
	if errs > 0 {
		return fmt.Errorf("%d of %d mutex sessions: %w", errs, add, first)
	}
	return nil
}

// dropGoroutinesBeyond closes the Mutex sessions past the first n (their leases' keep-alives
// would otherwise load etcd and this process in the scenarios that follow).
func (e *etcdBackend) dropGoroutinesBeyond(n int) {
	if len(e.hotSess) <= n {
		return
	}
	extra := e.hotSess[n:]
	e.hotSess = e.hotSess[:n]
	memstat.Parallel(len(extra), sessionMakers, func(i int) error { return extra[i].Close() })
}

// sessionMakers is how many goroutines grant or revoke sessions at once.
const sessionMakers = 32

// dupConf is the middleware's Lock section of scenario 7: its rule on the benchmark's etcd.
func (e *etcdBackend) dupConf() flmw.LockConf {
	return flmw.LockConf{Etcd: flmw.EtcdConf{Hosts: []string{strings.TrimPrefix(e.clientURL, "http://")}}}
}

// Scenario 6 on etcd, HTTP end to end (httpSection says what each row is): the example's
// create-order endpoint under wrk with the order API's lock on the benchmark's etcd. The
// example keeps its state and its Redis locks in a redis-server this command starts for the
// scenario; each row is a whole system of its own in this process, started once.

var etcdHTTPRows = []s6Row{
	{"none", "no lock", "n"},
	{rowFlight, "flightlock (the example's order rules, create-order on etcd)", "f"},
	{rowMutex, "etcd concurrency.Mutex TryLock (plain go-zero middleware)", "m"},
	{rowFloor, "floor: txn put on a lease if absent + delete (plain middleware)", "s"},
}

func (e *etcdBackend) http(b *bench) *s6Results {
	res := &s6Results{Conf: b.c.exampleConf}
	if res.Note = httpbench.NotRunnable(b.c.exampleConf); res.Note != "" {
		return res
	}
	rs, err := redisserver.Start("lockbench-etcd-state-redis")
	check(err, "s6: %v")
	alsoStop(rs.Stop)
	defer rs.Stop()
	progress("  6 redis-server (the example's state) pid %d on %s", rs.Pid(), rs.Addr)
	loadSystems(res, b.c, "  6 ", etcdHTTPRows, func(r s6Row) *httpbench.System { return e.startSystem(b, r, rs.Addr) },
		map[string]int{"etcd": e.Pid(), "redis": rs.Pid()}, b.meter(""),
		// A linearizable Get (the client's default) of an absent key: etcd's PING.
		func(ctx context.Context) error { _, err := e.cli.Get(ctx, "lockbench/get-floor"); return err })
	return res
}

// startSystem builds and starts the example for one row from the example's config file,
// its Redis pointed at redisAddr, its etcd sections at the benchmark's etcd, on free ports.
func (e *etcdBackend) startSystem(b *bench, r s6Row, redisAddr string) *httpbench.System {
	c, ports, err := httpbench.Load(b.c.exampleConf)
	check(err, "s6: %v")
	httpbench.PointRedis(&c, redisAddr)
	if len(c.Order.Lock.Etcd.Hosts) == 0 {
		fatalf("s6: %s: Order.Lock names no etcd (Etcd.Hosts): not the etcd example", b.c.exampleConf)
	}
	// The services' etcd sections (Order's, Balance's) go to the benchmark's etcd.
	host := strings.TrimPrefix(e.clientURL, "http://")
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
		// The order API's own rules, create-order moved to etcd, in a middleware of their own
		// (httpbench.OrderRules): installed as shipped, every create-order would answer 500, its
		// order logic looking for its fencing lease under a Redis rule's key (Prefix + "order:"
		// + uid), not an etcd lock's (Etcd.Key + Prefix + "order:" + uid). The section names
		// etcd alone, so a rule without a Store locks in etcd; once it names the benchmark's
		// Redis too, for its Redis rules (place-order), such a rule must say so (the withdraw
		// rule), or the section does not compile.
		lc := c.Order.Lock
		lc.Rules = slices.Clone(lc.Rules)
		for i := range lc.Rules {
			lc.Rules[i].Store = cmp.Or(lc.Rules[i].Store, "etcd")
		}
		lc.Redis = flmw.RedisConf{Host: redisAddr, Type: "node"}
		var closeMW func()
		mw, closeMW, err = httpbench.OrderRules(lc, func(r *flmw.Rule) { r.Store = "etcd" }, flmw.WithServerTimeout(c.Order.Timeout))
		check(err, "s6 %s: %v", r.id)
		closes = append(closes, closeMW)
	case rowMutex, rowFloor: // the Mutex's TryLock on one session of this process, whatever the TTL (the lease lives on)
		mw = httpbench.OrderMiddleware(tryLockFunc(e.lockOf(r.id, -1)), prefix)
	}
	s, err := httpbench.Start(r.id, r.uid, c, ports, closes, app.WithOrderLock(mw))
	check(err, "s6 %s: %v", r.id)
	return s
}

func (e *etcdBackend) notes() storeNotes {
	return storeNotes{
		name: "etcd", title: "etcd", scenarios: []int{1, 2, 3, 4, 5, 6, 7, 8, 9}, peer: rowMutex,
		reqUnit: "RPC", reqCol: "etcd RPCs", cpuCol: "etcd CPU", floorShort: "floor", peerShort: "Mutex", peerThe: "the Mutex",
		labels: map[string]string{
			rowFloor:  "raw etcd floor (txn put on a lease if create revision = 0, then delete)",
			rowFlight: "flightlock on etcdstore (Lock + Release)",
			rowMutex:  "etcd concurrency.Mutex (Lock + Unlock)",
		},
		floors: [][2]string{{rowFloor, "floor"}}, ping: "etcd Get", s6Intro: (*report).etcdHTTPIntro,
		s9HoldNote: "flightlock runs on a Locker and store of its own, whose one session lease the store keeps alive;\n" +
			"concurrency.Mutex holds a Mutex per key on one session, whose lease its client keeps alive. etcd memory is the growth\n" +
			"of the etcd process's resident set (`VmRSS`) per held lock: the Go runtime in etcd keeps freed pages for a while, so\n" +
			"the figure is coarse (negative: etcd gave back more than the held keys took).",
		s9WaitNote: " Each Mutex waiter needs a session of its own (two Mutexes of one session on one key would both be\n" +
			"granted): those sessions are made after the baseline and measured apart (session columns).",
		s8Note: " So the number of distinct keys costs etcd nothing until a key is locked: the keys axis reaches 100,000 in the\n" +
			"same time as 1,000. With many Mutex goroutines on one key, each Lock first puts its own key in the queue and every grant\n" +
			"is an etcd write and a watch event away from the previous one, so a short window mostly sees the queue being built and\n" +
			"drained.",
		s4Note: " The floor retries at once while its put-if-absent finds the key taken; those attempts are counted as retries and their RPCs are in its RPCs/op.",
		rejectHow: "`concurrency.Mutex`: `TryLock` of a Mutex on another session, which puts its own key under the lock's prefix, reads\n" +
			"the owner, finds another, deletes its key and answers `ErrLocked`, each goroutine on a session of its own; its allocations include the gRPC client's",
		s3Goal: true, waiterSessions: true,
		goals: (*report).storeGoalSets,
		head: func(r *report, w writer) {
			p, c := lines(w), r.cfg
			p("# etcd benchmarks")
			p("")
			p("Generated by `bench/cmd/lockbench -store etcd` on %s. flightlock's etcd store (`etcdstore`) against etcd's own", r.started.Format("2006-01-02 15:04 MST"))
			p("`concurrency.Mutex` (go.etcd.io/etcd/client/v3 v3.5.21, the version go-zero requires) and the raw etcd floor,")
			p("on one private etcd server. The Redis rows are in [benchmarks.md](benchmarks.md).")
			p("")
			howItWasRun(p, c)
			p("- One etcd member started by the command: `/usr/bin/etcd` on free loopback ports, a fresh data directory")
			p("  on %s (fsync on, etcd's default), default Raft timings; killed by its pid at the end.", e.fsType)
			p("- flightlock: `flightlock.New(etcdstore.New(cli), WithTTL(%v), WithWait(%v))`, handoff at its defaults", flightTTL, c.lockTimeout)
			p("  (%d handoffs or %v per grant). Mutex sessions and the floor's lease: %ds leases, as the store's own", flightlock.DefaultHandoff, flightlock.DefaultHandoffWindow, leaseSeconds)
			p("  (TTL + 1s margin). One Mutex session per goroutine in scenarios 2 and 3 (a Mutex belongs to one session);")
			p("  one session reused in scenario 1. Scenario 6 also starts a `redis-server` (free loopback port, no persistence,")
			p("  killed by its pid) for the example's state, as the Redis rows' scenario 6 runs on one.")
			commonBullets(p, c, "a fresh etcd's first writes are slower")
			p("- etcd RPCs and fsyncs per operation: deltas of etcd's `/metrics` over the row (unary gRPC calls handled,")
			p("  i.e. Txn, Range, DeleteRange, LeaseGrant...; keep-alives and watches are streams and not counted; WAL")
			p("  fsyncs), divided by the operations or critical sections counted; likewise the CPU time of the etcd process")
			p("  (from /proc, 10ms ticks) and, in scenario 1, of the benchmark process (the client).")
			p("")
			w("## Machine\n\n")
			r.machineTable(w)
		},
		machine: []string{fmt.Sprintf("| etcd (`etcd --version`) | %s |", e.version)},
		dataDir: fmt.Sprintf("| etcd data directory | %s (fsync on) |", e.fsType),
		s1Ratios: func(r *report) string {
			fo, fr := r.med(1, rowFloor, p50), r.med(1, rowFloor, rate)
			return fmt.Sprintf("Ratios to the floor: p50 flightlock %.2fx, Mutex %.2fx; ops/s flightlock %.2fx, Mutex %.2fx of the floor's.",
				safeDiv(r.med(1, rowFlight, p50), fo), safeDiv(r.med(1, rowMutex, p50), fo),
				safeDiv(r.med(1, rowFlight, rate), fr), safeDiv(r.med(1, rowMutex, rate), fr))
		},
		peerHow: "each contender puts its own key (one Raft write, one fsync) and waits on a watch for its predecessor's deletion, and each unlock is another write",
		closing: func(r *report, w writer) {
			if r.cfg.scenarios[2] && r.cfg.scenarios[3] {
				w("## Why flightlock is faster on a hot key\n\n%s\n", r.hotKeyWhy())
			}
		},
	}
}

// etcdHTTPIntro describes scenario 6's systems and load on etcd.
func (r *report) etcdHTTPIntro(w writer, h *s6Results) {
	c := r.cfg
	p := lines(w)
	p("The Redis rows are scenario 6 of benchmarks.md, whose setup this follows: wrk and its script, a uid and SKU of its own")
	p("in every request, seeded before, so that no two requests share a lock key; the example's go-zero chains; how CPU is")
	p("measured (here etcd's and `redis-server`'s from /proc). The example runs with config `etc/%s`, the create-order", filepath.Base(h.Conf))
	p("rule moved to etcd (`Store: etcd`), its etcd sections pointed at the benchmark's etcd and its state in a `redis-server`")
	p("this command starts (%d systems, each started once). A request is the order API's lock (the row), `Deduct` on the", len(h.Sat))
	p("inventory service (its SKU lock in Redis) and `Debit` on the balance service (its account lock in etcd) over zrpc,")
	p("each under its own flightlock interceptor in every row, and the order write in Redis. Rows: **no lock**")
	p("(`app.WithoutOrderLock()`); **flightlock**, the order API's rules (reject mode, the lock `flightlock/lock:order:<uid>`")
	p("on the store's session lease) installed with `app.WithOrderLock` as the other rows' locks are, so no owner goes to the")
	p("zrpc calls (as shipped, the order logic would look for its fencing lease under a Redis rule's key and answer 500);")
	p("**etcd concurrency.Mutex** in a plain go-zero middleware: uid from the JSON body, `TryLock` of a Mutex on the same key")
	p("on one session of this process (%ds lease; 409 when taken), the handler, `Unlock`; **floor**: that middleware with", leaseSeconds)
	p("scenario 1's floor, a put on a pre-granted lease if the key's create revision is 0 (409 otherwise), then a delete, no")
	p("owner check: the two writes any etcd lock needs. In every row the order is written unfenced.")
	p("")
	p("Low load: `wrk -c %d`; a round trip is the median latency of a linearizable etcd `Get` of an absent key from this", httpbench.LowConns)
	p("process, 300ms in each round (median %s): etcd's PING. Saturation: `wrk -c %d`, %v per row and repetition. etcd", mdfmt.Dur(h.Ping.med("p50")), httpbench.SatConns, httpbench.WholeSeconds(c.d6))
	p("RPCs and fsyncs per request are `/metrics` deltas (the balance service's account lock is two RPCs and two fsyncs in")
	p("every row). CPU shares are of %d cores × the run's wall time; with every system up and no load, the benchmark", runtime.NumCPU())
	p("process used %.1f %% of a core: that much of each run's service CPU is the idle systems' background.", 100*h.IdleCPU)
	p("")
}
