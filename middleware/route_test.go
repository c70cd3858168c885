package middleware

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/zeromicro/go-zero/rest"
	"google.golang.org/grpc"
)

// TestRouteMatchingAgreesWithGoZero registers tricky routes on a go-zero server, rules on
// some of them, and checks for each request that flightlock locks exactly when go-zero
// dispatched it to a route that a rule names, with that rule.
func TestRouteMatchingAgreesWithGoZero(t *testing.T) {
	routes := []struct{ method, path string }{
		{http.MethodGet, "/"},
		{http.MethodGet, "/sku/:id"},
		{http.MethodGet, "/sku/list"}, // static beside :id
		{http.MethodPost, "/sku/:id"},
		{http.MethodPost, "/sku/list"},
		{http.MethodDelete, "/sku/:id"},
		{http.MethodGet, "/sku/:id/stock"}, // /sku/list/stock backtracks to it
		{http.MethodGet, "/a/:x/c"},
		{http.MethodGet, "/a/b/d"},
		{http.MethodGet, "/p/:x"}, // both match /p/p with x=p: go-zero takes /p/:x
		{http.MethodGet, "/:x/p"},
		{http.MethodPut, "/t/"}, // trailing slashes, cleaned by the router
		{http.MethodPut, "/u"},
		{http.MethodGet, "/deep/:a/:b/:c/:d"},
		{http.MethodGet, "/deep/:a/x/:c/:d"},
		{http.MethodGet, "/m/:id"},
		{http.MethodPost, "/m/list"},
		{http.MethodGet, "/any/:id"},
		{http.MethodDelete, "/any/:id"},
		{http.MethodPatch, "/any/:id"},
		{http.MethodGet, "/tie/:x"}, // go-zero picks one of the two at random
		{http.MethodGet, "/tie/:y"},
		{http.MethodPut, "/:name"}, // PUT / lands here, with name ""
	}
	rules := []Rule{
		{Method: http.MethodGet, Path: "/"},
		{Method: http.MethodGet, Path: "/sku/:id"},
		{Method: http.MethodPost, Path: "/sku/list"},
		{Path: "/sku/:id/stock"},
		{Method: http.MethodGet, Path: "/a/:x/c"},
		{Method: http.MethodGet, Path: "/:x/p"}, // before /p/:x: order in the config must not matter
		{Method: http.MethodGet, Path: "/p/:x"},
		{Method: http.MethodPut, Path: "/t"},
		{Method: http.MethodPut, Path: "/u/"},
		{Method: http.MethodGet, Path: "/deep/:a/:b/:c/:d"},
		{Path: "/m/list"}, // no GET /m/list route: must not shadow GET /m/:id
		{Method: http.MethodGet, Path: "/m/:id"},
		{Path: "/any/:id"},
		{Method: http.MethodGet, Path: "/tie/:x"},
		{Method: http.MethodPut, Path: "/:name"},
	}
	for i := range rules {
		rules[i].Key = fmt.Sprintf("r%d", i)
	}
	// wantKey is the key of the rule that names the route go-zero ran, or "".
	wantKey := func(route string) string {
		method, pattern, _ := strings.Cut(route, " ")
		for _, r := range rules {
			if (r.Method == "" || r.Method == method) && path.Clean(r.Path) == path.Clean(pattern) {
				return "lock:" + r.Key
			}
		}
		return ""
	}

	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: rules})
	var rs []rest.Route
	for _, rt := range routes {
		route := rt.method + " " + rt.path
		rs = append(rs, rest.Route{Method: rt.method, Path: rt.path, Handler: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Route", route)
			echoKeys(w, r)
		}})
	}
	s := serverless(t, restConf(t, 3*time.Second), m, rs)
	if err := m.CheckRoutes(rs); err != nil {
		t.Fatalf("CheckRoutes: %v", err)
	}

	requests := []struct {
		method, target string
		want           string // the route go-zero must dispatch to, or "" for 404 / 405
	}{
		{"GET", "/", "GET /"},
		{"HEAD", "/", ""},
		{"GET", "/sku/9", "GET /sku/:id"},
		{"GET", "/sku/list", "GET /sku/list"},
		{"GET", "/sku/list/", "GET /sku/list"},
		{"POST", "/sku/9", "POST /sku/:id"},
		{"POST", "/sku/list", "POST /sku/list"},
		{"DELETE", "/sku/list", "DELETE /sku/:id"},
		{"GET", "/sku//9", "GET /sku/:id"},
		{"GET", "/sku/./9/", "GET /sku/:id"},
		{"GET", "/sku/x/../9", "GET /sku/:id"},
		{"GET", "/sku/9/stock", "GET /sku/:id/stock"},
		{"GET", "/sku/list/stock", "GET /sku/:id/stock"},
		{"POST", "/sku/9/stock", ""},
		{"GET", "/a/b/c", "GET /a/:x/c"},
		{"GET", "/a/b/d", "GET /a/b/d"},
		{"GET", "/a/z/c", "GET /a/:x/c"},
		{"GET", "/p/p", "GET /p/:x"},
		{"GET", "/p/q", "GET /p/:x"},
		{"GET", "/q/p", "GET /:x/p"},
		{"PUT", "/t", "PUT /t/"},
		{"PUT", "/t/", "PUT /t/"},
		{"PUT", "/u", "PUT /u"},
		{"PUT", "/u/", "PUT /u"},
		{"GET", "/deep/1/2/3/4", "GET /deep/:a/:b/:c/:d"},
		{"GET", "/deep/1/x/3/4", "GET /deep/:a/x/:c/:d"},
		{"GET", "/deep/1/x/3", ""},
		{"GET", "/m/list", "GET /m/:id"},
		{"POST", "/m/list", "POST /m/list"},
		{"GET", "/m/7", "GET /m/:id"},
		{"GET", "/any/1", "GET /any/:id"},
		{"DELETE", "/any/1", "DELETE /any/:id"},
		{"PATCH", "/any/1", "PATCH /any/:id"},
		{"POST", "/any/1", ""},
		{"GET", "/nothing/here", ""},
		{"PUT", "/", "PUT /:name"},
		{"PUT", "/zzz", "PUT /:name"},
		{"GET", "/tie/1", "GET /tie/:x|GET /tie/:y"},
	}
	for _, tt := range requests {
		n := 1
		if strings.Contains(tt.want, "|") {
			n = 40 // both branches of go-zero's random pick
		}
		for range n {
			w := serve(s, httptest.NewRequest(tt.method, tt.target, http.NoBody))
			route := w.Header().Get("X-Route")
			if tt.want == "" {
				if route != "" || w.Code < 400 {
					t.Errorf("%s %s: %d, served by %q; want 404 or 405", tt.method, tt.target, w.Code, route)
				}
				continue
			}
			if route == "" || !strings.Contains("|"+tt.want+"|", "|"+route+"|") {
				t.Errorf("%s %s: go-zero dispatched to %q (%d), the test expects %q", tt.method, tt.target, route, w.Code, tt.want)
				continue
			}
			if got, want := w.Body.String(), wantKey(route); w.Code != http.StatusOK || got != want {
				t.Errorf("%s %s (route %s): %d, locked %q; want %q", tt.method, tt.target, route, w.Code, got, want)
			}
		}
	}
}

