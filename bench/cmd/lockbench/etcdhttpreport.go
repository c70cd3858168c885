package main

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/flightlock/flightlock/bench/internal/httpbench"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
	"github.com/flightlock/flightlock/bench/internal/stat"
)

// Report sections of scenarios 5 (reject mode), 6 (HTTP end to end) and 7 (duplicates).

// medOf is the median of one figure over a row's runs.
func medOf(runs []map[string]float64, name string) float64 {
	var v []float64
	for _, m := range runs {
		v = append(v, m[name])
	}
	return stat.Median(v)
}

// worstOf is the largest value of one figure over a row's runs.
func worstOf(runs []map[string]float64, name string) float64 {
	var w float64
	for _, m := range runs {
		w = max(w, m[name])
	}
	return w
}

func (r *etcdResults) rejectSection(p printer, c *config) {
	p("## 5. Reject mode: duplicates of a key held in this process")
	p("")
	p("The Redis rows are scenario 5 of [benchmarks.md](benchmarks.md). The key is held in this process; then one goroutine tries it again and")
	p("again for %v (flightlock: `TryLock` on a `Reject` Locker that shares the holder's gate, which refuses without an RPC;", c.d5)
	p("`concurrency.Mutex`: `TryLock` of a Mutex on another session, which puts its own key under the lock's prefix, reads")
	p("the owner, finds another, deletes its key and answers `ErrLocked`). \"%d goroutines\" is the same with %d goroutines", s5Goroutines, s5Goroutines)
	p("at once for %v (wall time per call over all of them; each Mutex goroutine on a session of its own), as a burst of", c.d5)
	p("double clicks would. Allocations are `runtime.MemStats` deltas over the serial part (the Mutex's include the gRPC")
	p("client's); RPCs, fsyncs and etcd CPU as in the other scenarios. Medians over %d repetitions. \"not busy\" counts the", c.reps)
	p("calls that did not answer busy, over all repetitions (it must be 0).")
	p("")
	p("| row | ns/call | allocs/call | B/call | etcd RPCs/call | fsyncs/call | etcd CPU/call | %d goroutines: ns/call | calls/s | %d goroutines: RPCs/call | not busy |", s5Goroutines, s5Goroutines)
	p("|---|---|---|---|---|---|---|---|---|---|---|")
	med := func(row string, f func(rejectResult) float64) float64 {
		var v []float64
		for _, x := range r.reject[row] {
			v = append(v, f(x))
		}
		return stat.Median(v)
	}
	for _, row := range []string{rowFlight, rowMutex} {
		var wrong int64
		var firstErr error
		for _, x := range r.reject[row] {
			wrong += x.wrong
			if firstErr == nil {
				firstErr = x.firstErr
			}
		}
		p("| %s | %s | %.2f | %s | %s | %s | %s | %s | %s | %s | %d |", rejectLabel[row],
			countStr(int(med(row, func(x rejectResult) float64 { return x.ns }))),
			med(row, func(x rejectResult) float64 { return x.allocs }),
			countStr(int(med(row, func(x rejectResult) float64 { return x.bytes }))),
			perOp(med(row, func(x rejectResult) float64 { return x.rpcs })),
			perOp(med(row, func(x rejectResult) float64 { return x.fsyncs })),
			etcdDur(time.Duration(med(row, func(x rejectResult) float64 { return float64(x.etcdCPU) }))),
			countStr(int(med(row, func(x rejectResult) float64 { return x.parNs }))),
			countStr(int(med(row, func(x rejectResult) float64 { return x.parRate }))),
			perOp(med(row, func(x rejectResult) float64 { return x.parRPCs })), wrong)
		if firstErr != nil {
			defer p("First call of %s that did not answer busy: `%v`.\n", rejectLabel[row], firstErr)
		}
	}
	fl, mu := med(rowFlight, func(x rejectResult) float64 { return x.ns }), med(rowMutex, func(x rejectResult) float64 { return x.ns })
	flp, mup := med(rowFlight, func(x rejectResult) float64 { return x.parRate }), med(rowMutex, func(x rejectResult) float64 { return x.parRate })
	p("")
	p("A refusal costs Mutex %.0fx flightlock's time with one goroutine; with %d, flightlock refuses %.0fx as many calls per second.", safeDiv(mu, fl), s5Goroutines, safeDiv(flp, mup))
	p("")
}

