package middleware

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/lockstore/redisstore"
	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/rest"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// rwProbe counts the readers and writers inside handlers and records any overlap a
// read-write lock forbids: a writer beside anyone, a reader beside a writer. A request with
// X-Hold announces itself on in and stays inside until hold[its method] is closed.
type rwProbe struct {
	readers, writers atomic.Int32
	overlap          atomic.Bool
	in               chan string
	hold             map[string]chan struct{} // by HTTP method; read-only once made
}

func newRWProbe(methods ...string) *rwProbe {
	p := &rwProbe{in: make(chan string, 8), hold: make(map[string]chan struct{})}
	for _, m := range methods {
		p.hold[m] = make(chan struct{})
	}
	return p
}

func (p *rwProbe) handler(write bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// Each side adds itself before it looks at the other, so that of two that overlap at
		// least one sees the other.
		if write {
			if p.writers.Add(1) > 1 || p.readers.Load() > 0 {
				p.overlap.Store(true)
			}
			defer p.writers.Add(-1)
		} else {
			p.readers.Add(1)
			if p.writers.Load() > 0 {
				p.overlap.Store(true)
			}
			defer p.readers.Add(-1)
		}
		if r.Header.Get("X-Hold") != "" {
			p.in <- r.Method
			<-p.hold[r.Method]
		}
	}
}

// enter returns the method of the next request to hold inside its handler.
func (p *rwProbe) enter(t *testing.T) string {
	t.Helper()
	select {
	case m := <-p.in:
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("no request entered its handler")
		return ""
	}
}

// GETs of an order take read locks and run together, a POST is refused while they run, a
// PUT that waits holds new GETs back until it had its turn (writer preference), and no
// handler ever ran beside a writer.
func TestReadRulesRunTogetherAndWritesExcludeThem(t *testing.T) {
	tr := newTestRedis(t)
	const path = "/orders/:id"
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{
		{Method: http.MethodGet, Path: path, Key: "order:{path.id}", Mode: "read", OnBusy: "reject"},
		{Method: http.MethodPost, Path: path, Key: "order:{path.id}", Mode: "write", OnBusy: "reject"},
		{Method: http.MethodPut, Path: path, Key: "order:{path.id}", Mode: "Write", Wait: 5 * time.Second},
	}})
	p := newRWProbe(http.MethodGet, http.MethodPut)
	s := serverless(t, restConf(t, 10*time.Second), m, []rest.Route{
		{Method: http.MethodGet, Path: path, Handler: p.handler(false)},
		{Method: http.MethodPost, Path: path, Handler: p.handler(true)},
		{Method: http.MethodPut, Path: path, Handler: p.handler(true)},
	})
	send := func(method string, hold bool) int {
		r := httptest.NewRequest(method, "/orders/7", http.NoBody)
		if hold {
			r.Header.Set("X-Hold", "1")
		}
		return serve(s, r).Code
	}
	codes := make(chan int, 3)
	for _, method := range []string{http.MethodGet, http.MethodGet} {
		go func() { codes <- send(method, true) }()
	}
	if a, b := p.enter(t), p.enter(t); a != http.MethodGet || b != http.MethodGet {
		t.Fatalf("%s and %s entered, want two GETs at once", a, b)
	}
	if code := send(http.MethodPost, false); code != http.StatusConflict {
		t.Errorf("a POST while two GETs read: %d, want 409", code)
	}
	go func() { codes <- send(http.MethodPut, true) }()
	waitFor(t, 5*time.Second, "the waiting PUT to hold new GETs back", func() bool {
		return send(http.MethodGet, false) == http.StatusConflict
	})
	close(p.hold[http.MethodGet])
	if got := p.enter(t); got != http.MethodPut {
		t.Fatalf("%s entered after the reads, want the PUT that waited", got)
	}
	if code := send(http.MethodGet, false); code != http.StatusConflict {
		t.Errorf("a GET while the PUT writes: %d, want 409", code)
	}
	close(p.hold[http.MethodPut])
	for range 3 {
		if code := <-codes; code != http.StatusOK {
			t.Errorf("a request that got its lock: %d, want 200", code)
		}
	}
	if code := send(http.MethodGet, false); code != http.StatusOK {
		t.Errorf("a GET after the writes: %d, want 200", code)
	}
	if p.overlap.Load() {
		t.Error("a handler ran beside a writer")
	}
	if !tr.isFree("order:7") {
		t.Error("the order's lock is held after every request returned")
	}
}

