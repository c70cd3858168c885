package main

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/logc"
	"github.com/zeromicro/go-zero/core/prometheus"
	"github.com/zeromicro/go-zero/core/trace"
	"github.com/zeromicro/go-zero/rest"
	"github.com/zeromicro/go-zero/rest/httpx"

	"github.com/flightlock/flightlock/example/app"
	flmw "github.com/flightlock/flightlock/middleware"
)

// Scenario 6 of issue 4: the example's create-order endpoint (example/app, on the benchmark's
// redis-server) under wrk, every request on a uid of its own, with three locks on the order API:
//
//   - none: app.WithoutOrderLock();
//   - flightlock: the example as shipped, its middleware built from Order.Lock;
//   - bsm/redislock: app.WithOrderLock(redislockMiddleware(...)), a plain go-zero middleware;
//   - floor: the same middleware with a plain SET PX and DEL instead of a lock: the two round
//     trips any Redis lock needs, with nothing else (no owner check, no exclusion).
//
// Each row is a whole system of its own (order API, inventory and balance zrpc services) in
// this process, started once; the runs of a repetition go through the rows in the rotated
// order of the other scenarios. The inventory and balance services lock with flightlock in
// every row, as the example does: only the order API's lock differs.

//go:embed order.lua
var orderLua []byte

// s6Row is one lock of the order API. uid starts the uids of its requests, distinct per row.
type s6Row struct {
	id, label, uid string
}

var s6Rows = []s6Row{
	{"none", "no lock", "n"},
	{"flightlock", "flightlock (the example's middleware)", "f"},
	{"redislock", "bsm/redislock (plain go-zero middleware)", "r"},
	{"setdel", "floor: SET PX + DEL (plain middleware, not a lock)", "s"},
	// Issue 10: what a rule in shadow mode costs a request (it only counts would-be conflicts).
	{"shadow", "flightlock, the order rule in shadow mode (Shadow: true)", "h"},
}

// Scenario 6's load: one connection for latency, s6SatConns for saturation.
const (
	s6LowConns = 1
	s6SatConns = 32
	s6Rounds   = 3 // low-load rounds per repetition
)

// Seeded state of every uid: enough stock and money for more orders than a run makes, so a
// uid reused after a wrap still succeeds.
const (
	s6Stock   = 1_000_000
	s6Balance = 1_000_000_000 // cents
)

// s6Results is scenario 6: each row at low load and at saturation, and the PING floor.
type s6Results struct {
	Low  []*result `json:"low"`
	Sat  []*result `json:"saturation"`
	Ping *result   `json:"ping"`
	Note string    `json:"note,omitempty"`
	// IdleCPU is the cores this process used with every system up and no load.
	IdleCPU float64 `json:"idle_cpu"`
	Conf    string  `json:"config"`
	// Observe: go-zero's metrics and tracing were on in every row (-observe).
	Observe bool `json:"observe,omitempty"`
}

// s6System is one row's running system.
type s6System struct {
	row   s6Row
	sys   *app.System
	url   string
	done  chan struct{}
	next  int64   // next uid index
	rps   float64 // requests/s of the warm-up, to size the uids of a run
	close func()
}

