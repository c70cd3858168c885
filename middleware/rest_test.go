package middleware

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/middleware/rules"
	"github.com/golang-jwt/jwt/v4"
	"github.com/zeromicro/go-zero/rest"
	"github.com/zeromicro/go-zero/rest/httpx"
)

const jwtSecret = "0123456789abcdef0123456789abcdef"

// echoKeys answers the keys of the leases its context holds, sorted, comma separated.
func echoKeys(w http.ResponseWriter, r *http.Request) {
	var keys []string
	for _, l := range flightlock.AllFromContext(r.Context()) {
		keys = append(keys, l.Key())
	}
	slices.Sort(keys)
	_, _ = w.Write([]byte(strings.Join(keys, ",")))
}

// keyRules are the rules of the key source tests.
var keyRules = []Rule{
	{Method: http.MethodPost, Path: "/api/order/:uid", Key: "order:{uid}"},
	{Method: http.MethodPost, Path: "/api/any", Key: "any:{uid}"},
	{Method: http.MethodPost, Path: "/api/explicit/:sku", Key: "sku:{path.sku}:{query.w}:{header.X-Tenant}"},
	{Method: http.MethodPost, Path: "/api/form", Key: "f:{form.uid}"},
	{Method: http.MethodPost, Path: "/api/body", Key: "b:{body.order.uid}"},
	{Method: http.MethodPost, Path: "/api/jwt", Key: "j:{jwt.uid}"},
	{Method: http.MethodPost, Path: "/api/transfer", Key: "acct:{from}+acct:{to}"},
	{Method: http.MethodGet, Path: "/api/sku/:id", Key: "sku:{id}"},
}

