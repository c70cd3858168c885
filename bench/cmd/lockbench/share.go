package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeromicro/go-zero/rest"

	flmw "github.com/flightlock/flightlock/middleware"
)

// Scenario 7 of issue 12: 64 concurrent duplicates of one request (one idempotency key, one
// body) through go-zero's REST chain and flightlock's middleware on the benchmark's
// redis-server, the handler taking s7Work. Rows: OnBusy share (one run, every duplicate gets
// its response) and OnBusy reject (one run, 63 answered 409 at once). Each repetition uses a
// key of its own.

const (
	s7Dups   = 64
	s7Work   = 20 * time.Millisecond // the handler's own time: a payment call, say
	s7Rounds = 20                    // bursts per repetition
)

var s7Rows = []struct{ id, label, onBusy string }{
	{"share", "flightlock, OnBusy share", "share"},
	{"reject", "flightlock, OnBusy reject", "reject"},
}

func (b *bench) scenario7() []*result {
	var out []*result
	for _, row := range s7Rows {
		if onlyRows != nil && !onlyRows[row.id] {
			continue
		}
		out = append(out, &result{Row: row.id, Label: row.label})
	}
	type server struct {
		url   string
		runs  *atomic.Int64
		close func()
	}
	servers := map[string]server{}
	for _, row := range s7Rows {
		m, err := flmw.New(flmw.LockConf{Redis: flmw.RedisConf{Host: b.addr}, Rules: []flmw.Rule{
			{Method: http.MethodPost, Path: "/pay", Key: "pay:{header.Idempotency-Key}", OnBusy: row.onBusy, Wait: 5 * time.Second},
		}})
		if err != nil {
			fatalf("s7: %v", err)
		}
		runs := new(atomic.Int64)
		port := freePorts(1)[0]
		srv := rest.MustNewServer(rest.RestConf{Host: "127.0.0.1", Port: port, Timeout: 10000})
		srv.Use(m.Handle)
		srv.AddRoute(rest.Route{Method: http.MethodPost, Path: "/pay", Handler: func(w http.ResponseWriter, r *http.Request) {
			n := runs.Add(1)
			time.Sleep(s7Work)
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"payment":%d}`, n)
		}})
		go srv.Start()
		waitListening(port)
		servers[row.id] = server{url: fmt.Sprintf("http://127.0.0.1:%d/pay", port), runs: runs,
			close: func() { srv.Stop(); _ = m.Close() }}
	}
	defer func() {
		for _, s := range servers {
			s.close()
		}
	}()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: s7Dups, DialContext: (&net.Dialer{}).DialContext}}

	burst := func(url, key string) (latencies []int64, bodies map[string]int, codes map[int]int) {
		bodies, codes = map[string]int{}, map[int]int{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range s7Dups {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				t0 := time.Now()
				req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount":100}`))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", key)
				resp, err := client.Do(req)
				d := time.Since(t0)
				mu.Lock()
				defer mu.Unlock()
				latencies = append(latencies, int64(d))
				if err != nil {
					codes[0]++
					return
				}
				body, _ := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				codes[resp.StatusCode]++
				if resp.StatusCode == http.StatusOK {
					bodies[string(body)]++
				}
			}()
		}
		close(start)
		wg.Wait()
		sortInts(latencies)
		return latencies, bodies, codes
	}

	for rep := 0; rep < b.cfg.reps; rep++ {
		for _, x := range out {
			s := servers[x.Row]
			var lat []int64
			var runs, identical, ok200, busy, other float64
			for round := range s7Rounds {
				before := s.runs.Load()
				l, bodies, codes := burst(s.url, fmt.Sprintf("r%d-%s-%d", rep, x.Row, round))
				lat = append(lat, l...)
				runs += float64(s.runs.Load() - before)
				best := 0
				for _, n := range bodies {
					best = max(best, n)
				}
				identical += float64(best)
				ok200 += float64(codes[http.StatusOK])
				busy += float64(codes[http.StatusConflict])
				other += float64(s7Dups - codes[http.StatusOK] - codes[http.StatusConflict])
			}
			sortInts(lat)
			n := float64(s7Rounds)
			m := metrics{"runs": runs / n, "identical": identical / n, "ok": ok200 / n, "busy": busy / n, "other": other / n,
				"p50": percentile(lat, 0.5), "p99": percentile(lat, 0.99), "max": percentile(lat, 1)}
			x.Reps = append(x.Reps, m)
			progress("s7 rep %d %-7s runs/burst %.2f identical %.1f ok %.1f 409 %.1f other %.1f p50 %s p99 %s", rep+1, x.Row,
				m["runs"], m["identical"], m["ok"], m["busy"], m["other"], dur(m["p50"]), dur(m["p99"]))
		}
	}
	return out
}

func (r *report) s7Section(w func(string, ...any)) {
	w("%d concurrent duplicates of one request (one `Idempotency-Key`, one body) through go-zero's REST chain and the\n", s7Dups)
	w("middleware, the handler taking %v; %d bursts per repetition, a key of its own each; figures per burst, medians over\n", s7Work, s7Rounds)
	w("%d repetitions. *share*: duplicates wait and get the response of the one run; *reject*: they are answered 409 at once.\n\n", r.cfg.reps)
	w("| row | handler runs per burst | identical 200 responses | 409s | other | p50 latency | p99 | max |\n|---|---|---|---|---|---|---|---|\n")
	for _, x := range r.s7 {
		w("| %s | %s | %s | %s | %s | %s | %s | %s |\n", x.Label, fmtFloat(x.med("runs")), fmtFloat(x.med("identical")),
			fmtFloat(x.med("busy")), fmtFloat(x.med("other")), dur(x.med("p50")), dur(x.med("p99")), dur(x.med("max")))
	}
	w("\n")
}
