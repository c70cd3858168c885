package middleware

import (
	"path"
	"slices"
	"strings"
	"sync"

	"github.com/zeromicro/go-zero/rest"
	"google.golang.org/grpc"
)

// CheckRoutes reports the first rule with a Path that names no route in routes, naming the
// rule: "Lock.Rules[2]: POST /api/stock/deduct matches no route of the server". A rule names
// a route when its Method is empty or the route's, and its Path is the route's pattern once
// both are cleaned (path.Clean, as go-zero's router does), variable names included: a rule
// /api/sku/:sku names no route /api/sku/:id. The rules given to Route and RouteFunc with a
// Method or Path are checked too. Such a rule would lock nothing, silently; call CheckRoutes
// at start-up, after the routes are added and before Start:
//
//	logx.Must(mw.CheckRoutes(server.Routes()))
//
// Rules that name only an RPC method are left to CheckMethods.
func (m *Middleware) CheckRoutes(routes []rest.Route) error {
	clean := make([]rest.Route, 0, len(routes))
	for _, rt := range routes {
		if rt.Path != "" && rt.Path[0] == '/' { // the router refuses the others
			clean = append(clean, rest.Route{Method: rt.Method, Path: path.Clean(rt.Path)})
		}
	}
	for _, cr := range slices.Concat(m.rules, m.routed.list()) {
		rl := cr.http
		if rl == nil {
			continue
		}
		if rl.route.text == "" { // Route with a Method only
			if !slices.ContainsFunc(clean, func(rt rest.Route) bool { return rt.Method == rl.method }) {
				return fieldError(cr.spec.name, "%s matches no route of the server", rl.method)
			}
			continue
		}
		if slices.ContainsFunc(clean, func(rt rest.Route) bool {
			return rt.Path == rl.route.text && (rl.method == "" || rt.Method == rl.method)
		}) {
			continue
		}
		what := strings.TrimPrefix(rl.method+" "+rl.route.text, " ")
		if near, ok := nearRoute(rl, clean); ok {
			return fieldError(cr.spec.name, "%s matches no route of the server (did you mean %s %s?)", what, near.Method, near.Path)
		}
		return fieldError(cr.spec.name, "%s matches no route of the server", what)
	}
	return nil
}

// nearRoute finds the route that a rule matching no route most likely meant: the same
// pattern for another method, the same pattern with other variable names, or the pattern
// behind a group prefix that the rule's Path lacks (goctl's @server(prefix: ...)).
func nearRoute(rl *rule, routes []rest.Route) (rest.Route, bool) {
	shape := routeShape(rl.route.text)
	for _, near := range []func(rest.Route) bool{
		func(rt rest.Route) bool { return rt.Path == rl.route.text },
		func(rt rest.Route) bool {
			return routeShape(rt.Path) == shape && (rl.method == "" || rt.Method == rl.method)
		},
		func(rt rest.Route) bool {
			return strings.HasSuffix(routeShape(rt.Path), shape) && (rl.method == "" || rt.Method == rl.method)
		},
	} {
		if i := slices.IndexFunc(routes, near); i >= 0 {
			return routes[i], true
		}
	}
	return rest.Route{}, false
}

// routeShape is a cleaned pattern with its variable names left out: /sku/: for /sku/:id.
func routeShape(p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		if strings.HasPrefix(s, ":") {
			segs[i] = ":"
		}
	}
	return strings.Join(segs, "/")
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
					return fieldError(cr.spec.name, "%s matches no method of the server (did you mean %s?)", full, near)
				}
			}
		}
		if _, ok := info[svc]; !ok {
			return fieldError(cr.spec.name, "%s matches no method of the server: it has no service %s", full, svc)
		}
		return fieldError(cr.spec.name, "%s matches no method of the server", full)
	}
	return nil
}

// routedRules are the rules given to Route and RouteFunc with a Method or a Path, for
// CheckRoutes.
type routedRules struct {
	mu    sync.Mutex
	rules []*compiledRule // guarded by mu
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
