package middleware

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/middleware/rules"
	"github.com/zeromicro/go-zero/rest"
	"github.com/zeromicro/go-zero/rest/httpx"
	"github.com/zeromicro/go-zero/rest/pathvar"
)

// These tests hold the key to the value that go-zero's httpx.Parse hands the handler: a bare
// {name} that two sources supply with different values never locks one value while the handler
// reads another.

// keyReq is one request of the key tests.
type keyReq struct {
	method  string // POST when empty
	target  string
	ctype   string
	body    string
	header  http.Header
	chunked bool // sent with Transfer-Encoding: chunked, so ContentLength is -1
	noLen   bool // a body with ContentLength 0, as when the length is not known
}

func (k keyReq) request() *http.Request {
	method := k.method
	if method == "" {
		method = http.MethodPost
	}
	var body io.Reader = http.NoBody
	if k.body != "" {
		body = strings.NewReader(k.body)
		if k.chunked {
			body = io.MultiReader(body) // httptest sets ContentLength -1 for an unknown reader
		}
	}
	r := httptest.NewRequest(method, k.target, body)
	if k.chunked {
		r.TransferEncoding = []string{"chunked"}
		r.ContentLength = -1
	}
	if k.noLen {
		r.ContentLength = 0
	}
	if k.ctype != "" {
		r.Header.Set("Content-Type", k.ctype)
	}
	for name, vs := range k.header {
		for _, v := range vs {
			r.Header.Add(name, v)
		}
	}
	return r
}

// keyTestRules are the rules of the key tests: bare names, and every explicit source.
var keyTestRules = []Rule{
	{Method: http.MethodPost, Path: "/api/order/create", Key: "order:{uid}"},
	{Method: http.MethodPost, Path: "/api/user/:uid/order", Key: "order:{uid}"},
	{Method: http.MethodGet, Path: "/api/order/get", Key: "order:{uid}"},
	{Method: http.MethodPost, Path: "/api/order/body", Key: "order:{body.uid}"},
	{Method: http.MethodPost, Path: "/api/order/query", Key: "order:{query.uid}"},
	{Method: http.MethodPost, Path: "/api/order/form", Key: "order:{form.uid}"},
	{Method: http.MethodGet, Path: "/api/order/form", Key: "order:{form.uid}"},
	{Method: http.MethodPost, Path: "/api/order/header", Key: "order:{header.X-Uid}"},
	{Method: http.MethodPost, Path: "/api/order/path/:uid", Key: "order:{path.uid}"},
}

// keyTestServer serves keyTestRules through go-zero's whole chain, every route with handler.
func keyTestServer(t *testing.T, tr *testRedis, handler func(route string) http.HandlerFunc) *rest.Serverless {
	t.Helper()
	m := newMiddleware(t, tr, LockConf{Rules: keyTestRules})
	routes := make([]rest.Route, 0, len(keyTestRules))
	for _, r := range keyTestRules {
		routes = append(routes, rest.Route{Method: r.Method, Path: r.Path, Handler: handler(r.Path)})
	}
	return serverless(t, restConf(t, 3*time.Second), m, routes)
}

// sendKeyReq serves k and returns the status and the keys the handler's context held, or the
// status alone when the middleware refused the request. A refusal must cost no Redis command
// (againIfCostly).
func sendKeyReq(t *testing.T, tr *testRedis, s *rest.Serverless, k keyReq) (int, string) {
	t.Helper()
	before := tr.mr.CommandCount()
	w := serve(s, k.request())
	if w.Code == http.StatusBadRequest {
		if n := againIfCostly(tr, tr.mr.CommandCount()-before, func() { serve(s, k.request()) }); n != 0 {
			t.Errorf("%s: a refused request sent %d commands to Redis, twice in a row", k.target, n)
		}
		return w.Code, ""
	}
	return w.Code, w.Body.String()
}