func (b *bench) scenario6() *s6Results {
	res := &s6Results{Conf: b.cfg.exampleConf, Observe: b.cfg.observe}
	if b.cfg.observe {
		// What a service with Prometheus: and Telemetry: in its config runs: metrics recorded
		// (go-zero's core/metric records nothing until Prometheus is enabled) and every request
		// traced, spans batched and encoded by go-zero's file exporter (to /dev/null, so the
		// figures do not include a collector).
		prometheus.Enable()
		trace.StartAgent(trace.Config{Name: "lockbench", Endpoint: os.DevNull, Batcher: "file", Sampler: 1})
		defer trace.StopAgent()
	}
	if _, err := os.Stat(b.cfg.exampleConf); err != nil {
		res.Note = fmt.Sprintf("Not run: the example's config `%s` is missing (`-example-config`).", b.cfg.exampleConf)
		return res
	}
	wrk, err := exec.LookPath("wrk")
	if err != nil {
		res.Note = "Not run: `wrk` is not installed (bench/run.sh installs it with apt)."
		return res
	}
	script, err := os.CreateTemp("", "lockbench-order-*.lua")
	if err != nil {
		fatalf("s6: %v", err)
	}
	defer os.Remove(script.Name())
	if _, err := script.Write(orderLua); err != nil {
		fatalf("s6: %v", err)
	}
	_ = script.Close()

	var rows []s6Row
	for _, r := range s6Rows {
		if onlyRows == nil || onlyRows[r.id] {
			rows = append(rows, r)
		}
	}
	var systems []*s6System
	for _, r := range rows {
		systems = append(systems, b.startSystem(r))
	}
	defer stopSystems(systems)
	pingRow, _ := rowByID("ping")
	ping := b.impl(pingRow)

	// Warm-up: connections opened and scripts loaded by a first second of load; a second one
	// measures the throughput that sizes the uids of each run.
	for _, s := range systems {
		for range 2 {
			w := b.wrkRun(wrk, script.Name(), s, s6SatConns, time.Second, 10_000)
			s.rps = w.m["rps"]
			if e := w.m["errors"]; e > 0 {
				fatalf("s6 %s: %d failed requests in the warm-up", s.row.id, int64(e))
			}
		}
		progress("s6 warm-up %-10s %6.0f req/s", s.row.id, s.rps)
	}

	// What the process burns with no load at all (the systems' timers, pollers and go-zero's
	// own collectors): part of every run's service CPU.
	idle0, t0 := processCPU(), time.Now()
	time.Sleep(time.Second)
	res.IdleCPU = (processCPU() - idle0).Seconds() / time.Since(t0).Seconds()

	low, sat := map[string]*result{}, map[string]*result{}
	for _, r := range rows {
		low[r.id] = &result{Row: r.id, Label: r.label}
		sat[r.id] = &result{Row: r.id, Label: r.label}
	}
	res.Ping = &result{Row: "ping", Label: "floor: PING"}
	lowD, satD := wholeSeconds(b.cfg.d6low), wholeSeconds(b.cfg.d6)
	for rep := 0; rep < b.cfg.reps; rep++ {
		// Low load: s6Rounds short rounds, each a PING floor and every row, so that each row's
		// added latency is taken against the no-lock row and the round trip of its own round
		// (this 2-core machine drifts by more than a round trip between runs).
		for k := range s6Rounds {
			round := rep*s6Rounds + k
			res.Ping.Reps = append(res.Ping.Reps, metrics{"p50": pingMedian(ping, 300*time.Millisecond), "round": float64(round)})
			for _, i := range rotate(len(systems), round) {
				s := systems[i]
				w := b.wrkRun(wrk, script.Name(), s, s6LowConns, lowD, s.rps*lowD.Seconds())
				w.m["round"] = float64(round)
				low[s.row.id].Reps = append(low[s.row.id].Reps, w.m)
				low[s.row.id].Mix = w.mix
				progress("s6 rep %d.%d c=%-2d %-10s %6.0f req/s p50 %s p99 %s err %d", rep+1, k+1, s6LowConns, s.row.id, w.m["rps"], dur(w.m["p50"]), dur(w.m["p99"]), int64(w.m["errors"]))
			}
		}
		for _, i := range rotate(len(systems), rep) {
			s := systems[i]
			w := b.wrkRun(wrk, script.Name(), s, s6SatConns, satD, s.rps*satD.Seconds())
			w.m["rep"] = float64(rep)
			sat[s.row.id].Reps = append(sat[s.row.id].Reps, w.m)
			sat[s.row.id].Mix = w.mix
			s.rps = max(s.rps, w.m["rps"])
			progress("s6 rep %d   c=%-2d %-10s %6.0f req/s p50 %s p99 %s err %d cpu svc %.0f%% redis %.0f%% wrk %.0f%% other %.0f%%", rep+1, s6SatConns, s.row.id,
				w.m["rps"], dur(w.m["p50"]), dur(w.m["p99"]), int64(w.m["errors"]), 100*w.m["svc_share"], 100*w.m["redis_share"], 100*w.m["wrk_share"], 100*w.m["other_share"])
		}
	}
	for _, r := range rows {
		res.Low = append(res.Low, low[r.id])
		res.Sat = append(res.Sat, sat[r.id])
	}
	return res
}

// rotate is order for indexes: 0..n-1 rotated by rep.
func rotate(n, rep int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = (i + rep) % n
	}
	return out
}

// wholeSeconds rounds d to whole seconds, at least one: wrk's -d takes no fractions.
func wholeSeconds(d time.Duration) time.Duration {
	return max(d.Round(time.Second), time.Second)
}