func keyServer(t *testing.T, tr *testRedis, c LockConf, handler http.HandlerFunc) (*rest.Serverless, *Middleware) {
	t.Helper()
	c.Rules = keyRules
	m := newMiddleware(t, tr, c)
	var routes, jwtRoutes []rest.Route
	for _, r := range keyRules {
		route := rest.Route{Method: r.Method, Path: r.Path, Handler: handler}
		if r.Path == "/api/jwt" {
			jwtRoutes = append(jwtRoutes, route)
		} else {
			routes = append(routes, route)
		}
	}
	routes = append(routes, rest.Route{Method: http.MethodGet, Path: "/api/sku/list", Handler: handler})
	srv, err := rest.NewServer(restConf(t, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	srv.Use(m.Handle)
	srv.AddRoutes(routes)
	srv.AddRoutes(jwtRoutes, rest.WithJwt(jwtSecret))
	s, err := rest.NewServerless(srv)
	if err != nil {
		t.Fatal(err)
	}
	return s, m
}

func jwtToken(t *testing.T, claims jwt.MapClaims) string {
	t.Helper()
	claims["exp"] = time.Now().Add(time.Hour).Unix()
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(jwtSecret))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func multipartBody(t *testing.T, fields map[string]string) (string, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for k, v := range fields {
		if err := mw.WriteField(k, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return mw.FormDataContentType(), &buf
}

func TestRESTKeySources(t *testing.T) {
	tr := newTestRedis(t)
	s, _ := keyServer(t, tr, LockConf{}, echoKeys)
	mpType, mpBody := multipartBody(t, map[string]string{"uid": "m1"})

	tests := []struct {
		name    string
		method  string
		target  string
		ctype   string
		body    string
		header  map[string]string
		want    string // keys, comma separated; "" means no lock
		wantErr int    // expected status when not 200
	}{
		{name: "path variable", method: "POST", target: "/api/order/42", want: "lock:order:42"},
		{name: "escaped path variable", method: "POST", target: "/api/order/a%3Ab", want: "lock:order:a%3Ab"},
		{name: "query", method: "POST", target: "/api/any?uid=7", want: "lock:any:7"},
		{name: "form", method: "POST", target: "/api/any", ctype: "application/x-www-form-urlencoded", body: "uid=8&x=1", want: "lock:any:8"},
		{name: "json body", method: "POST", target: "/api/any", ctype: "application/json", body: `{"uid":"9"}`, want: "lock:any:9"},
		{name: "json number", method: "POST", target: "/api/any", ctype: "application/json", body: `{"uid":10}`, want: "lock:any:10"},
		// The query says "q" and httpx.Parse hands the handler the body's "b": refused, not guessed.
		{name: "query and body disagree", method: "POST", target: "/api/any?uid=q", ctype: "application/json", body: `{"uid":"b"}`, wantErr: http.StatusBadRequest},
		{name: "explicit sources", method: "POST", target: "/api/explicit/s1?w=north", header: map[string]string{"X-Tenant": "acme"}, want: "lock:sku:s1:north:acme"},
		{name: "explicit form", method: "POST", target: "/api/form", ctype: "application/x-www-form-urlencoded", body: "uid=u%2B1", want: "lock:f:u%2B1"},
		{name: "multipart form", method: "POST", target: "/api/form", ctype: mpType, body: mpBody.String(), want: "lock:f:m1"},
		{name: "nested body", method: "POST", target: "/api/body", ctype: "application/json", body: `{"order":{"uid":"n1"}}`, want: "lock:b:n1"},
		{name: "jwt claim", method: "POST", target: "/api/jwt", header: map[string]string{"Authorization": "Bearer " + jwtToken(t, jwt.MapClaims{"uid": 42})}, want: "lock:j:42"},
		{name: "two keys", method: "POST", target: "/api/transfer", ctype: "application/json", body: `{"from":"2","to":"1"}`, want: "lock:acct:1,lock:acct:2"},
		{name: "same account once", method: "POST", target: "/api/transfer", ctype: "application/json", body: `{"from":"1","to":"1"}`, want: "lock:acct:1"},
		{name: "param route", method: "GET", target: "/api/sku/9", want: "lock:sku:9"},
		{name: "static route beside a param route", method: "GET", target: "/api/sku/list", want: ""},
		{name: "missing path-less value", method: "POST", target: "/api/any", wantErr: http.StatusBadRequest},
		{name: "missing header", method: "POST", target: "/api/explicit/s1?w=north", wantErr: http.StatusBadRequest},
		{name: "missing second key", method: "POST", target: "/api/transfer", ctype: "application/json", body: `{"from":"1"}`, wantErr: http.StatusBadRequest},
		{name: "nested body number kept exact", method: "POST", target: "/api/body", ctype: "application/json", body: `{"items":[{"a":[1,2,{"b":null}]}],"order":{"note":{"x":1},"uid":12345678901234567890}}`, want: "lock:b:12345678901234567890"},
		{name: "body field not an object", method: "POST", target: "/api/body", ctype: "application/json", body: `{"order":"x"}`, wantErr: http.StatusBadRequest},
		{name: "body path through an array", method: "POST", target: "/api/body", ctype: "application/json", body: `{"order":[{"uid":"a"}]}`, wantErr: http.StatusBadRequest},
		{name: "body value null", method: "POST", target: "/api/body", ctype: "application/json", body: `{"order":{"uid":null}}`, wantErr: http.StatusBadRequest},
		{name: "body truncated", method: "POST", target: "/api/body", ctype: "application/json", body: `{"order":{"uid":"n1"}`, wantErr: http.StatusBadRequest},
		{name: "body not json", method: "POST", target: "/api/body", ctype: "application/json", body: `uid=1`, wantErr: http.StatusBadRequest},
		{name: "jwt claim missing", method: "POST", target: "/api/jwt", header: map[string]string{"Authorization": "Bearer " + jwtToken(t, jwt.MapClaims{"name": "x"})}, wantErr: http.StatusBadRequest},
		{name: "key too long", method: "POST", target: "/api/any?uid=" + strings.Repeat("x", flightlock.MaxKeyLen), wantErr: http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			request := func() *http.Request {
				r := httptest.NewRequest(tt.method, tt.target, strings.NewReader(tt.body))
				if tt.body == "" {
					r.Body = http.NoBody
				}
				if tt.ctype != "" {
					r.Header.Set("Content-Type", tt.ctype)
				}
				for k, v := range tt.header {
					r.Header.Set(k, v)
				}
				return r
			}
			before := tr.mr.CommandCount()
			w := serve(s, request())
			if tt.wantErr != 0 {
				if w.Code != tt.wantErr {
					t.Fatalf("status %d, want %d (%s)", w.Code, tt.wantErr, w.Body)
				}
				if n := againIfCostly(tr, tr.mr.CommandCount()-before, func() { serve(s, request()) }); n != 0 {
					t.Errorf("a bad request sent %d commands to Redis, twice in a row", n)
				}
				return
			}
			if w.Code != http.StatusOK || w.Body.String() != tt.want {
				t.Fatalf("got %d %q, want 200 %q", w.Code, w.Body, tt.want)
			}
			for _, k := range strings.Split(tt.want, ",") {
				if k != "" && tr.mr.Exists(k) {
					t.Errorf("%s still locked after the request", k)
				}
			}
		})
	}
}

// TestRESTBodyRestored checks that the handler's httpx.Parse reads the body and form that the
// key template read.
func TestRESTBodyRestored(t *testing.T) {
	type request struct {
		UID  string `json:"uid,optional" form:"uid,optional"`
		Note string `json:"note,optional" form:"note,optional"`
	}
	var got atomic.Value
	parse := func(w http.ResponseWriter, r *http.Request) {
		var req request
		if err := httpx.Parse(r, &req); err != nil {
			httpx.ErrorCtx(r.Context(), w, err)
			return
		}
		got.Store(req)
		echoKeys(w, r)
	}
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{
		{Method: http.MethodPost, Path: "/json", Key: "u:{body.uid}"},
		{Method: http.MethodPost, Path: "/form", Key: "u:{form.uid}"},
	}})
	s := serverless(t, restConf(t, 3*time.Second), m, []rest.Route{
		{Method: http.MethodPost, Path: "/json", Handler: parse},
		{Method: http.MethodPost, Path: "/form", Handler: parse},
	})
	tests := []struct{ path, ctype, body string }{
		{"/json", "application/json", `{"uid":"u1","note":"hello"}`},
		{"/form", "application/x-www-form-urlencoded", "uid=u1&note=hello"},
	}
	for _, tt := range tests {
		r := httptest.NewRequest(http.MethodPost, tt.path, strings.NewReader(tt.body))
		r.Header.Set("Content-Type", tt.ctype)
		w := serve(s, r)
		if w.Code != http.StatusOK || w.Body.String() != "lock:u:u1" {
			t.Fatalf("%s: %d %q", tt.path, w.Code, w.Body)
		}
		if req := got.Load().(request); req.UID != "u1" || req.Note != "hello" {
			t.Errorf("%s: handler parsed %+v, want the whole body", tt.path, req)
		}
	}
}

func TestRESTBodyTooLarge(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{{Method: http.MethodPost, Path: "/b", Key: "b:{body.uid}"}}})
	c := restConf(t, 3*time.Second)
	c.MaxBytes = 8 << 20 // let the body through go-zero's own bound
	var ran atomic.Bool
	s := serverless(t, c, m, []rest.Route{{Method: http.MethodPost, Path: "/b", Handler: func(w http.ResponseWriter, r *http.Request) { ran.Store(true) }}})
	body := `{"uid":"1","pad":"` + strings.Repeat("x", rules.MaxBodyBytes) + `"}`
	request := func() *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/b", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		return r
	}
	before := tr.mr.CommandCount()
	if w := serve(s, request()); w.Code != http.StatusBadRequest {
		t.Fatalf("status %d, want 400", w.Code)
	}
	if n := againIfCostly(tr, tr.mr.CommandCount()-before, func() { serve(s, request()) }); ran.Load() || n != 0 {
		t.Errorf("handler ran %v, Redis commands %d (twice in a row)", ran.Load(), n)
	}
}

