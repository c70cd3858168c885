package middleware

import (
	"cmp"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/rest"
	"google.golang.org/grpc"

	"github.com/flightlock/flightlock/internal/typo"
	"github.com/flightlock/flightlock/middleware/rules"
)

// CheckRoutes reports the first rule whose Method and Path name no route in routes, which would
// silently lock nothing ("Lock.Rules[2]: POST /api/stock/deduct matches no route of the server"):
// a rule's Method must be empty or the route's, and its Path the route's pattern (both cleaned,
// variable names included). It also reports a named rule that no Named(Name) middleware is on,
// and a Route or RouteFunc middleware on no route. Call it after adding routes, before Start:
//
//	mw.MustCheckRoutes(server.Routes())
//
// It cannot see whether server.Use(mw.Handle) was called, nor which group a Route or Named
// middleware wraps: keep a rule's Path inside its group. RPC-only rules are CheckMethods'.
func (m *Middleware) CheckRoutes(routes []rest.Route) error {
	if len(m.rules) > 0 && !slices.ContainsFunc(m.rules, func(cr *compiledRule) bool { return cr.http != nil }) {
		// RPC rules alone lock nothing on a REST server (Register refuses the reverse).
		return rules.FieldError(m.rules[0].spec.Field, "is an RPC rule in the Lock section of a REST server, which has no REST rule: "+
			"it would lock no request; name the route the rule is for with Method and Path (or Name for a goctl @server middleware)")
	}
	clean := make([]rest.Route, 0, len(routes))
	for _, rt := range routes {
		if rt.Path != "" && rt.Path[0] == '/' { // the router refuses the others
			clean = append(clean, rest.Route{Method: rt.Method, Path: path.Clean(rt.Path)})
		}
	}
	m.routedMu.Lock()
	routed := slices.Clone(m.routed)
	m.routedMu.Unlock()
	for _, cr := range slices.Concat(m.rules, routed) {
		if err := checkNamed(cr); err != nil {
			return err
		}
		rl := cr.http
		if rl == nil || rl.Route.Text == "" && rl.Method == "" { // an RPC rule, or a named rule for a whole group
			continue
		}
		if slices.ContainsFunc(clean, func(rt rest.Route) bool {
			return (rl.Route.Text == "" || rt.Path == rl.Route.Text) && (rl.Method == "" || rt.Method == rl.Method)
		}) {
			continue
		}
		what := strings.TrimSpace(rl.Method + " " + rl.Route.Text)
		if near, ok := nearRoute(rl, clean); ok {
			return rules.FieldError(ruleLabel(cr.spec), "%s matches no route of the server (did you mean %s %s?)", what, near.Method, near.Path)
		}
		return rules.FieldError(ruleLabel(cr.spec), "%s matches no route of the server", what)
	}
	for _, cr := range routed {
		if cr.wraps.Load() == 0 {
			// Built, but the .api file's @server block does not list the middleware.
			return rules.FieldError(cr.label, "locks nothing: its middleware is on no route (rest.WithMiddlewares of a route group)")
		}
	}
	return nil
}

// MustCheckRoutes is CheckRoutes for start-up code: a problem stops the service as MustNew does.
func (m *Middleware) MustCheckRoutes(routes []rest.Route) {
	mustStart(m.CheckRoutes(routes))
}

// ruleLabel names a rule in CheckRoutes' errors: "Lock.Rules[0] (StockLock)".
func ruleLabel(s rules.Spec) string {
	if s.Name == "" {
		return s.Field
	}
	return fmt.Sprintf("%s (%s)", s.Field, s.Name)
}

// checkNamed reports a named rule whose Named middleware was never built, or is on no route.
func checkNamed(cr *compiledRule) error {
	switch s := cr.spec; {
	case s.Name == "":
	case !cr.built.Load():
		return rules.FieldError(ruleLabel(s), "locks nothing: no middleware was built with Named(%q) for @server(middleware: %s)", s.Name, s.Name)
	case cr.wraps.Load() == 0:
		return rules.FieldError(ruleLabel(s), "locks nothing: the middleware of Named(%q) is on no route; add the routes with it (@server(middleware: %s), rest.WithMiddlewares) before CheckRoutes", s.Name, s.Name)
	}
	return nil
}

