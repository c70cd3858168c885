package middleware

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	"github.com/flightlock/flightlock/middleware/rules"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/zeromicro/go-zero/core/conf"
	"github.com/zeromicro/go-zero/rest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// etcdConf is a LockConf on the etcd cluster ec, with rules.
func etcdConf(ec *etcdtest.Cluster, rules ...Rule) LockConf {
	return LockConf{Etcd: EtcdConf{Hosts: ec.Endpoints(), DialTimeout: 5 * time.Second}, TTL: 5 * time.Second, Rules: rules}
}

// etcdExists reports whether the etcd key k exists.
func etcdExists(t *testing.T, cli *clientv3.Client, k string) bool {
	t.Helper()
	resp, err := cli.Get(context.Background(), k, clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count > 0
}

// startREST runs go-zero's rest.Server with m on a free loopback port and returns its base URL.
func startREST(t *testing.T, m *Middleware, routes ...rest.Route) string {
	t.Helper()
	var rc rest.RestConf
	port := freePort(t)
	if err := conf.LoadFromYamlBytes([]byte(fmt.Sprintf("Name: etcd-test\nHost: 127.0.0.1\nPort: %d\nTimeout: 10000\n", port)), &rc); err != nil {
		t.Fatal(err)
	}
	rc.Middlewares.Log = false
	rc.Middlewares.Shedding = false // the CPU shedder's 503s on a loaded machine are not the lock's
	server := rest.MustNewServer(rc)
	server.Use(m.Handle)
	server.AddRoutes(routes)
	go server.Start()
	t.Cleanup(server.Stop)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitFor(t, 5*time.Second, "the REST server to listen", func() bool {
		resp, err := http.Get(base + "/")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	return base
}

func post(t *testing.T, url string) (int, http.Header, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", http.NoBody)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(body)
}

// A REST rule on a real etcd, through go-zero's rest.Server on a loopback port: the lock is
// the etcd key Etcd.Key + Prefix + key (the lease's Key), a key held by another process is answered 409 with
// Retry-After in reject mode, the handler sees the lease's fence (larger than the previous
// holder's), and the metrics say etcd.
func TestEtcdREST(t *testing.T) {
	ec := etcdtest.Start(t)
	cli := ec.Client(t)
	rl := Rule{Method: http.MethodPost, Path: "/etcd/order/:uid", Key: "eorder:{uid}", OnBusy: "reject"}
	m, err := New(etcdConf(ec, rl))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	other := MustNew(etcdConf(ec)) // another process on the same cluster
	defer other.Close()

	var inHandler atomic.Bool
	base := startREST(t, m, rest.Route{Method: http.MethodPost, Path: "/etcd/order/:uid", Handler: func(w http.ResponseWriter, r *http.Request) {
		l := flightlock.FromContext(r.Context())
		inHandler.Store(etcdExists(t, cli, "flightlock/lock:eorder:1"))
		_, _ = fmt.Fprintf(w, "%s %d", l.Key(), l.Fence())
	}})

	held, err := other.Locker().TryLock(context.Background(), "eorder:1")
	if err != nil {
		t.Fatal(err)
	}
	if !etcdExists(t, cli, "flightlock/lock:eorder:1") {
		t.Fatal("the lock of eorder:1 is not the etcd key flightlock/lock:eorder:1")
	}
	before := metricValue(t, "flightlock_busy_total", "POST /etcd/order/:uid")
	code, h, _ := post(t, base+"/etcd/order/1")
	if code != http.StatusConflict {
		t.Fatalf("held by another process: %d, want 409", code)
	}
	// The holder's TTL as etcd tells it is its lease's: the lock's 5s plus the 1s margin.
	if ra, err := strconv.Atoi(h.Get("Retry-After")); err != nil || ra < 1 || ra > 6 {
		t.Fatalf("Retry-After %q, want 1-6 s (the holder's lease)", h.Get("Retry-After"))
	}
	if got := metricValue(t, "flightlock_busy_total", "POST /etcd/order/:uid"); got != before+1 {
		t.Fatalf("flightlock_busy_total = %v, want %v", got, before+1)
	}
	heldFence := held.Fence()
	if err := held.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	code, _, body := post(t, base+"/etcd/order/1")
	key, fenceText, _ := strings.Cut(body, " ")
	fence, _ := strconv.ParseInt(fenceText, 10, 64)
	if code != http.StatusOK || key != "flightlock/lock:eorder:1" || fence <= heldFence {
		t.Fatalf("after release: %d %q; want 200, the lease of flightlock/lock:eorder:1 with a fence above %d", code, body, heldFence)
	}
	if !inHandler.Load() {
		t.Fatal("the handler ran without its etcd key")
	}
	if etcdExists(t, cli, "flightlock/lock:eorder:1") {
		t.Fatal("the lock is still in etcd after the handler returned")
	}

	var acquired, busy bool
	families := scrapeDefault(t)
	for _, s := range families {
		if s.labels["rule"] != "POST /etcd/order/:uid" || s.name != "flightlock_acquire_duration_ms_count" {
			continue
		}
		if s.labels["store"] != "etcd" {
			t.Errorf("series %v: store %q, want etcd", s.labels, s.labels["store"])
		}
		acquired = acquired || s.labels["outcome"] == "acquired" && s.labels["grant"] == "etcd"
		busy = busy || s.labels["outcome"] == "busy"
	}
	if !acquired || !busy {
		t.Fatalf("acquire_duration series of the etcd rule: acquired by etcd %v, busy %v; want both", acquired, busy)
	}
}

// A zrpc rule on a real etcd: busy is Aborted with a retry delay from the holder's TTL, a free
// key runs the handler under its lease.
func TestEtcdRPC(t *testing.T) {
	ec := etcdtest.Start(t)
	m, err := New(etcdConf(ec, Rule{RPC: fullMethod("Host"), Key: "eh:{host}", OnBusy: "reject"}))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	other := MustNew(etcdConf(ec))
	defer other.Close()
	conn := startGRPC(t, m, func(ctx context.Context, req *rpb.ServerReflectionRequest) (*wrapperspb.StringValue, error) {
		return wrapperspb.String(fmt.Sprintf("%s %d", leaseKeys(ctx), flightlock.FromContext(ctx).Fence())), nil
	})

	held, err := other.Locker().TryLock(context.Background(), "eh:x")
	if err != nil {
		t.Fatal(err)
	}
	_, err = call(context.Background(), conn, "Host", &rpb.ServerReflectionRequest{Host: "x"})
	st := status.Convert(err)
	var delay time.Duration
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			delay = ri.GetRetryDelay().AsDuration()
		}
	}
	if st.Code() != codes.Aborted || delay <= 0 || delay > 6*time.Second {
		t.Fatalf("held: %v, retry delay %v; want Aborted within the holder's 6s lease", st.Code(), delay)
	}
	heldFence := held.Fence()
	if err := held.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	got, err := call(context.Background(), conn, "Host", &rpb.ServerReflectionRequest{Host: "x"})
	key, fenceText, _ := strings.Cut(got, " ")
	if fence, _ := strconv.ParseInt(fenceText, 10, 64); err != nil || key != "flightlock/lock:eh:x" || fence <= heldFence {
		t.Fatalf("free: %q, %v; want flightlock/lock:eh:x with a fence above %d", got, err, heldFence)
	}
}

// A Lock section with both stores: each rule locks in the store it names, each store with a
// Locker (and a gate) of its own, and the metrics say which.
func TestEtcdRuleChoosesStore(t *testing.T) {
	ec := etcdtest.Start(t)
	cli := ec.Client(t)
	tr := newTestRedis(t)
	c := etcdConf(ec,
		Rule{Method: http.MethodPost, Path: "/both/r/:id", Key: "br:{id}", Store: "Redis"},
		Rule{Method: http.MethodPost, Path: "/both/e/:id", Key: "be:{id}", Store: "etcd"},
	)
	c.Redis = RedisConf{Host: tr.mr.Addr(), Protocol: 2}
	m, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if len(m.bases) != 2 || m.bases[rules.StoreRedis] == m.bases[rules.StoreEtcd] || m.Locker() != m.bases[rules.StoreRedis] {
		t.Fatalf("base Lockers %v, Locker() %p: want one per store, Locker() the Redis one", m.bases, m.Locker())
	}
	where := func(w http.ResponseWriter, r *http.Request) {
		key := flightlock.FromContext(r.Context()).Key()
		_, _ = fmt.Fprintf(w, "redis=%v etcd=%v", tr.mr.Exists(key) || tr.mr.Exists(strings.TrimPrefix(key, "flightlock/")),
			etcdExists(t, cli, key) || etcdExists(t, cli, "flightlock/"+key))
	}
	base := startREST(t, m,
		rest.Route{Method: http.MethodPost, Path: "/both/r/:id", Handler: where},
		rest.Route{Method: http.MethodPost, Path: "/both/e/:id", Handler: where})
	if code, _, body := post(t, base+"/both/r/1"); code != http.StatusOK || body != "redis=true etcd=false" {
		t.Fatalf("Store: Redis rule: %d %q, want its lock in Redis only", code, body)
	}
	if code, _, body := post(t, base+"/both/e/1"); code != http.StatusOK || body != "redis=false etcd=true" {
		t.Fatalf("Store: etcd rule: %d %q, want its lock in etcd only", code, body)
	}
	stores := map[string]string{}
	for _, s := range scrapeDefault(t) {
		if s.name == "flightlock_hold_duration_ms_count" && strings.HasPrefix(s.labels["rule"], "POST /both/") {
			stores[s.labels["rule"]] = s.labels["store"]
		}
	}
	if want := map[string]string{"POST /both/r/:id": "redis", "POST /both/e/:id": "etcd"}; !maps.Equal(stores, want) {
		t.Fatalf("store labels %v, want %v", stores, want)
	}
}

// Shutdown on etcd: the handler holding a lock finishes, its lock is released in etcd at once
// (a waiter in another process gets it well before the TTL), new requests are refused, and the
// stores are closed.
func TestEtcdDrain(t *testing.T) {
	ec := etcdtest.Start(t)
	cli := ec.Client(t)
	c := etcdConf(ec, Rule{Method: http.MethodPost, Path: "/drain/:id", Key: "dr:{id}"})
	c.TTL, c.Drain = 30*time.Second, 5*time.Second
	m, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	entered, finish := make(chan struct{}), make(chan struct{})
	base := startREST(t, m, rest.Route{Method: http.MethodPost, Path: "/drain/:id", Handler: func(http.ResponseWriter, *http.Request) {
		close(entered)
		<-finish
	}})
	first := make(chan int, 1)
	go func() { code, _, _ := post(t, base+"/drain/1"); first <- code }()
	<-entered
	if !etcdExists(t, cli, "flightlock/lock:dr:1") {
		t.Fatal("the handler's lock is not in etcd")
	}
	other := MustNew(etcdConf(ec))
	defer other.Close()
	waiter := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		l, err := other.Locker().Lock(ctx, "dr:1")
		if err == nil {
			err = l.Release(context.Background())
		}
		waiter <- err
	}()

	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- m.Shutdown(context.Background()) }()
	waitFor(t, 5*time.Second, "the drain to refuse new requests", func() bool {
		code, _, _ := post(t, base+"/drain/2")
		return code == http.StatusServiceUnavailable
	})
	close(finish)
	if code := <-first; code != http.StatusOK {
		t.Fatalf("the request in flight: %d, want 200", code)
	}
	if err := <-waiter; err != nil {
		t.Fatalf("the waiter in another process: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if waited := time.Since(start); waited > 10*time.Second {
		t.Fatalf("drain and hand-over took %v: the lock was left to its TTL", waited)
	}
	if m.closers != nil {
		t.Fatal("Shutdown did not close the stores")
	}
}

