package middleware

import (
	"cmp"
	"fmt"
	"net/http"
	"strings"

	"github.com/flightlock/flightlock/middleware/rules"
	"github.com/zeromicro/go-zero/rest"
)

// Handle is a rest.Middleware for server.Use: it locks the requests of every route that a
// rule names by Method and Path, and passes the others through untouched.
//
// go-zero gives a server.Use middleware no route, so Handle finds it from the request as
// go-zero's router found it: the rule patterns sit in go-zero's own search trees, per method
// and per set of path variables, and the pattern found for the cleaned path must yield exactly
// the path variables that the router set. That tells /sku/:id from a static /sku/list, with
// the router's precedence (see httpRoutes). CheckRoutes tells at start-up whether each rule
// names a route of the server at all.
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

// Route returns a rest.Middleware that locks the requests it sees per rule: for
// rest.WithMiddlewares on a route group, or the middleware of a goctl @server(middleware: X)
// block. A rule with a Method locks only requests of that method, and a rule with a Path only
// requests of that route (matched as Handle matches), so one middleware on a goctl group can
// lock its POST /api/stock/:sku/deduct and leave its GET /api/stock/:sku alone; the other
// requests pass through untouched. Without Method and Path it locks every request of the
// group. rule.RPC and rule.Name are ignored: Named gives the middleware of a rule of the
// LockConf. CheckRoutes also checks the rules given to Route.
func (m *Middleware) Route(rule Rule) (rest.Middleware, error) {
	return m.route(rules.Spec{Rule: rule, Field: "Rule"})
}

// MustRoute is Route for start-up code such as goctl's NewServiceContext, which returns no
// error: it exits with the rule's error in one line on a bad rule, as MustNew does.
func (m *Middleware) MustRoute(rule Rule) rest.Middleware {
	mw, err := m.Route(rule)
	mustStart(err)
	return mw
}

// RouteFunc is Route with a key computed in Go by key instead of rule.Key.
func (m *Middleware) RouteFunc(rule Rule, key KeyFunc) (rest.Middleware, error) {
	if key == nil {
		return nil, rules.FieldError("RouteFunc", "nil key function")
	}
	return m.route(rules.Spec{Rule: rule, Field: "Rule", HTTPKey: key})
}

func (m *Middleware) route(s rules.Spec) (rest.Middleware, error) {
	if s.Key == "" && s.HTTPKey == nil {
		return nil, rules.FieldError(s.Field+".Key", "is empty")
	}
	s.Rule = s.Rule.Normalized()
	if err := rules.OneOf(s.Field+".Method", s.Method, rules.HTTPMethods...); err != nil {
		return nil, err
	}
	if err := rules.CheckLockSettings(s.Field, s.Rule, m.conf.OnStoreError); err != nil {
		return nil, err
	}
	s.RPC, s.Name = "", ""
	plan, err := rules.CompileHTTP(s)
	if err != nil {
		return nil, err
	}
	rl := &rule{Plan: plan}
	rl.Name = cmp.Or(rl.Name, "route "+s.Key)
	cr := &compiledRule{spec: rules.Spec{Rule: s.Rule, Field: "Route", HTTPKey: s.HTTPKey}, http: rl}
	store, base, err := m.baseFor(s)
	if err != nil {
		return nil, err
	}
	if !m.injected {
		if err := m.conf.CheckRuleStore(s); err != nil {
			return nil, err
		}
	}
	if rl.locker, err = m.ruleLocker(base, s.Rule, cr.setStats(store)); err != nil {
		return nil, rules.FieldError(s.Field, "%v", err)
	}
	if err := m.shareParts(cr, s.Field, store, false); err != nil {
		return nil, err
	}
	name := "Route"
	if s.HTTPKey != nil {
		name = "RouteFunc"
	}
	label := strings.TrimSpace(fmt.Sprintf("%s(%s %s)", name, s.Method, s.Path))
	if s.Path != "" {
		// One route is locked by one rule: a Route on a route that a rule of Handle locks
		// would take its lock twice (and two keys in two orders can answer 409 for nothing).
		for _, prev := range m.rules {
			if p := prev.http; p != nil && prev.spec.Name == "" && p.Route.Text == rl.Route.Text &&
				(p.Method == "" || rl.Method == "" || p.Method == rl.Method) {
				return nil, rules.FieldError(label, "%s %s is already locked by %s", s.Method, s.Path, prev.spec.Field)
			}
		}
	}
	cr.spec.Field, cr.label = name, label
	m.routed.add(cr)
	return m.groupMiddleware([]*rule{rl}, func() { m.routed.wrapRoute(cr) }), nil
}

// groupMiddleware is the rest.Middleware of Route, RouteFunc and Named: it locks the requests
// of rl's Method and Path (each when set) per rl, and passes the others through untouched.
// wrapped, when not nil, is called each time the middleware is put on a handler (go-zero's
// rest.WithMiddlewares does that as the routes are built), for CheckRoutes.
func (m *Middleware) groupMiddleware(rls []*rule, wrapped func()) rest.Middleware {
	// applies[i] reports whether r is a request of rls[i]'s method and route.
	applies := make([]func(*http.Request) bool, len(rls))
	for i, rl := range rls {
		applies[i] = func(*http.Request) bool { return true }
		switch {
		case rl.Route.Text != "":
			var only httpRoutes
			only.add(rl)
			applies[i] = func(r *http.Request) bool { return only.match(r) != nil }
		case rl.Method != "":
			method := rl.Method
			applies[i] = func(r *http.Request) bool { return r.Method == method }
		}
	}
	return func(next http.HandlerFunc) http.HandlerFunc {
		if wrapped != nil {
			wrapped()
		}
		return func(w http.ResponseWriter, r *http.Request) {
			for i, rl := range rls {
				if applies[i](r) {
					m.serveHTTP(rl, w, r, next)
					return
				}
			}
			next(w, r)
		}
	}
}

// serveHTTP runs next under the lock of rl's keys for r. The handler gets the lease's context
// (flightlock.FromContext works in it) and the body as it came, even when the key read it.
// The lock is released when next returns or panics; the panic then goes on to go-zero's
// recover handler.
func (m *Middleware) serveHTTP(rl *rule, w http.ResponseWriter, r *http.Request, next http.HandlerFunc) {
	ctx := r.Context()
	keys, err := rl.HTTPKeys(r)
	if err != nil {
		if m.badKey(ctx, rl, err) {
			next(w, r)
			return
		}
		writeHTTPError(w, r, err)
		return
	}
	if rl.share != nil {
		rl.share.HandleHTTP(w, r, next, keys)
		return
	}
	h, err := m.lock(ctx, rl, keys)
	if err != nil {
		writeHTTPError(w, r, err)
		return
	}
	defer m.release(ctx, rl, h)
	if h.ctx != ctx {
		r = r.WithContext(h.ctx)
	}
	next(w, r)
}
