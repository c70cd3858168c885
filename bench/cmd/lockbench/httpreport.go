package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/flightlock/flightlock/bench/internal/httpbench"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
)

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
	var rt []float64
	for _, m := range s.Ping.Reps {
		rt = append(rt, m["p50"])
	}
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
	w("is most of the request. **flightlock** is the example's order rules (`Order.Lock`, reject mode); the other rows are\n")
	w("scenario 6's plain middlewares, each row one server in this process.\n\n")
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
	w("`redis-server` and wrk's rusage, as shares of %d cores × the run's wall time. Redis commands per request are `INFO\n", runtime.NumCPU())
	w("commandstats` deltas. With every system up and no load the process used %.1f %% of a core: the idle systems' background.\n\n", 100*s.IdleCPU)
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
	list := func(sep string, f func(name string) string) string {
		var out []string
		for _, p := range append(procs, "wrk") {
			out = append(out, f(p))
		}
		return strings.Join(out, sep)
	}
	worstErrors := column{"errors", func(x *result) string { return mdfmt.Int(x.worst("errors")) }}
	perReq := []column{{n.reqCol + "/req", func(x *result) string { return mdfmt.Float(x.med(reqs)) }}, {"fsyncs/req", countCell(fsy)}}

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
		column{"service CPU µs/req", func(x *result) string { return mdfmt.Float(x.med("svc_cpu")) }}, worstErrors)...)

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
			for _, p := range append(procs, "wrk") {
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
	if wrapped := s.wrapped(); wrapped > 0 {
		w("%d runs sent more requests than the uids seeded for them and reused uids (one after the other, never at once).\n\n", int(wrapped))
	}
}