func TestRESTBusy(t *testing.T) {
	tr := newTestRedis(t)
	var ran atomic.Int32
	s, _ := keyServer(t, tr, LockConf{}, func(w http.ResponseWriter, r *http.Request) { ran.Add(1) })

	holder := holdKey(t, tr, "order:7")
	w := serve(s, httptest.NewRequest(http.MethodPost, "/api/order/7", http.NoBody))
	if w.Code != http.StatusConflict {
		t.Fatalf("status %d, want 409", w.Code)
	}
	secs, err := strconv.Atoi(w.Header().Get("Retry-After"))
	if err != nil || secs < 1 || secs > 5 {
		t.Errorf("Retry-After %q, want 1..5 seconds (TTL 5s)", w.Header().Get("Retry-After"))
	}

	// Owner tokens are never taken from HTTP headers, even in the metadata format.
	r := httptest.NewRequest(http.MethodPost, "/api/order/7", http.NoBody)
	r.Header.Set(ownerMetadataKey, base64.StdEncoding.EncodeToString([]byte((&ownerPolicy{}).encode(holder.Key(), holder.Owner(), holder.Fence()))))
	if w := serve(s, r); w.Code != http.StatusConflict {
		t.Errorf("with the holder's owner in a header: status %d, want 409", w.Code)
	}

	// A two-key lock is all or nothing: acct:1 is not left held when acct:2 is busy.
	holdKey(t, tr, "acct:2")
	r = httptest.NewRequest(http.MethodPost, "/api/transfer", strings.NewReader(`{"from":"1","to":"2"}`))
	r.Header.Set("Content-Type", "application/json")
	if w := serve(s, r); w.Code != http.StatusConflict {
		t.Errorf("transfer to a busy account: status %d, want 409", w.Code)
	}
	if !tr.isFree("acct:1") {
		t.Error("acct:1 left locked by a failed two-key lock")
	}
	if ran.Load() != 0 {
		t.Errorf("handler ran %d times under contention", ran.Load())
	}
}

