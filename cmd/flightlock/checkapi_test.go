package main

import (
	"strings"
	"testing"
)

// TestNearestRouteSuggestsOnlyARouteFewEditsAway: a rule's Path a few letters from a route
// (a misspelling, another method counting one more edit) is offered that route; one unlike
// every route is offered none, within the same bound as the middleware's CheckRoutes
// (typo.Edits: a third of the path, at most 3), however long the path.
func TestNearestRouteSuggestsOnlyARouteFewEditsAway(t *testing.T) {
	routes := []route{
		{method: "POST", path: "/api/wallet/withdraw"},
		{method: "POST", path: "/api/wallet/:from/transfer"},
		{method: "POST", path: "/api/wallet/tip"},
		{method: "GET", path: "/api/wallet/:uid/balance"},
	}
	for _, tt := range []struct {
		method, path string
		want         string // the route suggested, "" for none
	}{
		{"POST", "/api/wallet/withdrew", "POST /api/wallet/withdraw"},
		{"POST", "/api/wallet/withdrawl", "POST /api/wallet/withdraw"},
		{"GET", "/api/wallet/withdrawl", "POST /api/wallet/withdraw"}, // 1 letter + the method
		{"POST", "/api/wallet/:uid/balances", "GET /api/wallet/:uid/balance"},
		{"POST", "/api/wallet/refund", ""},     // 6 edits from /api/wallet/tip
		{"POST", "/api/wallet/statements", ""}, // 9 from /api/wallet/withdraw
		{"POST", "/api/wallet/:from/transfers/:id/cancel", ""},
	} {
		got := nearestRoute(tt.method, tt.path, routes)
		switch {
		case tt.want == "" && got != "":
			t.Errorf("%s %s: suggested%s, want no suggestion", tt.method, tt.path, got)
		case tt.want != "" && !strings.HasPrefix(got, " (did you mean "+tt.want+"?"):
			t.Errorf("%s %s: suggested %q, want %s", tt.method, tt.path, got, tt.want)
		}
	}
}
