package middleware

import (
	"cmp"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/rest"
	"google.golang.org/grpc"

	"github.com/flightlock/flightlock/middleware/rules"
)

// CheckRoutes reports the first rule whose Method and Path name no route in routes
// ("Lock.Rules[2]: POST /api/stock/deduct matches no route of the server"): such a rule would
// lock nothing, silently. A rule names a route when its Method is empty or the route's, and its
// Path is the route's pattern once both are cleaned (path.Clean, as go-zero's router does),
// variable names included (/api/sku/:sku names no route /api/sku/:id). It checks the rules of
// Route and RouteFunc too, reports a named rule that no Named(Name) middleware is on (naming
// it: "Lock.Rules[0] (StockLock): ..."), and a Route or RouteFunc middleware on no route. Call
// it at start-up, after the routes are added and before Start:
//
//	mw.MustCheckRoutes(server.Routes())
//
// It cannot see whether server.Use(mw.Handle) was called (go-zero applies such middlewares
// only at Start), nor which route group a Route or Named middleware wraps: keep a rule's Path
// inside the group whose @server block names its middleware. Rules that name only an RPC
// method are left to CheckMethods.
func (m *Middleware) CheckRoutes(routes []rest.Route) error {
	if !slices.ContainsFunc(m.rules, func(cr *compiledRule) bool { return cr.http != nil }) {
		// A Lock section wired into a REST server whose rules are all RPC rules (an RPC rule
		// copied into a REST service's YAML) locks nothing there, as Register refuses the
		// reverse on a zrpc server.
		for _, cr := range m.rules {
			if cr.rpc != nil && cr.http == nil {
				return rules.FieldError(cr.spec.Field, "is an RPC rule in the Lock section of a REST server, which has no REST rule: "+
					"it would lock no request; name the route the rule is for with Method and Path (or Name for a goctl @server middleware)")
			}
		}
	}
	clean := make([]rest.Route, 0, len(routes))
	for _, rt := range routes {
		if rt.Path != "" && rt.Path[0] == '/' { // the router refuses the others
			clean = append(clean, rest.Route{Method: rt.Method, Path: path.Clean(rt.Path)})
		}
	}
	for _, cr := range slices.Concat(m.rules, m.routed.list()) {
		if err := m.checkNamed(cr.spec); err != nil {
			return err
		}
		rl := cr.http
		switch {
		case rl == nil:
			continue
		case rl.Route.Text == "" && rl.Method == "": // a named rule for a whole group
			continue
		case rl.Route.Text == "": // Route or a named rule with a Method only
			if !slices.ContainsFunc(clean, func(rt rest.Route) bool { return rt.Method == rl.Method }) {
				return rules.FieldError(ruleLabel(cr.spec), "%s matches no route of the server", rl.Method)
			}
			continue
		}
		if slices.ContainsFunc(clean, func(rt rest.Route) bool {
			return rt.Path == rl.Route.Text && (rl.Method == "" || rt.Method == rl.Method)
		}) {
			continue
		}
		what := strings.TrimPrefix(rl.Method+" "+rl.Route.Text, " ")
		if near, ok := nearRoute(rl, clean); ok {
			return rules.FieldError(ruleLabel(cr.spec), "%s matches no route of the server (did you mean %s %s?)", what, near.Method, near.Path)
		}
		return rules.FieldError(ruleLabel(cr.spec), "%s matches no route of the server", what)
	}
	for _, cr := range m.routed.list() {
		if m.routed.routeWraps(cr) == 0 {
			// Built, but on no handler: the goctl ServiceContext field is set while the .api
			// file's @server block does not list the middleware. It would lock nothing.
			return rules.FieldError(cr.label, "locks nothing: its middleware is on no route (rest.WithMiddlewares of a route group)")
		}
	}
	return nil
}