// rejectLabel names scenario 5's rows.
var rejectLabel = map[string]string{
	rowFlight: "flightlock on etcdstore (TryLock, Reject Locker)",
	rowMutex:  "etcd concurrency.Mutex (TryLock)",
}

// added is how much row adds to the no-lock row's median latency at low load: the median over
// the rounds of its p50 minus the no-lock p50 of the same round, and of that difference divided
// by the round's etcd Get p50.
func (h *httpResults) added(row string) (ns, rts float64, ok bool) {
	x, none := h.low[row], h.low["none"]
	if len(x) == 0 || len(x) != len(none) || len(x) != len(h.getRT) {
		return 0, 0, false
	}
	var diffs, ratios []float64
	for k := range x {
		d := x[k]["p50"] - none[k]["p50"]
		diffs = append(diffs, d)
		ratios = append(ratios, d/h.getRT[k])
	}
	return stat.Median(diffs), stat.Median(ratios), true
}

// xNone is the median over the repetitions of row's saturation req/s over the no-lock row's in
// the same repetition: rows run one after the other, so a repetition disturbed by the machine
// moves both, and the ratio less than either.
func (h *httpResults) xNone(row string) (float64, bool) {
	x, none := h.sat[row], h.sat["none"]
	if len(x) == 0 || len(x) != len(none) {
		return 0, false
	}
	var v []float64
	for i := range x {
		v = append(v, safeDiv(x[i]["rps"], none[i]["rps"]))
	}
	return stat.Median(v), true
}

