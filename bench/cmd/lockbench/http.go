package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/zeromicro/go-zero/core/prometheus"
	"github.com/zeromicro/go-zero/core/trace"
	"github.com/zeromicro/go-zero/rest"

	"github.com/flightlock/flightlock/bench/internal/httpbench"
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
	res := b.httpScenario(b.startBare, rows)
	res.Bare = true
	return res
}

// httpScenario runs wrk against the system start builds for each of rows, at low load and at
// saturation (scenario 6 and its bare-handler twin).
func (b *bench) httpScenario(start func(s6Row) *httpbench.System, all []s6Row) *s6Results {
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
	var rows []s6Row
	for _, r := range all {
		if onlyRows == nil || onlyRows[r.id] {
			rows = append(rows, r)
		}
	}
	ping := b.rowImpl("ping", -1)
	loadSystems(res, b.c, "s6 ", rows, start, map[string]int{"redis": b.be.Pid()}, b.meter(""),
		func(ctx context.Context) error { _, err := ping.lock(ctx, ""); return err })
	return res
}

// loadSystems is scenario 6's load on every store (httpbench.Schedule): a system per row
// (start), wrk at low load and at saturation against each with the CPU of procs (name -> pid)
// and m's counters around every run (wrkRun): the server's requests and fsyncs per request
// and its command mix, roundTrip the store's cheapest call. The runs go into res, with each
// row's last mix at either load.
func loadSystems(res *s6Results, c *config, tag string, rows []s6Row, start func(s6Row) *httpbench.System, procs map[string]int, m meter,
	roundTrip func(ctx context.Context) error,
) {
	wrk, logf := newWrk(tag)
	defer wrk.Close()
	var systems []*httpbench.System
	for _, r := range rows {
		systems = append(systems, start(r))
	}
	defer httpbench.Stop(systems, logf)
	mix := map[int]map[string]string{httpbench.LowConns: {}, httpbench.SatConns: {}}
	loads, err := httpbench.Schedule{
		Reps: c.reps,
		Low:  httpbench.WholeSeconds(c.d6low),
		Sat:  httpbench.WholeSeconds(c.d6),
		Measure: func(s *httpbench.System, conns int, d time.Duration, expect float64) (map[string]float64, error) {
			fig, st, n := wrkRun(wrk, s, conns, d, expect, procs, m)
			fig[reqs], fig[fsy] = st.reqs/n, st.fsyncs/n
			mix[conns][s.ID] = mixString(st.cmds, int64(n))
			return fig, nil
		},
		RoundTrip: func() float64 { return roundTripMedian(300*time.Millisecond, roundTrip) },
		Logf:      logf,
		SatNote: func(m metrics) string {
			note := fmt.Sprintf("requests/req %.2f cpu svc %.0f%%", m[reqs], 100*m["svc_share"])
			for name := range procs {
				note += fmt.Sprintf(" %s %.0f%%", name, 100*m[name+"_share"])
			}
			return note + fmt.Sprintf(" wrk %.0f%% other %.0f%%", 100*m["wrk_share"], 100*m["other_share"])
		},
	}.Run(systems)
	if err != nil {
		fatalf("%s%v", tag, err)
	}
	res.addLoads(loads, rows, mix[httpbench.LowConns], mix[httpbench.SatConns])
}

// addLoads records scenario 6's schedule on every store: each row's low-load and saturation
// runs, with its command mix where the store has one, and the store's round trip of every
// low-load round as the PING row.
func (res *s6Results) addLoads(loads httpbench.Loads, rows []s6Row, lowMix, satMix map[string]string) {
	res.IdleCPU = loads.IdleCPU
	res.Ping = &result{Row: "ping", Label: "floor: PING"}
	for k, rt := range loads.RoundTrips {
		res.Ping.Reps = append(res.Ping.Reps, metrics{"p50": rt, "round": float64(k)})
	}
	for _, r := range rows {
		res.Low = append(res.Low, &result{Row: r.id, Label: r.label, Mix: lowMix[r.id], Reps: loads.Low[r.id]})
		res.Sat = append(res.Sat, &result{Row: r.id, Label: r.label, Mix: satMix[r.id], Reps: loads.Sat[r.id]})
	}
}

// wrapped counts the runs that reused uids.
func (res *s6Results) wrapped() float64 {
	var n float64
	for _, x := range append(res.Low, res.Sat...) {
		n += x.sum("wrapped")
	}
	return n
}

// newWrk is scenario 6's wrk on every store: tracked among the processes this run started, its
// progress lines (and the scenario's, logf) behind tag.
func newWrk(tag string) (*httpbench.Wrk, func(format string, args ...any)) {
	wrk, err := httpbench.NewWrk()
	if err != nil {
		fatalf("%s%v", tag, err)
	}
	logf := func(format string, args ...any) { progress(tag+format, args...) }
	wrk.Track, wrk.Logf = workers.Track, logf
	return wrk, logf
}

// startSystem builds and starts the example for one row from the example's own config file,
// pointed at the benchmark's Redis and at free loopback ports; the flightlock row keeps the
// example's own middleware, as shipped.
func (b *bench) startSystem(r s6Row) *httpbench.System {
	c, ports, err := httpbench.Load(b.c.exampleConf)
	if err != nil {
		fatalf("s6: %v", err)
	}
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
	if err != nil {
		fatalf("s6 %s: %v", r.id, err)
	}
	return s
}

// startBare starts the bare create-order server of one row, with the row's orderLock.
func (b *bench) startBare(r s6Row) *httpbench.System {
	c, _, err := httpbench.Load(b.c.exampleConf)
	if err != nil {
		fatalf("s6 bare: %v", err)
	}
	mw, closes := b.orderLock(r.id, c.Order.Lock, false)
	s, err := httpbench.StartBare(r.id, r.uid, mw, closes)
	if err != nil {
		fatalf("s6 bare %s: %v", r.id, err)
	}
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
		if err != nil {
			fatalf("s6 %s: %v", id, err)
		}
		return httpbench.OrderMiddleware(tryLockFunc(im), lc.Prefix), []func(){im.close}
	case id == "shadow":
		edit = func(r *flmw.Rule) { r.Shadow = true }
	case id != "flightlock" || asShipped:
		return nil, nil
	}
	lc.Redis = flmw.RedisConf{Host: b.redisAddr()}
	mw, closeMW, err := httpbench.OrderRules(lc, edit)
	if err != nil {
		fatalf("s6 %s: %v", id, err)
	}
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

// wrkRun runs wrk against s (httpbench.Wrk.RunCPU: the CPU of the service and of the procs
// by name), on every store, and returns the run's figures, what m counted over it and the
// requests it made.
func wrkRun(wrk *httpbench.Wrk, s *httpbench.System, conns int, d time.Duration, expect float64, procs map[string]int, m meter) (metrics, serverStats, float64) {
	var st0 serverStats
	fig, run, err := wrk.RunCPU(s, conns, d, expect, procs, func() { st0 = readStats(m, false) })
	if err != nil {
		fatalf("s6 %s: %v", s.ID, err)
	}
	return fig, readStats(m, true).sub(st0), float64(run.Requests)
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
		if err != nil {
			fatalf("s6: round trip: %v", err)
		}
	}
	slices.Sort(lat)
	return percentile(lat, 0.5)
}
