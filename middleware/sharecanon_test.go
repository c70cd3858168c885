package middleware

// A lock key renders every REST value written as a number in one form, so "007" and "7" make
// one key. A share rule's stored responses are keyed by the values as written
// (templateHTTPKeys with raw): a duplicate is recognised by its key and by a fingerprint of method,
// path, query and body only (middleware/share), so when the number comes from a header (or a
// JWT claim) the two requests have the same fingerprint, and the request of account "7" must
// not receive the response the handler gave to account "007" (a string field: another account).

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/zeromicro/go-zero/rest"
	"github.com/zeromicro/go-zero/rest/httpx"
)

type acctHeaderReq struct {
	Account string `header:"X-Account"`
}

func TestShareNeverReplaysAnotherValuesResponse(t *testing.T) {
	tr := newTestRedis(t)
	rule := Rule{Method: http.MethodPost, Path: "/balance/reset", Key: "acct:{header.X-Account}", OnBusy: "share",
		Replay: 10 * time.Second}
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{rule}})
	s := serverless(t, restConf(t, 5*time.Second), m, []rest.Route{{Method: http.MethodPost, Path: "/balance/reset",
		Handler: func(w http.ResponseWriter, r *http.Request) {
			var req acctHeaderReq
			if err := httpx.Parse(r, &req); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			fmt.Fprintf(w, "reset account %q", req.Account)
		}}})
	req := func(acct string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/balance/reset", strings.NewReader(`{}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-Account", acct)
		return r
	}
	if w := serve(s, req("007")); w.Code != http.StatusOK || w.Body.String() != `reset account "007"` {
		t.Fatalf("first request: %d %q", w.Code, w.Body.String())
	}
	w := serve(s, req("7"))
	if w.Body.String() != `reset account "7"` {
		t.Errorf("request for account \"7\" answered %d %q (%s: %q): the response of account \"007\", whose "+
			"handler saw another value; want its own run", w.Code, w.Body.String(), ReplayedHeader, w.Header().Get(ReplayedHeader))
	}
}