// TestRESTErrorHandler checks that a service's own error handler shapes the replies.
func TestRESTErrorHandler(t *testing.T) {
	httpx.SetErrorHandlerCtx(func(ctx context.Context, err error) (int, any) {
		switch {
		case errors.Is(err, flightlock.ErrBusy):
			return http.StatusTooManyRequests, map[string]string{"code": "busy"}
		case errors.Is(err, flightlock.ErrInvalidKey):
			return http.StatusUnprocessableEntity, map[string]string{"code": "bad key"}
		}
		return http.StatusInternalServerError, nil
	})
	t.Cleanup(func() { httpx.SetErrorHandlerCtx(nil) })

	tr := newTestRedis(t)
	s, _ := keyServer(t, tr, LockConf{}, echoKeys)
	holdKey(t, tr, "order:1")
	tests := []struct {
		target string
		code   int
		body   string
	}{
		{"/api/order/1", http.StatusTooManyRequests, "busy"},
		{"/api/any", http.StatusUnprocessableEntity, "bad key"},
	}
	for _, tt := range tests {
		w := serve(s, httptest.NewRequest(http.MethodPost, tt.target, http.NoBody))
		var body map[string]string
		if w.Code != tt.code || json.Unmarshal(w.Body.Bytes(), &body) != nil || body["code"] != tt.body {
			t.Errorf("%s: %d %q, want %d with code %q", tt.target, w.Code, w.Body, tt.code, tt.body)
		}
	}
}

func TestRESTStoreDown(t *testing.T) {
	for _, mode := range []string{"closed", "open"} {
		t.Run(mode, func(t *testing.T) {
			tr := newTestRedis(t)
			var ran atomic.Bool
			var sref *rest.Serverless
			var degraded atomic.Bool
			s, _ := keyServer(t, tr, LockConf{OnStoreError: mode}, func(w http.ResponseWriter, r *http.Request) {
				ran.Store(true)
				lease := flightlock.FromContext(r.Context())
				degraded.Store(lease != nil && lease.Degraded())
				// While it runs, a second request of this process for the key is refused.
				if w2 := serve(sref, httptest.NewRequest(http.MethodPost, "/api/order/5", http.NoBody)); w2.Code != http.StatusConflict {
					t.Errorf("duplicate in the same process during the outage: %d, want 409", w2.Code)
				}
			})
			sref = s
			const rule = "POST /api/order/:uid" // the rule's name in logs and metrics
			before := failOpenCount(t, rule)
			tr.mr.Close()
			w := serve(s, httptest.NewRequest(http.MethodPost, "/api/order/5", http.NoBody))
			switch mode {
			case "closed":
				if w.Code != http.StatusServiceUnavailable || ran.Load() {
					t.Fatalf("status %d, handler ran %v; want 503 without the handler", w.Code, ran.Load())
				}
			case "open":
				if counted := failOpenCount(t, rule) - before; w.Code != http.StatusOK || !ran.Load() || !degraded.Load() || counted != 1 {
					t.Fatalf("status %d, ran %v, degraded lease %v, counted %v; want 200, run under the local gate only, counted once",
						w.Code, ran.Load(), degraded.Load(), counted)
				}
			}
			// A bad key is still a 400, whatever the store does.
			if w := serve(s, httptest.NewRequest(http.MethodPost, "/api/any", http.NoBody)); w.Code != http.StatusBadRequest {
				t.Errorf("bad key with the store down: %d, want 400", w.Code)
			}
		})
	}
}

