package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/zeromicro/go-zero/core/prometheus"
	"github.com/zeromicro/go-zero/core/trace"
	"github.com/zeromicro/go-zero/rest"

	"github.com/flightlock/flightlock/bench/internal/cpustat"
	"github.com/flightlock/flightlock/bench/internal/httpbench"
	"github.com/flightlock/flightlock/bench/internal/interleave"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
	"github.com/flightlock/flightlock/example/app"
	flmw "github.com/flightlock/flightlock/middleware"
)

// Scenario 6: the example's create-order endpoint (example/app, on the benchmark's
// redis-server) under wrk, every request on a uid of its own, with the locks of s6Rows on the
// order API. Each row is a whole system of its own (order API, inventory and balance zrpc
// services, which lock with flightlock in every row) in this process, started once.

// s6Row is one lock of the order API, on every store. uid starts the uids of its requests,
// distinct per row.
type s6Row struct {
	id, label, uid string
}

var s6Rows = []s6Row{
	{"none", "no lock", "n"},
	{"flightlock", "flightlock (the example's middleware)", "f"},
	{"redislock", "bsm/redislock (plain go-zero middleware)", "r"},
	{"setdel", "floor: SET PX + DEL (plain middleware, not a lock)", "s"},
	// What a rule in shadow mode costs a request (it only counts would-be conflicts).
	{"shadow", "flightlock, the order rule in shadow mode (Shadow: true)", "h"},
}

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
	// Bare: the rows ran over a bare handler (scenario6Bare), not the example.
	Bare bool `json:"bare,omitempty"`
}

// scenario6Bare is scenario 6's rows over a bare handler (httpbench.StartBare): the create-order
// route binds its request and answers, with no service behind it, so that what a row's lock
// costs a request is most of the request. The shadow row is left out: it differs from the
// enforcing one only in what it holds back.
func (b *bench) scenario6Bare() *s6Results {
	var rows []s6Row
	for _, r := range s6Rows {
		switch r.id {
		case "shadow":
			continue
		case "flightlock":
			r.label = "flightlock (the example's order rules)"
		}
		rows = append(rows, s6Row{id: r.id, label: r.label, uid: "b" + r.uid})
	}
	res := b.httpScenario(func(r s6Row) *httpbench.System { // the create-order route alone, under the row's orderLock
		c, _, err := httpbench.Load(b.c.exampleConf)
		check(err, "s6 bare: %v")
		mw, closes := b.orderLock(r.id, c.Order.Lock, false)
		s, err := httpbench.StartBare(r.id, r.uid, mw, closes)
		check(err, "s6 bare %s: %v", r.id)
		return s
	}, rows)
	res.Bare = true
	return res
}

// httpScenario runs wrk against the system start builds for each of rows, at low load and at
// saturation (scenario 6 and its bare-handler twin).
func (b *bench) httpScenario(start func(s6Row) *httpbench.System, rows []s6Row) *s6Results {
	res := &s6Results{Conf: b.c.exampleConf, Observe: b.c.observe}
	if b.c.observe {
		// What a service with Prometheus: and Telemetry: in its config runs: metrics recorded
		// (go-zero's core/metric records nothing until Prometheus is enabled) and every request
		// traced, spans batched and encoded by go-zero's file exporter (to /dev/null, so the
		// figures do not include a collector).
		prometheus.Enable()
		trace.StartAgent(trace.Config{Name: "lockbench", Endpoint: os.DevNull, Batcher: "file", Sampler: 1})
		defer trace.StopAgent()
	}
	if res.Note = httpbench.NotRunnable(b.c.exampleConf); res.Note != "" {
		return res
	}
	ping := b.rowImpl("ping", -1)
	loadSystems(res, b.c, "s6 ", rows, start, map[string]int{"redis": b.be.Pid()}, b.meter(""),
		func(ctx context.Context) error { _, err := ping.lock(ctx, ""); return err })
	return res
}