// TestRESTKeyQueryCannotOverrideBody is the reported attack: the query names another user than
// the JSON body, which is what httpx.Parse hands the handler. A bare name refuses the request;
// an explicit {body.uid} locks the body's user whatever the query says.
func TestRESTKeyQueryCannotOverrideBody(t *testing.T) {
	tr := newTestRedis(t)
	s := keyTestServer(t, tr, func(string) http.HandlerFunc { return echoKeys })
	for _, dup := range []string{"dup-1", "dup-2"} {
		bare := keyReq{target: "/api/order/create?uid=" + dup, ctype: "application/json", body: `{"uid":"alice"}`}
		if code, keys := sendKeyReq(t, tr, s, bare); code != http.StatusBadRequest {
			t.Errorf("bare {uid}, query %s, body alice: %d %q, want 400", dup, code, keys)
		}
		explicit := keyReq{target: "/api/order/body?uid=" + dup, ctype: "application/json", body: `{"uid":"alice"}`}
		if code, keys := sendKeyReq(t, tr, s, explicit); code != http.StatusOK || keys != "lock:order:alice" {
			t.Errorf("{body.uid}, query %s, body alice: %d %q, want 200 lock:order:alice", dup, code, keys)
		}
	}

	// While alice's order runs, no query value lets a second one in.
	holdKey(t, tr, "order:alice")
	for _, dup := range []string{"dup-1", "dup-2"} {
		for _, target := range []string{"/api/order/create?uid=", "/api/order/body?uid="} {
			k := keyReq{target: target + dup, ctype: "application/json", body: `{"uid":"alice"}`}
			if code, _ := sendKeyReq(t, tr, s, k); code == http.StatusOK {
				t.Errorf("%s: ran while alice's order is held", k.target)
			}
		}
	}
}

// TestRESTKeyIgnoresBodyGoZeroIgnores checks that the key reads no body that httpx.Parse does
// not read: a JSON body is parsed only when ContentLength > 0 and the Content-Type contains
// application/json (withJsonBody), and an urlencoded body only on POST, PUT and PATCH
// (net/http's ParseForm).
func TestRESTKeyIgnoresBodyGoZeroIgnores(t *testing.T) {
	tr := newTestRedis(t)
	s := keyTestServer(t, tr, func(string) http.HandlerFunc { return echoKeys })
	const alice = `{"uid":"alice"}`
	tests := []struct {
		name string
		req  keyReq
		want string // "" means refused with 400
	}{
		{"body: json as text/plain", keyReq{target: "/api/order/body", ctype: "text/plain", body: alice}, ""},
		{"body: json without content type", keyReq{target: "/api/order/body", body: alice}, ""},
		{"body: json as vnd+json", keyReq{target: "/api/order/body", ctype: "application/vnd.api+json", body: alice}, ""},
		{"body: chunked json", keyReq{target: "/api/order/body", ctype: "application/json", body: alice, chunked: true}, ""},
		{"body: json of unknown length", keyReq{target: "/api/order/body", ctype: "application/json", body: alice, noLen: true}, ""},
		{"body: json with charset", keyReq{target: "/api/order/body", ctype: "application/json; charset=utf-8", body: alice}, "lock:order:alice"},
		{"body: trailing data after the json value", keyReq{target: "/api/order/body", ctype: "application/json", body: alice + ` {"uid":"bob"}`}, "lock:order:alice"},
		{"bare: json as text/plain", keyReq{target: "/api/order/create", ctype: "text/plain", body: alice}, ""},
		{"bare: chunked json", keyReq{target: "/api/order/create", ctype: "application/json", body: alice, chunked: true}, ""},
		{"bare: json of unknown length", keyReq{target: "/api/order/create", ctype: "application/json", body: alice, noLen: true}, ""},
		{"bare: query beside text/plain json", keyReq{target: "/api/order/create?uid=q", ctype: "text/plain", body: alice}, "lock:order:q"},
		{"bare: query beside chunked json", keyReq{target: "/api/order/create?uid=q", ctype: "application/json", body: alice, chunked: true}, "lock:order:q"},
		{"bare: form body of a GET", keyReq{method: http.MethodGet, target: "/api/order/get", ctype: "application/x-www-form-urlencoded", body: "uid=f"}, ""},
		{"form: form body of a GET", keyReq{method: http.MethodGet, target: "/api/order/form", ctype: "application/x-www-form-urlencoded", body: "uid=f"}, ""},
		{"form: chunked form body", keyReq{target: "/api/order/form", ctype: "application/x-www-form-urlencoded", body: "uid=f", chunked: true}, "lock:order:f"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, keys := sendKeyReq(t, tr, s, tt.req)
			if tt.want == "" {
				if code != http.StatusBadRequest {
					t.Fatalf("%d %q, want 400: httpx.Parse does not read this body", code, keys)
				}
				return
			}
			if code != http.StatusOK || keys != tt.want {
				t.Fatalf("%d %q, want 200 %q", code, keys, tt.want)
			}
		})
	}
}

