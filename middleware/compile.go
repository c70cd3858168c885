package middleware

import (
	"cmp"
	"context"
	"fmt"
	"net/http"

	"github.com/flightlock/flightlock"
)

// rule is a compiled Rule.
type rule struct {
	name     string // for logs and metrics: "POST /api/order" or "/pkg.Svc/Method"
	method   string
	route    routePattern
	locker   *flightlock.Locker
	httpKeys httpKeys // nil for a zrpc-only rule
	// httpReplayKeys renders a template's keys with the values as written (no canonicalValue),
	// for a share rule's stored responses; nil for a rule keyed by a KeyFunc.
	httpReplayKeys httpKeys
	rpcKeys        rpcKeys // nil for a REST-only rule
	// fromMessage: the keys of a stream call come from its first message.
	fromMessage bool
	stats       *ruleStats // its labels in metrics, traces and logs
	shadow      bool       // Rule.Shadow: counted, never enforced
	onBusy      string     // Rule.OnBusy, normalized: what a shadow conflict would have been
	share       sharePolicy
	shared      bool // OnBusy share
}

// compiledRule is a rule as compiled for each transport: the REST and zrpc parts share the
// Locker but not the key plan.
type compiledRule struct {
	spec  spec
	http  *rule  // REST part, or nil
	rpc   *rule  // zrpc part, or nil
	label string // Route and RouteFunc rules: "Route(POST /path)", for CheckRoutes
}

// compileRules checks c and compiles its rules, then those built in Go, without building any
// store.
func compileRules(c LockConf, extra []spec) ([]*compiledRule, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	specs := make([]spec, 0, len(c.Rules)+len(extra))
	for i, r := range c.Rules {
		specs = append(specs, spec{Rule: r, name: fmt.Sprintf("Lock.Rules[%d]", i)})
	}
	specs = append(specs, extra...)
	out := make([]*compiledRule, 0, len(specs))
	seenRPC := make(map[string]string)
	seenName := make(map[string]string) // Rule.Name => the rule's spec name
	for _, s := range specs {
		if err := checkRule(s); err != nil {
			return nil, err
		}
		if err := c.checkRuleStore(s); err != nil {
			return nil, err
		}
		if s.Name != "" {
			if prev, dup := seenName[s.Name]; dup {
				return nil, fieldError(s.name+".Name", "%s is already the name of %s", s.Name, prev)
			}
			seenName[s.Name] = s.name
		}
		cr := &compiledRule{spec: s}
		if s.Path != "" || s.Name != "" { // a named rule is a REST middleware, with or without a Path
			rl, err := compileHTTP(s)
			if err != nil {
				return nil, err
			}
			rl.name = cmp.Or(rl.name, s.Name) // logs and metrics of a named rule without a Path
			for _, prev := range out {
				// A route is locked by one rule, named or not: two would lock it twice.
				if p := prev.http; s.Path != "" && p != nil && p.route.text == rl.route.text &&
					(p.method == "" || rl.method == "" || p.method == rl.method) {
					return nil, fieldError(s.name+".Path", "%s %s is already locked by %s", s.Method, s.Path, prev.spec.name)
				}
			}
			cr.http = rl
		}
		if s.RPC != "" {
			if prev, dup := seenRPC[s.RPC]; dup {
				return nil, fieldError(s.name+".RPC", "%s is already locked by %s", s.RPC, prev)
			}
			seenRPC[s.RPC] = s.name
			rl, err := compileRPC(s)
			if err != nil {
				return nil, err
			}
			cr.rpc = rl
		}
		out = append(out, cr)
	}
	return out, nil
}

// compileHTTP compiles the REST part of a rule.
func compileHTTP(s spec) (*rule, error) {
	rl := &rule{method: s.Method}
	var route *routePattern
	if s.Path != "" {
		rp, err := parseRoute(s.Path)
		if err != nil {
			return nil, fieldError(s.name+".Path", "bad route pattern %q: %v", s.Path, err)
		}
		rl.route, route = rp, &rp
		rl.name = cmp.Or(s.Method, "*") + " " + rp.text
	}
	if s.httpKey != nil {
		rl.httpKeys = ownKeysApartHTTP(s, funcHTTPKeys(s.httpKey))
		return rl, nil
	}
	keys, err := parseTemplate(s.Key)
	if err == nil && !s.Shadow {
		err = checkOwnKeys(keys)
	}
	if err != nil {
		return nil, fieldError(s.name+".Key", "%v", err)
	}
	plan, err := bindPlan(keys, bindHTTP(route))
	if err != nil {
		return nil, fieldError(s.name+".Key", "%v", err)
	}
	rl.httpKeys = ownKeysApartHTTP(s, templateHTTPKeys(plan))
	rl.httpReplayKeys = templateHTTPRawKeys(plan)
	return rl, nil
}

// ownKeysApartHTTP refuses the keys of an enforced rule's request that fall among the
// middleware's own keys (notInternal); a shadow rule's keys live apart already.
func ownKeysApartHTTP(s spec, keys httpKeys) httpKeys {
	if s.Shadow {
		return keys
	}
	return func(r *http.Request) ([]string, error) { return notInternal(keys(r)) }
}

// ownKeysApartRPC is ownKeysApartHTTP for zrpc.
func ownKeysApartRPC(s spec, keys rpcKeys) rpcKeys {
	if s.Shadow {
		return keys
	}
	return func(ctx context.Context, req any) ([]string, error) { return notInternal(keys(ctx, req)) }
}

// compileRPC compiles the zrpc part of a rule.
func compileRPC(s spec) (*rule, error) {
	rl := &rule{name: s.RPC}
	if s.rpcKey != nil {
		rl.rpcKeys = ownKeysApartRPC(s, funcRPCKeys(s.rpcKey))
		rl.fromMessage = true
		return rl, nil
	}
	keys, err := parseTemplate(s.Key)
	if err == nil && !s.Shadow {
		err = checkOwnKeys(keys)
	}
	if err != nil {
		return nil, fieldError(s.name+".Key", "%v", err)
	}
	plan, err := bindPlan(keys, bindRPC(methodInput(s.RPC)))
	if err != nil {
		return nil, fieldError(s.name+".Key", "%v", err)
	}
	rl.rpcKeys = ownKeysApartRPC(s, templateRPCKeys(plan))
	rl.fromMessage = usesMessage(keys)
	return rl, nil
}

// setStats gives the transports of cr their labels (store is the store it locks in) and shadow settings, and returns the
// stats that the observer of cr's Locker reports under (its REST part's, else its zrpc's).
func (cr *compiledRule) setStats(store string) *ruleStats {
	template := cmpTemplate(cr.spec)
	var first *ruleStats
	for _, rl := range []*rule{cr.http, cr.rpc} {
		if rl == nil {
			continue
		}
		rl.stats = newRuleStats(rl.name, template, store)
		rl.shadow, rl.onBusy = cr.spec.Shadow, cr.spec.OnBusy
		if rl.shared = cr.spec.OnBusy == onBusyShare; rl.shared {
			classes, _ := parseReplayStatus("", cr.spec.ReplayStatus) // checked by checkLockSettings
			rl.share = sharePolicy{classes: classes, maxBytes: cr.spec.ReplayMaxBytes, ttl: cr.spec.Replay,
				wait: cr.spec.Wait}
		}
		if first == nil {
			first = rl.stats
		}
	}
	return first
}