// TestRESTTimeout: go-zero's timeout handler answers 503 and cancels the request context
// while the handler still runs; the lock stays held until the handler returns, then goes.
func TestRESTTimeout(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{{Method: http.MethodPost, Path: "/slow/:uid", Key: "slow:{uid}", OnBusy: "reject"}}})
	proceed := make(chan struct{})
	done := make(chan error, 1)
	// The timeout counts from the request's start, the lock's acquisition included: long
	// enough for that on a loaded machine, short enough to wait out twice.
	s := serverless(t, restConf(t, time.Second), m, []rest.Route{{Method: http.MethodPost, Path: "/slow/:uid",
		Handler: func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done() // the timeout fired
			<-proceed
			lease := flightlock.FromContext(r.Context())
			if lease == nil {
				done <- errors.New("no lease in the handler's context")
				return
			}
			done <- nil
		}}})

	if w := serve(s, httptest.NewRequest(http.MethodPost, "/slow/1", http.NoBody)); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want go-zero's 503 timeout", w.Code)
	}
	if tr.isFree("slow:1") {
		t.Fatal("lock released while the handler still runs")
	}
	// Another request for the key is turned away meanwhile.
	if w := serve(s, httptest.NewRequest(http.MethodPost, "/slow/1", http.NoBody)); w.Code != http.StatusConflict {
		t.Fatalf("second request: %d, want 409", w.Code)
	}
	close(proceed)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitFree(t, tr, "slow:1")
}

func TestRESTPanic(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{{Method: http.MethodPost, Path: "/boom/:uid", Key: "boom:{uid}"}}})
	s := serverless(t, restConf(t, 3*time.Second), m, []rest.Route{{Method: http.MethodPost, Path: "/boom/:uid",
		Handler: func(w http.ResponseWriter, r *http.Request) { panic("boom") }}})
	if w := serve(s, httptest.NewRequest(http.MethodPost, "/boom/1", http.NoBody)); w.Code != http.StatusInternalServerError {
		t.Fatalf("status %d, want go-zero's recovered 500", w.Code)
	}
	if !tr.isFree("boom:1") {
		t.Fatal("lock left held after a panic")
	}
}

