package middleware

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/rest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
)

// shareRule is the rule of the share tests: create-order keyed by the caller and an
// idempotency key, as the README shows it.
func shareRule() Rule {
	return Rule{Method: "POST", Path: "/pay", Key: "pay:{header.X-Uid}:{header.Idempotency-Key}", OnBusy: "share",
		Wait: 10 * time.Second}
}

// payHandler counts its runs in Redis (so that several processes count together), takes a
// while, and answers with a body that differs per run.
func payHandler(rdb *redis.Client, delay time.Duration, status int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n := rdb.Incr(r.Context(), "runs").Val()
		time.Sleep(delay)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Set-Cookie", "session=only-mine")
		w.WriteHeader(status)
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, `{"run":%d,"paid":%s}`, n, body)
	}
}

func payRequest(uid, idem, body string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("X-Uid", uid)
	r.Header.Set("Idempotency-Key", idem)
	return r
}

// Duplicates in one process, through go-zero's whole REST chain: the handler runs once, every
// duplicate gets its status and body (marked as a replay), later duplicates get the stored
// response at once, a changed payload under the same key gets 422, and the stored response is
// bounded by the replay time.
func TestShareDuplicatesInOneProcess(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	rule := shareRule()
	rule.Replay = 3 * time.Second
	m, err := New(LockConf{Redis: RedisConf{Host: srv.Addr}, Rules: []Rule{rule}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s := serverless(t, restConf(t, 20*time.Second), m, []rest.Route{
		{Method: http.MethodPost, Path: "/pay", Handler: payHandler(rdb, 200*time.Millisecond, http.StatusOK)},
	})

	const n = 16
	var wg sync.WaitGroup
	replies := make([]*httptest.ResponseRecorder, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies[i] = serve(s, payRequest("u1", "k1", `{"amount":5}`))
		}()
	}
	wg.Wait()
	if runs := rdb.Get(context.Background(), "runs").Val(); runs != "1" {
		t.Fatalf("the handler ran %s times for %d duplicates, want 1", runs, n)
	}
	replayed := 0
	for i, w := range replies {
		if w.Code != http.StatusOK || w.Body.String() != `{"run":1,"paid":{"amount":5}}` || w.Header().Get("Content-Type") != "application/json" {
			t.Errorf("duplicate %d: %d %q %v", i, w.Code, w.Body.String(), w.Header())
		}
		if w.Header().Get(ReplayedHeader) == "true" {
			replayed++
			if w.Header().Get("Set-Cookie") != "" {
				t.Errorf("duplicate %d got the first request's cookie", i)
			}
		} else if w.Header().Get("Set-Cookie") == "" {
			t.Errorf("the request that ran the handler lost its own cookie")
		}
	}
	if replayed != n-1 {
		t.Errorf("%d responses marked as replays, want %d", replayed, n-1)
	}

	// A later duplicate: the stored response, at once.
	if w := serve(s, payRequest("u1", "k1", `{"amount":5}`)); w.Code != http.StatusOK || w.Header().Get(ReplayedHeader) != "true" ||
		!strings.Contains(w.Body.String(), `"run":1`) {
		t.Errorf("later duplicate: %d %q", w.Code, w.Body.String())
	}
	// The same idempotency key with another payload: 422, the handler not run.
	if w := serve(s, payRequest("u1", "k1", `{"amount":500}`)); w.Code != http.StatusUnprocessableEntity {
		t.Errorf("same key, another payload: %d %q, want 422", w.Code, w.Body.String())
	}
	// Another caller's identical request is not a duplicate: the key names the caller.
	if w := serve(s, payRequest("u2", "k1", `{"amount":5}`)); w.Code != http.StatusOK || w.Header().Get(ReplayedHeader) != "" {
		t.Errorf("another caller: %d %v, want its own run", w.Code, w.Header())
	}
	if runs := rdb.Get(context.Background(), "runs").Val(); runs != "2" {
		t.Errorf("runs = %s after the other caller, want 2", runs)
	}
	// Redis memory: the stored response lives at most the replay time.
	ttl := rdb.PTTL(context.Background(), "lock:replay:pay:u1:k1").Val()
	if ttl <= 0 || ttl > 3*time.Second {
		t.Errorf("stored response TTL %v, want within Replay (3s)", ttl)
	}
}

// An error response is not replayed (a retry runs the handler again); a response over
// ReplayMaxBytes is not stored; a duplicate whose deadline comes while it waits gets 409 with
// Retry-After before it, and a panic in the shared run answers 500 to everyone, no hang.
func TestShareErrorsTooLargeDeadlinesAndPanics(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	rule := shareRule()
	rule.ReplayMaxBytes = 40
	big := Rule{Method: "POST", Path: "/big", Key: "big:{header.X-Uid}", OnBusy: "share"}
	boom := Rule{Method: "POST", Path: "/boom", Key: "boom:{header.X-Uid}", OnBusy: "share"}
	m, err := New(LockConf{Redis: RedisConf{Host: srv.Addr}, Rules: []Rule{rule, big, boom}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	status := atomic.Int32{}
	status.Store(http.StatusServiceUnavailable)
	var panics atomic.Int32
	s := serverless(t, restConf(t, 20*time.Second), m, []rest.Route{
		{Method: http.MethodPost, Path: "/pay", Handler: func(w http.ResponseWriter, r *http.Request) {
			payHandler(rdb, 0, int(status.Load()))(w, r)
		}},
		{Method: http.MethodPost, Path: "/big", Handler: func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(strings.Repeat("x", 70000))) // above the default 64 KiB
		}},
		{Method: http.MethodPost, Path: "/boom", Handler: func(w http.ResponseWriter, r *http.Request) {
			panics.Add(1)
			time.Sleep(100 * time.Millisecond)
			panic("boom")
		}},
	})

	if w := serve(s, payRequest("u1", "e", `{}`)); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("first: %d", w.Code)
	}
	if rdb.Exists(ctx, "lock:replay:pay:u1:e").Val() != 0 {
		t.Error("a 503 was stored for replay")
	}
	status.Store(http.StatusOK)
	if w := serve(s, payRequest("u1", "e", `{}`)); w.Code != http.StatusOK || w.Header().Get(ReplayedHeader) != "" {
		t.Errorf("retry after an error: %d %v, want a run of its own", w.Code, w.Header())
	}
	if rdb.Exists(ctx, "lock:replay:pay:u1:e").Val() != 1 {
		t.Error("the 200 was not stored")
	}
	// Over the size bound: not stored, counted.
	tooLarge := func() (n float64) {
		withMetric(t, "flightlock_shared_total", func(l map[string]string, v float64) {
			if l["rule"] == "POST /pay" && l["how"] == "too_large" {
				n += v
			}
		})
		return n
	}
	before := tooLarge()
	if w := serve(s, payRequest("u1", "large", `{"pad":"`+strings.Repeat("y", 40)+`"}`)); w.Code != http.StatusOK {
		t.Fatalf("large: %d", w.Code)
	}
	if keys := rdb.Keys(ctx, "lock:replay:pay:u1:large").Val(); len(keys) != 0 {
		t.Errorf("a response over ReplayMaxBytes was stored: %v", keys)
	}
	if after := tooLarge(); after != before+1 {
		t.Errorf("too_large not counted: %v -> %v", before, after)
	}
	r := httptest.NewRequest(http.MethodPost, "/big", nil)
	r.Header.Set("X-Uid", "u1")
	if w := serve(s, r); w.Code != http.StatusOK || w.Body.Len() != 70000 {
		t.Errorf("big: %d, %d bytes", w.Code, w.Body.Len())
	}
	if rdb.Exists(ctx, "lock:replay:big:u1").Val() != 0 {
		t.Error("a 70,000-byte body was stored over the 64 KiB default")
	}

	// A panic: every duplicate answers 500, none hangs; the handler ran once.
	var wg sync.WaitGroup
	codes := make([]int, 4)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := httptest.NewRequest(http.MethodPost, "/boom", nil)
			r.Header.Set("X-Uid", "u1")
			codes[i] = serve(s, r).Code
		}()
	}
	wg.Wait()
	for i, c := range codes {
		if c != http.StatusInternalServerError {
			t.Errorf("duplicate %d of a panicking run: %d, want 500", i, c)
		}
	}
	if n := panics.Load(); n != 1 {
		t.Errorf("the panicking handler ran %d times for 4 concurrent duplicates, want 1", n)
	}

	// A duplicate with a short deadline while the first holds the key in another process: the
	// key is still in flight, and the answer is 409 with Retry-After before the duplicate's
	// deadline (the wait keeps a reserve for it), as the Idempotency-Key draft answers
	// a key in flight.
	held := holdKeyOn(t, srv, "pay:u9:d")
	defer held()
	short := restConf(t, 300*time.Millisecond)
	slow := func(w http.ResponseWriter, r *http.Request) { time.Sleep(time.Second); w.WriteHeader(http.StatusOK) }
	s2 := serverless(t, short, m, []rest.Route{{Method: http.MethodPost, Path: "/pay", Handler: slow}})
	// Its Retry-After is at most the holder's remaining TTL (10s, the default), which the
	// Locker's wait tells, and less when the rule's locks are held for less.
	if w := serve(s2, payRequest("u9", "d", `{}`)); w.Code != http.StatusConflict || !retryAfterWithin(w, 1, 10) {
		t.Errorf("duplicate of a key held elsewhere, deadline 300ms: %d (Retry-After %q), want 409 before its deadline, "+
			"Retry-After 1..10", w.Code, w.Header().Get("Retry-After"))
	}
	// A duplicate that joined a run of this process (the handler takes 1s) and whose own
	// deadline (300ms) ends first: the same 409 with Retry-After before its deadline, while the
	// run goes on, as a duplicate in another process got above: contention answers below 500
	// before the caller's deadline, so that go-zero's breakers do not count it.
	long := serverless(t, restConf(t, 10*time.Second), m, []rest.Route{{Method: http.MethodPost, Path: "/pay", Handler: slow}})
	leader := make(chan int, 1)
	go func() { leader <- serve(long, payRequest("u9", "joined", `{}`)).Code }()
	time.Sleep(100 * time.Millisecond) // the leader's run has started
	if w := serve(s2, payRequest("u9", "joined", `{}`)); w.Code != http.StatusConflict || w.Header().Get("Retry-After") == "" {
		t.Errorf("joined duplicate, deadline 300ms: %d (Retry-After %q), want 409 before its deadline",
			w.Code, w.Header().Get("Retry-After"))
	}
	if code := <-leader; code != http.StatusOK {
		t.Errorf("the leader's run: %d, want 200", code)
	}
}