// loadSystems is scenario 6's load on every store: a system per row that -rows keeps (start),
// every system warmed up, then per repetition httpbench.LowRounds low-load rounds (each a
// roundTrip median, the store's cheapest call, and one wrk run of every system at
// httpbench.LowConns for -d6low) and one saturation run of every system at httpbench.SatConns
// for -d6, the systems in an order rotated per round and per repetition, so that no row always
// runs first. Each run measures the CPU of procs (name -> pid) and m's counters (the server's
// requests and fsyncs per request and its command mix) around it (httpbench.Wrk.RunCPU). The
// runs go into res, with each row's last mix at either load and the round trip of every round
// as the PING row; wrk is tracked among the processes this run started, its progress lines
// (and the scenario's) behind tag.
func loadSystems(res *s6Results, c *config, tag string, rows []s6Row, start func(s6Row) *httpbench.System, procs map[string]int, m meter,
	roundTrip func(ctx context.Context) error,
) {
	wrk, err := httpbench.NewWrk()
	check(err, "%s%v", tag)
	defer wrk.Close()
	logf := func(format string, args ...any) { progress(tag+format, args...) }
	wrk.Track, wrk.Logf = workers.Track, logf
	rows = slices.DeleteFunc(slices.Clone(rows), func(r s6Row) bool { return onlyRows != nil && !onlyRows[r.id] })
	var systems []*httpbench.System
	low, sat := map[string]*result{}, map[string]*result{}
	for _, r := range rows {
		systems = append(systems, start(r))
		low[r.id], sat[r.id] = &result{Row: r.id, Label: r.label}, &result{Row: r.id, Label: r.label}
		res.Low, res.Sat = append(res.Low, low[r.id]), append(res.Sat, sat[r.id])
	}
	defer httpbench.Stop(systems, logf)
	// measure runs wrk once against s, expecting about expect requests (which sizes the uids
	// seeded), and records the run's command mix in x.
	measure := func(s *httpbench.System, conns int, d time.Duration, expect float64, x *result) metrics {
		var st0 serverStats
		fig, run, err := wrk.RunCPU(s, conns, d, expect, procs, func() { st0 = readStats(m, false) })
		check(err, "s6 %s: %v", s.ID)
		st, n := readStats(m, true).sub(st0), float64(run.Requests)
		fig[reqs], fig[fsy] = st.reqs/n, st.fsyncs/n
		x.Mix = mixString(st.cmds, int64(n))
		return fig
	}
	// The warm-up: two runs of a second at saturation per system (connections opened, scripts
	// loaded or leases granted, then the throughput that sizes the uids of each run); a failed
	// request in it ends the run.
	for _, s := range systems {
		for range 2 {
			fig := measure(s, httpbench.SatConns, time.Second, 10_000, sat[s.ID])
			if s.RPS = fig["rps"]; fig["errors"] > 0 {
				fatalf("%s%s: %d failed requests in the warm-up", tag, s.ID, int64(fig["errors"]))
			}
		}
		logf("warm-up %-10s %6.0f req/s", s.ID, s.RPS)
	}
	// What the process burns with no load at all (the systems' timers, pollers, keep-alives
	// and go-zero's own collectors): part of every run's service CPU.
	idle0, t0 := cpustat.Self(), time.Now()
	time.Sleep(time.Second)
	res.IdleCPU = (cpustat.Self() - idle0).Seconds() / time.Since(t0).Seconds()
	res.Ping = &result{Row: "ping", Label: "floor: PING"}
	lowD, satD := httpbench.WholeSeconds(c.d6low), httpbench.WholeSeconds(c.d6)
	line := func(conns int, s *httpbench.System, fig metrics) string {
		return fmt.Sprintf("c=%-2d %-10s %6.0f req/s p50 %v p99 %v err %d", conns, s.ID, fig["rps"],
			time.Duration(fig[p50]).Round(10*time.Microsecond), time.Duration(fig[p99]).Round(10*time.Microsecond), int64(fig["errors"]))
	}
	for rep := range c.reps {
		// Low load: short rounds, each with its own round trip and every row, so that each row's
		// added latency is taken against the no-lock row and the round trip of its own round
		// (this 2-core machine drifts by more than a round trip between runs).
		for k := range httpbench.LowRounds {
			round := rep*httpbench.LowRounds + k
			rt := roundTripMedian(300*time.Millisecond, roundTrip)
			res.Ping.Reps = append(res.Ping.Reps, metrics{p50: rt, "round": float64(round)})
			for _, s := range interleave.Rotate(systems, round) {
				fig := measure(s, httpbench.LowConns, lowD, s.RPS*lowD.Seconds(), low[s.ID])
				fig["round"] = float64(round)
				low[s.ID].Reps = append(low[s.ID].Reps, fig)
				logf("rep %d.%d %s", rep+1, k+1, line(httpbench.LowConns, s, fig))
			}
		}
		for _, s := range interleave.Rotate(systems, rep) {
			fig := measure(s, httpbench.SatConns, satD, s.RPS*satD.Seconds(), sat[s.ID])
			fig["rep"] = float64(rep)
			sat[s.ID].Reps = append(sat[s.ID].Reps, fig)
			s.RPS = max(s.RPS, fig["rps"])
			note := fmt.Sprintf("requests/req %.2f cpu svc %.0f%%", fig[reqs], 100*fig["svc_share"])
			for name := range procs {
				note += fmt.Sprintf(" %s %.0f%%", name, 100*fig[name+"_share"])
			}
			logf("rep %d   %s %s wrk %.0f%% other %.0f%%", rep+1, line(httpbench.SatConns, s, fig), note, 100*fig["wrk_share"], 100*fig["other_share"])
		}
	}
}