// TestRESTKeyAmbiguousNameRefused checks that a name whose sources, or the several values of
// one source, disagree is refused with 400, and that sources which agree are accepted.
func TestRESTKeyAmbiguousNameRefused(t *testing.T) {
	tr := newTestRedis(t)
	s := keyTestServer(t, tr, func(string) http.HandlerFunc { return echoKeys })
	mpType, mpBody := multipartBody(t, map[string]string{"uid": "m"})
	const form = "application/x-www-form-urlencoded"
	tests := []struct {
		name string
		req  keyReq
		want string // "" means refused with 400
	}{
		{"query and json body differ", keyReq{target: "/api/order/create?uid=q", ctype: "application/json", body: `{"uid":"b"}`}, ""},
		{"query and json body agree", keyReq{target: "/api/order/create?uid=b", ctype: "application/json", body: `{"uid":"b"}`}, "lock:order:b"},
		{"query number and json number agree", keyReq{target: "/api/order/create?uid=7", ctype: "application/json", body: `{"uid":7}`}, "lock:order:7"},
		{"repeated query values", keyReq{target: "/api/order/create?uid=a&uid=b"}, ""},
		{"repeated equal query values", keyReq{target: "/api/order/create?uid=a&uid=a"}, "lock:order:a"},
		{"empty query value skipped as go-zero does", keyReq{target: "/api/order/create?uid=&uid=a"}, "lock:order:a"},
		{"bracket notation", keyReq{target: "/api/order/create?uid[]=a"}, "lock:order:a"},
		{"plain and bracket notation differ", keyReq{target: "/api/order/create?uid=a&uid[]=b"}, ""},
		{"form body and query differ", keyReq{target: "/api/order/create?uid=q", ctype: form, body: "uid=f"}, ""},
		{"form body and query agree", keyReq{target: "/api/order/create?uid=f", ctype: form, body: "uid=f"}, "lock:order:f"},
		{"repeated form body values", keyReq{target: "/api/order/create", ctype: form, body: "uid=f&uid=g"}, ""},
		{"multipart and query differ", keyReq{target: "/api/order/create?uid=q", ctype: mpType, body: mpBody.String()}, ""},
		{"path variable and json body differ", keyReq{target: "/api/user/u1/order", ctype: "application/json", body: `{"uid":"alice"}`}, ""},
		{"path variable and query differ", keyReq{target: "/api/user/u1/order?uid=q"}, ""},
		{"path variable and json body agree", keyReq{target: "/api/user/u1/order", ctype: "application/json", body: `{"uid":"u1"}`}, "lock:order:u1"},
		{"header and json body differ", keyReq{target: "/api/order/create", ctype: "application/json", body: `{"uid":"b"}`, header: http.Header{"Uid": {"h"}}}, ""},
		{"header alone", keyReq{target: "/api/order/create", header: http.Header{"Uid": {"h"}}}, "lock:order:h"},
		{"explicit query, form body differs", keyReq{target: "/api/order/query?uid=q", ctype: form, body: "uid=f"}, ""},
		{"explicit query, repeated values", keyReq{target: "/api/order/query?uid=q&uid=r"}, ""},
		{"explicit query beside a json body", keyReq{target: "/api/order/query?uid=q", ctype: "application/json", body: `{"uid":"b"}`}, "lock:order:q"},
		{"explicit query absent, form body present", keyReq{target: "/api/order/query", ctype: form, body: "uid=f"}, ""},
		{"explicit form, query differs", keyReq{target: "/api/order/form?uid=q", ctype: form, body: "uid=f"}, ""},
		{"explicit form, multipart and query differ", keyReq{target: "/api/order/form?uid=q", ctype: mpType, body: mpBody.String()}, ""},
		{"explicit form, query agrees", keyReq{target: "/api/order/form?uid=f", ctype: form, body: "uid=f"}, "lock:order:f"},
		{"explicit path beside a json body", keyReq{target: "/api/order/path/u1", ctype: "application/json", body: `{"uid":"alice"}`}, "lock:order:u1"},
		{"explicit header, repeated values", keyReq{target: "/api/order/header", header: http.Header{"X-Uid": {"a", "b"}}}, ""},
		{"explicit header, repeated equal values", keyReq{target: "/api/order/header", header: http.Header{"X-Uid": {"a", "a"}}}, "lock:order:a"},
		{"malformed query", keyReq{target: "/api/order/create?uid=a&x=%zz"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, keys := sendKeyReq(t, tr, s, tt.req)
			if tt.want == "" {
				if code != http.StatusBadRequest {
					t.Fatalf("%d %q, want 400", code, keys)
				}
				return
			}
			if code != http.StatusOK || keys != tt.want {
				t.Fatalf("%d %q, want 200 %q", code, keys, tt.want)
			}
		})
	}
}