// holdKeyOn takes key on srv through a Locker of its own (another process) until the returned
// function releases it.
func holdKeyOn(t *testing.T, srv *redistest.Server, key string) func() {
	t.Helper()
	m, err := New(LockConf{Redis: RedisConf{Host: srv.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := m.Locker().TryLock(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return func() { _ = lease.Release(context.Background()); _ = m.Close() }
}

const sharePodEnv = "FLIGHTLOCK_SHARE_POD_REDIS"

// sharePod is the second process of TestShareDuplicatesAcrossProcesses: a go-zero server with
// the share rule on the given Redis; it prints its address and serves until killed.
func sharePod(redisAddr string) int {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, DisableIdentity: true})
	m, err := New(LockConf{Redis: RedisConf{Host: redisAddr}, Rules: []Rule{shareRule()}})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	server := rest.MustNewServer(rest.RestConf{Host: "127.0.0.1", Port: 0, Timeout: 30000})
	server.Use(m.Handle)
	server.AddRoute(rest.Route{Method: http.MethodPost, Path: "/pay", Handler: payHandler(rdb, 300*time.Millisecond, http.StatusOK)})
	fmt.Println("ready")
	server.Start()
	return 0
}

// Duplicates sent to two processes (this one and the test binary re-executed) run the handler
// once: the process that lost the race for the lock waits, and replays the response the holder
// stored before releasing.
func TestShareDuplicatesAcrossProcesses(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	cmd, _ := startChild(t, sharePodEnv, srv.Addr)
	port := listeningPort(t, cmd.Process.Pid)

	m, err := New(LockConf{Redis: RedisConf{Host: srv.Addr}, Rules: []Rule{shareRule()}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	local := serverless(t, restConf(t, 30*time.Second), m, []rest.Route{
		{Method: http.MethodPost, Path: "/pay", Handler: payHandler(rdb, 300*time.Millisecond, http.StatusOK)},
	})
	const each = 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bodies []string
	record := func(code int, body string) {
		mu.Lock()
		defer mu.Unlock()
		bodies = append(bodies, fmt.Sprintf("%d %s", code, body))
	}
	for range each {
		wg.Add(2)
		go func() {
			defer wg.Done()
			w := serve(local, payRequest("u1", "x", `{"amount":7}`))
			record(w.Code, w.Body.String())
		}()
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/pay", port), strings.NewReader(`{"amount":7}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Uid", "u1")
			req.Header.Set("Idempotency-Key", "x")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			record(resp.StatusCode, string(b))
		}()
	}
	wg.Wait()
	if runs := rdb.Get(context.Background(), "runs").Val(); runs != "1" {
		t.Fatalf("the handler ran %s times for %d duplicates in two processes, want 1", runs, 2*each)
	}
	for _, b := range bodies {
		if b != bodies[0] || !strings.HasPrefix(b, "200 ") {
			t.Fatalf("responses differ: %q", bodies)
		}
	}
}

// gRPC: duplicates on one server, and on a second server with its own Middleware (another
// process's gate and flights) on the same Redis, get the reply of the one call that ran the
// handler; a changed request under the same key gets InvalidArgument; an Unavailable reply is
// not replayed.
func TestShareGRPC(t *testing.T) {
	srv := redistest.Start(t)
	testShareGRPCOnTwoServers(t, func(rules []Rule) LockConf {
		return LockConf{Redis: RedisConf{Host: srv.Addr}, Rules: rules}
	})
}

// testShareGRPCOnTwoServers runs a share rule on two gRPC servers, each with its own
// Middleware built from conf (two processes on one store): 12 duplicates started together on
// both get the reply of the one call that ran the handler, 11 marked replayed; a changed
// request under the same key gets InvalidArgument on either server; an Unavailable reply is
// not replayed: the retry on the other server runs the handler again.
func testShareGRPCOnTwoServers(t *testing.T, conf func(rules []Rule) LockConf) {
	ctx := context.Background()
	var runs atomic.Int64
	var fail atomic.Bool
	handler := func(ctx context.Context, req *rpb.ServerReflectionRequest) (*wrapperspb.StringValue, error) {
		n := runs.Add(1)
		time.Sleep(200 * time.Millisecond)
		if fail.Load() {
			return nil, status.Error(codes.Unavailable, "try again")
		}
		return wrapperspb.String(fmt.Sprintf("run %d for %s", n, req.GetHost())), nil
	}
	rules := []Rule{{RPC: fullMethod("Host"), Key: "h:{host}", OnBusy: "share", Wait: 10 * time.Second}}
	var conns []*grpc.ClientConn
	for range 2 {
		m, err := New(conf(rules))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		conns = append(conns, startGRPC(t, m, handler))
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var replies []string
	replayed := 0
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var md metadata.MD
			reply := new(wrapperspb.StringValue)
			err := conns[i%2].Invoke(ctx, fullMethod("Host"), &rpb.ServerReflectionRequest{Host: "a"}, reply, grpc.Header(&md))
			mu.Lock()
			defer mu.Unlock()
			replies = append(replies, fmt.Sprintf("%v %s", err, reply.GetValue()))
			if len(md.Get(ReplayedMetadata)) > 0 {
				replayed++
			}
		}()
	}
	close(start)
	wg.Wait()
	if got := runs.Load(); got != 1 {
		t.Fatalf("the handler ran %d times for 12 duplicates on two servers, want 1", got)
	}
	for _, r := range replies {
		if r != "<nil> run 1 for a" {
			t.Fatalf("replies: %q", replies)
		}
	}
	if replayed != 11 {
		t.Errorf("%d replies marked %s, want 11", replayed, ReplayedMetadata)
	}
	// Another request message under the same key.
	for i, conn := range conns {
		_, err := call(ctx, conn, "Host", &rpb.ServerReflectionRequest{Host: "a", MessageRequest: &rpb.ServerReflectionRequest_FileByFilename{FileByFilename: "x"}})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("same key, another request on server %d: %v, want InvalidArgument", i, err)
		}
	}
	// Unavailable is not replayed: the retry runs the handler.
	fail.Store(true)
	if _, err := call(ctx, conns[0], "Host", &rpb.ServerReflectionRequest{Host: "b"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("failing call: %v", err)
	}
	fail.Store(false)
	if got, err := call(ctx, conns[1], "Host", &rpb.ServerReflectionRequest{Host: "b"}); err != nil || got != "run 3 for b" {
		t.Errorf("retry after Unavailable on the other server: %q %v, want a run of its own (run 3)", got, err)
	}
}

// A share rule whose replay key renders as the key of another rule's lock never overwrites
// that lock: the stored response is refused (logged), the lock keeps its value and owner.
func TestShareNeverOverwritesALock(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	m, err := New(LockConf{Redis: RedisConf{Host: srv.Addr}, Rules: []Rule{
		{Method: "POST", Path: "/pay", Key: "a:{header.X-Uid}", OnBusy: "share"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	// Another rule's lock on the key "replay:a:u1": the share rule's replay key for u1.
	release := holdKeyOn(t, srv, "replay:a:u1")
	defer release()
	before := rdb.Get(ctx, "lock:replay:a:u1").Val()
	s := serverless(t, restConf(t, 10*time.Second), m, []rest.Route{
		{Method: http.MethodPost, Path: "/pay", Handler: payHandler(rdb, 0, http.StatusOK)},
	})
	if w := serve(s, payRequest("u1", "", `{}`)); w.Code != http.StatusOK {
		t.Fatalf("request: %d", w.Code)
	}
	if after := rdb.Get(ctx, "lock:replay:a:u1").Val(); after != before {
		t.Fatalf("the lock's value changed from %q to %q", before, after)
	}
}

// A rule's key never renders as a share rule's stored response: the two share Prefix, and a
// lock taken on a record's key would find it "held", mark it for waiters (acquire.lua appends
// " ~" to the value) and so corrupt it, after which the share rule's duplicates no longer
// replay it and run the handler again. A template whose first value is "replay" renders that
// key for some requests; such a request is refused with 400, and the record stays whole.
func TestRuleKeysCannotReachStoredResponses(t *testing.T) {
	tr := newTestRedis(t)
	var runs atomic.Int64
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{
		shareRule(),
		{Method: "POST", Path: "/other", Key: "{header.X-Kind}:pay:{header.X-Uid}:{header.Idempotency-Key}", OnBusy: "reject"},
	}})
	s := serverless(t, restConf(t, 10*time.Second), m, []rest.Route{
		{Method: http.MethodPost, Path: "/pay", Handler: countingPay(&runs, 0)},
		{Method: http.MethodPost, Path: "/other", Handler: func(w http.ResponseWriter, r *http.Request) {}},
	})
	if w := serve(s, payRequest("u1", "k1", `{}`)); w.Code != http.StatusOK {
		t.Fatalf("first request: %d", w.Code)
	}
	const record = "lock:replay:pay:u1:k1"
	stored, err := tr.mr.Get(record)
	if err != nil {
		t.Fatalf("the stored response %s: %v", record, err)
	}
	other := httptest.NewRequest(http.MethodPost, "/other", http.NoBody)
	other.Header.Set("X-Kind", "replay")
	other.Header.Set("X-Uid", "u1")
	other.Header.Set("Idempotency-Key", "k1")
	if w := serve(s, other); w.Code != http.StatusBadRequest {
		t.Errorf("a request of the other rule whose key renders as %s: %d, want 400", record, w.Code)
	}
	if got, _ := tr.mr.Get(record); got != stored {
		t.Errorf("the stored response changed: %q -> %q", stored, got)
	}
	if w := serve(s, payRequest("u1", "k1", `{}`)); w.Code != http.StatusOK || w.Header().Get(ReplayedHeader) != "true" {
		t.Errorf("duplicate: %d %v, want the stored response replayed", w.Code, w.Header())
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times for one request and its duplicate, want 1", n)
	}
}

// retryAfterWithin reports whether w's Retry-After is a whole number of seconds in [lo, hi].
func retryAfterWithin(w *httptest.ResponseRecorder, lo, hi int) bool {
	secs, err := strconv.Atoi(w.Header().Get("Retry-After"))
	return err == nil && secs >= lo && secs <= hi
}
