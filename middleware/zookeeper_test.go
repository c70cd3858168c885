package middleware

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/zeromicro/go-zero/rest"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/testenv/zktest"
)

// zkConf is a LockConf on the ZooKeeper server at addr, with a 6s session: with zktest's 500ms
// tick the store keeps locks of up to 4s - 1s = 3s.
func zkConf(addr string, rules ...Rule) LockConf {
	return LockConf{Zookeeper: ZookeeperConf{Hosts: []string{addr}, SessionTimeout: 6 * time.Second}, TTL: 2 * time.Second, Rules: rules}
}

// A REST rule on a real ZooKeeper, in two processes (two Middlewares, each with its own
// session): concurrent requests for one key run one at a time while the lock is the key's node
// under Root, a key held by another process is answered 409 in reject mode, and the metrics
// say zookeeper.
func TestZookeeperRuleExcludesConcurrentRequestsAcrossProcesses(t *testing.T) {
	srv := zktest.Start(t)
	conn, _ := zktest.Connect(t, 10*time.Second, srv.Addr)
	rl := []Rule{
		{Method: http.MethodPost, Path: "/zk/order/:uid", Key: "zorder:{uid}", Wait: 20 * time.Second},
		{Method: http.MethodPost, Path: "/zk/reject/:uid", Key: "zorder:{uid}", OnBusy: "reject", Store: "ZooKeeper"},
	}
	var inside, most, noNode atomic.Int32
	handler := func(w http.ResponseWriter, r *http.Request) {
		n := inside.Add(1)
		defer inside.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		if ok, _, err := conn.Exists("/flightlock/lock:zorder:1"); err != nil || !ok {
			noNode.Add(1)
		}
		time.Sleep(20 * time.Millisecond)
	}
	routes := []rest.Route{
		{Method: http.MethodPost, Path: "/zk/order/:uid", Handler: handler},
		{Method: http.MethodPost, Path: "/zk/reject/:uid", Handler: handler},
	}
	var servers []*rest.Serverless
	for range 2 {
		m, err := New(zkConf(srv.Addr, rl...))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		servers = append(servers, serverless(t, restConf(t, 30*time.Second), m, routes))
	}

	start := make(chan struct{})
	codes := make(chan int, 8)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			<-start
			codes <- serve(servers[i%2], httptest.NewRequest(http.MethodPost, "/zk/order/1", http.NoBody)).Code
		})
	}
	close(start)
	wg.Wait()
	close(codes)
	for code := range codes {
		if code != http.StatusOK {
			t.Errorf("a request that waits for the key: %d, want 200", code)
		}
	}
	if most.Load() != 1 {
		t.Fatalf("%d handlers of one key ran at once in two processes, want 1", most.Load())
	}
	if noNode.Load() > 0 {
		t.Fatalf("%d handlers ran without the key's node /flightlock/lock:zorder:1", noNode.Load())
	}

	other, err := New(zkConf(srv.Addr)) // a third process holds the key
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	held, err := other.Locker().TryLock(context.Background(), "zorder:2")
	if err != nil {
		t.Fatal(err)
	}
	if code := serve(servers[0], httptest.NewRequest(http.MethodPost, "/zk/reject/2", http.NoBody)).Code; code != http.StatusConflict {
		t.Fatalf("a reject rule on a key held by another process: %d, want 409", code)
	}
	var stores []string
	withMetric(t, "flightlock_busy_total", func(labels map[string]string, v float64) {
		if labels["rule"] == "POST /zk/reject/:uid" && v > 0 {
			stores = append(stores, labels["store"])
		}
	})
	if !slices.Equal(stores, []string{"zookeeper"}) {
		t.Errorf("flightlock_busy_total of the rule is labelled store %q, want zookeeper", stores)
	}
	if err := held.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if code := serve(servers[0], httptest.NewRequest(http.MethodPost, "/zk/reject/2", http.NoBody)).Code; code != http.StatusOK {
		t.Fatalf("after the other process released: %d, want 200", code)
	}
	if ok, _, err := conn.Exists("/flightlock/lock:zorder:2"); err != nil || ok {
		t.Fatalf("the key's node is still there after the request returned (%v)", err)
	}
}

// Read and write rules on ZooKeeper, in two processes: reads of a key run together, a write is
// refused while they hold it, and goes through once they are done.
func TestZookeeperReadRulesShareAndWriteRulesExclude(t *testing.T) {
	srv := zktest.Start(t)
	const path = "/zk/orders/:id"
	rl := []Rule{
		{Method: http.MethodGet, Path: path, Key: "zro:{path.id}", Mode: "read", OnBusy: "reject"},
		{Method: http.MethodPost, Path: path, Key: "zro:{path.id}", Mode: "write", OnBusy: "reject"},
	}
	p := newRWProbe(http.MethodGet)
	routes := []rest.Route{
		{Method: http.MethodGet, Path: path, Handler: p.handler(false)},
		{Method: http.MethodPost, Path: path, Handler: p.handler(true)},
	}
	var servers []*rest.Serverless
	for range 2 {
		m, err := New(zkConf(srv.Addr, rl...))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		servers = append(servers, serverless(t, restConf(t, 10*time.Second), m, routes))
	}
	send := func(s *rest.Serverless, method string, hold bool) int {
		r := httptest.NewRequest(method, "/zk/orders/7", http.NoBody)
		if hold {
			r.Header.Set("X-Hold", "1")
		}
		return serve(s, r).Code
	}
	codes := make(chan int, 2)
	for _, s := range servers {
		go func() { codes <- send(s, http.MethodGet, true) }()
	}
	if a, b := p.enter(t), p.enter(t); a != http.MethodGet || b != http.MethodGet {
		t.Fatalf("%s and %s entered, want two GETs at once", a, b)
	}
	for i, s := range servers {
		if code := send(s, http.MethodPost, false); code != http.StatusConflict {
			t.Errorf("a POST in process %d while two GETs read: %d, want 409", i, code)
		}
	}
	close(p.hold[http.MethodGet])
	for range 2 {
		if code := <-codes; code != http.StatusOK {
			t.Errorf("a GET that read: %d, want 200", code)
		}
	}
	waitFor(t, 5*time.Second, "a POST once the reads are done", func() bool {
		return send(servers[1], http.MethodPost, false) == http.StatusOK
	})
	if p.overlap.Load() {
		t.Error("a handler ran beside a writer")
	}
}