// TestRESTKeyAmbiguousIsInvalidKey checks that an ambiguous name fails as an ErrInvalidKey.
func TestRESTKeyAmbiguousIsInvalidKey(t *testing.T) {
	rl, err := rules.CompileHTTP(rules.Spec{Rule: Rule{Key: "order:{uid}"}, Field: "Rule"})
	if err != nil {
		t.Fatal(err)
	}
	r := keyReq{target: "/api/order/create?uid=dup-1", ctype: "application/json", body: `{"uid":"alice"}`}.request()
	if _, err := rl.HTTPKeys(r); !errors.Is(err, flightlock.ErrInvalidKey) {
		t.Fatalf("err = %v, want ErrInvalidKey", err)
	}
	if b, _ := io.ReadAll(r.Body); string(b) != `{"uid":"alice"}` {
		t.Errorf("body left for the handler: %q", b)
	}
}

// TestRESTKeyMatchesHandlerParse sends tricky requests to handlers that bind the request with
// httpx.Parse, as goctl's handlers do, and checks the invariant: the handler runs only
// under the key built from the very value it bound; otherwise the middleware answers 400.
func TestRESTKeyMatchesHandlerParse(t *testing.T) {
	// One request type per route, with the tags that goctl writes for such a route.
	parseUID := map[string]func(r *http.Request) (string, error){
		"/api/order/create": func(r *http.Request) (string, error) {
			var req struct {
				UID string `form:"uid,optional" header:"uid,optional" json:"uid,optional"`
			}
			err := httpx.Parse(r, &req)
			return req.UID, err
		},
		"/api/user/:uid/order": func(r *http.Request) (string, error) {
			var req struct {
				UID string `path:"uid" form:"uid,optional" json:"uid,optional"`
			}
			err := httpx.Parse(r, &req)
			return req.UID, err
		},
		"/api/order/get": func(r *http.Request) (string, error) {
			var req struct {
				UID string `form:"uid,optional"`
			}
			err := httpx.Parse(r, &req)
			return req.UID, err
		},
		"/api/order/body": func(r *http.Request) (string, error) {
			var req struct {
				UID string `json:"uid"`
			}
			err := httpx.Parse(r, &req)
			return req.UID, err
		},
		"/api/order/form": func(r *http.Request) (string, error) {
			var req struct {
				UID string `form:"uid"`
			}
			err := httpx.Parse(r, &req)
			return req.UID, err
		},
	}
	type outcome struct {
		UID string `json:"uid"`
		Key string `json:"key"`
	}
	var ran atomic.Int32
	handler := func(route string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			ran.Add(1)
			parse := parseUID[route]
			if parse == nil {
				http.Error(w, "no parser for "+route, http.StatusInternalServerError)
				return
			}
			uid, err := parse(r)
			if err != nil {
				http.Error(w, err.Error(), http.StatusUnprocessableEntity)
				return
			}
			lease := flightlock.FromContext(r.Context())
			if lease == nil {
				http.Error(w, "no lease", http.StatusInternalServerError)
				return
			}
			httpx.OkJsonCtx(r.Context(), w, outcome{UID: uid, Key: lease.Key()})
		}
	}
	tr := newTestRedis(t)
	s := keyTestServer(t, tr, handler)
	mpType, mpBody := multipartBody(t, map[string]string{"uid": "m"})
	const (
		alice = `{"uid":"alice"}`
		form  = "application/x-www-form-urlencoded"
	)
	tests := []struct {
		name string
		req  keyReq
		want string // the uid the handler must get; "" means refused with 400
	}{
		{"query vs json body", keyReq{target: "/api/order/create?uid=dup-1", ctype: "application/json", body: alice}, ""},
		{"query vs json body, explicit body", keyReq{target: "/api/order/body?uid=dup-1", ctype: "application/json", body: alice}, "alice"},
		{"json body alone", keyReq{target: "/api/order/create", ctype: "application/json", body: alice}, "alice"},
		{"json body with charset", keyReq{target: "/api/order/create", ctype: "application/json; charset=utf-8", body: alice}, "alice"},
		{"query beside text/plain json", keyReq{target: "/api/order/create?uid=q", ctype: "text/plain", body: alice}, "q"},
		{"text/plain json alone", keyReq{target: "/api/order/create", ctype: "text/plain", body: alice}, ""},
		{"text/plain json, explicit body", keyReq{target: "/api/order/body", ctype: "text/plain", body: alice}, ""},
		{"chunked json", keyReq{target: "/api/order/create", ctype: "application/json", body: alice, chunked: true}, ""},
		{"query beside chunked json", keyReq{target: "/api/order/create?uid=q", ctype: "application/json", body: alice, chunked: true}, "q"},
		{"json of unknown length", keyReq{target: "/api/order/create", ctype: "application/json", body: alice, noLen: true}, ""},
		{"form body vs query", keyReq{target: "/api/order/create?uid=q", ctype: form, body: "uid=f"}, ""},
		{"form body vs query, explicit form", keyReq{target: "/api/order/form?uid=q", ctype: form, body: "uid=f"}, ""},
		{"form body alone", keyReq{target: "/api/order/create", ctype: form, body: "uid=f"}, "f"},
		{"multipart vs query", keyReq{target: "/api/order/create?uid=q", ctype: mpType, body: mpBody.String()}, ""},
		{"multipart alone, explicit form", keyReq{target: "/api/order/form", ctype: mpType, body: mpBody.String()}, "m"},
		{"repeated query values", keyReq{target: "/api/order/create?uid=a&uid=b"}, ""},
		{"empty then real query value", keyReq{target: "/api/order/create?uid=&uid=b"}, "b"},
		{"bracket notation", keyReq{target: "/api/order/create?uid[]=b"}, "b"},
		{"header vs json body", keyReq{target: "/api/order/create", ctype: "application/json", body: alice, header: http.Header{"Uid": {"h"}}}, ""},
		{"header vs query", keyReq{target: "/api/order/create?uid=q", header: http.Header{"Uid": {"h"}}}, ""},
		{"header alone", keyReq{target: "/api/order/create", header: http.Header{"Uid": {"h"}}}, "h"},
		{"path var vs json body", keyReq{target: "/api/user/u1/order", ctype: "application/json", body: alice}, ""},
		{"path var vs query", keyReq{target: "/api/user/u1/order?uid=q"}, ""},
		{"path var alone", keyReq{target: "/api/user/u1/order"}, "u1"},
		{"path var beside text/plain json", keyReq{target: "/api/user/u1/order", ctype: "text/plain", body: alice}, "u1"},
		{"form body of a GET", keyReq{method: http.MethodGet, target: "/api/order/get?uid=q", ctype: form, body: "uid=f"}, "q"},
		{"form body of a GET alone", keyReq{method: http.MethodGet, target: "/api/order/get", ctype: form, body: "uid=f"}, ""},
		{"trailing data after the json value", keyReq{target: "/api/order/body", ctype: "application/json", body: alice + `{"uid":"bob"}`}, "alice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := ran.Load()
			code, body := sendKeyReq(t, tr, s, tt.req)
			if code == http.StatusBadRequest {
				if ran.Load() != before {
					t.Fatal("the handler ran on a refused request")
				}
				if tt.want != "" {
					t.Fatalf("refused with 400, want the handler to get %q", tt.want)
				}
				return
			}
			if code != http.StatusOK {
				t.Fatalf("status %d (%s)", code, body)
			}
			var got outcome
			if err := json.Unmarshal([]byte(body), &got); err != nil {
				t.Fatalf("answer %q: %v", body, err)
			}
			if wantKey := flightlock.DefaultPrefix + "order:" + got.UID; got.Key != wantKey {
				t.Fatalf("the handler got uid %q under the lock %q, want %q", got.UID, got.Key, wantKey)
			}
			if got.UID != tt.want {
				t.Fatalf("the handler got uid %q, want %q", got.UID, tt.want)
			}
		})
	}
}