// startSystem builds and starts the example for one row from the example's own config file,
// pointed at the benchmark's Redis and at free loopback ports.
func (b *bench) startSystem(r s6Row) *s6System {
	c, err := app.LoadConfig(b.cfg.exampleConf)
	if err != nil {
		fatalf("s6: %v", err)
	}
	ports := freePorts(3)
	c.Redis.Host, c.Redis.Type = b.addr, "node"
	// Each service's Lock block may carry its own copy of the top-level Redis (the example
	// refuses one that differs from it): point those at the benchmark's Redis too.
	for _, rc := range []*flmw.RedisConf{&c.Order.Lock.Redis, &c.Inventory.Lock.Redis, &c.Balance.Lock.Redis} {
		if rc.Host != "" {
			rc.Host, rc.Type = b.addr, "node"
		}
	}
	c.Order.Host, c.Order.Port = "127.0.0.1", ports[0]
	c.Inventory.ListenOn = fmt.Sprintf("127.0.0.1:%d", ports[1])
	c.Balance.ListenOn = fmt.Sprintf("127.0.0.1:%d", ports[2])
	c.Order.Inventory.Endpoints = []string{c.Inventory.ListenOn}
	c.Order.Balance.Endpoints = []string{c.Balance.ListenOn}
	c.Order.OrderDelay = 0
	// A log line per request would measure the terminal; go-zero still formats it (its log
	// handler builds the line before the level check), in every row alike. Load shedding off:
	// on 2 busy cores it would answer 503s at saturation (dev mode turns it off too).
	for _, sc := range []*int64{&c.Order.CpuThreshold, &c.Inventory.CpuThreshold, &c.Balance.CpuThreshold} {
		*sc = 0
	}
	c.Order.Log.Level, c.Inventory.Log.Level, c.Balance.Log.Level = "severe", "severe", "severe"

	s := &s6System{row: r, url: fmt.Sprintf("http://127.0.0.1:%d", ports[0]), done: make(chan struct{})}
	var opts []app.Option
	switch r.id {
	case "none":
		opts = append(opts, app.WithoutOrderLock())
	case "redislock":
		client, _ := newClient(b.addr)
		opts = append(opts, app.WithOrderLock(orderMiddleware(redislockLock(redislock.New(client)), c.Order.Lock.Prefix, c.Order.Lock.TTL)))
		s.close = func() { _ = client.Close() }
	case "setdel":
		client, _ := newClient(b.addr)
		opts = append(opts, app.WithOrderLock(orderMiddleware(setDelLock(client), c.Order.Lock.Prefix, c.Order.Lock.TTL)))
		s.close = func() { _ = client.Close() }
	case "shadow":
		// The example's order rules with create-order in shadow mode, in a middleware of its own
		// (app.WithOrderLock): the example's order logic fences its writes with the lease of an
		// enforced lock, which a shadow rule never gives it, so the writes go unfenced, as in the
		// other replaced rows.
		lc := c.Order.Lock
		lc.Redis = flmw.RedisConf{Host: b.addr}
		lc.Rules = slices.Clone(lc.Rules)
		for i := range lc.Rules {
			lc.Rules[i].Shadow = lc.Rules[i].Path == "/api/order/create"
		}
		mw, err := flmw.New(lc)
		if err != nil {
			fatalf("s6 shadow: %v", err)
		}
		opts = append(opts, app.WithOrderLock(mw.Handle))
		s.close = func() { _ = mw.Close() }
	}
	if s.sys, err = app.New(c, opts...); err != nil {
		fatalf("s6 %s: %v", r.id, err)
	}
	go func() {
		defer close(s.done)
		s.sys.Start()
	}()
	for _, p := range ports {
		waitListening(p)
	}
	return s
}

// stopSystems stops every go-zero server of the process (app.System.Stop), then closes the
// systems.
func stopSystems(systems []*s6System) {
	if len(systems) == 0 {
		return
	}
	systems[0].sys.Stop()
	for _, s := range systems {
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			progress("s6 %s: the servers did not stop within 10s", s.row.id)
		}
		if err := s.sys.Close(); err != nil {
			progress("s6 %s: close: %v", s.row.id, err)
		}
		if s.close != nil {
			s.close()
		}
	}
}

// lockFunc takes key for ttl; it returns the release, or errBusy when the key is taken.
type lockFunc func(ctx context.Context, key string, ttl time.Duration) (release func(context.Context) error, err error)

// redislockLock is one bsm/redislock Obtain without retry (the example's OnBusy: reject).
func redislockLock(lc *redislock.Client) lockFunc {
	return func(ctx context.Context, key string, ttl time.Duration) (func(context.Context) error, error) {
		lock, err := lc.Obtain(ctx, key, ttl, nil)
		if errors.Is(err, redislock.ErrNotObtained) {
			return nil, errBusy
		}
		if err != nil {
			return nil, err
		}
		return lock.Release, nil
	}
}

