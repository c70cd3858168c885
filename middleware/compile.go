package middleware

import (
	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/middleware/internal/sharehook"
	"github.com/flightlock/flightlock/middleware/rules"
)

// rule is one transport's part of a compiled Rule, with what running it needs: the Locker,
// its labels, and its shadow and share settings.
type rule struct {
	*rules.Plan
	locker *flightlock.Locker
	stats  *ruleStats     // its labels in metrics, traces and logs
	shadow bool           // Rule.Shadow: counted, never enforced
	onBusy string         // Rule.OnBusy, normalized: what a shadow conflict would have been
	share  sharehook.Rule // OnBusy share: the sharing of its requests (middleware/share); nil otherwise
	holds  holdTimes      // how long its locks are held, for the Retry-After of its busy answers
}

// compiledRule is a rule as compiled for each transport, whose parts share the Locker.
type compiledRule struct {
	spec  rules.Spec
	http  *rule  // REST part, or nil
	rpc   *rule  // zrpc part, or nil
	label string // Route and RouteFunc rules: "Route(POST /path)", for CheckRoutes
}

// compileRules compiles c's rules and those built in Go (rules.Compile); New gives them their
// Lockers.
func compileRules(c LockConf, extra []rules.Spec) ([]*compiledRule, error) {
	compiled, err := rules.Compile(c, extra)
	if err != nil {
		return nil, err
	}
	out := make([]*compiledRule, len(compiled))
	for i, cr := range compiled {
		out[i] = &compiledRule{spec: cr.Spec}
		if cr.HTTP != nil {
			out[i].http = &rule{Plan: cr.HTTP}
		}
		if cr.RPC != nil {
			out[i].rpc = &rule{Plan: cr.RPC}
		}
	}
	return out, nil
}

// setStats gives the transports of cr their labels, store and shadow settings, and returns
// the stats that the observer of cr's Locker reports under (its REST part's, else zrpc's).
func (cr *compiledRule) setStats(store string) *ruleStats {
	template := cmpTemplate(cr.spec)
	var first *ruleStats
	for _, rl := range []*rule{cr.http, cr.rpc} {
		if rl == nil {
			continue
		}
		rl.stats = newRuleStats(rl.Name, template, store, cr.spec.Rule)
		rl.shadow, rl.onBusy = cr.spec.Shadow, cr.spec.OnBusy
		if first == nil {
			first = rl.stats
		}
	}
	return first
}
