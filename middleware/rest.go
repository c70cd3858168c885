package middleware

import (
	"cmp"
	"net/http"

	"github.com/zeromicro/go-zero/rest"
)

// Handle is a rest.Middleware for server.Use: it locks the requests of every route that a
// rule names by Method and Path, and passes the others through untouched.
//
// go-zero gives a server.Use middleware no route, so Handle finds it from the request: the
// cleaned path must fit the rule's pattern and the path variables that go-zero's router set
// must be exactly the pattern's, which tells /sku/:id from a static /sku/list as the router
// does.
func (m *Middleware) Handle(next http.HandlerFunc) http.HandlerFunc {
	if m.http.empty() {
		return next
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if rl := m.http.match(r); rl != nil {
			m.serveHTTP(rl, w, r, next)
			return
		}
		next(w, r)
	}
}

// Route returns a rest.Middleware that locks every request it sees per rule, whatever the
// route: for rest.WithMiddlewares on a route group, or the middleware of a goctl
// @server(middleware: X) block. rule.Method and rule.RPC are ignored; rule.Path, when set,
// only serves to check {path.x} references at start-up.
func (m *Middleware) Route(rule Rule) (rest.Middleware, error) {
	return m.route(spec{Rule: rule, name: "Rule"})
}

// RouteFunc is Route with a key computed in Go by key instead of rule.Key.
func (m *Middleware) RouteFunc(rule Rule, key KeyFunc) (rest.Middleware, error) {
	if key == nil {
		return nil, fieldError("RouteFunc", "nil key function")
	}
	return m.route(spec{Rule: rule, name: "Rule", httpKey: key})
}

func (m *Middleware) route(s spec) (rest.Middleware, error) {
	if s.Key == "" && s.httpKey == nil {
		return nil, fieldError(s.name+".Key", "is empty")
	}
	if err := checkLockSettings(s.name, s.Rule); err != nil {
		return nil, err
	}
	s.Method, s.RPC = "", ""
	rl, err := compileHTTP(s)
	if err != nil {
		return nil, err
	}
	rl.name = cmp.Or(rl.name, "route "+s.Key)
	if rl.locker, err = m.ruleLocker(s.Rule); err != nil {
		return nil, fieldError(s.name, "%v", err)
	}
	return func(next http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			m.serveHTTP(rl, w, r, next)
		}
	}, nil
}

// serveHTTP runs next under the lock of rl's keys for r. The handler gets the lease's context
// (flightlock.FromContext works in it) and the body as it came, even when the key read it.
// The lock is released when next returns or panics; the panic then goes on to go-zero's
// recover handler.
func (m *Middleware) serveHTTP(rl *rule, w http.ResponseWriter, r *http.Request, next http.HandlerFunc) {
	keys, err := rl.httpKeys(r)
	if err != nil {
		writeHTTPError(w, r, err)
		return
	}
	ctx := r.Context()
	g, err := m.lock(ctx, rl, keys)
	if err != nil {
		writeHTTPError(w, r, err)
		return
	}
	defer m.release(ctx, rl, g)
	next(w, r.WithContext(g.Context()))
}