// MustCheckRoutes is CheckRoutes for start-up code: a rule that matches no route stops the
// service with one line on stderr and in the log, naming the rule and the route it probably
// meant, and exit status 1, as MustNew does (logx.Must would add a stack trace that says
// nothing more). Call it after the routes are added and before Start:
//
//	ctx.Lock.MustCheckRoutes(server.Routes())
func (m *Middleware) MustCheckRoutes(routes []rest.Route) {
	mustStart(m.CheckRoutes(routes))
}

// checkNamed reports a named rule whose middleware is not on any route: Named never built it
// (the ServiceContext field is not set with Named), or built it but no route was added with
// it (the .api file's @server block lacks the middleware). Either way the rule locks nothing.
func (m *Middleware) checkNamed(s rules.Spec) error {
	if s.Name == "" {
		return nil
	}
	switch built, handlers := m.routed.wired(s.Name); {
	case !built:
		return rules.FieldError(ruleLabel(s), "locks nothing: no middleware was built with Named(%q) for @server(middleware: %s)", s.Name, s.Name)
	case handlers == 0:
		return rules.FieldError(ruleLabel(s), "locks nothing: the middleware of Named(%q) is on no route; add the routes with it (@server(middleware: %s), rest.WithMiddlewares) before CheckRoutes", s.Name, s.Name)
	}
	return nil
}

// nearRoute finds the route that a rule matching no route most likely meant: the same
// pattern for another method, the same pattern with other variable names, or the pattern
// behind a group prefix that the rule's Path lacks (goctl's @server(prefix: ...)).
func nearRoute(rl *rule, routes []rest.Route) (rest.Route, bool) {
	shape := rules.RouteShape(rl.Route.Text)
	for _, near := range []func(rest.Route) bool{
		func(rt rest.Route) bool { return rt.Path == rl.Route.Text },
		func(rt rest.Route) bool {
			return rules.RouteShape(rt.Path) == shape && (rl.Method == "" || rt.Method == rl.Method)
		},
		func(rt rest.Route) bool {
			return strings.HasSuffix(rules.RouteShape(rt.Path), shape) && (rl.Method == "" || rt.Method == rl.Method)
		},
	} {
		if i := slices.IndexFunc(routes, near); i >= 0 {
			return routes[i], true
		}
	}
	return rest.Route{}, false
}

// CheckMethods reports the first rule with an RPC that names no method in info, naming the
// rule: "Lock.Rules[3]: /inventory.Inventory/Dedcut matches no method of the server". info is
// what grpc.Server.GetServiceInfo returns once the services are registered; with zrpc, check
// at the end of the function that registers them, which zrpc runs before it serves:
//
//	s := zrpc.MustNewServer(c.RpcServerConf, func(gs *grpc.Server) {
//		pb.RegisterInventoryServer(gs, server.NewInventoryServer(ctx))
//		logx.Must(mw.CheckMethods(gs.GetServiceInfo()))
//	})
//
// Rules that name only a REST route are left to CheckRoutes.
func (m *Middleware) CheckMethods(info map[string]grpc.ServiceInfo) error {
	for _, cr := range m.rules {
		if cr.rpc == nil {
			continue
		}
		full := cr.spec.RPC
		svc, method, _ := strings.Cut(strings.TrimPrefix(full, "/"), "/")
		if slices.ContainsFunc(info[svc].Methods, func(mi grpc.MethodInfo) bool { return mi.Name == method }) {
			continue
		}
		for name, si := range info {
			for _, mi := range si.Methods {
				if near := "/" + name + "/" + mi.Name; strings.EqualFold(near, full) {
					return rules.FieldError(cr.spec.Field, "%s matches no method of the server (did you mean %s?)", full, near)
				}
			}
		}
		if _, ok := info[svc]; !ok {
			return rules.FieldError(cr.spec.Field, "%s matches no method of the server: it has no service %s", full, svc)
		}
		return rules.FieldError(cr.spec.Field, "%s matches no method of the server", full)
	}
	return nil
}