// TestRESTRouteGroup uses Route and RouteFunc with rest.WithMiddlewares, as goctl does.
func TestRESTRouteGroup(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{})
	byTemplate, err := m.Route(Rule{Path: "/group/:uid", Key: "g:{path.uid}"})
	if err != nil {
		t.Fatal(err)
	}
	byFunc, err := m.RouteFunc(Rule{OnBusy: "reject"}, func(r *http.Request) (string, error) {
		id := r.Header.Get("X-Id")
		if id == "" {
			return "", errors.New("no X-Id")
		}
		return "fn:" + id, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []Rule{{Key: "g:{foo.x}"}, {Key: ""}, {Key: "g:{x}", OnBusy: "later"}, {Path: "/g/:a", Key: "g:{path.b}"}} {
		if _, err := m.Route(bad); err == nil {
			t.Errorf("Route(%+v) accepted", bad)
		}
	}
	for _, noKey := range []Rule{{}, {Method: http.MethodPost, Path: "/group/:uid", OnBusy: "reject"}} {
		if _, err := m.Route(noKey); err == nil || err.Error() != "Rule.Key: is empty" {
			t.Errorf("Route(%+v): %v, want Rule.Key: is empty", noKey, err)
		}
	}
	s := serverless(t, restConf(t, 3*time.Second), nil, rest.WithMiddlewares([]rest.Middleware{byTemplate}, rest.Route{
		Method: http.MethodPost, Path: "/group/:uid", Handler: echoKeys,
	}))
	if w := serve(s, httptest.NewRequest(http.MethodPost, "/group/3", http.NoBody)); w.Body.String() != "lock:g:3" {
		t.Errorf("Route: %d %q", w.Code, w.Body)
	}
	s = serverless(t, restConf(t, 3*time.Second), nil, rest.WithMiddlewares([]rest.Middleware{byFunc}, rest.Route{
		Method: http.MethodPost, Path: "/fn", Handler: echoKeys,
	}))
	r := httptest.NewRequest(http.MethodPost, "/fn", http.NoBody)
	r.Header.Set("X-Id", "a")
	if w := serve(s, r); w.Body.String() != "lock:fn:a" {
		t.Errorf("RouteFunc: %d %q", w.Code, w.Body)
	}
	if w := serve(s, httptest.NewRequest(http.MethodPost, "/fn", http.NoBody)); w.Code != http.StatusBadRequest {
		t.Errorf("RouteFunc without a key: %d, want 400", w.Code)
	}
}

func TestRESTWithHTTPRule(t *testing.T) {
	tr := newTestRedis(t)
	m, err := New(LockConf{}, WithLocker(tr.locker(t)), WithHTTPRule(Rule{Method: http.MethodPut, Path: "/user/:id"},
		func(r *http.Request) (string, error) { return "user:" + r.Header.Get("X-Id"), nil }))
	if err != nil {
		t.Fatal(err)
	}
	s := serverless(t, restConf(t, 3*time.Second), m, []rest.Route{{Method: http.MethodPut, Path: "/user/:id", Handler: echoKeys}})
	r := httptest.NewRequest(http.MethodPut, "/user/1", http.NoBody)
	r.Header.Set("X-Id", "z")
	if w := serve(s, r); w.Body.String() != "lock:user:z" {
		t.Errorf("%d %q", w.Code, w.Body)
	}
	if _, err := New(LockConf{}, WithHTTPRule(Rule{Path: "/user/:id", OnBusy: "later"}, nil)); err == nil || !strings.HasPrefix(err.Error(), "WithHTTPRule") {
		t.Errorf("bad Go rule: %v", err)
	}
}

// A rule built in Go keeps every field of its Rule but the key, which its function computes:
// one with Permits is a semaphore, one with OnBusy share keeps its defaults (Replay), and a
// Key or an RPC method beside the function is refused, since neither could be honoured.
func TestGoRulesKeepEveryFieldButTheKey(t *testing.T) {
	key := func(*http.Request) (string, error) { return "export", nil }
	rpcKey := func(context.Context, any) (string, error) { return "export", nil }
	tr := newTestRedis(t)
	m, err := New(LockConf{}, WithLocker(tr.locker(t)), WithHTTPRule(Rule{Method: http.MethodPost, Path: "/export", Permits: 2}, key))
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}, 3), make(chan struct{})
	s := serverless(t, restConf(t, 10*time.Second), m, []rest.Route{{Method: http.MethodPost, Path: "/export",
		Handler: func(http.ResponseWriter, *http.Request) { entered <- struct{}{}; <-release }}})
	codes := make(chan int, 3)
	send := func() {
		go func() { codes <- serve(s, httptest.NewRequest(http.MethodPost, "/export", http.NoBody)).Code }()
	}
	for i := range 2 {
		send()
		select {
		case <-entered:
		case code := <-codes:
			t.Fatalf("request %d of a rule with Permits: 2 answered %d while %d held a permit; want both in", i+1, code, i)
		}
	}
	send()
	if code := <-codes; code != http.StatusConflict {
		t.Errorf("a third request with both permits held: %d, want 409", code)
	}
	close(release)
	for range 2 {
		if code := <-codes; code != http.StatusOK {
			t.Errorf("a permit holder: %d, want 200", code)
		}
	}

	for _, tt := range []struct {
		name  string
		opt   Option
		field string // the field the error must name; "" for none
	}{
		{"share", WithHTTPRule(Rule{Method: http.MethodPost, Path: "/pay", OnBusy: "share"}, key), ""},
		{"rpc share", WithRPCRule(Rule{RPC: fullMethod("Host"), OnBusy: "share"}, rpcKey), ""},
		{"key beside a function", WithHTTPRule(Rule{Method: http.MethodPost, Path: "/pay", Key: "pay:{body.id}"}, key), "WithHTTPRule(POST /pay).Key"},
		{"rpc key beside a function", WithRPCRule(Rule{RPC: fullMethod("Host"), Key: "host:{req.host}"}, rpcKey), "WithRPCRule(" + fullMethod("Host") + ").Key"},
		{"an RPC on a REST rule", WithHTTPRule(Rule{Method: http.MethodPost, Path: "/pay", RPC: fullMethod("Host")}, key), "WithHTTPRule(POST /pay).RPC"},
		{"a Path on an RPC rule", WithRPCRule(Rule{RPC: fullMethod("Host"), Path: "/pay"}, rpcKey), "WithRPCRule(" + fullMethod("Host") + ").Path"},
		// A Name would make it a Named middleware's rule, which Handle and the interceptors skip.
		{"a Name on a REST rule", WithHTTPRule(Rule{Name: "PayLock", Method: http.MethodPost, Path: "/pay"}, key), "WithHTTPRule(POST /pay).Name"},
		{"a Name on an RPC rule", WithRPCRule(Rule{Name: "HostLock", RPC: fullMethod("Host")}, rpcKey), "WithRPCRule(" + fullMethod("Host") + ").Name"},
		{"a REST rule naming nothing", WithHTTPRule(Rule{}, key), "WithHTTPRule()"},
	} {
		_, err := New(LockConf{}, WithLocker(tr.locker(t)), tt.opt)
		if tt.field == "" && err != nil {
			t.Errorf("%s: %v, want the rule taken with its defaults", tt.name, err)
		}
		if tt.field != "" && (err == nil || !strings.HasPrefix(err.Error(), tt.field+":")) {
			t.Errorf("%s: %v, want an error naming %s", tt.name, err, tt.field)
		}
	}
	if _, err := m.RouteFunc(Rule{Key: "pay:{body.id}"}, key); err == nil || !strings.HasPrefix(err.Error(), "Rule.Key:") {
		t.Errorf("RouteFunc with a Key beside its function: %v, want an error naming Rule.Key", err)
	}
}