// Request types of the bool key tests, each binding one bool from one source.
type (
	boolQuery struct {
		First bool `form:"first"`
	}
	boolPath struct {
		First bool `path:"first"`
	}
	boolHeader struct {
		First bool `header:"X-First"`
	}
	boolJSONString struct {
		First bool `json:"first,string"`
	}
	boolFormOrJSON struct {
		First bool `form:"first,optional" json:"first,optional"`
	}
)

func (v *boolQuery) first() bool      { return v.First }
func (v *boolPath) first() bool       { return v.First }
func (v *boolHeader) first() bool     { return v.First }
func (v *boolJSONString) first() bool { return v.First }
func (v *boolFormOrJSON) first() bool { return v.First }

type floatQueryReq struct {
	Amount float64 `form:"amount"`
}

// bindsAlike checks that go-zero binds both requests of c to one value, so that the case
// proves what it says (formatted with %v: NaN is one value to the handler, never == itself).
func (c oneEntityCase) bindsAlike(t *testing.T) {
	t.Helper()
	v1, err1 := c.bind(c.first())
	v2, err2 := c.bind(c.second())
	if err1 != nil || err2 != nil || fmt.Sprint(v1) != fmt.Sprint(v2) {
		t.Fatalf("go-zero binds %v (%v) and %v (%v): not one entity", v1, err1, v2, err2)
	}
}