// Register wraps the function that registers a zrpc server's services (zrpc.MustNewServer's
// second argument). When the server starts and has registered them, it stops the service, with
// one line naming the rule, when a rule names an RPC the server does not serve (with the
// nearest method: names match as gRPC matches them, case-sensitively, as full names), or when
// the server's chain lacks the interceptor a rule's method needs (the unary one for unary
// methods, the stream one for streams): its calls would run unlocked. To know the chain, it
// adds a service of its own, flightlock.InterceptorProbeN, and calls it once in process (no
// listener) before the server serves; an interceptor of the Middleware answers that call
// itself. When another interceptor refuses the call first (zrpc's Auth), the interceptors
// built with this Middleware count instead.
//
//	s := zrpc.MustNewServer(c.RpcServerConf, mw.Register(func(gs *grpc.Server) {
//		pb.RegisterInventoryServer(gs, server.NewInventoryServer(ctx))
//	}))
//	s.AddUnaryInterceptors(mw.UnaryServerInterceptor())
func (m *Middleware) Register(register func(*grpc.Server)) func(*grpc.Server) {
	return func(gs *grpc.Server) {
		register(gs)
		info := gs.GetServiceInfo() // the service's own, without the probe's
		unary, stream := probeUnknown, probeUnknown
		if len(m.rpc) > 0 {
			p := newInterceptorProbe()
			p.register(gs)
			m.probe.Store(p)
			unary, stream = p.run(gs)
		}
		mustStart(m.checkServer(info, unary, stream))
	}
}

// checkServer is Register's check of a server's services and interceptors: each RPC rule needs
// the interceptor of its method's kind (a unary method the unary one, a streaming method the
// stream one), since a server runs each kind of call through its own chain only.
// unary and stream are what the probe found out about the server's chains; where it could not
// tell, what was built counts.
func (m *Middleware) checkServer(info map[string]grpc.ServiceInfo, unary, stream probeVerdict) error {
	if len(m.rpc) == 0 {
		// A Lock section wired into a zrpc server whose rules are all REST rules (a REST rule
		// copied into an RPC service's YAML) locks nothing there: refuse it, as a rule for a
		// method the server does not serve is refused. Rules built in Go for REST routes
		// (Route, RouteFunc) are the service's own choice and are left alone.
		for _, cr := range m.rules {
			if cr.http != nil && cr.label == "" {
				return rules.FieldError(cr.spec.Field, "is a REST rule (Method, Path or Name) in the Lock section of a zrpc server, "+
					"which has no RPC rule: it would lock no call; name the method the rule is for with RPC: /package.Service/Method")
			}
		}
	}
	for _, cr := range m.rules {
		if cr.rpc == nil {
			continue
		}
		if streaming(info, cr.spec.RPC) {
			if !installed(stream, &m.streamIntercepting) {
				return rules.FieldError(cr.spec.Field, "%s is a streaming method and the zrpc server runs its streams without "+
					"this Middleware's stream interceptor: add s.AddStreamInterceptors(mw.StreamServerInterceptor()), or its streams run unlocked", cr.spec.RPC)
			}
			continue
		}
		if !installed(unary, &m.unaryIntercepting) {
			return rules.FieldError(cr.spec.Field, "%s is locked by no interceptor: the zrpc server runs its unary calls without "+
				"this Middleware's unary interceptor: add s.AddUnaryInterceptors(mw.UnaryServerInterceptor()), or its calls run unlocked", cr.spec.RPC)
		}
	}
	if err := m.CheckMethods(info); err != nil {
		return fmt.Errorf("%w (gRPC matches full method names case-sensitively)", err)
	}
	return nil
}

// installed reports whether an interceptor is in the server's chain: as the probe found, or,
// when it could not tell, whether it was built at all.
func installed(v probeVerdict, built *atomic.Bool) bool {
	if v == probeUnknown {
		return built.Load()
	}
	return v == probeInstalled
}