// TestRouteHonoursMethodAndPath wires Route on a goctl-shaped group (one middleware for every
// route of a prefixed group): only the rule's method and route are locked.
func TestRouteHonoursMethodAndPath(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{})
	deduct := m.MustRoute(Rule{Method: http.MethodPost, Path: "/api/stock/:sku/deduct", Key: "stock:{path.sku}"})
	read := m.MustRoute(Rule{Method: "get", Path: "/api/stock/:sku", Key: "read:{path.sku}"}) // goctl's spelling
	posts := m.MustRoute(Rule{Method: http.MethodPost, Key: "post:{query.id}"})
	group := []rest.Route{
		{Method: http.MethodGet, Path: "/:sku", Handler: echoKeys},
		{Method: http.MethodGet, Path: "/list", Handler: echoKeys},
		{Method: http.MethodPost, Path: "/:sku", Handler: echoKeys},
		{Method: http.MethodPost, Path: "/:sku/deduct", Handler: echoKeys},
	}
	srv, err := rest.NewServer(restConf(t, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	srv.AddRoutes(rest.WithMiddlewares([]rest.Middleware{deduct, read}, group...), rest.WithPrefix("/api/stock"))
	srv.AddRoutes(rest.WithMiddlewares([]rest.Middleware{posts}, group...), rest.WithPrefix("/api/other"))
	if err := m.CheckRoutes(srv.Routes()); err != nil {
		t.Fatalf("CheckRoutes: %v", err)
	}
	s, err := rest.NewServerless(srv)
	if err != nil {
		t.Fatal(err)
	}

	holdKey(t, tr, "post:busy")
	tests := []struct{ method, target, want string }{
		{"GET", "/api/stock/s1", "lock:read:s1"},
		{"GET", "/api/stock/list", ""}, // static route beside /:sku
		{"POST", "/api/stock/s1", ""},  // same pattern, other method
		{"POST", "/api/stock/s1/deduct", "lock:stock:s1"},
		{"GET", "/api/other/s1?id=1", ""},
		{"POST", "/api/other/s1/deduct?id=1", "lock:post:1"},
		{"POST", "/api/other/s1?id=busy", "409"},
		{"GET", "/api/other/s1?id=busy", ""},
	}
	for _, tt := range tests {
		w := serve(s, httptest.NewRequest(tt.method, tt.target, http.NoBody))
		if tt.want == "409" {
			if w.Code != http.StatusConflict {
				t.Errorf("%s %s: %d, want 409", tt.method, tt.target, w.Code)
			}
			continue
		}
		if w.Code != http.StatusOK || w.Body.String() != tt.want {
			t.Errorf("%s %s: %d %q, want 200 %q", tt.method, tt.target, w.Code, w.Body, tt.want)
		}
	}

	if _, err := m.Route(Rule{Method: "FETCH", Key: "x"}); err == nil || !strings.Contains(err.Error(), "Rule.Method") {
		t.Errorf("Route with an unknown method: %v, want an error naming Rule.Method", err)
	}
}

func TestCheckRoutes(t *testing.T) {
	ok := []Rule{
		{Method: http.MethodPost, Path: "/api/order/:uid", Key: "order:{uid}"},
		{Path: "/api/sku/:id/", Key: "sku:{id}"},
		{RPC: fullMethod("Host"), Key: "h:{host}"}, // not a REST rule: not CheckRoutes' business
	}
	srv, err := rest.NewServer(restConf(t, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	h := func(http.ResponseWriter, *http.Request) {}
	srv.AddRoutes([]rest.Route{
		{Method: http.MethodPost, Path: "/order/:uid", Handler: h},
		{Method: http.MethodGet, Path: "/stock/:sku", Handler: h},
		{Method: http.MethodPost, Path: "/stock/:sku/deduct", Handler: h},
	}, rest.WithPrefix("/api"))
	srv.AddRoute(rest.Route{Method: http.MethodDelete, Path: "/api/sku/:id", Handler: h})
	routes := srv.Routes()

	tests := []struct {
		name string
		bad  Rule
		want string // "" when every rule names a route
	}{
		{"all found", Rule{Method: http.MethodGet, Path: "/api/stock/:sku", Key: "s:{sku}"}, ""},
		{"no such route", Rule{Method: http.MethodPost, Path: "/api/stock/deduct", Key: "s:{query.sku}"},
			"Lock.Rules[2]: POST /api/stock/deduct matches no route of the server"},
		{"other method", Rule{Method: http.MethodPut, Path: "/api/stock/:sku", Key: "s:{sku}"},
			"Lock.Rules[2]: PUT /api/stock/:sku matches no route of the server (did you mean GET /api/stock/:sku?)"},
		{"other variable name", Rule{Method: http.MethodGet, Path: "/api/stock/:id", Key: "s:{id}"},
			"Lock.Rules[2]: GET /api/stock/:id matches no route of the server (did you mean GET /api/stock/:sku?)"},
		{"group prefix missing", Rule{Method: http.MethodPost, Path: "/stock/:sku/deduct", Key: "s:{sku}"},
			"Lock.Rules[2]: POST /stock/:sku/deduct matches no route of the server (did you mean POST /api/stock/:sku/deduct?)"},
		{"misspelt path", Rule{Method: http.MethodPost, Path: "/api/stock/:sku/deductt", Key: "s:{sku}"},
			"Lock.Rules[2]: POST /api/stock/:sku/deductt matches no route of the server (did you mean POST /api/stock/:sku/deduct?)"},
		{"path in another case", Rule{Method: http.MethodGet, Path: "/api/Stock/:sku", Key: "s:{sku}"},
			"Lock.Rules[2]: GET /api/Stock/:sku matches no route of the server (did you mean GET /api/stock/:sku?)"},
		{"misspelt path of another method", Rule{Method: http.MethodPut, Path: "/api/ordr/:uid", Key: "o:{uid}"},
			"Lock.Rules[2]: PUT /api/ordr/:uid matches no route of the server (did you mean POST /api/order/:uid?)"},
		{"any method", Rule{Path: "/api/nothing", Key: "s:{query.x}"},
			"Lock.Rules[2]: /api/nothing matches no route of the server"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := newTestRedis(t)
			rules := append(append([]Rule(nil), ok[:2]...), tt.bad, ok[2])
			m := newMiddleware(t, tr, LockConf{Rules: rules})
			err := m.CheckRoutes(routes)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("CheckRoutes: %v", err)
			case tt.want != "" && (err == nil || err.Error() != tt.want || !errors.Is(err, flightlock.ErrConfig)):
				t.Fatalf("CheckRoutes: %v, want %q (ErrConfig)", err, tt.want)
			}
		})
	}

	t.Run("rules built in Go and by Route", func(t *testing.T) {
		tr := newTestRedis(t)
		m, err := New(LockConf{}, WithLocker(tr.locker(t)),
			WithHTTPRule(Rule{Method: http.MethodPost, Path: "/api/order/:uid"}, func(*http.Request) (string, error) { return "k", nil }))
		if err != nil {
			t.Fatal(err)
		}
		if err := m.CheckRoutes(routes); err != nil {
			t.Fatalf("CheckRoutes: %v", err)
		}
		wire := func(mw rest.Middleware) { mw(func(http.ResponseWriter, *http.Request) {}) } // as rest.WithMiddlewares does
		wire(m.MustRoute(Rule{Key: "g:{uid}"}))                                              // the whole group: nothing to check
		wire(m.MustRoute(Rule{Method: http.MethodDelete, Key: "g:{uid}"}))
		if err := m.CheckRoutes(routes); err != nil {
			t.Fatalf("CheckRoutes: %v", err)
		}
		wire(m.MustRoute(Rule{Method: http.MethodPatch, Key: "g:{uid}"}))
		if err := m.CheckRoutes(routes); err == nil || err.Error() != "Route: PATCH matches no route of the server" {
			t.Fatalf("CheckRoutes: %v, want the PATCH Route rule named", err)
		}
		m, err = New(LockConf{}, WithLocker(tr.locker(t)))
		if err != nil {
			t.Fatal(err)
		}
		if mw, err := m.RouteFunc(Rule{Path: "/api/order/:id"}, func(*http.Request) (string, error) { return "k", nil }); err != nil {
			t.Fatal(err)
		} else {
			wire(mw)
		}
		if err := m.CheckRoutes(routes); err == nil || !strings.HasPrefix(err.Error(), "RouteFunc: /api/order/:id matches no route") {
			t.Fatalf("CheckRoutes: %v, want the RouteFunc rule named", err)
		}
		if err := m.CheckRoutes(nil); err == nil {
			t.Fatal("CheckRoutes before the routes are added: no error")
		}
	})
}

func TestCheckMethods(t *testing.T) {
	srv := grpc.NewServer()
	srv.RegisterService(testServiceDesc(echoLeases), nil)
	info := srv.GetServiceInfo()
	ok := []Rule{
		{RPC: fullMethod("Host"), Key: "h:{host}"},
		{RPC: fullMethod("Stream"), Key: "s:{host}"},
		{Method: http.MethodPost, Path: "/api/nowhere", Key: "x:{uid}"}, // not CheckMethods' business
	}
	tests := []struct {
		name string
		bad  Rule
		want string
	}{
		{"all found", Rule{RPC: fullMethod("Two"), Key: "p:{host}"}, ""},
		{"no such method", Rule{RPC: fullMethod("Deduct"), Key: "d:{host}"},
			"Lock.Rules[3]: /flightlock.test.Locked/Deduct matches no method of the server"},
		{"case", Rule{RPC: "/flightlock.test.locked/host", Key: "d:{host}"},
			"Lock.Rules[3]: /flightlock.test.locked/host matches no method of the server (did you mean /flightlock.test.Locked/Host?)"},
		{"no such service", Rule{RPC: "/inventory.Inventory/Deduct", Key: "d:{sku}"},
			"Lock.Rules[3]: /inventory.Inventory/Deduct matches no method of the server: it has no service inventory.Inventory"},
		{"misspelt method", Rule{RPC: fullMethod("Hots"), Key: "d:{host}"},
			"Lock.Rules[3]: /flightlock.test.Locked/Hots matches no method of the server (did you mean /flightlock.test.Locked/Host?)"},
		{"service without its package", Rule{RPC: "/Locked/Host", Key: "d:{host}"},
			"Lock.Rules[3]: /Locked/Host matches no method of the server (did you mean /flightlock.test.Locked/Host? a full method name starts with the proto package)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := newTestRedis(t)
			m := newMiddleware(t, tr, LockConf{Rules: append(append([]Rule(nil), ok...), tt.bad)})
			err := m.CheckMethods(info)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("CheckMethods: %v", err)
			case tt.want != "" && (err == nil || err.Error() != tt.want || !errors.Is(err, flightlock.ErrConfig)):
				t.Fatalf("CheckMethods: %v, want %q (ErrConfig)", err, tt.want)
			}
		})
	}
}
