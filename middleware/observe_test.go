package middleware

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/flightlock/flightlock"
	"github.com/zeromicro/go-zero/core/conf"
	"github.com/zeromicro/go-zero/rest"
)

// sample is one line of a Prometheus text exposition.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// scrape reads url as Prometheus would and returns its samples.
func scrape(t *testing.T, url string) []sample {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	var out []sample
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		s, ok := parseSample(line)
		if !ok {
			t.Fatalf("unparsable exposition line %q", line)
		}
		out = append(out, s)
	}
	return out
}

// parseSample parses `name{k="v",...} value` (label values here hold no escaped quotes).
func parseSample(line string) (sample, bool) {
	s := sample{labels: map[string]string{}}
	rest := line
	if i := strings.IndexAny(line, "{ "); i >= 0 && line[i] == '{' {
		s.name = line[:i]
		rest = line[i+1:]
		for !strings.HasPrefix(rest, "}") {
			eq := strings.Index(rest, `="`)
			if eq < 0 {
				return s, false
			}
			k := rest[:eq]
			rest = rest[eq+2:]
			end := strings.IndexByte(rest, '"')
			if end < 0 {
				return s, false
			}
			s.labels[k] = rest[:end]
			rest = strings.TrimPrefix(rest[end+1:], ",")
		}
		rest = strings.TrimSpace(rest[1:])
	} else {
		f := strings.Fields(line)
		if len(f) < 2 {
			return s, false
		}
		s.name, rest = f[0], f[1]
	}
	v, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
	s.value = v
	return s, err == nil
}

