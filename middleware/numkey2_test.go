package middleware

// Review 6 of ea28f3c (canonicalNumber; fixed but for 2^53, see below): values that go-zero's
// httpx.Parse binds as one number still rendered as two keys, so two requests on one entity both hold "their" lock and run the
// handler at once (mutual exclusion, DESIGN.md step 1: the key is built from the very value the
// handler reads).
//
//   - "int64 path 7 vs 65 zeros then 7": canonicalNumber leaves values over 64 bytes as
//     written, but strconv.ParseInt (go-zero's core/mapping.convertTypeFromString) reads any
//     number of leading zeros. Any client can take a second lock on entity 7 by padding its id;
//     the 1024-byte key bound leaves ample room. The most serious case: int64 ids are the
//     common lock key.
//   - float64 fields: ParseFloat reads "1_000" as 1000 (underscores between decimal digits)
//     and "0x1p0" as 1, both left as written; an integer written without a point or exponent
//     is kept exactly, while the float64 it binds to is not: "9007199254740993" and
//     "9007199254740992" are one float64, and "1000000000000000000000" and "1e21" are one
//     float64 but render as the digits and as "1e+21".
//
// Each subtest holds the first request in the handler (OnBusy reject); the second binds the
// same value and must be refused with 409.

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

type numFloatQueryReq struct {
	Amount float64 `form:"amount"`
}

func TestNumericValuesWrittenAnyWayShareAKey(t *testing.T) {
	jsonReq := func(path, body string) func() *http.Request {
		return func() *http.Request {
			r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
			r.Header.Set("Content-Type", "application/json")
			return r
		}
	}
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
	for _, c := range []struct {
		name          string
		rule          Rule
		route         string
		bind          func(r *http.Request) (any, error)
		first, second func() *http.Request
	}{
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
		t.Run(c.name, func(t *testing.T) {
			tr := newTestRedis(t)
			m := newMiddleware(t, tr, LockConf{Rules: []Rule{c.rule}})
			var (
				inside  atomic.Int32
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
				inside.Add(1)
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
			select {
			case w := <-secondDone:
				close(release)
				<-firstDone
				if w.Code != http.StatusConflict {
					t.Errorf("second request: %d %q, want 409", w.Code, w.Body.String())
				}
			case <-entered:
				b1, b2 := <-bound, <-bound
				close(release)
				<-secondDone
				<-firstDone
				t.Errorf("two holders: the requests bound %v and %v (equal: %v) and both ran the handler at once",
					b1, b2, b1 == b2)
			}
		})
	}
}
