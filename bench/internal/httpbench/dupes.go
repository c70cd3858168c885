package httpbench

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

	"github.com/flightlock/flightlock/bench/internal/stat"
	"github.com/flightlock/flightlock/internal/testenv/freeport"

	flmw "github.com/flightlock/flightlock/middleware"
	"github.com/flightlock/flightlock/middleware/share"
)

// The duplicates scenario: Dups concurrent duplicates of one request (one
// Idempotency-Key, one body) through go-zero's REST chain and flightlock's middleware, the
// handler taking DupWork; DupRounds bursts per repetition, a key of its own each.
const (
	Dups      = 64
	DupWork   = 20 * time.Millisecond // the handler's own time: a payment call, say
	DupRounds = 20                    // bursts per repetition
)

// DupRule is the duplicates scenario's rule, with onBusy "share" (duplicates wait up to 5s for
// the one run's response) or "reject" (which never waits, so it sets no Wait); its store is
// the LockConf's (set Store to choose one in a section that names both).
func DupRule(onBusy string) flmw.Rule {
	r := flmw.Rule{Method: http.MethodPost, Path: "/pay", Key: "pay:{header.Idempotency-Key}", OnBusy: onBusy}
	if onBusy == "share" {
		r.Wait = 5 * time.Second
	}
	return r
}

// DupServer is a go-zero REST server with one route, POST /pay, under the middleware built
// from a LockConf: its handler counts its runs, sleeps DupWork and answers its run's number.
type DupServer struct {
	url    string
	runs   atomic.Int64
	client *http.Client
	stop   func()
}

// NewDupServer starts a DupServer on a free loopback port, its middleware built from conf.
func NewDupServer(conf flmw.LockConf) (*DupServer, error) {
	flmw.ResponseSharing = share.New // DupRule's OnBusy share, as a service's main.go sets it
	m, err := flmw.New(conf)
	if err != nil {
		return nil, err
	}
	ports, err := freeport.Ports(1)
	if err != nil {
		_ = m.Close()
		return nil, err
	}
	s := &DupServer{
		url:    fmt.Sprintf("http://127.0.0.1:%d/pay", ports[0]),
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: Dups, DialContext: (&net.Dialer{}).DialContext}},
	}
	srv := rest.MustNewServer(rest.RestConf{Host: "127.0.0.1", Port: ports[0], Timeout: 10000})
	srv.Use(m.Handle)
	srv.AddRoute(rest.Route{Method: http.MethodPost, Path: "/pay", Handler: func(w http.ResponseWriter, r *http.Request) {
		n := s.runs.Add(1)
		time.Sleep(DupWork)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"payment":%d}`, n)
	}})
	go srv.Start()
	s.stop = func() { srv.Stop(); _ = m.Close() }
	if err := WaitListening(ports[0]); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Close stops the server and closes its middleware.
func (s *DupServer) Close() { s.stop() }

// Bursts sends DupRounds bursts of Dups duplicates, the key of round i keyPrefix + i, and
// returns per burst (averaged over the rounds): handler runs, the most identical 200 bodies
// (the shared response), 200s, 409s and other answers (transport errors included); and over
// all requests the p50, p99 and max latency in ns.
func (s *DupServer) Bursts(keyPrefix string) map[string]float64 {
	var lat []int64
	var runs, identical, ok200, busy, other float64
	for round := range DupRounds {
		before := s.runs.Load()
		l, bodies, codes := s.burst(fmt.Sprintf("%s%d", keyPrefix, round))
		lat = append(lat, l...)
		runs += float64(s.runs.Load() - before)
		best := 0
		for _, n := range bodies {
			best = max(best, n)
		}
		identical += float64(best)
		ok200 += float64(codes[http.StatusOK])
		busy += float64(codes[http.StatusConflict])
		other += float64(Dups - codes[http.StatusOK] - codes[http.StatusConflict])
	}
	n := float64(DupRounds)
	return map[string]float64{"runs": runs / n, "identical": identical / n, "ok": ok200 / n, "busy": busy / n, "other": other / n,
		"p50": stat.Percentile(lat, 0.5), "p99": stat.Percentile(lat, 0.99), "max": stat.Percentile(lat, 1)}
}

// burst sends Dups duplicates at once and returns their latencies, the count of each 200
// body and of each status (0: no response).
func (s *DupServer) burst(key string) (latencies []int64, bodies map[string]int, codes map[int]int) {
	bodies, codes = map[string]int{}, map[int]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range Dups {
		wg.Go(func() {
			<-start
			t0 := time.Now()
			req, _ := http.NewRequest(http.MethodPost, s.url, strings.NewReader(`{"amount":100}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", key)
			resp, err := s.client.Do(req)
			d := time.Since(t0)
			var body []byte
			if err == nil {
				body, _ = io.ReadAll(resp.Body)
				_ = resp.Body.Close()
			}
			mu.Lock()
			defer mu.Unlock()
			latencies = append(latencies, int64(d))
			if err != nil {
				codes[0]++
				return
			}
			codes[resp.StatusCode]++
			if resp.StatusCode == http.StatusOK {
				bodies[string(body)]++
			}
		})
	}
	close(start)
	wg.Wait()
	return latencies, bodies, codes
}