// value returns the value of the series name with (at least) the given labels, and whether
// it exists.
func value(samples []sample, name string, labels ...string) (float64, bool) {
next:
	for _, s := range samples {
		if s.name != name {
			continue
		}
		for i := 0; i+1 < len(labels); i += 2 {
			if s.labels[labels[i]] != labels[i+1] {
				continue next
			}
		}
		return s.value, true
	}
	return 0, false
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// deadStore returns the address of a Redis that is gone: its port refuses connections.
func deadRedis(t *testing.T) string {
	mr := miniredis.RunT(t)
	addr := mr.Addr()
	mr.Close()
	return addr
}

// Every series the operations issue lists appears on a real go-zero server's metrics
// endpoint (its DevServer), with the right values, after requests that exercise it.
func TestMetricsScrapedFromGoZeroServer(t *testing.T) {
	tr := newTestRedis(t)
	apiPort, devPort := freePort(t), freePort(t)
	var rc rest.RestConf
	yaml := fmt.Sprintf("Name: metrics-test\nHost: 127.0.0.1\nPort: %d\nTimeout: 10000\n"+
		"DevServer:\n  Enabled: true\n  Host: 127.0.0.1\n  Port: %d\n  EnableMetrics: true\n  EnablePprof: false\n",
		apiPort, devPort)
	if err := conf.LoadFromYamlBytes([]byte(yaml), &rc); err != nil {
		t.Fatal(err)
	}
	rc.Middlewares.Log = false
	// go-zero drops requests (503) when the CPU is busy and requests are in flight: this test
	// run beside a CPU-bound process in CI, and asserts the lock's answers, not the shedder's.
	rc.Middlewares.Shedding = false
	server := rest.MustNewServer(rc)

	// A handoff window wide enough for the test to queue a request while the lock is held.
	up, err := New(LockConf{Rules: []Rule{
		{Method: "POST", Path: "/m/order", Key: "order:{body.uid}", OnBusy: "reject"},
		{Method: "POST", Path: "/m/wait", Key: "wait:{body.uid}", OnBusy: "wait", TTL: 300 * time.Millisecond, Wait: 5 * time.Second},
		{Method: "POST", Path: "/m/lost", Key: "lost:{body.uid}", OnBusy: "reject", TTL: 300 * time.Millisecond},
		{Method: "POST", Path: "/m/shadow", Key: "shadow:{body.uid}", OnBusy: "reject", Shadow: true},
	}}, WithLocker(tr.locker(t, flightlock.WithHandoff(64, time.Minute))))
	if err != nil {
		t.Fatal(err)
	}
	open, err := New(LockConf{Redis: RedisConf{Host: deadRedis(t), NonBlock: true, PingTimeout: time.Second},
		OnStoreError: "open", Rules: []Rule{{Method: "POST", Path: "/m/open", Key: "o:{body.uid}"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	closed, err := New(LockConf{Redis: RedisConf{Host: deadRedis(t), NonBlock: true, PingTimeout: time.Second},
		Rules: []Rule{{Method: "POST", Path: "/m/closed", Key: "c:{body.uid}"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer closed.Close()
	server.Use(up.Handle)
	server.Use(open.Handle)
	server.Use(closed.Handle)

	var (
		started = make(chan string, 8)
		release = make(chan struct{})
	)
	block := func(w http.ResponseWriter, r *http.Request) {
		started <- r.URL.Path
		<-release
	}
	server.AddRoutes([]rest.Route{
		{Method: http.MethodPost, Path: "/m/order", Handler: block},
		{Method: http.MethodPost, Path: "/m/wait", Handler: func(w http.ResponseWriter, r *http.Request) {
			started <- r.URL.Path
			<-release
			time.Sleep(150 * time.Millisecond) // past TTL/3: one renewal at least
		}},
		{Method: http.MethodPost, Path: "/m/lost", Handler: func(w http.ResponseWriter, r *http.Request) {
			tr.mr.Del("lock:lost:u1") // the lock is gone from Redis: the next renewal is refused
			<-r.Context().Done()
		}},
		{Method: http.MethodPost, Path: "/m/shadow", Handler: block},
		{Method: http.MethodPost, Path: "/m/open", Handler: func(http.ResponseWriter, *http.Request) {}},
		{Method: http.MethodPost, Path: "/m/closed", Handler: func(http.ResponseWriter, *http.Request) {}},
	})
	go server.Start()
	defer server.Stop()
	base := fmt.Sprintf("http://127.0.0.1:%d", apiPort)
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", devPort)
	waitFor(t, 5*time.Second, "the servers to listen", func() bool {
		for _, u := range []string{base + "/", metricsURL} {
			resp, err := http.Get(u)
			if err != nil {
				return false
			}
			resp.Body.Close()
		}
		return true
	})

	post := func(path string) int {
		resp, err := http.Post(base+path, "application/json", strings.NewReader(`{"uid":"u1"}`))
		if err != nil {
			t.Errorf("POST %s: %v", path, err)
			return 0
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	var wg sync.WaitGroup
	codes := make(chan string, 16)
	async := func(path string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes <- fmt.Sprintf("%s %d", path, post(path))
		}()
	}

	// A holder of /m/order, /m/wait and /m/shadow each; then a duplicate of each: the order
	// duplicate is refused, the wait one queues, the shadow one runs.
	for _, p := range []string{"/m/order", "/m/wait", "/m/shadow"} {
		async(p)
		if got := <-started; got != p {
			t.Fatalf("started %s, want %s", got, p)
		}
	}
	if code := post("/m/order"); code != http.StatusConflict {
		t.Fatalf("duplicate order: %d, want 409", code)
	}
	async("/m/wait")
	async("/m/shadow")
	if got := <-started; got != "/m/shadow" {
		t.Fatalf("started %s, want the shadow duplicate (it must not wait)", got)
	}
	rule := func(path, key string) []string { return []string{"rule", "POST " + path, "key", key} }
	waitFor(t, 5*time.Second, "the queued wait request in the gauge", func() bool {
		v, _ := value(scrape(t, metricsURL), "flightlock_waiting", rule("/m/wait", "wait:{body.uid}")...)
		return v == 1
	})
	live := scrape(t, metricsURL)
	if v, _ := value(live, "flightlock_held", rule("/m/order", "order:{body.uid}")...); v != 1 {
		t.Errorf("flightlock_held for /m/order = %v while one request holds it, want 1", v)
	}
	close(release) // every held handler returns; the queued wait request gets the lock by handoff
	if got := <-started; got != "/m/wait" {
		t.Fatalf("started %s, want the queued wait request", got)
	}
	if code := post("/m/lost"); code != http.StatusOK {
		t.Errorf("/m/lost: %d", code)
	}
	for range 3 {
		if code := post("/m/closed"); code != http.StatusServiceUnavailable {
			t.Errorf("/m/closed on a dead Redis: %d, want 503", code)
		}
	}
	if code := post("/m/open"); code != http.StatusOK {
		t.Errorf("/m/open on a dead Redis: %d, want 200", code)
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		if !strings.HasSuffix(c, " 200") {
			t.Errorf("%s, want 200", c)
		}
	}

	checkScrapedSeries(t, scrape(t, metricsURL))
}

// checkScrapedSeries checks the series TestMetricsScrapedFromGoZeroServer's requests leave.
func checkScrapedSeries(t *testing.T, got []sample) {
	t.Helper()
	rule := func(path, key string) []string { return []string{"rule", "POST " + path, "key", key} }
	want := []struct {
		name   string
		labels []string
		min    float64
		max    float64
	}{
		{"flightlock_acquire_duration_ms_count", append(rule("/m/order", "order:{body.uid}"), "outcome", "acquired", "grant", "redis", "store", "redis"), 1, 1},
		{"flightlock_acquire_duration_ms_count", append(rule("/m/order", "order:{body.uid}"), "outcome", "busy", "grant", "none"), 1, 1},
		{"flightlock_acquire_duration_ms_count", append(rule("/m/wait", "wait:{body.uid}"), "outcome", "acquired", "grant", "handoff"), 1, 1},
		{"flightlock_acquire_duration_ms_count", append(rule("/m/closed", "c:{body.uid}"), "outcome", "store_error"), 3, 3},
		{"flightlock_acquire_duration_ms_count", append(rule("/m/open", "o:{body.uid}"), "outcome", "degraded"), 1, 1},
		{"flightlock_hold_duration_ms_count", rule("/m/order", "order:{body.uid}"), 1, 1},
		{"flightlock_hold_duration_ms_count", rule("/m/wait", "wait:{body.uid}"), 2, 2},
		{"flightlock_busy_total", rule("/m/order", "order:{body.uid}"), 1, 1},
		{"flightlock_handoffs_total", rule("/m/wait", "wait:{body.uid}"), 1, 1},
		{"flightlock_renewals_total", append(rule("/m/wait", "wait:{body.uid}"), "result", "ok"), 1, 100},
		{"flightlock_renewals_total", append(rule("/m/lost", "lost:{body.uid}"), "result", "failed"), 1, 1},
		{"flightlock_lost_total", rule("/m/lost", "lost:{body.uid}"), 1, 1},
		{"flightlock_store_errors_total", append(rule("/m/closed", "c:{body.uid}"), "op", "acquire"), 3, 3},
		{"flightlock_fail_open_total", rule("/m/open", "o:{body.uid}"), 1, 1},
		{"flightlock_shadow_conflicts_total", append(rule("/m/shadow", "shadow:{body.uid}"), "would", "reject"), 1, 1},
		{"flightlock_held", rule("/m/order", "order:{body.uid}"), 0, 0},
		{"flightlock_waiting", rule("/m/wait", "wait:{body.uid}"), 0, 0},
	}
	for _, w := range want {
		v, ok := value(got, w.name, w.labels...)
		if !ok || v < w.min || v > w.max {
			t.Errorf("%s%v = %v (present %v), want %v..%v", w.name, w.labels, v, ok, w.min, w.max)
		}
	}
	// Shadow rules' own acquisitions are not lock traffic: they stay out of the histogram.
	if _, ok := value(got, "flightlock_acquire_duration_ms_count", rule("/m/shadow", "shadow:{body.uid}")...); ok {
		t.Error("a shadow rule's try-locks are in flightlock_acquire_duration_ms")
	}
	// No rendered key ("u1") in any label: keys hold user ids.
	for _, s := range got {
		if strings.HasPrefix(s.name, "flightlock_") {
			for k, v := range s.labels {
				if strings.Contains(v, "u1") {
					t.Errorf("%s has the rendered key in label %s=%q", s.name, k, v)
				}
			}
		}
	}
}

// A lease of the Middleware's Locker (a job's) that is never released is counted in
// flightlock_abandoned_total under rule "Locker" once its lock has run out past MaxHold.
func TestLeaseNeverReleasedIsCounted(t *testing.T) {
	tr := newTestRedis(t)
	m, err := New(LockConf{TTL: 150 * time.Millisecond, MaxHold: 150 * time.Millisecond}, WithStore(tr.store))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	before := metricValue(t, "flightlock_abandoned_total", "Locker")
	if _, err := m.Locker().TryLock(context.Background(), "job:interest"); err != nil { // never released
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the leaked lease to be counted", func() bool {
		return metricValue(t, "flightlock_abandoned_total", "Locker")-before == 1
	})
}
