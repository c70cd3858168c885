package main

import (
	"fmt"

	"github.com/flightlock/flightlock/bench/internal/httpbench"
	"github.com/flightlock/flightlock/bench/internal/interleave"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
	flmw "github.com/flightlock/flightlock/middleware"
)

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
	w("flightlock's middleware with its rule (`pay:{header.Idempotency-Key}`, `Wait: 5s`) on the benchmark's %s, the handler\n", r.be.title())
	w("taking %v; %d bursts per repetition, a key of its own each; figures per burst, medians over %d repetitions. *share*:\n", httpbench.DupWork, httpbench.DupRounds, r.cfg.reps)
	w("duplicates wait and get the response of the one run (stored in %s for `Replay`, 10s by default); *reject*: they are\n", r.be.title())
	w("answered 409 at once.\n\n")
	table(w, r.s7, column{"handler runs per burst", floatCell("runs")}, column{"identical 200 responses", floatCell("identical")}, column{"409s", floatCell("busy")},
		column{"other", floatCell("other")}, column{"p50 latency", durCell("p50")}, column{"p99", durCell("p99")}, column{"max", durCell("max")})
}