// nearRoute finds the route a rule matching none most likely meant: its pattern for another
// method, with other variable names, behind a group prefix its Path lacks, or a few letters
// away (a misspelling, another case; another method counts as one more edit).
func nearRoute(rl *rule, routes []rest.Route) (rest.Route, bool) {
	shape := rules.RouteShape(rl.Route.Text)
	method := func(rt rest.Route) bool { return rl.Method == "" || rt.Method == rl.Method }
	for _, near := range []func(rest.Route) bool{
		func(rt rest.Route) bool { return rt.Path == rl.Route.Text },
		func(rt rest.Route) bool { return method(rt) && rules.RouteShape(rt.Path) == shape },
		func(rt rest.Route) bool { return method(rt) && strings.HasSuffix(rules.RouteShape(rt.Path), shape) },
	} {
		if i := slices.IndexFunc(routes, near); i >= 0 {
			return routes[i], true
		}
	}
	best, bestD := rest.Route{}, typo.Edits(rl.Route.Text)+1
	for _, rt := range routes {
		d := typo.Distance(rl.Route.Text, rt.Path)
		if !method(rt) {
			d++
		}
		if d < bestD {
			best, bestD = rt, d
		}
	}
	return best, best.Path != ""
}

// CheckMethods reports the first rule with an RPC that names no method in info, as
// grpc.Server.GetServiceInfo returns it once the services are registered; with zrpc, check at
// the end of the function that registers them (or use Register):
//
//	s := zrpc.MustNewServer(c.RpcServerConf, func(gs *grpc.Server) {
//		pb.RegisterInventoryServer(gs, server.NewInventoryServer(ctx))
//		logx.Must(mw.CheckMethods(gs.GetServiceInfo()))
//	})
//
// Rules that name only a REST route are left to CheckRoutes.
func (m *Middleware) CheckMethods(info map[string]grpc.ServiceInfo) error {
	for _, cr := range m.rules {
		full := cr.spec.RPC
		svc, _, ok := methodInfo(info, full)
		if cr.rpc == nil || ok {
			continue
		}
		if err := nearMethod(cr.spec.Field, full, info); err != nil {
			return err
		}
		if _, ok := info[svc]; !ok {
			return rules.FieldError(cr.spec.Field, "%s matches no method of the server: it has no service %s", full, svc)
		}
		return rules.FieldError(cr.spec.Field, "%s matches no method of the server", full)
	}
	return nil
}

// nearMethod is CheckMethods' error naming the method of info an RPC most likely meant: the
// same in another case, without its proto package (/Inventory/Reserve), or a few letters
// away; nil when none is that near.
func nearMethod(field, full string, info map[string]grpc.ServiceInfo) error {
	var methods []string
	for name, si := range info {
		for _, mi := range si.Methods {
			methods = append(methods, "/"+name+"/"+mi.Name)
		}
	}
	slices.Sort(methods) // the same answer whatever the map's order
	if i := slices.IndexFunc(methods, func(m string) bool { return strings.EqualFold(m, full) }); i >= 0 {
		return rules.FieldError(field, "%s matches no method of the server (did you mean %s?)", full, methods[i])
	}
	unqualified := "." + strings.TrimPrefix(full, "/")
	if i := slices.IndexFunc(methods, func(m string) bool { return strings.HasSuffix(m, unqualified) }); i >= 0 {
		return rules.FieldError(field, "%s matches no method of the server (did you mean %s? a full method name starts with the proto package)", full, methods[i])
	}
	best, bestD := "", typo.Edits(full)+1
	for _, m := range methods {
		if d := typo.Distance(full, m); d < bestD {
			best, bestD = m, d
		}
	}
	if best != "" {
		return rules.FieldError(field, "%s matches no method of the server (did you mean %s?)", full, best)
	}
	return nil
}

