package middleware

// Numeric keys: go-zero's httpx.Parse binds a path variable, a form or query value and a
// header into an integer field with strconv.ParseInt (core/mapping.convertTypeFromString),
// which reads "7", "07", "007", "+7" as the same 7, and a JSON number into an integer field
// the same way ("0" and "-0" are both 0; a float field takes 1, 1.0 and 1e0 alike). goctl
// generates int64 fields for ids as often as strings. Keys made from the text would differ for
// one entity ("sku:7", "sku:07") and let two requests on it run the handler at once;
// canonicalNumber renders a value written as a number in one form, so that the key is built
// from the very value the handler reads for numeric fields too.
//
// Each subtest holds the first request inside the handler (OnBusy reject) and sends the second,
// which binds the same number: it must be refused with 409, and its handler must not run.

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeromicro/go-zero/rest"
	"github.com/zeromicro/go-zero/rest/httpx"
)

type numSkuReq struct {
	Sku int64 `path:"sku"`
}

type numQueryReq struct {
	Uid int64 `form:"uid"`
}

type numHeaderReq struct {
	Uid int64 `header:"X-Uid"`
}

type numJSONReq struct {
	Uid int64 `json:"uid"`
}

type numFloatReq struct {
	Account float64 `json:"account"`
}

func TestNumericValuesOfOneEntityShareAKey(t *testing.T) {
	cases := []oneEntityCase{
		{
			name:  "path 7 vs 07",
			rule:  Rule{Method: http.MethodPost, Path: "/api/sku/:sku/deduct", Key: "sku:{path.sku}", OnBusy: "reject"},
			route: "/api/sku/:sku/deduct",
			bind: func(r *http.Request) (any, error) {
				var v numSkuReq
				err := httpx.Parse(r, &v)
				return v.Sku, err
			},
			first:  func() *http.Request { return httptest.NewRequest(http.MethodPost, "/api/sku/7/deduct", http.NoBody) },
			second: func() *http.Request { return httptest.NewRequest(http.MethodPost, "/api/sku/07/deduct", http.NoBody) },
		},
		{
			name:  "query 7 vs +7",
			rule:  Rule{Method: http.MethodPost, Path: "/api/pay", Key: "uid:{query.uid}", OnBusy: "reject"},
			route: "/api/pay",
			bind: func(r *http.Request) (any, error) {
				var v numQueryReq
				err := httpx.Parse(r, &v)
				return v.Uid, err
			},
			first:  func() *http.Request { return httptest.NewRequest(http.MethodPost, "/api/pay?uid=7", http.NoBody) },
			second: func() *http.Request { return httptest.NewRequest(http.MethodPost, "/api/pay?uid=%2B7", http.NoBody) },
		},
		{
			name:  "header 7 vs 007",
			rule:  Rule{Method: http.MethodPost, Path: "/api/hdr", Key: "uid:{header.X-Uid}", OnBusy: "reject"},
			route: "/api/hdr",
			bind: func(r *http.Request) (any, error) {
				var v numHeaderReq
				err := httpx.Parse(r, &v)
				return v.Uid, err
			},
			first: func() *http.Request {
				r := httptest.NewRequest(http.MethodPost, "/api/hdr", http.NoBody)
				r.Header.Set("X-Uid", "7")
				return r
			},
			second: func() *http.Request {
				r := httptest.NewRequest(http.MethodPost, "/api/hdr", http.NoBody)
				r.Header.Set("X-Uid", "007")
				return r
			},
		},
		{
			name:  "json int 0 vs -0",
			rule:  Rule{Method: http.MethodPost, Path: "/api/json", Key: "uid:{body.uid}", OnBusy: "reject"},
			route: "/api/json",
			bind: func(r *http.Request) (any, error) {
				var v numJSONReq
				err := httpx.Parse(r, &v)
				return v.Uid, err
			},
			first:  jsonReq("/api/json", `{"uid":0}`),
			second: jsonReq("/api/json", `{"uid":-0}`),
		},
		{
			name:  "json float 1 vs 1.0",
			rule:  Rule{Method: http.MethodPost, Path: "/api/float", Key: "acct:{body.account}", OnBusy: "reject"},
			route: "/api/float",
			bind: func(r *http.Request) (any, error) {
				var v numFloatReq
				err := httpx.Parse(r, &v)
				return v.Account, err
			},
			first:  jsonReq("/api/float", `{"account":1}`),
			second: jsonReq("/api/float", `{"account":1.0}`),
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.secondIsRefused(t) })
	}
}

type numFloatQueryReq struct {
	Amount float64 `form:"amount"`
}