func (r *etcdResults) httpSection(p printer, c *config) {
	h := r.http
	p("## 6. HTTP end to end")
	p("")
	if h.note != "" {
		p("%s", h.note)
		p("")
		return
	}
	p("The Redis rows are scenario 6 of benchmarks.md, whose setup this follows. The example (`example/app`, config")
	p("`etc/%s` with the create-order rule moved to etcd (`Store: etcd`), its etcd sections pointed at the", filepath.Base(h.conf))
	p("benchmark's etcd and its Redis at a `redis-server` this command starts for the scenario, free ports) runs in the")
	p("benchmark process, once per row (%d systems, each started once). `wrk` (one thread,", len(h.rows))
	p("`bench/internal/httpbench/order.lua`) posts `/api/order/create` with a uid of its own in every request, and a SKU of")
	p("the same name, both seeded in Redis before the run: no two requests share a lock key, so the figures are the cost of")
	p("locking, not of contention. A request is the whole example: the order API's lock (the row), `Deduct` on the inventory")
	p("service (its SKU lock in Redis) and `Debit` on the balance service (its account lock in etcd, as the etcd example")
	p("has it) over zrpc, each under its own flightlock interceptor in every row, and the order write in Redis. Rows:")
	p("**no lock** (`app.WithoutOrderLock()`); **flightlock**, the order API's rules (`Order.Lock`, create-order moved to")
	p("etcd: reject mode, the lock `flightlock/lock:order:<uid>` on the store's session lease) in a middleware installed")
	p("with `app.WithOrderLock` as the other rows' locks are (so no owner goes to the zrpc calls; installed as shipped, the")
	p("example's order logic would look for its fencing lease under a Redis rule's key, find none, and answer 500); **etcd")
	p("concurrency.Mutex** in a plain go-zero middleware (`app.WithOrderLock`): uid from the JSON body (restored), `TryLock`")
	p("of a Mutex on the same key on one session of this process (%ds lease, kept alive by the client; 409 when taken), the", leaseSeconds)
	p("handler, `Unlock`; **floor**: the same middleware with scenario 1's floor, a transaction that puts the key on a")
	p("pre-granted lease if its create revision is 0 (409 otherwise), then a delete: the two writes any etcd lock needs and")
	p("nothing else (no owner check). In every row the order is written unfenced. go-zero's REST and zrpc")
	p("chains are the example's (tracing, logging at level `severe`, breakers, timeouts); load shedding is off.")
	p("")
	p("Low load: `wrk -c %d`; a round trip is the median latency of an etcd `Get` (linearizable, the client's default) of an", httpbench.LowConns)
	p("absent key from an etcd client of the same process, measured for 300ms in each round (median %s): etcd's PING. Saturation:", etcdDur(time.Duration(stat.Median(h.getRT))))
	p("`wrk -c %d` for %v per row and repetition. etcd RPCs and fsyncs per request are deltas of etcd's `/metrics` over", httpbench.SatConns, httpbench.WholeSeconds(c.d6))
	p("the run (the balance service's account lock is two RPCs and two fsyncs of every row). CPU: the benchmark process's")
	p("own `getrusage` (the service), `/proc/<pid>/stat` of etcd and of `redis-server`, and wrk's rusage as a child, over the")
	p("run; shares are of %d cores × the run's wall time. With every system up and no load, the benchmark process used", runtime.NumCPU())
	p("%.1f %% of a core: that much of each run's service CPU is the idle systems' background.", 100*h.idleCPU)
	p("")
	p("### Low load (wrk -c %d)", httpbench.LowConns)
	p("")
	p("Medians over %d runs of %v per row (%d rounds per repetition). \"Added\" is the median over the rounds of the row's p50", len(h.getRT), httpbench.WholeSeconds(c.d6low), httpbench.LowRounds)
	p("minus the no-lock p50 of the same round, and in round trips divided by that round's etcd Get p50.")
	p("")
	p("| row | p50 latency | added over no lock | in round trips (etcd Get p50) | p90 | p99 | req/s | etcd RPCs/req | fsyncs/req | service CPU µs/req | errors |")
	p("|---|---|---|---|---|---|---|---|---|---|---|")
	for _, row := range h.rows {
		runs := h.low[row.id]
		added, rts := "", ""
		if d, rt, ok := h.added(row.id); ok && row.id != "none" {
			added, rts = mdfmt.SignedDur(d), fmt.Sprintf("%.2f", rt)
		}
		p("| %s | %s | %s | %s | %s | %s | %.0f | %.2f | %.2f | %.0f | %.0f |", row.label, etcdDur(time.Duration(medOf(runs, "p50"))), added, rts,
			etcdDur(time.Duration(medOf(runs, "p90"))), etcdDur(time.Duration(medOf(runs, "p99"))), medOf(runs, "rps"),
			medOf(runs, "rpcs"), medOf(runs, "fsyncs"), medOf(runs, "svc_cpu"), worstOf(runs, "errors"))
	}
	p("")
	p("### Saturation (wrk -c %d)", httpbench.SatConns)
	p("")
	p("Medians of %d repetitions; \"x no lock\" is the median of the repetitions' ratios to the no-lock row. CPU shares are of", c.reps)
	p("%d cores over the run; \"other\" is the rest of the machine's busy time (`/proc/stat`): processes outside the benchmark.", runtime.NumCPU())
	p("")
	p("| row | req/s | x no lock | p50 | p90 | p99 | p99.9 | max | etcd RPCs/req | fsyncs/req | CPU µs/req: service / etcd / Redis / wrk | CPU share: service / etcd / Redis / wrk / other / idle | errors |")
	p("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, row := range h.rows {
		runs := h.sat[row.id]
		ratio := ""
		if v, ok := h.xNone(row.id); ok {
			ratio = fmt.Sprintf("%.2f", v)
		}
		share := func(name string) float64 { return 100 * medOf(runs, name) }
		idle := 100 - share("svc_share") - share("etcd_share") - share("redis_share") - share("wrk_share") - share("other_share")
		p("| %s | %.0f | %s | %s | %s | %s | %s | %s | %.2f | %.2f | %.0f / %.0f / %.0f / %.0f | %.0f %% / %.0f %% / %.0f %% / %.0f %% / %.0f %% / %.0f %% | %.0f |",
			row.label, medOf(runs, "rps"), ratio, etcdDur(time.Duration(medOf(runs, "p50"))), etcdDur(time.Duration(medOf(runs, "p90"))),
			etcdDur(time.Duration(medOf(runs, "p99"))), etcdDur(time.Duration(medOf(runs, "p999"))), etcdDur(time.Duration(medOf(runs, "max"))),
			medOf(runs, "rpcs"), medOf(runs, "fsyncs"),
			medOf(runs, "svc_cpu"), medOf(runs, "etcd_cpu"), medOf(runs, "redis_cpu"), medOf(runs, "wrk_cpu"),
			share("svc_share"), share("etcd_share"), share("redis_share"), share("wrk_share"), share("other_share"), max(idle, 0),
			worstOf(runs, "errors"))
	}
	var disturbed []string
	for _, row := range h.rows {
		for _, m := range h.sat[row.id] {
			if m["other_share"] > 0.1 {
				disturbed = append(disturbed, fmt.Sprintf("%s in repetition %.0f (%.0f %%)", row.id, m["rep"]+1, 100*m["other_share"]))
			}
		}
	}
	if len(disturbed) > 0 {
		p("")
		p("Saturation runs in which processes outside the benchmark took more than 10 %% of the machine (they count in the")
		p("medians): %s.", strings.Join(disturbed, ", "))
	}
	var wrapped float64
	for _, byRow := range []map[string][]map[string]float64{h.low, h.sat} {
		for _, runs := range byRow {
			for _, m := range runs {
				wrapped += m["wrapped"]
			}
		}
	}
	if wrapped > 0 {
		p("")
		p("%.0f runs sent more requests than the uids seeded for them and reused uids (one after the other, never at once).", wrapped)
	}
	p("")
}