// Register wraps the function that registers a zrpc server's services (zrpc.MustNewServer's second
// argument). Once they are registered, it stops the service as MustNew does when a rule names an
// RPC the server does not serve, or the server's chain lacks the interceptor (unary or stream) the
// rule's method needs, which it finds out by registering a service flightlock.InterceptorProbeN
// and calling it once in process (when another interceptor, such as zrpc's Auth, refuses the
// probe first, the interceptors built with this Middleware count).
//
//	s := zrpc.MustNewServer(c.RpcServerConf, mw.Register(func(gs *grpc.Server) {
//		pb.RegisterInventoryServer(gs, server.NewInventoryServer(ctx))
//	}))
//	s.AddUnaryInterceptors(mw.UnaryServerInterceptor())
func (m *Middleware) Register(register func(*grpc.Server)) func(*grpc.Server) {
	return func(gs *grpc.Server) {
		register(gs)
		info := gs.GetServiceInfo() // the service's own, without the probe's
		unary, stream := m.unaryIntercepting.Load(), m.streamIntercepting.Load()
		if len(m.rpc) > 0 {
			p := &interceptorProbe{service: fmt.Sprintf("flightlock.InterceptorProbe%d", probeServices.Add(1))}
			p.register(gs)
			m.probe.Store(p)
			unary, stream = p.installed(gs, probeUnary, unary), p.installed(gs, probeStream, stream)
		}
		mustStart(m.checkServer(info, unary, stream))
	}
}

// checkServer is Register's check: each RPC rule needs the interceptor of its method's kind.
func (m *Middleware) checkServer(info map[string]grpc.ServiceInfo, unary, stream bool) error {
	if len(m.rpc) == 0 && len(m.rules) > 0 {
		// REST rules alone lock nothing on a zrpc server (Route rules are the service's choice).
		return rules.FieldError(m.rules[0].spec.Field, "is a REST rule (Method, Path or Name) in the Lock section of a zrpc server, "+
			"which has no RPC rule: it would lock no call; name the method the rule is for with RPC: /package.Service/Method")
	}
	for _, cr := range m.rules {
		if cr.rpc == nil {
			continue
		}
		_, mi, _ := methodInfo(info, cr.spec.RPC)
		switch streaming := mi.IsClientStream || mi.IsServerStream; {
		case streaming && !stream:
			return rules.FieldError(cr.spec.Field, "%s is a streaming method and the zrpc server runs its streams without "+
				"this Middleware's stream interceptor: add s.AddStreamInterceptors(mw.StreamServerInterceptor()), or its streams run unlocked", cr.spec.RPC)
		case !streaming && !unary:
			return rules.FieldError(cr.spec.Field, "%s is locked by no interceptor: the zrpc server runs its unary calls without "+
				"this Middleware's unary interceptor: add s.AddUnaryInterceptors(mw.UnaryServerInterceptor()), or its calls run unlocked", cr.spec.RPC)
		}
	}
	if err := m.CheckMethods(info); err != nil {
		return fmt.Errorf("%w (gRPC matches full method names case-sensitively)", err)
	}
	return nil
}

// methodInfo returns full's service and, if served, its info (else a unary method's zero info).
func methodInfo(info map[string]grpc.ServiceInfo, full string) (svc string, mi grpc.MethodInfo, ok bool) {
	svc, method, _ := strings.Cut(strings.TrimPrefix(full, "/"), "/")
	i := slices.IndexFunc(info[svc].Methods, func(mi grpc.MethodInfo) bool { return mi.Name == method })
	if i < 0 {
		return svc, mi, false
	}
	return svc, info[svc].Methods[i], true
}

// logWaitsPastTimeout logs each waiting rule whose Wait is not below go-zero's server timeout
// (0: none), without refusing it: the busy answer still arrives, with no time left to retry.
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

// logTrustWithoutSecret logs TrustOwner without OwnerSecret: a closed network may trust enough.
func logTrustWithoutSecret(c LockConf) {
	if !c.TrustOwner || c.OwnerSecret != "" {
		return
	}
	logx.Errorf("Lock.TrustOwner is on and Lock.OwnerSecret is empty: this service honours any lock owner " +
		"a caller names, so a client that can reach it and knows a holder's owner token enters that lock beside " +
		"its holder; set the same Lock.OwnerSecret on this service and on the services that call it")
}