// streaming reports whether full (/package.Service/Method) is a streaming method of the
// server, as its registered services say; a method it does not serve counts as unary (the
// method check reports it).
func streaming(info map[string]grpc.ServiceInfo, full string) bool {
	svc, method, _ := strings.Cut(strings.TrimPrefix(full, "/"), "/")
	for _, mi := range info[svc].Methods {
		if mi.Name == method {
			return mi.IsClientStream || mi.IsServerStream
		}
	}
	return false
}

// routedRules are the rules given to Route and RouteFunc with a Method or a Path, and the
// middlewares that Named built, for CheckRoutes.
type routedRules struct {
	mu    sync.Mutex
	rules []*compiledRule       // guarded by mu
	named map[string]int        // guarded by mu; Rule.Name => handlers its Named middlewares wrap
	wraps map[*compiledRule]int // guarded by mu; Route rule => handlers its middleware wraps
}

// wrapRoute records that the middleware of a Route rule was put on a handler (go-zero's
// rest.WithMiddlewares wraps the handlers of a group when the routes are added).
func (r *routedRules) wrapRoute(cr *compiledRule) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.wraps == nil {
		r.wraps = make(map[*compiledRule]int)
	}
	r.wraps[cr]++
}

// routeWraps returns on how many handlers the middleware of a Route rule was put.
func (r *routedRules) routeWraps(cr *compiledRule) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.wraps[cr]
}

// build records that Named built the middleware of the rule named name.
func (r *routedRules) build(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.named == nil {
		r.named = make(map[string]int)
	}
	if _, ok := r.named[name]; !ok {
		r.named[name] = 0
	}
}

// wrap records that a Named middleware of the rule named name was put on a handler.
func (r *routedRules) wrap(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.named[name]++
}

// wired reports whether Named built the middleware of the rule named name, and on how many
// handlers its middlewares were put.
func (r *routedRules) wired(name string) (built bool, handlers int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	handlers, built = r.named[name]
	return built, handlers
}

func (r *routedRules) add(cr *compiledRule) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rules = append(r.rules, cr)
}

func (r *routedRules) list() []*compiledRule {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.rules)
}

// logWaitsPastTimeout logs, at error level, each rule of rules that waits for a busy key (wait
// and share, not in shadow) with a Wait not below timeout, go-zero's server timeout (0: none).
// Such a rule is not refused: the wait still ends a reserve before the request's deadline, so
// the busy answer arrives, but it arrives when the caller has no time left to retry.
func logWaitsPastTimeout(c LockConf, compiled []*compiledRule, timeout time.Duration) {
	if timeout <= 0 {
		return
	}
	for _, cr := range compiled {
		r := cr.spec.Rule
		wait := cmp.Or(r.Wait, c.Wait)
		if r.Shadow || r.OnBusy == rules.OnBusyReject || wait < timeout {
			continue
		}
		logx.Errorf("%s: Wait %s is not below the server's Timeout %s: a busy key holds the request "+
			"until its deadline, and the caller gets the busy answer with no time left to retry; "+
			"set Wait (or Lock.Wait) below Timeout", ruleLabel(cr.spec), wait, timeout)
	}
}

// logTrustWithoutSecret logs, at error level, a section that honours propagated owners
// (TrustOwner) without checking their signature (no OwnerSecret): any client that reaches the
// service may name an owner token it learned (from a log line, from flightlock ls) and
// re-enter that lock beside its holder. It is not refused: a closed network may be trust
// enough, as the README says.
func logTrustWithoutSecret(c LockConf) {
	if !c.TrustOwner || c.OwnerSecret != "" {
		return
	}
	logx.Errorf("Lock.TrustOwner is on and Lock.OwnerSecret is empty: this service honours any lock owner " +
		"a caller names, so a client that can reach it and knows a holder's owner token enters that lock beside " +
		"its holder; set the same Lock.OwnerSecret on this service and on the services that call it")
}