// TestRESTMutualExclusion sends concurrent requests for one key to a wait rule: they all
// succeed, one at a time.
func TestRESTMutualExclusion(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{{Method: http.MethodPost, Path: "/x/:id", Key: "x:{id}", OnBusy: "wait", Wait: 5 * time.Second}}})
	var active, maxActive atomic.Int32
	s := serverless(t, restConf(t, 10*time.Second), m, []rest.Route{{Method: http.MethodPost, Path: "/x/:id",
		Handler: func(w http.ResponseWriter, r *http.Request) {
			n := active.Add(1)
			for {
				cur := maxActive.Load()
				if n <= cur || maxActive.CompareAndSwap(cur, n) {
					break
				}
			}
			time.Sleep(time.Millisecond)
			active.Add(-1)
		}}})
	const n = 20
	start := make(chan struct{})
	codes := make(chan int, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			codes <- serve(s, httptest.NewRequest(http.MethodPost, "/x/1", http.NoBody)).Code
		}()
	}
	close(start)
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusOK {
			t.Errorf("status %d, want 200 for every waiter", c)
		}
	}
	if maxActive.Load() != 1 {
		t.Errorf("%d handlers ran at once, want 1", maxActive.Load())
	}
}

// TestRESTRealServer runs one request through a real go-zero server on a free loopback port.
func TestRESTRealServer(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{{Method: http.MethodPost, Path: "/order/:uid", Key: "order:{uid}"}}})
	s := serverless(t, restConf(t, 3*time.Second), m, []rest.Route{{Method: http.MethodPost, Path: "/order/:uid", Handler: echoKeys}})
	ts := httptest.NewServer(http.HandlerFunc(s.Serve))
	defer ts.Close()
	resp, err := http.Post(ts.URL+"/order/77", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	if resp.StatusCode != http.StatusOK || buf.String() != "lock:order:77" {
		t.Fatalf("%d %q", resp.StatusCode, buf.String())
	}
}

// A rule's OnStoreError overrides the Lock section's: with the store down, the stock rule
// fails closed (503, the handler never runs) while the like counter on the same service fails
// open (the handler runs under this process's lock).
func TestRuleOnStoreErrorOverridesTheSections(t *testing.T) {
	tr := newTestRedis(t)
	var stockRan, likeRan atomic.Bool
	m := newMiddleware(t, tr, LockConf{OnStoreError: "open", Rules: []Rule{
		{Method: http.MethodPost, Path: "/stock/:sku", Key: "stock:{sku}", OnStoreError: "Closed"},
		{Method: http.MethodPost, Path: "/like/:post", Key: "like:{post}"},
	}})
	s := serverless(t, restConf(t, 3*time.Second), m, []rest.Route{
		{Method: http.MethodPost, Path: "/stock/:sku", Handler: func(http.ResponseWriter, *http.Request) { stockRan.Store(true) }},
		{Method: http.MethodPost, Path: "/like/:post", Handler: func(http.ResponseWriter, *http.Request) { likeRan.Store(true) }},
	})
	tr.mr.Close()
	if w := serve(s, httptest.NewRequest(http.MethodPost, "/stock/s1", http.NoBody)); w.Code != http.StatusServiceUnavailable || stockRan.Load() {
		t.Errorf("stock rule (OnStoreError: closed) with the store down: %d, handler ran %v; want 503 without the handler", w.Code, stockRan.Load())
	}
	if w := serve(s, httptest.NewRequest(http.MethodPost, "/like/p1", http.NoBody)); w.Code != http.StatusOK || !likeRan.Load() {
		t.Errorf("like rule (the section's OnStoreError: open) with the store down: %d, handler ran %v; want 200", w.Code, likeRan.Load())
	}
	if _, err := New(LockConf{Rules: []Rule{{Method: http.MethodPost, Path: "/x", Key: "x", OnStoreError: "ajar"}}}); err == nil ||
		!strings.Contains(err.Error(), "Lock.Rules[0].OnStoreError") {
		t.Errorf("a rule's OnStoreError \"ajar\": %v, want an error naming Lock.Rules[0].OnStoreError", err)
	}
}