// A TTL longer than the ZooKeeper session keeps a lock is refused when the Middleware starts,
// naming the setting, the TTL and the session timeout: a rule's own TTL, and the section's.
// With zktest's standalone server (a 500ms tick, no follower to lag) a 6s session keeps locks of
// up to 3.5s.
func TestZookeeperTTLAboveMaxTTLIsRefusedAtStartUp(t *testing.T) {
	srv := zktest.Start(t)
	order := Rule{Method: http.MethodPost, Path: "/zk/o", Key: "o:{body.uid}"}
	long := order
	long.TTL = 3800 * time.Millisecond
	sectionTTL := zkConf(srv.Addr, order)
	sectionTTL.TTL = 3800 * time.Millisecond
	for _, tc := range []struct {
		name  string
		c     LockConf
		field string
	}{
		{"rule TTL", zkConf(srv.Addr, long), "Lock.Rules[0].TTL"},
		{"section TTL", sectionTTL, "Lock.TTL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.c.Validate(); err != nil {
				t.Fatalf("Validate = %v: 3.8s is below two thirds of 6s, which only the servers' tick refuses", err)
			}
			m, err := New(tc.c)
			if err == nil {
				_ = m.Close()
				t.Fatal("New accepted a 3.8s TTL on a 6s session (at most 3.5s with a 500ms tick)")
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field || !errors.Is(err, flightlock.ErrConfig) {
				t.Fatalf("New = %v, want the ConfigError of %s", err, tc.field)
			}
			if msg := err.Error(); !strings.Contains(msg, "3.5s") || !strings.Contains(msg, "6s session timeout") {
				t.Fatalf("New = %q, want it to name the 3.5s TTL and the 6s session timeout", msg)
			}
		})
	}
	ok := order
	ok.TTL = 3 * time.Second
	m, err := New(zkConf(srv.Addr, ok))
	if err != nil {
		t.Fatalf("a 3s TTL, the most a 6s session keeps with a 500ms tick: %v", err)
	}
	_ = m.Close()
}

// Closing the Middleware ends its ZooKeeper session, so the holds it made go at once rather
// than at the end of the session timeout.
func TestZookeeperCloseEndsTheSession(t *testing.T) {
	srv := zktest.Start(t)
	conn, _ := zktest.Connect(t, 10*time.Second, srv.Addr)
	m, err := New(zkConf(srv.Addr))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Locker().TryLock(context.Background(), "closed:1"); err != nil {
		t.Fatal(err)
	}
	kids, _, err := conn.Children("/flightlock/lock:closed:1")
	if err != nil || len(kids) == 0 {
		t.Fatalf("the held key has holds %v (%v), want its own", kids, err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "the holds to go with the session", func() bool {
		kids, _, err := conn.Children("/flightlock/lock:closed:1")
		return errors.Is(err, zk.ErrNoNode) || err == nil && len(kids) == 0
	})
}

// A handler that outlives the drain keeps its lock on ZooKeeper: Shutdown then leaves the
// session open, since ending it would delete the hold under the running handler and let a
// second holder in; the hold goes with the session when the process exits.
func TestZookeeperShutdownKeepsTheSessionOfLocksStillHeld(t *testing.T) {
	srv := zktest.Start(t)
	conn, _ := zktest.Connect(t, 10*time.Second, srv.Addr)
	c := zkConf(srv.Addr, Rule{Method: http.MethodPost, Path: "/zk/slow/:id", Key: "slow:{id}"})
	c.Drain = 100 * time.Millisecond
	m, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	in, release := make(chan struct{}), make(chan struct{})
	s := serverless(t, restConf(t, 30*time.Second), m, []rest.Route{{Method: http.MethodPost, Path: "/zk/slow/:id",
		Handler: func(w http.ResponseWriter, r *http.Request) {
			close(in)
			<-release // ignores its context's cancellation
		}}})
	done := make(chan int, 1)
	go func() { done <- serve(s, httptest.NewRequest(http.MethodPost, "/zk/slow/1", http.NoBody)).Code }()
	<-in
	if err := m.Shutdown(context.Background()); err == nil {
		t.Fatal("Shutdown reported no lock left held while the handler still ran")
	}
	if kids, _, err := conn.Children("/flightlock/lock:slow:1"); err != nil || len(kids) == 0 {
		t.Fatalf("after Shutdown the running handler's key has holds %v (%v), want its own still there", kids, err)
	}
	other, err := New(zkConf(srv.Addr))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.Locker().TryLock(context.Background(), "slow:1"); !errors.Is(err, flightlock.ErrBusy) {
		t.Fatalf("another process on the key of a handler still running: %v, want ErrBusy", err)
	}
	close(release)
	<-done
}