// Requests of a fair rule in two processes get a held key in the order they asked for it,
// whichever process they are in; the store's line counts them while they wait.
func TestFairRuleGrantsInRequestOrderAcrossProcesses(t *testing.T) {
	tr := newTestRedis(t)
	const path = "/acct/:id/debit"
	rule := Rule{Method: http.MethodPost, Path: path, Key: "acct:{path.id}", Fair: true, Wait: 10 * time.Second}
	granted := make(chan string, 3)
	var pods [2]*rest.Serverless
	for i := range pods {
		m := newMiddleware(t, tr, LockConf{Rules: []Rule{rule}})
		pods[i] = serverless(t, restConf(t, 15*time.Second), m, []rest.Route{{Method: http.MethodPost, Path: path,
			Handler: func(w http.ResponseWriter, r *http.Request) { granted <- r.Header.Get("X-Name") }}})
	}
	client := redis.NewClient(&redis.Options{Addr: tr.mr.Addr(), Protocol: 2, DisableIdentity: true})
	t.Cleanup(func() { _ = client.Close() })
	inspector := redisstore.NewInspector(client, "lock:")
	queued := func() int {
		l, err := inspector.Lookup(context.Background(), "acct:1")
		if err != nil {
			return -1
		}
		return l.Queued
	}

	holder := holdKey(t, tr, "acct:1")
	codes := make(chan int, 3)
	for i, w := range []struct {
		name string
		pod  int
	}{{"a", 0}, {"b", 1}, {"c", 0}} {
		go func() {
			r := httptest.NewRequest(http.MethodPost, "/acct/1/debit", http.NoBody)
			r.Header.Set("X-Name", w.name)
			codes <- serve(pods[w.pod], r).Code
		}()
		waitFor(t, 5*time.Second, "the request to take its place in line", func() bool { return queued() == i+1 })
	}
	if err := holder.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	var order []string
	for range 3 {
		select {
		case name := <-granted:
			order = append(order, name)
		case <-time.After(10 * time.Second):
			t.Fatalf("granted %v, then nothing", order)
		}
	}
	if !slices.Equal(order, []string{"a", "b", "c"}) {
		t.Errorf("granted in the order %v, want a, b, c: the order they asked in", order)
	}
	for range 3 {
		if code := <-codes; code != http.StatusOK {
			t.Errorf("a fair request: %d, want 200", code)
		}
	}
}

// A read rule on a zrpc method shares the key with the calls of other read methods and
// answers a write method Aborted while they read.
func TestReadRuleOnRPCSharesTheKey(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{
		{RPC: fullMethod("Host"), Key: "o:{host}", Mode: "read"},
		{RPC: fullMethod("Header"), Key: "o:{header.x-order}", Mode: "write", OnBusy: "reject"},
	}})
	inside, release := make(chan struct{}, 2), make(chan struct{})
	conn := startGRPC(t, m, func(ctx context.Context, req *rpb.ServerReflectionRequest) (*wrapperspb.StringValue, error) {
		if req.GetHost() != "" {
			inside <- struct{}{}
			<-release
		}
		return echoLeases(ctx, req)
	})
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := call(context.Background(), conn, "Host", &rpb.ServerReflectionRequest{Host: "1"})
			errs <- err
		}()
	}
	for range 2 {
		select {
		case <-inside:
		case <-time.After(5 * time.Second):
			t.Fatal("two read calls of one key did not run together")
		}
	}
	write := metadata.NewOutgoingContext(context.Background(), metadata.Pairs("x-order", "1"))
	if _, err := call(write, conn, "Header", &rpb.ServerReflectionRequest{}); status.Code(err) != codes.Aborted {
		t.Errorf("a write call while two read: %v, want Aborted", err)
	}
	close(release)
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("a read call: %v", err)
		}
	}
	if _, err := call(write, conn, "Header", &rpb.ServerReflectionRequest{}); err != nil {
		t.Errorf("a write call after the reads: %v", err)
	}
}

// The client interceptor hands the downstream service the write locks of the calling context
// only: a read lease has no owner to hand over (Lease.Owner is ""), and a context that holds
// read locks alone calls out unchanged.
func TestReadLeasesAreNotHandedDownstream(t *testing.T) {
	tr := newTestRedis(t)
	l := tr.locker(t)
	m, err := New(LockConf{PropagateTo: []string{"/pkg.Svc/"}}, WithLocker(l))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	readers, err := l.With(flightlock.WithRead())
	if err != nil {
		t.Fatal(err)
	}
	read, err := readers.Lock(ctx, "order:1")
	if err != nil {
		t.Fatal(err)
	}
	defer read.Release(ctx)
	sent := func(ctx context.Context) (keys []string, same bool) {
		err := m.UnaryClientInterceptor()(ctx, "/pkg.Svc/Get", nil, nil, nil,
			func(out context.Context, _ string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
				md, _ := metadata.FromOutgoingContext(out)
				for _, v := range md.Get(ownerMetadataKey) {
					key, _, _, ok := m.owners.decode(v)
					if !ok {
						t.Errorf("undecodable owner metadata %q", v)
					}
					keys = append(keys, key)
				}
				same = out == ctx
				return nil
			})
		if err != nil {
			t.Fatal(err)
		}
		return keys, same
	}
	if keys, same := sent(read.Context()); len(keys) != 0 || !same {
		t.Errorf("a call under a read lock sent owners of %v (context unchanged: %v), want none", keys, same)
	}
	write, err := l.Lock(read.Context(), "user:9")
	if err != nil {
		t.Fatal(err)
	}
	defer write.Release(ctx)
	if keys, _ := sent(write.Context()); !slices.Equal(keys, []string{"lock:user:9"}) {
		t.Errorf("a call under a read and a write lock sent owners of %v, want the write's alone", keys)
	}
}