// startSystem builds and starts the example for one row from the example's own config file,
// pointed at the benchmark's Redis and at free loopback ports; the flightlock row keeps the
// example's own middleware, as shipped.
func (b *bench) startSystem(r s6Row) *httpbench.System {
	c, ports, err := httpbench.Load(b.c.exampleConf)
	check(err, "s6: %v")
	httpbench.PointRedis(&c, b.redisAddr())
	var opts []app.Option
	if r.id == "none" {
		opts = append(opts, app.WithoutOrderLock())
	}
	mw, closes := b.orderLock(r.id, c.Order.Lock, true)
	if mw != nil {
		opts = append(opts, app.WithOrderLock(mw))
	}
	s, err := httpbench.Start(r.id, r.uid, c, ports, closes, opts...)
	check(err, "s6 %s: %v", r.id)
	return s
}

// orderLock is the order API's lock of row id as a middleware of its own, from the example's
// Lock section lc, with what closes it; nil for "none", and for flightlock when the example
// installs its own (asShipped). redislock and setdel are locks as a go-zero user writes them
// without flightlock (httpbench.OrderMiddleware), with lc's prefix, on a client of their own.
// flightlock and shadow are the example's order rules on the benchmark's Redis, shadow with
// create-order in shadow mode: a shadow rule never gives the order logic the lease it fences
// its writes with, so the writes go unfenced, as in the other replaced rows.
func (b *bench) orderLock(id string, lc flmw.LockConf, asShipped bool) (rest.Middleware, []func()) {
	edit := func(*flmw.Rule) {}
	switch {
	case id == "redislock" || id == "setdel":
		r, _ := rowByID(id)
		im, err := r.build(b.redisAddr(), tunedClient)
		check(err, "s6 %s: %v", id)
		return httpbench.OrderMiddleware(tryLockFunc(im), lc.Prefix), []func(){im.close}
	case id == "shadow":
		edit = func(r *flmw.Rule) { r.Shadow = true }
	case id != "flightlock" || asShipped:
		return nil, nil
	}
	lc.Redis = flmw.RedisConf{Host: b.redisAddr()}
	mw, closeMW, err := httpbench.OrderRules(lc, edit)
	check(err, "s6 %s: %v", id)
	return mw, []func(){closeMW}
}

// tryLockFunc is one attempt of im (busy: 409) as the order API's lock, on every store; the
// lock keeps its row's TTL (lockTTL, the examples' too, or a session's lease).
func tryLockFunc(im impl) httpbench.LockFunc {
	return func(ctx context.Context, key string) (func(context.Context) error, error) {
		h, err := im.tryLock(ctx, key)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) error { return im.unlock(ctx, key, h) }, nil
	}
}

