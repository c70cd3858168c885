package middleware

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeromicro/go-zero/rest"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
)

// countingPay is payHandler with its runs counted in runs (the pods of these tests share one
// process, so an atomic counts for all of them): it takes delay and answers with a body that
// differs per run.
func countingPay(runs *atomic.Int64, delay time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		time.Sleep(delay)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Set-Cookie", "session=only-mine")
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, `{"run":%d,"paid":%s}`, n, body)
	}
}

// etcdPod is one "pod" of a share test: a Middleware of its own on the etcd cluster ec (its
// own etcd client, store, gate and flights) serving /pay through go-zero's REST chain.
func etcdPod(t *testing.T, ec *etcdtest.Cluster, handler http.HandlerFunc, rules ...Rule) (*Middleware, *rest.Serverless) {
	t.Helper()
	m, err := New(etcdConf(ec, rules...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m, serverless(t, restConf(t, 30*time.Second), m, []rest.Route{{Method: http.MethodPost, Path: "/pay", Handler: handler}})
}

// etcdGet returns the etcd key k (nil when there is none).
func etcdGet(t *testing.T, cli *clientv3.Client, k string) *clientv3.GetResponse {
	t.Helper()
	resp, err := cli.Get(context.Background(), k)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// Duplicates of one request sent at once to two pods on one etcd run the handler once: the
// pod that lost the race for the lock replays the response the holder stored in etcd before
// releasing, and every duplicate gets its status, headers (not its cookie) and body, marked as
// a replay. The stored response lives in etcd under Etcd.Key + Prefix + "replay:" + key, on a
// lease of the rule's Replay time (plus the lease-sharing second); a later duplicate gets it
// at once from either pod, and the same key with another payload gets 422 from both.
func TestShareEtcdDuplicatesAcrossPods(t *testing.T) {
	ec := etcdtest.Start(t)
	cli := ec.Client(t)
	var runs atomic.Int64
	pay := countingPay(&runs, 300*time.Millisecond)
	_, pod1 := etcdPod(t, ec, pay, shareRule())
	_, pod2 := etcdPod(t, ec, pay, shareRule())
	pods := []*rest.Serverless{pod1, pod2}

	const n = 16
	start := make(chan struct{})
	replies := make([]*httptest.ResponseRecorder, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			replies[i] = serve(pods[i%2], payRequest("u1", "x", `{"amount":7}`))
		}()
	}
	close(start)
	wg.Wait()
	if got := runs.Load(); got != 1 {
		t.Fatalf("the handler ran %d times for %d duplicates on two pods, want 1", got, n)
	}
	checkRepliesAcrossPods(t, replies)

	// The stored response in etcd: a JSON record on a lease of Replay (10s) plus at most 1s.
	const replayKey = "flightlock/lock:replay:pay:u1:x"
	got := etcdGet(t, cli, replayKey)
	if len(got.Kvs) != 1 || !strings.HasPrefix(string(got.Kvs[0].Value), "{") || got.Kvs[0].Lease == 0 {
		t.Fatalf("stored response %s: %v, want a JSON record on a lease", replayKey, got.Kvs)
	}
	ttl, err := cli.TimeToLive(context.Background(), clientv3.LeaseID(got.Kvs[0].Lease))
	if err != nil {
		t.Fatal(err)
	}
	if ttl.GrantedTTL != 11 || ttl.TTL < 9 || ttl.TTL > 11 {
		t.Errorf("lease of the stored response: granted %ds, %ds left; want 11s granted (Replay 10s + 1s), 9-11s left",
			ttl.GrantedTTL, ttl.TTL)
	}

	// Later duplicates, on either pod: the stored response at once.
	for i, pod := range pods {
		if w := serve(pod, payRequest("u1", "x", `{"amount":7}`)); w.Code != http.StatusOK || w.Header().Get(ReplayedHeader) != "true" ||
			w.Body.String() != `{"run":1,"paid":{"amount":7}}` {
			t.Errorf("later duplicate on pod %d: %d %q %v", i+1, w.Code, w.Body.String(), w.Header())
		}
	}
	// The same idempotency key with another payload: 422 on both pods.
	for i, pod := range pods {
		if w := serve(pod, payRequest("u1", "x", `{"amount":700}`)); w.Code != http.StatusUnprocessableEntity {
			t.Errorf("same key, another payload, pod %d: %d %q, want 422", i+1, w.Code, w.Body.String())
		}
	}
	if got := runs.Load(); got != 1 {
		t.Errorf("the handler ran %d times after the later duplicates, want still 1", got)
	}
}

// checkRepliesAcrossPods checks the replies of TestShareEtcdDuplicatesAcrossPods, request i
// sent to pod i%2: every one the response of the one run, each replay marked and without the
// cookie of the request that ran the handler, and every request of the other pod a replay.
func checkRepliesAcrossPods(t *testing.T, replies []*httptest.ResponseRecorder) {
	t.Helper()
	n := len(replies)
	replayedOn := [2]int{}
	for i, w := range replies {
		if w.Code != http.StatusOK || w.Body.String() != `{"run":1,"paid":{"amount":7}}` || w.Header().Get("Content-Type") != "application/json" {
			t.Errorf("duplicate %d: %d %q %v", i, w.Code, w.Body.String(), w.Header())
		}
		if w.Header().Get(ReplayedHeader) == "true" {
			replayedOn[i%2]++
			if w.Header().Get("Set-Cookie") != "" {
				t.Errorf("duplicate %d got the first request's cookie", i)
			}
		} else if w.Header().Get("Set-Cookie") == "" {
			t.Errorf("the request that ran the handler lost its own cookie")
		}
	}
	if replayedOn[0]+replayedOn[1] != n-1 || max(replayedOn[0], replayedOn[1]) != n/2 {
		t.Errorf("replays per pod %v, want %d in all: every request of the pod that did not run the handler", replayedOn, n-1)
	}
}

// A stored response expires after the rule's Replay time, counted up to whole seconds: a
// duplicate within it is replayed, the key is gone from etcd no earlier than Replay after the
// request started and within etcd's lease expiry, and the next request runs the handler again.
// Responses saved together share one lease (no grant per save).
func TestShareEtcdStoredResponseExpires(t *testing.T) {
	ec := etcdtest.Start(t)
	cli := ec.Client(t)
	var runs atomic.Int64
	rule := shareRule()
	rule.Replay = time.Second
	_, pod := etcdPod(t, ec, countingPay(&runs, 0), rule)

	started := time.Now()
	if w := serve(pod, payRequest("u1", "e", `{}`)); w.Code != http.StatusOK || w.Header().Get(ReplayedHeader) != "" {
		t.Fatalf("first: %d %v", w.Code, w.Header())
	}
	if w := serve(pod, payRequest("u1", "e2", `{}`)); w.Code != http.StatusOK {
		t.Fatalf("another key: %d", w.Code)
	}
	first, second := etcdGet(t, cli, "flightlock/lock:replay:pay:u1:e"), etcdGet(t, cli, "flightlock/lock:replay:pay:u1:e2")
	if len(first.Kvs) != 1 || len(second.Kvs) != 1 {
		t.Fatalf("stored responses: %v and %v, want both in etcd", first.Kvs, second.Kvs)
	}
	if first.Kvs[0].Lease == 0 || first.Kvs[0].Lease != second.Kvs[0].Lease {
		t.Errorf("leases of two responses saved within a second: %x and %x, want one shared lease",
			first.Kvs[0].Lease, second.Kvs[0].Lease)
	}
	if w := serve(pod, payRequest("u1", "e", `{}`)); w.Header().Get(ReplayedHeader) != "true" || !strings.Contains(w.Body.String(), `"run":1`) {
		t.Fatalf("duplicate within Replay: %d %q %v, want the stored response", w.Code, w.Body.String(), w.Header())
	}
	waitFor(t, 6*time.Second, "the stored response to expire", func() bool {
		return len(etcdGet(t, cli, "flightlock/lock:replay:pay:u1:e").Kvs) == 0
	})
	if lived := time.Since(started); lived < time.Second {
		t.Fatalf("the stored response was gone %v after the request started, before Replay (1s)", lived)
	}
	w := serve(pod, payRequest("u1", "e", `{}`))
	if w.Code != http.StatusOK || w.Header().Get(ReplayedHeader) != "" || w.Body.String() != `{"run":3,"paid":{}}` {
		t.Fatalf("after Replay: %d %q %v, want a run of its own (run 3)", w.Code, w.Body.String(), w.Header())
	}
}

// A share rule whose replay key renders as the key of another rule's lock never overwrites
// that lock: the request runs, its response is not stored, and the lock keeps its value,
// revision and lease. The save's transaction itself: it replaces a stored response (a value
// starting with '{'), and refuses any other value.
func TestShareEtcdNeverOverwritesALock(t *testing.T) {
	ec := etcdtest.Start(t)
	cli := ec.Client(t)
	ctx := context.Background()
	var runs atomic.Int64
	_, pod := etcdPod(t, ec, countingPay(&runs, 0), Rule{Method: "POST", Path: "/pay", Key: "a:{header.X-Uid}", OnBusy: "share"})

	// Another rule's lock on the key "replay:a:u1": the share rule's replay key for u1.
	other := MustNew(etcdConf(ec))
	defer other.Close()
	lock, err := other.Locker().TryLock(ctx, "replay:a:u1")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Release(ctx) }()
	const k = "flightlock/lock:replay:a:u1"
	before := etcdGet(t, cli, k)
	if len(before.Kvs) != 1 || strings.HasPrefix(string(before.Kvs[0].Value), "{") {
		t.Fatalf("the lock at %s: %v, want a lock value", k, before.Kvs)
	}
	for i := range 2 {
		if w := serve(pod, payRequest("u1", "", `{}`)); w.Code != http.StatusOK || w.Header().Get(ReplayedHeader) != "" {
			t.Fatalf("request %d: %d %v, want a run of its own", i+1, w.Code, w.Header())
		}
	}
	if got := runs.Load(); got != 2 {
		t.Fatalf("the handler ran %d times, want 2 (nothing could be stored)", got)
	}
	after := etcdGet(t, cli, k)
	if len(after.Kvs) != 1 || string(after.Kvs[0].Value) != string(before.Kvs[0].Value) ||
		after.Kvs[0].ModRevision != before.Kvs[0].ModRevision || after.Kvs[0].Lease != before.Kvs[0].Lease {
		t.Fatalf("the lock changed: %v -> %v", before.Kvs, after.Kvs)
	}
}

// A Lock section with a Redis and an etcd store and a share rule on each: each rule keeps its
// responses in the store it locks in, and a share rule built in Go (Route) on etcd shares too.
func TestShareEtcdAndRedisRules(t *testing.T) {
	ec := etcdtest.Start(t)
	cli := ec.Client(t)
	tr := newTestRedis(t)
	var runs atomic.Int64
	c := etcdConf(ec,
		Rule{Method: http.MethodPost, Path: "/r", Key: "r:{header.X-Uid}", OnBusy: "share", Store: "redis"},
		Rule{Method: http.MethodPost, Path: "/e", Key: "e:{header.X-Uid}", OnBusy: "share", Store: "etcd"},
	)
	c.Redis = RedisConf{Host: tr.mr.Addr(), Protocol: 2}
	m, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	pay := countingPay(&runs, 0)
	s := serverless(t, restConf(t, 10*time.Second), m, []rest.Route{
		{Method: http.MethodPost, Path: "/r", Handler: pay},
		{Method: http.MethodPost, Path: "/e", Handler: pay},
	})
	req := func(path string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{}`))
		r.Header.Set("X-Uid", "u1")
		return r
	}
	for _, path := range []string{"/r", "/e", "/r", "/e"} {
		if w := serve(s, req(path)); w.Code != http.StatusOK {
			t.Fatalf("%s: %d", path, w.Code)
		}
	}
	if got := runs.Load(); got != 2 {
		t.Fatalf("the handler ran %d times for two requests to each rule, want 2 (the second of each replayed)", got)
	}
	if !tr.mr.Exists("lock:replay:r:u1") || len(etcdGet(t, cli, "flightlock/lock:replay:r:u1").Kvs) != 0 {
		t.Error("the Redis rule's response is not in Redis only")
	}
	if tr.mr.Exists("lock:replay:e:u1") || len(etcdGet(t, cli, "flightlock/lock:replay:e:u1").Kvs) != 1 {
		t.Error("the etcd rule's response is not in etcd only")
	}

	route, err := m.Route(Rule{Method: http.MethodPost, Path: "/g", Key: "g:{header.X-Uid}", OnBusy: "share", Store: "etcd"})
	if err != nil {
		t.Fatal(err)
	}
	h := route(pay)
	for i := range 2 {
		w := httptest.NewRecorder()
		h(w, req("/g"))
		if w.Code != http.StatusOK || (w.Header().Get(ReplayedHeader) == "true") != (i == 1) {
			t.Fatalf("Route share rule, request %d: %d %v", i+1, w.Code, w.Header())
		}
	}
	if len(etcdGet(t, cli, "flightlock/lock:replay:g:u1").Kvs) != 1 {
		t.Error("the Route rule's response is not in etcd")
	}
}

// gRPC on etcd: duplicates on two servers, each with its own Middleware (two pods) on one
// etcd, get the reply of the one call that ran the handler; a changed request under the same
// key gets InvalidArgument; an Unavailable reply is not replayed.
func TestShareEtcdGRPC(t *testing.T) {
	ec := etcdtest.Start(t)
	testShareGRPCOnTwoServers(t, func(rules []Rule) LockConf { return etcdConf(ec, rules...) })
}
