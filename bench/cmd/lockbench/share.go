package main

import (
	"fmt"

	"github.com/flightlock/flightlock/bench/internal/httpbench"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
	flmw "github.com/flightlock/flightlock/middleware"
)

// Scenario 7: 64 concurrent duplicates of one request (one idempotency key, one
// body) through go-zero's REST chain and flightlock's middleware on the benchmark's
// redis-server, the handler taking httpbench.DupWork. Rows: OnBusy share (one run, every
// duplicate gets its response) and OnBusy reject (one run, 63 answered 409 at once). Each
// repetition uses a key of its own. etcdshare.go runs it on etcd.

var s7Rows = []struct{ id, label, onBusy string }{
	{"share", "flightlock, OnBusy share", "share"},
	{"reject", "flightlock, OnBusy reject", "reject"},
}

func (b *bench) scenario7() []*result {
	var out []*result
	servers := map[string]*httpbench.DupServer{}
	defer func() {
		for _, s := range servers {
			s.Close()
		}
	}()
	for _, row := range s7Rows {
		if onlyRows != nil && !onlyRows[row.id] {
			continue
		}
		out = append(out, &result{Row: row.id, Label: row.label})
		s, err := httpbench.NewDupServer(flmw.LockConf{Redis: flmw.RedisConf{Host: b.addr}, Rules: []flmw.Rule{httpbench.DupRule(row.onBusy)}})
		if err != nil {
			fatalf("s7: %v", err)
		}
		servers[row.id] = s
	}
	for rep := 0; rep < b.cfg.reps; rep++ {
		for _, x := range out {
			m := metrics(servers[x.Row].Bursts(fmt.Sprintf("r%d-%s-", rep, x.Row)))
			x.Reps = append(x.Reps, m)
			progress("s7 rep %d %-7s runs/burst %.2f identical %.1f ok %.1f 409 %.1f other %.1f p50 %s p99 %s", rep+1, x.Row,
				m["runs"], m["identical"], m["ok"], m["busy"], m["other"], mdfmt.Dur(m["p50"]), mdfmt.Dur(m["p99"]))
		}
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