// roundTripMedian is the median latency of op, called one after the other for d: the round
// trip of a store (Redis's PING, etcd's Get) that scenario 6's added latency is counted in.
func roundTripMedian(d time.Duration, op func(ctx context.Context) error) float64 {
	var lat []int64
	for deadline := time.Now().Add(d); time.Now().Before(deadline); {
		ctx, cancel := context.WithTimeout(context.Background(), waitBudget)
		t0 := time.Now()
		err := op(ctx)
		lat = append(lat, int64(time.Since(t0)))
		cancel()
		check(err, "s6: round trip: %v")
	}
	return percentile(lat, 0.5)
}

// httpGoals are scenario 6's goals: at low load the lock adds at most 2.5 round trips
// (PING medians of the same run) to the no-lock row's median latency; at saturation flightlock
// serves at least the requests/s of bsm/redislock. A row with errors misses its goal.
func (r *report) httpGoals() []goal {
	s := r.s6
	if s == nil || s.Ping == nil {
		return nil
	}
	var gs []goal
	none, fl, rl := find(s.Low, "none"), find(s.Low, "flightlock"), find(s.Low, "redislock")
	if added, rts, ok := s.added(fl); ok && none != nil {
		measure := fmt.Sprintf("+%s over no lock (p50 %s vs %s) = %.2f round trips (PING p50 %s)",
			mdfmt.Dur(added), mdfmt.Dur(fl.med("p50")), mdfmt.Dur(none.med("p50")), rts, mdfmt.Dur(s.Ping.med("p50")))
		if _, rrts, ok := s.added(rl); ok {
			measure += fmt.Sprintf("; bsm/redislock +%.2f", rrts)
		}
		if _, frts, ok := s.added(find(s.Low, "setdel")); ok {
			measure += fmt.Sprintf(", SET PX + DEL floor +%.2f", frts)
		}
		measure += errNote(fl)
		gs = append(gs, goal{fmt.Sprintf("6: HTTP, low load (wrk -c %d)", httpbench.LowConns), "lock adds ≤ 2.5 round trips to median latency",
			measure, rts <= 2.5 && fl.worst("errors") == 0})
	}
	fl, rl = find(s.Sat, "flightlock"), find(s.Sat, "redislock")
	if ratio, ok := pairedRatio(fl, rl, "rps"); ok {
		gs = append(gs, goal{fmt.Sprintf("6: HTTP, saturation (wrk -c %d)", httpbench.SatConns), "flightlock req/s ≥ bsm/redislock's, and where the CPU goes",
			fmt.Sprintf("%.2fx (median of the repetitions' ratios; medians %s vs %s req/s); CPU of %d cores: service %.0f %%, Redis %.0f %%, wrk %.0f %%, other processes %.0f %%%s",
				ratio, mdfmt.Int(fl.med("rps")), mdfmt.Int(rl.med("rps")), runtime.NumCPU(),
				100*fl.med("svc_share"), 100*fl.med("redis_share"), 100*fl.med("wrk_share"), 100*fl.med("other_share"), errNote(fl)),
			ratio >= 1 && fl.worst("errors") == 0})
	}
	return gs
}

// added is httpbench.Added of row x over the no-lock row, in PINGs (the round trips of the rounds).
func (s *s6Results) added(x *result) (ns, rts float64, ok bool) {
	none := find(s.Low, "none")
	if x == nil || none == nil || s.Ping == nil {
		return 0, 0, false
	}
	rt := each(len(s.Ping.Reps), func(i int) float64 { return s.Ping.Reps[i][p50] })
	return httpbench.Added(x.Reps, none.Reps, rt)
}

// pairedRatio is httpbench.Paired of two rows.
func pairedRatio(x, y *result, metric string) (float64, bool) {
	if x == nil || y == nil {
		return 0, false
	}
	return httpbench.Paired(x.Reps, y.Reps, metric)
}

func errNote(x *result) string {
	if e := x.worst("errors"); e > 0 {
		return fmt.Sprintf("; %s failed requests in a repetition", mdfmt.Int(e))
	}
	return ""
}