// go-zero binds "1" and "true" in any case (strings.EqualFold) to true, and "0" and "false" to
// false, from the path, the form and headers, and from a JSON string under a ",string" tag; a
// JSON true binds the same bool. Every spelling of one bool must render one key, or two
// requests on one entity both hold "their" lock.
func TestBoolSpellingsOfOneEntityShareAKey(t *testing.T) {
	post := func(target string) func() *http.Request {
		return func() *http.Request { return httptest.NewRequest(http.MethodPost, target, http.NoBody) }
	}
	// withPath carries the path variable as go-zero's router sets it, so that bindsAlike can
	// bind it outside the router too.
	withPath := func(v string) func() *http.Request {
		return func() *http.Request {
			r := httptest.NewRequest(http.MethodPost, "/api/coupon/"+v, http.NoBody)
			return pathvar.WithVars(r, map[string]string{"first": v})
		}
	}
	withHeader := func(v string) func() *http.Request {
		return func() *http.Request {
			r := httptest.NewRequest(http.MethodPost, "/api/hdr", http.NoBody)
			r.Header.Set("X-First", v)
			return r
		}
	}
	// bindWith binds into a new value of v's type for each request.
	bindWith := func(v interface{ first() bool }) func(r *http.Request) (any, error) {
		return func(r *http.Request) (any, error) {
			nv := reflect.New(reflect.TypeOf(v).Elem()).Interface().(interface{ first() bool })
			err := httpx.Parse(r, nv)
			return nv.first(), err
		}
	}
	queryRule := Rule{Method: http.MethodPost, Path: "/api/coupon", Key: "coupon:{query.first}", OnBusy: "reject"}
	pathRule := Rule{Method: http.MethodPost, Path: "/api/coupon/:first", Key: "coupon:{path.first}", OnBusy: "reject"}
	headerRule := Rule{Method: http.MethodPost, Path: "/api/hdr", Key: "coupon:{header.X-First}", OnBusy: "reject"}
	bodyRule := Rule{Method: http.MethodPost, Path: "/api/body", Key: "coupon:{body.first}", OnBusy: "reject"}
	anyRule := Rule{Method: http.MethodPost, Path: "/api/any", Key: "coupon:{first}", OnBusy: "reject"}
	for _, c := range []oneEntityCase{
		{"query true vs 1", queryRule, "/api/coupon", bindWith(new(boolQuery)), post("/api/coupon?first=true"), post("/api/coupon?first=1")},
		{"query TRUE vs True", queryRule, "/api/coupon", bindWith(new(boolQuery)), post("/api/coupon?first=TRUE"), post("/api/coupon?first=True")},
		{"query false vs 0", queryRule, "/api/coupon", bindWith(new(boolQuery)), post("/api/coupon?first=false"), post("/api/coupon?first=0")},
		{"path True vs 1", pathRule, "/api/coupon/:first", bindWith(new(boolPath)), withPath("True"), withPath("1")},
		{"header 1 vs true", headerRule, "/api/hdr", bindWith(new(boolHeader)), withHeader("1"), withHeader("true")},
		{"json string TRUE vs 1", bodyRule, "/api/body", bindWith(new(boolJSONString)),
			jsonReq("/api/body", `{"first":"TRUE"}`), jsonReq("/api/body", `{"first":"1"}`)},
		{"query 1 vs json true", anyRule, "/api/any", bindWith(new(boolFormOrJSON)),
			post("/api/any?first=1"), jsonReq("/api/any", `{"first":true}`)},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.bindsAlike(t)
			c.secondIsRefused(t)
		})
	}
}