// A transfer from an account to itself locks that account once: the handler runs (no
// deadlock on its own key), a withdrawal from the account waits behind it, and once it returns
// the account is free, with no hold left over from the second mention.
func TestTransferToTheSameAccountIsOneLock(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{
		{Method: http.MethodPost, Path: "/transfer", Key: "acct:{body.from}+acct:{body.to}"},
		{Method: http.MethodPost, Path: "/withdraw", Key: "acct:{body.account}", OnBusy: "reject"},
	}})
	inside, proceed := make(chan []string, 1), make(chan struct{})
	var sref *rest.Serverless
	s := serverless(t, restConf(t, 5*time.Second), m, []rest.Route{
		{Method: http.MethodPost, Path: "/transfer", Handler: func(w http.ResponseWriter, r *http.Request) {
			var keys []string
			for _, l := range flightlock.AllFromContext(r.Context()) {
				keys = append(keys, l.Key())
			}
			inside <- keys
			<-proceed
		}},
		{Method: http.MethodPost, Path: "/withdraw", Handler: func(http.ResponseWriter, *http.Request) {}},
	})
	sref = s
	done := make(chan int, 1)
	go func() {
		r := httptest.NewRequest(http.MethodPost, "/transfer", strings.NewReader(`{"from":"A","to":"A"}`))
		r.Header.Set("Content-Type", "application/json")
		done <- serve(sref, r).Code
	}()
	if keys := <-inside; !slices.Equal(keys, []string{"lock:acct:A"}) {
		t.Errorf("A->A holds %v, want [lock:acct:A] once", keys)
	}
	withdraw := func() int {
		r := httptest.NewRequest(http.MethodPost, "/withdraw", strings.NewReader(`{"account":"A"}`))
		r.Header.Set("Content-Type", "application/json")
		return serve(s, r).Code
	}
	if code := withdraw(); code != http.StatusConflict {
		t.Errorf("withdrawal from A during A->A: %d, want 409", code)
	}
	close(proceed)
	if code := <-done; code != http.StatusOK {
		t.Fatalf("A->A: %d, want 200", code)
	}
	if code := withdraw(); code != http.StatusOK {
		t.Errorf("withdrawal from A after A->A: %d, want 200 (the account free again)", code)
	}
}

// A rule with Permits: 2 lets two requests for one key run at once and answers a third 409
// while they do; other keys are not counted against it.
func TestPermitsRuleLetsThatManyRequestsIn(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{
		{Method: http.MethodPost, Path: "/export/:tenant", Key: "export:{path.tenant}", OnBusy: "reject", Permits: 2},
	}})
	inside, proceed := make(chan string, 3), make(chan struct{})
	s := serverless(t, restConf(t, 5*time.Second), m, []rest.Route{
		{Method: http.MethodPost, Path: "/export/:tenant", Handler: func(w http.ResponseWriter, r *http.Request) {
			inside <- flightlock.FromContext(r.Context()).Key()
			<-proceed
		}},
	})
	post := func(tenant string) int {
		return serve(s, httptest.NewRequest(http.MethodPost, "/export/"+tenant, http.NoBody)).Code
	}
	codes := make(chan int, 2)
	for range 2 {
		go func() { codes <- post("acme") }()
	}
	held := map[string]bool{<-inside: true, <-inside: true}
	if !held["lock:export:acme"] || !held[flightlock.PermitKey("lock:", "export:acme", 2)] {
		t.Errorf("two requests of one tenant hold %v, want its two permits", held)
	}
	if code := post("acme"); code != http.StatusConflict {
		t.Errorf("a third export of the tenant while two run: %d, want 409", code)
	}
	go func() { codes <- post("other") }()
	if key := <-inside; key != "lock:export:other" && key != flightlock.PermitKey("lock:", "export:other", 2) {
		t.Errorf("another tenant's export holds %q, want one of its own permits", key)
	}
	close(proceed)
	for range 3 {
		if code := <-codes; code != http.StatusOK {
			t.Errorf("an export that got a permit: %d, want 200", code)
		}
	}
	if _, err := New(LockConf{Rules: []Rule{{Method: http.MethodPost, Path: "/x", Key: "x", Permits: 2, OnBusy: "share"}}}); err == nil ||
		!strings.Contains(err.Error(), "Lock.Rules[0].Permits") {
		t.Errorf("Permits with OnBusy share: %v, want an error naming Lock.Rules[0].Permits", err)
	}
}