// scrapeDefault reads the flightlock series of Prometheus's default registry as samples, a
// histogram as its _count.
func scrapeDefault(t *testing.T) []sample {
	t.Helper()
	families, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []sample
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "flightlock_") {
			continue
		}
		for _, mt := range f.GetMetric() {
			s := sample{name: f.GetName(), labels: map[string]string{}}
			for _, l := range mt.GetLabel() {
				s.labels[l.GetName()] = l.GetValue()
			}
			switch {
			case mt.GetHistogram() != nil:
				s.name += "_count"
				s.value = float64(mt.GetHistogram().GetSampleCount())
			case mt.GetGauge() != nil:
				s.value = mt.GetGauge().GetValue()
			default:
				s.value = mt.GetCounter().GetValue()
			}
			out = append(out, s)
		}
	}
	return out
}

// Lock.Etcd's User and Pass reach etcd: on a cluster with authentication on, the section's
// account takes and releases locks, a wrong password stops New with an error naming Lock.Etcd,
// and no account at all cannot lock.
func TestEtcdAccount(t *testing.T) {
	ec := etcdtest.Start(t)
	root := ec.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, step := range []func() error{
		func() error { _, err := root.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := root.UserAdd(ctx, "locks", "s3cret"); return err },
		func() error { _, err := root.RoleAdd(ctx, "locker"); return err },
		func() error {
			_, err := root.RoleGrantPermission(ctx, "locker", "\x00", "\x00", clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := root.UserGrantRole(ctx, "locks", "locker"); return err },
		func() error { _, err := root.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatalf("setting up authentication: %v", err)
		}
	}

	c := etcdConf(ec)
	c.Etcd.User, c.Etcd.Pass = "locks", "s3cret"
	m, err := New(c)
	if err != nil {
		t.Fatalf("New with the section's account: %v", err)
	}
	defer m.Close()
	lease, err := m.Locker().TryLock(ctx, "acct:auth")
	if err != nil {
		t.Fatalf("lock with the section's account: %v", err)
	}
	if lease.Fence() <= 0 {
		t.Fatalf("fence %d from an authenticated grant, want > 0", lease.Fence())
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("release with the section's account: %v", err)
	}

	c.Etcd.Pass = "wrong"
	if m2, err := New(c); err == nil {
		m2.Close()
		t.Fatal("New with a wrong password succeeded")
	} else if !strings.Contains(err.Error(), "Lock.Etcd") {
		t.Fatalf("New with a wrong password: %v, want an error naming Lock.Etcd", err)
	}

	c.Etcd.User, c.Etcd.Pass = "", ""
	if m3, err := New(c); err == nil {
		defer m3.Close()
		if l, err := m3.Locker().TryLock(ctx, "acct:anonymous"); err == nil {
			_ = l.Release(ctx)
			t.Fatal("a section without an account locked on a cluster with authentication on")
		}
	}
}