// A shadow read rule takes read locks as the enforced rule would: reads of one key count no
// conflict among themselves, and a shadow write while they read counts one.
func TestShadowReadRuleCountsOnlyWhatAWriteWouldHoldBack(t *testing.T) {
	tr := newTestRedis(t)
	const path = "/shadow/orders/:id"
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{
		{Method: http.MethodGet, Path: path, Key: "order:{path.id}", Mode: "read", OnBusy: "reject", Shadow: true},
		{Method: http.MethodPost, Path: path, Key: "order:{path.id}", OnBusy: "reject", Shadow: true},
	}})
	p := newRWProbe(http.MethodGet)
	s := serverless(t, restConf(t, 10*time.Second), m, []rest.Route{
		{Method: http.MethodGet, Path: path, Handler: p.handler(false)},
		{Method: http.MethodPost, Path: path, Handler: p.handler(true)},
	})
	reads := conflictCount(t, "GET "+path, "reject")
	codes := make(chan int, 2)
	for range 2 {
		go func() {
			r := httptest.NewRequest(http.MethodGet, "/shadow/orders/3", http.NoBody)
			r.Header.Set("X-Hold", "1")
			codes <- serve(s, r).Code
		}()
	}
	p.enter(t)
	p.enter(t)
	countsOneConflict(t, "a shadow write while two read", "POST "+path, "reject", func() int {
		return serve(s, httptest.NewRequest(http.MethodPost, "/shadow/orders/3", http.NoBody)).Code
	})
	close(p.hold[http.MethodGet])
	for range 2 {
		if code := <-codes; code != http.StatusOK {
			t.Errorf("a shadow read: %d, want 200", code)
		}
	}
	if got := conflictCount(t, "GET "+path, "reject") - reads; got != 0 {
		t.Errorf("two reads counted %v conflicts, want none: reads share", got)
	}
}

// The span of an acquisition says what kind of lock its rule takes: its mode, whether it is
// fair, and its permits.
func TestLockSpansNameTheKindOfLock(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{
		{Method: http.MethodGet, Path: "/k/read", Key: "k:{query.id}", Mode: "read"},
		{Method: http.MethodPost, Path: "/k/fair", Key: "k:{query.id}", Fair: true},
		{Method: http.MethodPost, Path: "/k/export", Key: "export:{query.id}", Permits: 3},
	}})
	h := m.Handle(func(http.ResponseWriter, *http.Request) {})
	for _, tt := range []struct {
		method, path, mode string
		fair               bool
		permits            int64
	}{
		{http.MethodGet, "/k/read", "read", false, 1},
		{http.MethodPost, "/k/fair", "write", true, 1},
		{http.MethodPost, "/k/export", "write", false, 3},
	} {
		exp.Reset()
		ctx, span := tp.Tracer("test").Start(context.Background(), "request")
		w := httptest.NewRecorder()
		h(w, httptest.NewRequest(tt.method, tt.path+"?id=1", http.NoBody).WithContext(ctx))
		span.End()
		locks := spansNamed(exp.GetSpans(), "flightlock.lock")
		if w.Code != http.StatusOK || len(locks) != 1 {
			t.Fatalf("%s %s: status %d, %d lock spans; want 200 and one", tt.method, tt.path, w.Code, len(locks))
		}
		a := attrs(locks[0])
		if a["flightlock.mode"].AsString() != tt.mode || a["flightlock.fair"].AsBool() != tt.fair || a["flightlock.permits"].AsInt64() != tt.permits {
			t.Errorf("%s %s: mode %v, fair %v, permits %v; want %s, %v, %d", tt.method, tt.path,
				a["flightlock.mode"], a["flightlock.fair"], a["flightlock.permits"], tt.mode, tt.fair, tt.permits)
		}
	}
}
