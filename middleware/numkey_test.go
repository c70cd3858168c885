package middleware

// Review 4, finding "numeric keys" (fixed by canonicalNumber): the key is the text of a value, but go-zero's httpx.Parse
// binds a path variable, a form or query value and a header into an integer field with
// strconv.ParseInt (core/mapping.convertTypeFromString), which reads "7", "07", "007", "+7"
// as the same 7, and a JSON number into an integer field the same way ("0" and "-0" are both
// 0; a float field takes 1, 1.0 and 1e0 alike). goctl generates int64 fields for ids as often
// as strings. Two requests on the same entity therefore get two different lock keys
// ("sku:7", "sku:07") and both run the handler at once: the invariant "the key is built from
// the very value the handler reads" does not hold for numeric fields.
//
// Each subtest holds the first request inside the handler (OnBusy reject) and sends the second,
// which binds the same number: it must be refused with 409, and its handler must not run. Before
// canonicalNumber it ran, concurrently with the first.

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
	type tc struct {
		name    string
		rule    Rule
		route   string
		bind    func(r *http.Request) (any, error)
		first   func() *http.Request
		second  func() *http.Request
		boundAs string
	}
	jsonReq := func(path, body string) func() *http.Request {
		return func() *http.Request {
			r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
			r.Header.Set("Content-Type", "application/json")
			return r
		}
	}
	cases := []tc{
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
		t.Run(c.name, func(t *testing.T) {
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
			firstDone := make(chan int, 1)
			go func() { firstDone <- serve(s, c.first()).Code }()
			select {
			case <-entered:
			case <-time.After(2 * time.Second):
				t.Fatal("the first request never reached the handler")
			}
			secondDone := make(chan int, 1)
			go func() { secondDone <- serve(s, c.second()).Code }()
			var second int
			select {
			case second = <-secondDone:
			case <-entered:
				// The second request is inside the handler while the first still is.
				close(release)
				second = <-secondDone
				<-firstDone
				b1, b2 := <-bound, <-bound
				t.Fatalf("two holders: both requests bound %v / %v and ran the handler at once (overlap %d); the second got %d, want 409",
					b1, b2, overlap.Load(), second)
			}
			close(release)
			<-firstDone
			if second != http.StatusConflict {
				t.Errorf("second request: %d, want 409 (the first holds the same entity)", second)
			}
		})
	}
}

// canonicalNumber writes every way of writing one number alike, and keeps different integers
// apart at any length (snowflake ids above 2^53 must not share a lock with their neighbours).
func TestCanonicalNumber(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"7", "7"}, {"07", "7"}, {"007", "7"}, {"+7", "7"}, {"-7", "-7"}, {"-007", "-7"},
		{"0", "0"}, {"-0", "0"}, {"+0", "0"}, {"000", "0"},
		{"1.0", "1"}, {"1e0", "1"}, {"1E0", "1"}, {"10e-1", "1"}, {"1.5", "1.5"}, {"-1.50", "-1.5"},
		{"-0.0", "0"}, {".5", "0.5"}, {"1e20", "100000000000000000000"},
		{"1844674407370955161", "1844674407370955161"}, {"1844674407370955162", "1844674407370955162"},
		{"123456789012345678901234567890", "123456789012345678901234567890"},
		// Any length (review 6: 65 zeros before a 7 made a second lock on 7).
		{strings.Repeat("0", 65) + "7", "7"}, {"-" + strings.Repeat("0", 900) + "42", "-42"},
		// What ParseFloat reads too: underscores, hexadecimal floats; integral floats as digits.
		{"1_000", "1000"}, {"0x1p0", "1"}, {"0X1P-2", "0.25"}, {"1e21", "1000000000000000000000"},
		{"1000000000000000000000", "1000000000000000000000"},
		// Not numbers: as written.
		{"", ""}, {"abc", "abc"}, {"7a", "7a"}, {"+-7", "+-7"}, {"7-", "7-"}, {"-", "-"}, {"1e", "1e"},
		{"0x10", "0x10"}, {"Inf", "Inf"}, {"NaN", "NaN"}, {"1e400", "1e400"}, {"1 2", "1 2"}, {"e5", "e5"},
		{"deadbeef", "deadbeef"}, {"_1", "_1"},
	} {
		if got := canonicalNumber(tc.in); got != tc.want {
			t.Errorf("canonicalNumber(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
