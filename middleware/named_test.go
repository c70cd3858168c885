package middleware

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/zeromicro/go-zero/rest"
)

// TestNamedConfig covers the config side of named rules: what a named rule may leave out,
// what it may not have, and the names themselves.
func TestNamedConfig(t *testing.T) {
	tests := []struct {
		name  string
		rules []Rule
		want  string // "" when Validate accepts the rules; "ErrConfig" for any config error
	}{
		{"name only", []Rule{{Name: "StockLock", Key: "s:{path.sku}"}}, ""},
		{"name and method", []Rule{{Name: "StockLock", Method: "post", Key: "s:{path.sku}"}}, ""},
		{"name, method and path", []Rule{{Name: "StockLock", Method: "POST", Path: "/api/stock/:sku/deduct", Key: "s:{path.sku}"}}, ""},
		{"no key", []Rule{{Name: "StockLock"}}, "Lock.Rules[0].Key: is empty"},
		{"bad key", []Rule{{Name: "StockLock", Key: "s:{nope.x}"}}, "ErrConfig"},
		{"path variable the path lacks", []Rule{{Name: "StockLock", Path: "/api/stock/:id", Key: "s:{path.sku}"}}, "ErrConfig"},
		{"rpc", []Rule{{Name: "StockLock", RPC: "/stock.Stock/Deduct", Key: "s:{sku}"}},
			"Lock.Rules[0].RPC: is set on the named rule StockLock, a REST middleware: lock /stock.Stock/Deduct in a rule without a Name"},
		{"bad method", []Rule{{Name: "StockLock", Method: "FETCH", Key: "s:{x}"}}, "ErrConfig"},
		{"nothing at all", []Rule{{Key: "s:{x}"}}, "Lock.Rules[0]: names no Path, RPC method or Name: it would lock nothing"},
		{"duplicate name", []Rule{
			{Name: "StockLock", Key: "s:{path.sku}"},
			{Method: "GET", Path: "/x", Key: "x:{query.x}"},
			{Name: "StockLock", Method: "POST", Key: "t:{path.sku}"},
		}, "Lock.Rules[2].Name: StockLock is already the name of Lock.Rules[0]; rules that share a name each need their own Method or Path, the requests of the group they lock"},
		{"shared name, same method", []Rule{
			{Name: "PriceLock", Method: "GET", Key: "price:{path.sku}", Mode: "read"},
			{Name: "PriceLock", Method: "get", Key: "price:{path.sku}"},
		}, "Lock.Rules[1].Name: PriceLock is already the name of Lock.Rules[0]; rules that share a name each need their own Method or Path, the requests of the group they lock"},
		{"shared name, a method each", []Rule{
			{Name: "PriceLock", Method: "GET", Key: "price:{path.sku}", Mode: "read"},
			{Name: "PriceLock", Method: "PUT", Key: "price:{path.sku}", Mode: "write"},
		}, ""},
		{"names differing in case", []Rule{{Name: "StockLock", Key: "s:{x}"}, {Name: "stocklock", Key: "t:{x}"}}, ""},
		{"route of another rule", []Rule{
			{Method: "POST", Path: "/api/stock/:sku/deduct", Key: "s:{path.sku}"},
			{Name: "StockLock", Method: "POST", Path: "/api/stock/:sku/deduct", Key: "t:{path.sku}"},
		}, "Lock.Rules[1].Path: POST /api/stock/:sku/deduct is already locked by Lock.Rules[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := LockConf{Rules: tt.rules}.Validate()
			switch {
			case tt.want == "":
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
			case tt.want == "ErrConfig":
				if !errors.Is(err, flightlock.ErrConfig) {
					t.Fatalf("Validate: %v, want a config error", err)
				}
			case err == nil || err.Error() != tt.want || !errors.Is(err, flightlock.ErrConfig):
				t.Fatalf("Validate: %v, want %q (ErrConfig)", err, tt.want)
			}
		})
	}
}