func (r *report) s6Section(w func(string, ...any)) {
	s := r.s6
	if s.Note != "" {
		w("%s\n\n", s.Note)
		return
	}
	r.be.notes().s6Intro(r, w, s)
	r.httpTables(w, s, true)
}

// s6BareSection is scenario 6's rows over a bare handler.
func (r *report) s6BareSection(w func(string, ...any)) {
	s := r.s6bare
	w("Scenario 6's rows, wrk script and load on a go-zero REST server with the create-order route and nothing behind it\n")
	w("(`bench/internal/httpbench/bare.go`: the handler binds uid, sku and qty with `httpx.Parse` and answers), so the lock\n")
	w("is most of the request; each row is one server in this process.\n\n")
	if s.Observe {
		w("**Metrics and tracing on** (`-observe`), in every row, as in scenario 6.\n\n")
	}
	r.httpTables(w, s, false)
}

// s6Intro describes scenario 6's systems and load.
func (r *report) s6Intro(w func(string, ...any), s *s6Results) {
	conf := s.Conf
	if wd, err := os.Getwd(); err == nil {
		if rel, err := filepath.Rel(wd, conf); err == nil && !strings.HasPrefix(rel, "..") {
			conf = rel
		}
	}
	w("The example (`example/app`, config `%s`, its Redis replaced by the benchmark's and free ports) runs in the\n", conf)
	w("benchmark process, once per row (%d systems). `wrk` (one thread, `bench/internal/httpbench/order.lua`) posts\n", len(s.Sat))
	w("`/api/order/create` with a uid and a SKU of its own in every request, seeded before: no two requests share a lock key,\n")
	w("so the figures are the cost of locking, not of contention. A request is the whole example: the order API's lock (the\n")
	w("row), `Deduct` and `Debit` over zrpc on the inventory and balance services (each under its own flightlock interceptor\n")
	w("in every row), and the order write. Rows: **no lock** (`app.WithoutOrderLock()`); **flightlock** as shipped\n")
	w("(`Order.Lock`, reject mode, owner passed to the zrpc calls); **bsm/redislock** in a plain go-zero middleware\n")
	w("(`app.WithOrderLock`: uid from the JSON body, `Obtain` without retry, 409 when taken, `Release`); **floor**: that\n")
	w("middleware with a plain `SET PX` and `DEL`, two round trips and no lock; **flightlock, shadow**: the order rule with\n")
	w("`Shadow: true`, which holds no request back and counts the conflicts enforcement would have had. Without flightlock's\n")
	w("lease the order is written unfenced. go-zero's chains are the example's (tracing, logging at `severe`, breakers,\n")
	w("timeouts; no load shedding).\n\n")
	if s.Observe {
		w("**Metrics and tracing on** (`-observe`), in every row: go-zero's Prometheus metrics enabled (flightlock's and\n")
		w("go-zero's own series recorded) and every request traced, spans batched and encoded by go-zero's `file` exporter to\n")
		w("`/dev/null`. Compare with a run without `-observe` for what flightlock's metrics and spans add.\n\n")
	}
	w("Low load: `wrk -c %d`; a round trip is the median `PING` of a go-redis client of this process in each round (median\n", httpbench.LowConns)
	w("%s). Saturation: `wrk -c %d`, %v per row and repetition. CPU: the service's own `getrusage`, `/proc/<pid>/stat` of\n", mdfmt.Dur(s.Ping.med("p50")), httpbench.SatConns, httpbench.WholeSeconds(r.cfg.d6))
	w("`redis-server` and wrk's rusage, as shares of %d cores × the run's wall time. With every system up and no load the\n", runtime.NumCPU())
	w("process used %.1f %% of a core: the idle systems' background.\n\n", 100*s.IdleCPU)
}

