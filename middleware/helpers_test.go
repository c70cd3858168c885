package middleware

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/flightlock/flightlock/lockstore/embedded"
	"github.com/flightlock/flightlock/middleware/share"

	"github.com/alicebob/miniredis/v2"
	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/testenv/poll"
	"github.com/flightlock/flightlock/lockstore/redisstore"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/conf"
	"github.com/zeromicro/go-zero/core/logx"
	zeroprom "github.com/zeromicro/go-zero/core/prometheus"
	"github.com/zeromicro/go-zero/rest"
)

func TestMain(m *testing.M) {
	// As a development binary with share rules sets them in main: the embedded store for the
	// configs that name no store, response sharing for OnBusy share.
	EmbeddedStore, ResponseSharing = embedded.New, share.New
	if addr := os.Getenv(drainHolderEnv); addr != "" {
		os.Exit(drainHolder(addr)) // this process is the holder of TestDrainOnSIGTERM
	}
	if addr := os.Getenv(sharePodEnv); addr != "" {
		os.Exit(sharePod(addr)) // this process is the second pod of TestShareDuplicatesAcrossProcesses
	}
	logx.Disable() // the tests assert codes and counters, not log lines
	// go-zero's metrics count only while Prometheus is on, as in a service whose config has a
	// Prometheus section; Enable turns counting on without starting the agent's HTTP server.
	zeroprom.Enable()
	os.Exit(m.Run())
}

// failOpenCount reads flightlock_fail_open_total{rule="<rule>"}; see metricValue.
func failOpenCount(t *testing.T, rule string) float64 {
	return metricValue(t, "flightlock_fail_open_total", rule)
}

// metricValue reads the counter or gauge name{rule="<rule>"} from Prometheus's default
// registry, where go-zero's metric package registers it: the figure a service's /metrics
// endpoint shows. go-zero wraps its metrics, so testutil.ToFloat64 cannot take them; the
// registry is read as the exporter reads it. The metrics are process-wide: tests compare them
// before and after, or use rules of their own.
func metricValue(t *testing.T, name, rule string) float64 {
	t.Helper()
	families, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, mt := range f.GetMetric() {
			if labelValue(mt, "rule") == rule {
				if g := mt.GetGauge(); g != nil {
					return g.GetValue()
				}
				return mt.GetCounter().GetValue()
			}
		}
	}
	return 0 // no such series yet
}

// withMetric calls fn with the labels and value of each series of the counter or gauge name.
func withMetric(t *testing.T, name string, fn func(labels map[string]string, value float64)) {
	t.Helper()
	families, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, mt := range f.GetMetric() {
			labels := make(map[string]string)
			for _, l := range mt.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			v := mt.GetCounter().GetValue()
			if g := mt.GetGauge(); g != nil {
				v = g.GetValue()
			}
			fn(labels, v)
		}
	}
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// testRedis is a miniredis with a store and client on it, closed when the test ends.
type testRedis struct {
	mr    *miniredis.Miniredis
	store *redisstore.RedisStore
}

func newTestRedis(t *testing.T) *testRedis {
	t.Helper()
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{
		Addr:                  mr.Addr(),
		Protocol:              2, // miniredis delivers pub/sub on RESP2 only
		DisableIdentity:       true,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1, // a stopped server fails at once
	})
	store := redisstore.New(client)
	t.Cleanup(func() {
		_ = store.Close()
		_ = client.Close()
	})
	return &testRedis{mr: mr, store: store}
}

// locker returns a new Locker on the test Redis: another "process" with its own gate.
func (tr *testRedis) locker(t *testing.T, opts ...flightlock.Option) *flightlock.Locker {
	t.Helper()
	l, err := flightlock.New(tr.store, append([]flightlock.Option{flightlock.WithTTL(5 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// againIfCostly returns the Redis commands a refused request cost, given cost, what its first
// serving counted, and again, which serves it once more. Work that earlier requests left
// running (a grant given back after a late reply, a held lock's renewal) can land during one
// serving, not during two in a row: a count above zero is taken again, and a refusal that
// costs commands both times sent them.
func againIfCostly(tr *testRedis, cost int, again func()) int {
	if cost == 0 {
		return 0
	}
	before := tr.mr.CommandCount()
	again()
	return tr.mr.CommandCount() - before
}

// newMiddleware builds a Middleware on a Locker of tr.
func newMiddleware(t *testing.T, tr *testRedis, c LockConf) *Middleware {
	t.Helper()
	m, err := New(c, WithLocker(tr.locker(t)))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// restConf is a go-zero RestConf with its defaults (timeout, recover, max bytes...).
func restConf(t *testing.T, timeout time.Duration) rest.RestConf {
	t.Helper()
	var c rest.RestConf
	if err := conf.LoadFromYamlBytes([]byte("Name: flightlock-test\nHost: 127.0.0.1\nPort: 0\n"), &c); err != nil {
		t.Fatal(err)
	}
	c.Timeout = timeout.Milliseconds()
	c.Middlewares.Prometheus = false
	c.Middlewares.Metrics = false
	c.Middlewares.Trace = false
	c.Middlewares.Log = false
	// go-zero drops requests (503) when the CPU is busy and requests are in flight: these tests
	// run beside a CPU-bound process in CI, and assert the lock's answers, not the shedder's.
	c.Middlewares.Shedding = false
	return c
}

// serverless builds go-zero's whole REST chain around routes, with m.Handle applied by
// server.Use when use is set.
func serverless(t *testing.T, c rest.RestConf, m *Middleware, routes []rest.Route, opts ...rest.RouteOption) *rest.Serverless {
	t.Helper()
	srv, err := rest.NewServer(c)
	if err != nil {
		t.Fatal(err)
	}
	if m != nil {
		srv.Use(m.Handle)
	}
	srv.AddRoutes(routes, opts...)
	s, err := rest.NewServerless(srv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func serve(s *rest.Serverless, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	s.Serve(w, r)
	return w
}

// holdKey takes key (without prefix) through another Locker, as another process would.
func holdKey(t *testing.T, tr *testRedis, key string) *flightlock.Lease {
	t.Helper()
	lease, err := tr.locker(t).TryLock(context.Background(), key)
	if err != nil {
		t.Fatalf("hold %q: %v", key, err)
	}
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	return lease
}

// waitFree polls until key (without prefix) can be taken, for up to two seconds.
func waitFree(t *testing.T, tr *testRedis, key string) {
	t.Helper()
	l := tr.locker(t)
	deadline := time.Now().Add(2 * time.Second)
	for {
		lease, err := l.TryLock(context.Background(), key)
		if err == nil {
			_ = lease.Release(context.Background())
			return
		}
		if !errors.Is(err, flightlock.ErrBusy) || time.Now().After(deadline) {
			t.Fatalf("key %q still not free: %v", key, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// isFree reports whether key (without prefix) is free in Redis right now.
func (tr *testRedis) isFree(key string) bool {
	return !tr.mr.Exists(flightlock.DefaultPrefix + key)
}

// waitFor polls cond until it holds, failing the test after within.
func waitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, within, 5*time.Millisecond, what, cond)
}