// Values that go-zero's httpx.Parse binds as one number, in its less common spellings too,
// render as one key, so two requests on one entity never both hold "their" lock and run the
// handler at once (mutual exclusion, DESIGN.md step 1: the key is built from the very value
// the handler reads).
//
//   - "int64 path 7 vs 65 zeros then 7": strconv.ParseInt (go-zero's
//     core/mapping.convertTypeFromString) reads any number of leading zeros, and
//     canonicalNumber drops them at any length: no client takes a second lock on entity 7 by
//     padding its id, which the 1024-byte key bound leaves ample room for. int64 ids are the
//     common lock key.
//   - float64 fields: ParseFloat reads "1_000" as 1000 (underscores between decimal digits)
//     and "0x1p0" as 1, and "1000000000000000000000" and "1e21" as one float64, rendered as
//     its digits. An integer written without a point or exponent is kept exactly, while the
//     float64 it binds to is not: "9007199254740993" and "9007199254740992" are one float64
//     but two keys (not covered below).
//
// Each subtest holds the first request in the handler (OnBusy reject); the second binds the
// same value and must be refused with 409.
func TestNumericValuesWrittenAnyWayShareAKey(t *testing.T) {
	get := func(target string) func() *http.Request {
		return func() *http.Request { return httptest.NewRequest(http.MethodPost, target, http.NoBody) }
	}
	bindSku := func(r *http.Request) (any, error) {
		var v numSkuReq
		err := httpx.Parse(r, &v)
		return v.Sku, err
	}
	bindFloatJSON := func(r *http.Request) (any, error) {
		var v numFloatReq
		err := httpx.Parse(r, &v)
		return v.Account, err
	}
	bindFloatQuery := func(r *http.Request) (any, error) {
		var v numFloatQueryReq
		err := httpx.Parse(r, &v)
		return v.Amount, err
	}
	skuRule := Rule{Method: http.MethodPost, Path: "/api/sku/:sku/deduct", Key: "sku:{path.sku}", OnBusy: "reject"}
	floatRule := Rule{Method: http.MethodPost, Path: "/api/float", Key: "acct:{body.account}", OnBusy: "reject"}
	queryRule := Rule{Method: http.MethodPost, Path: "/api/amt", Key: "amt:{query.amount}", OnBusy: "reject"}
	for _, c := range []oneEntityCase{
		{"int64 path 7 vs 65 zeros then 7", skuRule, "/api/sku/:sku/deduct", bindSku,
			get("/api/sku/7/deduct"), get("/api/sku/" + strings.Repeat("0", 65) + "7/deduct")},
		{"float64 json 1e21 vs its digits", floatRule, "/api/float", bindFloatJSON,
			jsonReq("/api/float", `{"account":1e21}`), jsonReq("/api/float", `{"account":1000000000000000000000}`)},
		// Not covered: 9007199254740992 and 9007199254740993 are one float64, but as integers
		// they are two ids, and an int64 field must keep them apart (canonicalNumber's doc).
		{"float64 query 1000 vs 1_000", queryRule, "/api/amt", bindFloatQuery,
			get("/api/amt?amount=1000"), get("/api/amt?amount=1_000")},
		{"float64 query 1 vs 0x1p0", queryRule, "/api/amt", bindFloatQuery,
			get("/api/amt?amount=1"), get("/api/amt?amount=0x1p0")},
	} {
		t.Run(c.name, func(t *testing.T) { c.secondIsRefused(t) })
	}
}

// oneEntityCase is two requests that a handler binds to one entity, under a reject rule.
type oneEntityCase struct {
	name          string
	rule          Rule
	route         string
	bind          func(r *http.Request) (any, error) // what the handler binds
	first, second func() *http.Request
}

// jsonReq makes a POST of body as application/json to path.
func jsonReq(path, body string) func() *http.Request {
	return func() *http.Request {
		r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		return r
	}
}

// secondIsRefused holds the first request inside the handler and sends the second, which binds
// the same entity: it must be refused with 409, and its handler must not run.
func (c oneEntityCase) secondIsRefused(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{c.rule}})
	var (
		inside  atomic.Int32
		overlap atomic.Int32
		bound   = make(chan any, 2)
		entered = make(chan struct{}, 2)
		release = make(chan struct{})
	)
	handler := func(w http.ResponseWriter, r *http.Request) {
		v, err := c.bind(r)
		if err != nil {
			httpx.ErrorCtx(r.Context(), w, err)
			return
		}
		bound <- v
		if inside.Add(1) > 1 {
			overlap.Add(1)
		}
		defer inside.Add(-1)
		entered <- struct{}{}
		select {
		case <-release:
		case <-time.After(2 * time.Second):
		}
	}
	s := serverless(t, restConf(t, 5*time.Second), m, []rest.Route{{Method: http.MethodPost, Path: c.route, Handler: handler}})
	firstDone := make(chan *httptest.ResponseRecorder, 1)
	go func() { firstDone <- serve(s, c.first()) }()
	select {
	case <-entered:
	case w := <-firstDone:
		t.Fatalf("the first request never reached the handler: %d %q", w.Code, w.Body.String())
	case <-time.After(2 * time.Second):
		t.Fatal("the first request never reached the handler")
	}
	secondDone := make(chan *httptest.ResponseRecorder, 1)
	go func() { secondDone <- serve(s, c.second()) }()
	var second *httptest.ResponseRecorder
	select {
	case second = <-secondDone:
	case <-entered:
		// The second request is inside the handler while the first still is.
		close(release)
		second = <-secondDone
		<-firstDone
		b1, b2 := <-bound, <-bound
		t.Fatalf("two holders: both requests bound %v / %v and ran the handler at once (overlap %d); the second got %d, want 409",
			b1, b2, overlap.Load(), second.Code)
	}
	close(release)
	<-firstDone
	if second.Code != http.StatusConflict {
		t.Errorf("second request: %d %q, want 409 (the first holds the same entity)", second.Code, second.Body.String())
	}
}