// go-zero binds a float field with strconv.ParseFloat, which reads "Inf", "+inf", "infinity"
// in any case as +Inf (and "nan" in any case as NaN): one value, one key.
func TestInfinitySpellingsOfOneEntityShareAKey(t *testing.T) {
	post := func(target string) func() *http.Request {
		return func() *http.Request { return httptest.NewRequest(http.MethodPost, target, http.NoBody) }
	}
	bind := func(r *http.Request) (any, error) {
		var v floatQueryReq
		err := httpx.Parse(r, &v)
		return v.Amount, err
	}
	rule := Rule{Method: http.MethodPost, Path: "/api/amt", Key: "amt:{query.amount}", OnBusy: "reject"}
	for _, c := range []oneEntityCase{
		{"Inf vs +inf", rule, "/api/amt", bind, post("/api/amt?amount=Inf"), post("/api/amt?amount=%2Binf")},
		{"Inf vs Infinity", rule, "/api/amt", bind, post("/api/amt?amount=Inf"), post("/api/amt?amount=Infinity")},
		{"-Inf vs -INFINITY", rule, "/api/amt", bind, post("/api/amt?amount=-Inf"), post("/api/amt?amount=-INFINITY")},
		{"NaN vs nan", rule, "/api/amt", bind, post("/api/amt?amount=NaN"), post("/api/amt?amount=nan")},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.bindsAlike(t)
			c.secondIsRefused(t)
		})
	}
}