// setDelLock is the floor: SET PX, then DEL. Not a lock: it never finds the key busy.
func setDelLock(c *redis.Client) lockFunc {
	return func(ctx context.Context, key string, ttl time.Duration) (func(context.Context) error, error) {
		if err := c.Set(ctx, key, "1", ttl).Err(); err != nil {
			return nil, err
		}
		return func(ctx context.Context) error { return c.Del(ctx, key).Err() }, nil
	}
}

// orderMiddleware locks POST /api/order/create on prefix + "order:{uid}" with lock, as a
// go-zero user would write it without flightlock: the uid from the JSON body (restored for the
// handler's httpx.Parse), the lock (409 when busy, 503 when Redis fails), the handler, the
// release. Every other route passes through.
func orderMiddleware(lock lockFunc, prefix string, ttl time.Duration) rest.Middleware {
	return func(next http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPost || r.URL.Path != "/api/order/create" {
				next(w, r)
				return
			}
			body, err := io.ReadAll(r.Body)
			if err != nil {
				httpx.ErrorCtx(r.Context(), w, err)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			var req struct {
				UID string `json:"uid"`
			}
			if err := json.Unmarshal(body, &req); err != nil || req.UID == "" {
				httpx.ErrorCtx(r.Context(), w, errors.New("uid is required"))
				return
			}
			release, err := lock(r.Context(), prefix+"order:"+req.UID, ttl)
			switch {
			case errors.Is(err, errBusy):
				http.Error(w, "lock busy", http.StatusConflict)
				return
			case err != nil:
				http.Error(w, "lock store unavailable", http.StatusServiceUnavailable)
				return
			}
			defer func() {
				if err := release(context.WithoutCancel(r.Context())); err != nil {
					logc.Errorf(r.Context(), "order lock: release: %v", err)
				}
			}()
			next(w, r)
		}
	}
}

// wrkSummary is the line order.lua prints when wrk is done.
type wrkSummary struct {
	Requests      int64   `json:"requests"`
	DurationUs    int64   `json:"duration_us"`
	StatusErrors  int64   `json:"status_errors"`
	ConnectErrors int64   `json:"connect_errors"`
	ReadErrors    int64   `json:"read_errors"`
	WriteErrors   int64   `json:"write_errors"`
	Timeouts      int64   `json:"timeouts"`
	P50           float64 `json:"p50"`
	P90           float64 `json:"p90"`
	P99           float64 `json:"p99"`
	P999          float64 `json:"p999"`
	Max           float64 `json:"max"`
	Mean          float64 `json:"mean"`
}

type wrkResult struct {
	m   metrics
	mix string // Redis command mix per request
}

// wrkRun seeds the uids a run may use (twice the expected requests), runs wrk against s, and
// returns the run's figures with the CPU time of the service (this process), redis-server and
// wrk, and the Redis commands, over the run.
//
// A run in which wrk got no reply at all is made again, twice at most: on this machine the
// first connection after a saturation run now and then stalls for a second (a SYN that is
// answered only by its retransmission), which leaves a one-second run at one connection empty.
func (b *bench) wrkRun(bin, script string, s *s6System, conns int, d time.Duration, expect float64) wrkResult {
	for attempt := 1; ; attempt++ {
		r, ok := b.wrkRunOnce(bin, script, s, conns, d, expect, attempt == 3)
		if ok {
			return r
		}
		progress("s6 %s: wrk got no reply in %v at -c %d; running it again", s.row.id, d, conns)
		time.Sleep(time.Second)
	}
}

