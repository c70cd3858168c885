package middleware

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/zeromicro/go-zero/rest"
)

// A Route middleware that is put on no route locks nothing: CheckRoutes says so, naming it,
// rather than passing silently.
func TestRouteNeverWiredFailsTheCheck(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{})
	_ = m.MustRoute(Rule{Method: "POST", Path: "/api/stock/:sku/deduct", Key: "stock:{path.sku}"})
	srv, err := rest.NewServer(restConf(t, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	srv.AddRoute(rest.Route{Method: http.MethodPost, Path: "/api/stock/:sku/deduct", Handler: echoKeys})
	err = m.CheckRoutes(srv.Routes())
	if err == nil || !strings.Contains(err.Error(), "Route(POST /api/stock/:sku/deduct)") || !strings.Contains(err.Error(), "on no route") {
		t.Fatalf("CheckRoutes = %v, want an error naming the unwired Route", err)
	}

	// Wired on its group, the same rule passes and locks.
	m2 := newMiddleware(t, tr, LockConf{})
	mw := m2.MustRoute(Rule{Method: "POST", Path: "/api/stock/:sku/deduct", Key: "stock:{path.sku}"})
	srv2, err := rest.NewServer(restConf(t, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	srv2.AddRoutes(rest.WithMiddlewares([]rest.Middleware{mw},
		rest.Route{Method: http.MethodPost, Path: "/:sku/deduct", Handler: echoKeys}), rest.WithPrefix("/api/stock"))
	if err := m2.CheckRoutes(srv2.Routes()); err != nil {
		t.Fatalf("CheckRoutes of a wired Route: %v", err)
	}
	s, err := rest.NewServerless(srv2)
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	s.Serve(w, httptest.NewRequest(http.MethodPost, "/api/stock/s1/deduct", http.NoBody))
	if !strings.Contains(w.Body.String(), "lock:stock:s1") {
		t.Fatalf("wired Route did not lock: %d %q", w.Code, w.Body.String())
	}
}

// A route is locked by one rule: a Route on a route that a rule of Handle already locks is
// refused, naming both, so that the key is not taken twice.
func TestRouteOnARouteHandleLocksIsRefused(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{
		{Method: "POST", Path: "/api/stock/:sku/deduct", Key: "stock:{path.sku}"},
	}})
	_, err := m.Route(Rule{Method: "POST", Path: "/api/stock/:sku/deduct", Key: "stock:{path.sku}"})
	if err == nil || !strings.Contains(err.Error(), "already locked by Lock.Rules[0]") {
		t.Fatalf("Route on a route Handle locks: %v, want refused", err)
	}
	// Another method of the same path is another route.
	if _, err := m.Route(Rule{Method: "GET", Path: "/api/stock/:sku/deduct", Key: "stock:{path.sku}"}); err != nil {
		t.Fatalf("Route on another method: %v", err)
	}
}