// httpTables writes the low-load and saturation tables of an HTTP scenario; the first one
// (scenario 6) says how they are measured, the next (6b) points at it. The CPU columns name
// the service, each server process that ran (etcd's, Redis's) and wrk.
func (r *report) httpTables(w writer, s *s6Results, first bool) {
	n, c := r.be.notes(), r.cfg
	procs := []string{"svc"}
	for _, name := range []string{"etcd", "redis"} {
		if slices.ContainsFunc(s.Sat, func(x *result) bool { return has(x, name+"_cpu") }) {
			procs = append(procs, name)
		}
	}
	names := strings.NewReplacer("svc", "service", "etcd", "etcd", "redis", "Redis")
	procs = append(procs, "wrk")
	list := func(sep string, f func(name string) string) string {
		return strings.Join(each(len(procs), func(i int) string { return f(procs[i]) }), sep)
	}
	worstErrors := column{"errors", func(x *result) string { return mdfmt.Int(x.worst("errors")) }}
	perReq := []column{{n.reqCol + "/req", floatCell(reqs)}, {"fsyncs/req", countCell(fsy)}}

	w("### Low load (wrk -c %d)\n\n", httpbench.LowConns)
	if first {
		w("Medians over %d runs of %v per row (%d rounds per repetition). \"Added\" is the median over the rounds of the row's p50\n", len(s.Ping.Reps), httpbench.WholeSeconds(c.d6low), httpbench.LowRounds)
		w("minus the no-lock p50 of the same round, and in round trips divided by that round's %s p50.\n\n", n.ping)
	} else {
		w("Latency and cost of a request under one connection, as in scenario 6.\n\n")
	}
	added := func(rts bool) func(*result) string {
		return func(x *result) string {
			d, rt, ok := s.added(x)
			switch {
			case !ok || x.Row == "none":
				return " "
			case rts:
				return fmt.Sprintf("%.2f", rt)
			}
			return mdfmt.SignedDur(d)
		}
	}
	table(w, s.Low, append(append([]column{{"p50 latency", durCell(p50)}, {"added over no lock", added(false)}, {"in round trips (" + n.ping + " p50)", added(true)},
		{"p90", durCell("p90")}, {"p99", durCell(p99)}, {"req/s", intCell("rps")}}, perReq...),
		column{"service CPU µs/req", floatCell("svc_cpu")}, worstErrors)...)

	w("### Saturation (wrk -c %d)\n\n", httpbench.SatConns)
	if first {
		w("Medians of %d repetitions; \"x no lock\" is the median of the repetitions' ratios to the no-lock row. CPU shares are of\n", c.reps)
		w("%d cores over the run; \"other\" is the rest of the machine's busy time (`/proc/stat`): processes outside the benchmark.\n\n", runtime.NumCPU())
	} else {
		w("Throughput, latency and CPU under %d connections, as in scenario 6.\n\n", httpbench.SatConns)
	}
	none := find(s.Sat, "none")
	table(w, s.Sat, append(append([]column{{"req/s", intCell("rps")}, {"x no lock", func(x *result) string {
		if v, ok := pairedRatio(x, none, "rps"); ok {
			return fmt.Sprintf("%.2f", v)
		}
		return " "
	}}, {"p50", durCell(p50)}, {"p90", durCell("p90")}, {"p99", durCell(p99)}, {"p99.9", durCell("p999")}, {"max", durCell("max")}}, perReq...),
		column{"CPU µs/req: " + list(" / ", names.Replace), func(x *result) string {
			return list(" / ", func(p string) string { return mdfmt.Float(x.med(p + "_cpu")) })
		}},
		column{"CPU share: " + list(" / ", names.Replace) + " / other / idle", func(x *result) string {
			idle := 1 - x.med("other_share")
			for _, p := range procs {
				idle -= x.med(p + "_share")
			}
			return list(" / ", func(p string) string { return fmt.Sprintf("%.0f %%", 100*x.med(p+"_share")) }) +
				fmt.Sprintf(" / %.0f %% / %.0f %%", 100*x.med("other_share"), 100*max(idle, 0))
		}}, worstErrors)...)
	if slices.ContainsFunc(s.Sat, func(x *result) bool { return x.Mix != "" }) {
		w("Redis command mix per request at saturation (last repetition):\n\n")
		for _, x := range s.Sat {
			if x.Mix != "" {
				w("- %s: %s\n", x.Label, x.Mix)
			}
		}
		w("\n")
	}
	var disturbed []string
	for _, x := range s.Sat {
		for _, m := range x.Reps {
			if m["other_share"] > 0.1 {
				disturbed = append(disturbed, fmt.Sprintf("%s in repetition %.0f (%.0f %%)", x.Row, m["rep"]+1, 100*m["other_share"]))
			}
		}
	}
	if len(disturbed) > 0 {
		w("Saturation runs in which processes outside the benchmark took more than 10 %% of the machine (they count in the\n")
		w("medians): %s.\n\n", strings.Join(disturbed, ", "))
	}
	var wrapped float64 // the runs that reused uids
	for _, x := range append(s.Low, s.Sat...) {
		wrapped += x.sum("wrapped")
	}
	if wrapped > 0 {
		w("%d runs sent more requests than the uids seeded for them and reused uids (one after the other, never at once).\n\n", int(wrapped))
	}
}

