package middleware

import (
	"cmp"
	"fmt"
	"maps"
	"net/http"
	"path"
	"slices"
	"strings"

	"github.com/flightlock/flightlock/middleware/rules"
	"github.com/zeromicro/go-zero/core/search"
	"github.com/zeromicro/go-zero/rest"
	"github.com/zeromicro/go-zero/rest/pathvar"
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

// MustRoute is Route for start-up code (goctl's NewServiceContext): a bad rule stops the service
// as MustNew does (one line naming the field, exit 1).
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

// Named returns the rest.Middleware of the LockConf rules named name, for the route group of a
// goctl @server(middleware: name) block, keeping the key in the YAML. It locks the requests of
// the group as Route does, by the first rule of that name in config order that matches. A name
// no rule has is an error; CheckRoutes reports a named rule whose middleware is on no route.
func (m *Middleware) Named(name string) (rest.Middleware, error) {
	crs := slices.DeleteFunc(slices.Clone(m.rules), func(cr *compiledRule) bool { return cr.spec.Name != name })
	if len(crs) == 0 {
		return nil, m.unknownName(name)
	}
	return m.groupMiddleware(crs), nil
}

// MustNamed is Named for goctl's NewServiceContext: an unknown name stops the service as MustNew
// does (one line naming the field, exit 1).
func (m *Middleware) MustNamed(name string) rest.Middleware {
	mw, err := m.Named(name)
	mustStart(err)
	return mw
}

// unknownName is Named's error for a name no rule has, with the one probably meant (goctl
// middleware names are Go identifiers, matched exactly).
func (m *Middleware) unknownName(name string) error {
	if name == "" {
		return rules.FieldError("Named", "the name is empty")
	}
	var names []string
	for _, cr := range m.rules {
		if n := cr.spec.Name; n != "" {
			if strings.EqualFold(n, name) {
				return rules.FieldError("Lock.Rules", "has no rule named %s (did you mean %s?)", name, n)
			}
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return rules.FieldError("Lock.Rules", "has no rule named %s: no rule has a Name", name)
	}
	return rules.FieldError("Lock.Rules", "has no rule named %s; the named rules are %s", name, strings.Join(names, ", "))
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

// routerMethods are the methods go-zero's router accepts: a rule without Method is in each tree.
var routerMethods = [...]string{
	http.MethodDelete, http.MethodGet, http.MethodHead, http.MethodOptions,
	http.MethodPatch, http.MethodPost, http.MethodPut,
}

// httpRoutes finds the rule that names the route go-zero's router dispatched a request to. A
// server.Use middleware sees the method, the path and the route's variables (pathvar.Vars),
// not the route. So the rule patterns sit in core/search.Trees, as the router's do, one per
// method and set of variable names: search.Tree's precedence picks the pattern the router
// picks, and the pattern found must yield the very values the router set. A rule /sku/:id thus
// never locks a request routed to /sku/list or /sku/:sku; what stays ambiguous (/p/:x and
// /:x/p on /p/p) is resolved as the router resolves it.
type httpRoutes struct {
	byMethod map[string][]routeTree // built by New, read-only after
}

// routeTree holds the rule patterns of one method that declare the same variable names.
type routeTree struct {
	params []string     // the variable names of every pattern in tree
	tree   *search.Tree // cleaned pattern => *rule
}

// add puts a rule with a Path in the tree of its method, or of every method the router
// accepts; compileRules refused two rules on one pattern and method, so it cannot fail.
func (h *httpRoutes) add(r *rule) {
	if h.byMethod == nil {
		h.byMethod = make(map[string][]routeTree)
	}
	methods := []string{r.Method}
	if r.Method == "" {
		methods = routerMethods[:]
	}
	for _, method := range methods {
		if err := h.treeFor(method, r.Route.Params).Add(r.Route.Text, r); err != nil {
			panic(fmt.Sprintf("flightlock: rule %s: %v", r.Name, err))
		}
	}
}

func (h *httpRoutes) treeFor(method string, params []string) *search.Tree {
	for _, t := range h.byMethod[method] {
		if len(t.params) == len(params) && !slices.ContainsFunc(params, func(p string) bool { return !slices.Contains(t.params, p) }) {
			return t.tree
		}
	}
	t := routeTree{params: params, tree: search.NewTree()}
	h.byMethod[method] = append(h.byMethod[method], t)
	return t.tree
}

func (h *httpRoutes) match(r *http.Request) *rule {
	trees := h.byMethod[r.Method]
	if len(trees) == 0 {
		return nil
	}
	vars := pathvar.Vars(r)
	for _, t := range trees {
		if !t.declares(vars) {
			continue
		}
		found, ok := t.tree.Search(path.Clean(r.URL.Path)) // as the router searches
		if !ok || !maps.Equal(found.Params, vars) {
			return nil
		}
		return found.Item.(*rule)
	}
	return nil
}

// declares reports whether t's patterns declare exactly the variables in vars.
func (t *routeTree) declares(vars map[string]string) bool {
	return len(t.params) == len(vars) && !slices.ContainsFunc(t.params, func(p string) bool {
		_, ok := vars[p]
		return !ok
	})
}
