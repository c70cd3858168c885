package main

import (
	"github.com/flightlock/flightlock/bench/internal/httpbench"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
	flmw "github.com/flightlock/flightlock/middleware"
)

// Scenario 7: 64 concurrent duplicates of one request (one idempotency key, one
// body) through go-zero's REST chain and flightlock's middleware on the benchmark's
// redis-server, the handler taking httpbench.DupWork (dupBursts, as on every store). Rows:
// OnBusy share (one run, every duplicate gets its response) and OnBusy reject (one run, 63
// answered 409 at once). Each burst uses a key of its own.

func (b *bench) scenario7() []*result {
	runs := dupBursts(flmw.LockConf{Redis: flmw.RedisConf{Host: b.addr}}, b.cfg.reps)
	var out []*result
	for _, row := range dupRows {
		out = append(out, &result{Row: row.id, Label: "flightlock, OnBusy " + row.onBusy, Reps: runs[row.id]})
	}
	return out
}

func (r *report) s7Section(w func(string, ...any)) {
	w("%d concurrent duplicates of one request (one `Idempotency-Key`, one body) through go-zero's REST chain and the\n", httpbench.Dups)
	w("middleware, the handler taking %v; %d bursts per repetition, a key of its own each; figures per burst, medians over\n", httpbench.DupWork, httpbench.DupRounds)
	w("%d repetitions. *share*: duplicates wait and get the response of the one run; *reject*: they are answered 409 at once.\n\n", r.cfg.reps)
	w("| row | handler runs per burst | identical 200 responses | 409s | other | p50 latency | p99 | max |\n|---|---|---|---|---|---|---|---|\n")
	for _, x := range r.s7 {
		w("| %s | %s | %s | %s | %s | %s | %s | %s |\n", x.Label, mdfmt.Float(x.med("runs")), mdfmt.Float(x.med("identical")),
			mdfmt.Float(x.med("busy")), mdfmt.Float(x.med("other")), mdfmt.Dur(x.med("p50")), mdfmt.Dur(x.med("p99")), mdfmt.Dur(x.med("max")))
	}
	w("\n")
}
