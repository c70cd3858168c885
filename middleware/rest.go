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
// rule names by Method and Path, passing the others through. go-zero gives it no route, so it
// finds it as the router did (httpRoutes).
func (m *Middleware) Handle(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if rl := m.http.match(r); rl != nil {
			m.serveHTTP(rl, w, r, next)
			return
		}
		next(w, r)
	}
}

// Route returns a rest.Middleware that locks the requests it sees per rule, for a route group's
// rest.WithMiddlewares or a goctl @server(middleware: X) block. Method and Path, when set, narrow
// them (as Handle matches); rule.RPC and rule.Name are ignored (see Named).
func (m *Middleware) Route(rule Rule) (rest.Middleware, error) {
	return m.route("Route", rules.Spec{Rule: rule, Field: "Rule"})
}

// MustRoute is Route for start-up code (goctl's NewServiceContext): a bad rule stops the service.
func (m *Middleware) MustRoute(rule Rule) rest.Middleware {
	mw, err := m.Route(rule)
	mustStart(err)
	return mw
}

// RouteFunc is Route with a key computed in Go by key; rule.Key must be empty.
func (m *Middleware) RouteFunc(rule Rule, key KeyFunc) (rest.Middleware, error) {
	if key == nil {
		return nil, rules.FieldError("RouteFunc", "nil key function")
	}
	return m.route("RouteFunc", rules.Spec{Rule: rule, Field: "Rule", HTTPKey: key})
}

// route is Route and RouteFunc, named name in CheckRoutes' errors. The template compiler
// refuses an empty Key, in the words of a Lock.Rules entry's.
func (m *Middleware) route(name string, s rules.Spec) (rest.Middleware, error) {
	if s.Key != "" && s.HTTPKey != nil {
		return nil, rules.FieldError(s.Field+".Key", "is set on a rule whose key a function computes: leave it out")
	}
	s.Rule = s.Rule.Normalized()
	if err := cmp.Or(rules.OneOf(s.Field+".Method", s.Method, rules.HTTPMethods...),
		rules.CheckLockSettings(s.Field, s.Rule, m.conf.OnStoreError)); err != nil {
		return nil, err
	}
	s.RPC, s.Name = "", ""
	plan, err := rules.CompileHTTP(s)
	if err != nil {
		return nil, err
	}
	rl := &rule{Plan: plan}
	rl.Name = cmp.Or(rl.Name, "route "+s.Key)
	cr := &compiledRule{spec: rules.Spec{Rule: s.Rule, Field: name, HTTPKey: s.HTTPKey}, http: rl,
		label: strings.TrimSpace(fmt.Sprintf("%s(%s %s)", name, s.Method, s.Path))}
	// One route is locked by one rule: two keys in two orders can answer 409 for nothing.
	for _, prev := range m.rules {
		if prev.http != nil && prev.spec.Name == "" && prev.http.Overlaps(rl.Plan) {
			return nil, rules.FieldError(cr.label, "%s %s is already locked by %s", s.Method, s.Path, prev.spec.Field)
		}
	}
	if err := m.lockRule(cr, s, false); err != nil {
		return nil, err
	}
	m.routedMu.Lock()
	m.routed = append(m.routed, cr)
	m.routedMu.Unlock()
	return m.groupMiddleware([]*compiledRule{cr}), nil
}

// groupMiddleware is the rest.Middleware of Route, RouteFunc and Named: it locks the requests
// of each rule's Method and Path (when set), and counts in each rule the handlers it wraps.
func (m *Middleware) groupMiddleware(crs []*compiledRule) rest.Middleware {
	applies := make([]func(*http.Request) bool, len(crs))
	for i, cr := range crs {
		cr.built.Store(true)
		method := cr.http.Method
		applies[i] = func(r *http.Request) bool { return method == "" || r.Method == method }
		if cr.http.Route.Text != "" {
			var only httpRoutes
			only.add(cr.http)
			applies[i] = func(r *http.Request) bool { return only.match(r) != nil }
		}
	}
	return func(next http.HandlerFunc) http.HandlerFunc {
		for _, cr := range crs {
			cr.wraps.Add(1)
		}
		return func(w http.ResponseWriter, r *http.Request) {
			for i, cr := range crs {
				if applies[i](r) {
					m.serveHTTP(cr.http, w, r, next)
					return
				}
			}
			next(w, r)
		}
	}
}

// serveHTTP runs next under the lock of rl's keys for r, with the lease's context and the body
// as it came, releasing it when next returns or panics.
func (m *Middleware) serveHTTP(rl *rule, w http.ResponseWriter, r *http.Request, next http.HandlerFunc) {
	ctx := r.Context()
	keys, err := rl.HTTPKeys(r)
	if err == nil && rl.share != nil {
		rl.share.HandleHTTP(w, r, next, keys)
		return
	}
	h, err := m.lock(ctx, rl, keys, err)
	if err != nil {
		writeHTTPError(w, r, err)
		return
	}
	defer m.release(ctx, rl, h)
	if h.Ctx != ctx {
		r = r.WithContext(h.Ctx)
	}
	next(w, r)
}