// TestNamed covers Named's middleware: it honours the rule's Method and Path on the group it
// is put on, Handle leaves named rules alone, unknown names are errors, and CheckRoutes
// reports a named rule whose middleware is on no route.
func TestNamed(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{
		{Name: "StockLock", Method: "post", Path: "/api/stock/:sku/deduct", Key: "stock:{path.sku}"},
		{Name: "GroupLock", Key: "group:{path.sku}"},
		{Name: "PostLock", Method: "POST", Key: "post:{path.sku}"},
	}})
	group := []rest.Route{
		{Method: http.MethodGet, Path: "/:sku", Handler: echoKeys},
		{Method: http.MethodPost, Path: "/:sku", Handler: echoKeys},
		{Method: http.MethodPost, Path: "/:sku/deduct", Handler: echoKeys},
	}
	srv, err := rest.NewServer(restConf(t, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	srv.Use(m.Handle) // named rules are not Handle's: nothing is locked twice
	if err := m.CheckRoutes(nil); err == nil || err.Error() != `Lock.Rules[0] (StockLock): locks nothing: no middleware was built with Named("StockLock") for @server(middleware: StockLock)` {
		t.Fatalf("CheckRoutes before Named: %v", err)
	}
	stock := m.MustNamed("StockLock")
	if err := m.CheckRoutes(nil); err == nil || err.Error() != `Lock.Rules[0] (StockLock): locks nothing: the middleware of Named("StockLock") is on no route; add the routes with it (@server(middleware: StockLock), rest.WithMiddlewares) before CheckRoutes` {
		t.Fatalf("CheckRoutes before the routes: %v", err)
	}
	srv.AddRoutes(rest.WithMiddlewares([]rest.Middleware{stock}, group...), rest.WithPrefix("/api/stock"))
	srv.AddRoutes(rest.WithMiddlewares([]rest.Middleware{m.MustNamed("GroupLock")}, group...), rest.WithPrefix("/api/group"))
	srv.AddRoutes(rest.WithMiddlewares([]rest.Middleware{m.MustNamed("PostLock")}, group...), rest.WithPrefix("/api/post"))
	srv.AddRoute(rest.Route{Method: http.MethodPost, Path: "/api/plain/:sku/deduct", Handler: echoKeys})
	if err := m.CheckRoutes(srv.Routes()); err != nil {
		t.Fatalf("CheckRoutes: %v", err)
	}
	s, err := rest.NewServerless(srv)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ method, target, want string }{
		{"GET", "/api/stock/s1", ""},
		{"POST", "/api/stock/s1", ""},
		{"POST", "/api/stock/s1/deduct", "lock:stock:s1"},
		{"GET", "/api/group/s1", "lock:group:s1"},
		{"POST", "/api/group/s1/deduct", "lock:group:s1"},
		{"GET", "/api/post/s1", ""},
		{"POST", "/api/post/s1", "lock:post:s1"},
		{"POST", "/api/plain/s1/deduct", ""}, // the same shape outside the group: not StockLock's
	} {
		w := httptest.NewRecorder()
		s.Serve(w, httptest.NewRequest(tt.method, tt.target, http.NoBody))
		if w.Code != http.StatusOK || w.Body.String() != tt.want {
			t.Errorf("%s %s: %d %q, want 200 %q", tt.method, tt.target, w.Code, w.Body, tt.want)
		}
	}

	for name, want := range map[string]string{
		"StockLok":  "Lock.Rules: has no rule named StockLok; the named rules are StockLock, GroupLock, PostLock",
		"stocklock": "Lock.Rules: has no rule named stocklock (did you mean StockLock?)",
		"":          "Named: the name is empty",
	} {
		if _, err := m.Named(name); err == nil || err.Error() != want || !errors.Is(err, flightlock.ErrConfig) {
			t.Errorf("Named(%q): %v, want %q (ErrConfig)", name, err, want)
		}
	}
	if _, err := newMiddleware(t, tr, LockConf{}).Named("StockLock"); err == nil || err.Error() != "Lock.Rules: has no rule named StockLock: no rule has a Name" {
		t.Errorf("Named without named rules: %v", err)
	}

	// The route of a named rule is checked once its middleware is on a route.
	m = newMiddleware(t, tr, LockConf{Rules: []Rule{{Name: "StockLock", Method: "POST", Path: "/stock/:sku/deduct", Key: "stock:{path.sku}"}}})
	rest.WithMiddlewares([]rest.Middleware{m.MustNamed("StockLock")}, group...)
	want := "Lock.Rules[0] (StockLock): POST /stock/:sku/deduct matches no route of the server (did you mean POST /api/stock/:sku/deduct?)"
	if err := m.CheckRoutes(srv.Routes()); err == nil || err.Error() != want {
		t.Errorf("CheckRoutes: %v, want %q", err, want)
	}
}