// Scenario 7, on every store: httpbench.Dups concurrent duplicates of one request (one
// idempotency key, one body) through go-zero's REST chain and flightlock's middleware on the
// benchmark's server, the handler taking httpbench.DupWork. Rows: OnBusy share (one run, every
// duplicate gets its response) and OnBusy reject (one run, the others answered 409 at once).
// Each burst uses a key of its own.

// dupRows are the rows of scenario 7: id and the rule's OnBusy.
var dupRows = []struct{ id, onBusy string }{{"share", "share"}, {"reject", "reject"}}

// dupBursts runs scenario 7: a server per row on the middleware's Lock section conf with that
// row's rule, reps repetitions of the rows in rotated order, one httpbench.DupServer.Bursts per
// row and repetition. Rows are labelled lib + ", OnBusy " + the rule's OnBusy.
func dupBursts(conf flmw.LockConf, reps int, lib string) []*result {
	servers := map[string]*httpbench.DupServer{}
	defer func() {
		for _, s := range servers {
			s.Close()
		}
	}()
	var rows []rowSpec
	for _, row := range dupRows {
		conf.Rules = []flmw.Rule{httpbench.DupRule(row.onBusy)}
		s, err := httpbench.NewDupServer(conf)
		check(err, "s7 %s: %v", row.id)
		servers[row.id] = s
		rows = append(rows, rowSpec{id: row.id, lib: lib + ", OnBusy " + row.onBusy})
	}
	var out []*result
	for rep := range reps {
		for _, r := range interleave.Rotate(rows, rep) {
			m := servers[r.id].Bursts(fmt.Sprintf("r%d-%s-", rep, r.id))
			out = addRep(out, r, m, "", "")
			progress("  7 rep %d %-7s runs/burst %.2f identical %.1f ok %.1f 409 %.1f other %.1f p50 %s p99 %s", rep+1, r.id,
				m["runs"], m["identical"], m["ok"], m["busy"], m["other"], mdfmt.Dur(m["p50"]), mdfmt.Dur(m["p99"]))
		}
	}
	return out
}

func (r *report) s7Section(w writer) {
	w("%d concurrent duplicates of one request (one `Idempotency-Key`, one body) through go-zero's REST chain and\n", httpbench.Dups)
	w("flightlock's middleware with its rule (`pay:{header.Idempotency-Key}`; `Wait: 5s` for share) on the benchmark's %s, the handler\n", r.be.notes().title)
	w("taking %v; %d bursts per repetition, a key of its own each; figures per burst, medians over %d repetitions. *share*:\n", httpbench.DupWork, httpbench.DupRounds, r.cfg.reps)
	w("duplicates wait and get the response of the one run (stored in %s for `Replay`, 10s by default); *reject*: they are\n", r.be.notes().title)
	w("answered 409 at once.\n\n")
	table(w, r.s7, column{"handler runs per burst", floatCell("runs")}, column{"identical 200 responses", floatCell("identical")}, column{"409s", floatCell("busy")},
		column{"other", floatCell("other")}, column{"p50 latency", durCell("p50")}, column{"p99", durCell("p99")}, column{"max", durCell("max")})
}
