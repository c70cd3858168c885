package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/flightlock/flightlock/bench/internal/httpbench"
	"github.com/flightlock/flightlock/bench/internal/interleave"
	flmw "github.com/flightlock/flightlock/middleware"
)

// Scenario 7 on etcd, duplicates of one request, as for the Redis rows: httpbench.Dups concurrent duplicates of one request (one Idempotency-Key, one
// body) through go-zero's REST chain and flightlock's middleware with its rule on the
// benchmark's etcd, the handler taking httpbench.DupWork. Rows: OnBusy share (one run, every
// duplicate gets its response, stored in etcd for Replay) and OnBusy reject (one run, the
// others answered 409 at once). Each burst uses a key of its own.

// etcdDupRows are the rows of scenario 7: id, label and the rule's OnBusy.
var etcdDupRows = []struct{ id, label, onBusy string }{
	{"share", "flightlock on etcd, OnBusy share", "share"},
	{"reject", "flightlock on etcd, OnBusy reject", "reject"},
}

func (b *etcdBench) dups() map[string][]map[string]float64 {
	servers := map[string]*httpbench.DupServer{}
	defer func() {
		for _, s := range servers {
			s.Close()
		}
	}()
	etcd := flmw.EtcdConf{Hosts: []string{strings.TrimPrefix(b.srv.clientURL, "http://")}}
	var ids []string
	for _, row := range etcdDupRows {
		s, err := httpbench.NewDupServer(flmw.LockConf{Etcd: etcd, Rules: []flmw.Rule{httpbench.DupRule(row.onBusy)}})
		if err != nil {
			fatalf("s9 %s: %v", row.id, err)
		}
		servers[row.id] = s
		ids = append(ids, row.id)
	}
	out := map[string][]map[string]float64{}
	for rep := range b.c.reps {
		for _, id := range interleave.Rotate(ids, rep) {
			m := servers[id].Bursts(fmt.Sprintf("r%d-%s-", rep, id))
			out[id] = append(out[id], m)
			progress("  7 rep %d %-7s runs/burst %.2f identical %.1f ok %.1f 409 %.1f other %.1f p50 %s p99 %s", rep+1, id,
				m["runs"], m["identical"], m["ok"], m["busy"], m["other"], etcdDur(time.Duration(m["p50"])), etcdDur(time.Duration(m["p99"])))
		}
	}
	return out
}