// wrkRunOnce is one wrk run; it reports false when wrk got no reply, or exits if last.
func (b *bench) wrkRunOnce(bin, script string, s *s6System, conns int, d time.Duration, expect float64, last bool) (wrkResult, bool) {
	count := int64(max(2*expect, 2000))
	first := s.next
	stock, money := make(map[string]int64, count), make(map[string]int64, count)
	for i := first; i < first+count; i++ {
		uid := uidOf(s.row, i) // also the name of the SKU it orders
		stock[uid], money[uid] = s6Stock, s6Balance
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	err := s.sys.Seed(ctx, stock, money)
	cancel()
	if err != nil {
		fatalf("s6 %s: seed: %v", s.row.id, err)
	}
	runtime.GC()

	cmd := exec.Command(bin, "-t", "1", "-c", strconv.Itoa(conns), "-d", strconv.Itoa(int(d.Seconds()))+"s",
		"--timeout", "10s", "-s", script, s.url, "--", prefixOf(s.row), strconv.FormatInt(first, 10), strconv.FormatInt(count, 10))
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	cmds0, svc0, redis0, busy0 := b.stats(), processCPU(), procCPU(srv.cmd.Process.Pid), machineBusy()
	start := time.Now()
	if err := cmd.Start(); err != nil {
		fatalf("s6: start wrk: %v", err)
	}
	workers.add(cmd)
	err = cmd.Wait()
	workers.remove(cmd)
	wall := time.Since(start)
	svc, redisCPU, busy := processCPU()-svc0, procCPU(srv.cmd.Process.Pid)-redis0, machineBusy()-busy0
	delta := diffStats(cmds0, b.stats())
	if err != nil {
		fatalf("s6: wrk: %v: %s", err, stderr.String())
	}
	var ws wrkSummary
	found := false
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		if raw, ok := strings.CutPrefix(sc.Text(), "LOCKBENCH "); ok {
			if err := json.Unmarshal([]byte(raw), &ws); err != nil {
				fatalf("s6: wrk summary %q: %v", raw, err)
			}
			found = true
		}
	}
	if !found || ws.Requests == 0 {
		if !last {
			return wrkResult{}, false
		}
		fatalf("s6 %s: wrk reported no requests: %s %s", s.row.id, out.String(), stderr.String())
	}
	s.next = first + min(ws.Requests, count)
	var wrkCPU time.Duration
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		wrkCPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	n := float64(ws.Requests)
	cores := float64(runtime.NumCPU()) * wall.Seconds()
	wrapped := 0.0
	if ws.Requests > count {
		wrapped = 1
	}
	return wrkResult{m: metrics{
		"requests":    n,
		"rps":         n / (float64(ws.DurationUs) / 1e6),
		"p50":         ws.P50 * 1e3, // ns, as every latency in the report
		"p90":         ws.P90 * 1e3,
		"p99":         ws.P99 * 1e3,
		"p999":        ws.P999 * 1e3,
		"max":         ws.Max * 1e3,
		"mean":        ws.Mean * 1e3,
		"errors":      float64(ws.StatusErrors + ws.ConnectErrors + ws.ReadErrors + ws.WriteErrors + ws.Timeouts),
		"cmds":        float64(delta.total()) / n,
		"svc_cpu":     float64(svc.Microseconds()) / n,
		"redis_cpu":   float64(redisCPU.Microseconds()) / n,
		"wrk_cpu":     float64(wrkCPU.Microseconds()) / n,
		"svc_share":   svc.Seconds() / cores,
		"redis_share": redisCPU.Seconds() / cores,
		"wrk_share":   wrkCPU.Seconds() / cores,
		// Everything else that ran on the machine meanwhile (other processes, the kernel's
		// own threads): what makes one repetition differ from the next.
		"other_share": max(busy-svc-redisCPU-wrkCPU, 0).Seconds() / cores,
		"wrapped":     wrapped,
	}, mix: mixString(delta, ws.Requests)}, true
}

func prefixOf(r s6Row) string       { return r.uid }
func uidOf(r s6Row, i int64) string { return prefixOf(r) + strconv.FormatInt(i, 10) }

// pingMedian is the median latency of PING from a go-redis client of this process, over d:
// the round trip that scenario 6's added latency is counted in.
func pingMedian(im impl, d time.Duration) float64 {
	ctx := context.Background()
	var lat []int64
	for deadline := time.Now().Add(d); time.Now().Before(deadline); {
		t0 := time.Now()
		if _, err := im.lock(ctx, ""); err != nil {
			fatalf("s6: PING: %v", err)
		}
		lat = append(lat, int64(time.Since(t0)))
	}
	sortInts(lat)
	return percentile(lat, 0.5)
}

// procCPU is the CPU time (user + system) of process pid so far, from /proc/<pid>/stat, in
// clock ticks of 10 ms (USER_HZ is 100 on Linux).
func procCPU(pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses and may hold spaces: state is
	// field 3, utime 14, stime 15.
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// machineBusy is the CPU time all cores spent outside idle and iowait so far, from the
// first line of /proc/stat (USER_HZ ticks of 10 ms).
func machineBusy() time.Duration {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var ticks int64
	for i, v := range f[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

func freePorts(n int) []int {
	ports := make([]int, 0, n)
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fatalf("s6: free port: %v", err)
		}
		ls = append(ls, l) // held until all are chosen, so the n ports differ
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		_ = l.Close()
	}
	return ports
}

func waitListening(port int) {
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for range 400 { // 400 x 25ms: 10s
		if conn, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			_ = conn.Close()
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	fatalf("s6: nothing listens on %s", addr)
}