func (r *etcdResults) dupsSection(p printer, c *config) {
	p("## 7. Duplicates of one request: shared response against 409")
	p("")
	p("The Redis rows are scenario 7 of benchmarks.md. %d concurrent duplicates of one request (one `Idempotency-Key`, one body)", httpbench.Dups)
	p("through go-zero's REST chain and flightlock's middleware with its rule on the benchmark's etcd (`Lock.Etcd.Hosts`,")
	p("rule `pay:{header.Idempotency-Key}`, `Wait: 5s`), the handler taking %v; %d bursts per repetition, a key of its own", httpbench.DupWork, httpbench.DupRounds)
	p("each; figures per burst, medians over %d repetitions. *share*: duplicates wait and get the response of the one run", c.reps)
	p("(stored in etcd for `Replay`, 10s by default); *reject*: they are answered 409 at once.")
	p("")
	p("| row | handler runs per burst | identical 200 responses | 409s | other | p50 latency | p99 | max |")
	p("|---|---|---|---|---|---|---|---|")
	for _, row := range etcdDupRows {
		runs := r.dups[row.id]
		p("| %s | %.2f | %.1f | %.1f | %.1f | %s | %s | %s |", row.label, medOf(runs, "runs"), medOf(runs, "identical"),
			medOf(runs, "busy"), medOf(runs, "other"), etcdDur(time.Duration(medOf(runs, "p50"))), etcdDur(time.Duration(medOf(runs, "p99"))),
			etcdDur(time.Duration(medOf(runs, "max"))))
	}
	p("")
}
