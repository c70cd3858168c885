package middleware

import (
	"cmp"
	"slices"
	"sync/atomic"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/middleware/internal/sharehook"
	"github.com/flightlock/flightlock/middleware/rules"
)

// rule is one transport's part of a compiled Rule, with what running it needs.
type rule struct {
	*rules.Plan
	locker *flightlock.Locker
	stats  *ruleStats
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
	// For CheckRoutes: a Route, RouteFunc or Named middleware was built, wrapping wraps handlers.
	built atomic.Bool
	wraps atomic.Int64
}

// compileRules compiles c's rules and those built in Go (rules.Compile), without Lockers.
func compileRules(c LockConf, extra []rules.Spec) ([]*compiledRule, error) {
	compiled, err := rules.Compile(c, extra)
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
	return out, err
}

func (cr *compiledRule) parts() []*rule {
	return slices.DeleteFunc([]*rule{cr.http, cr.rpc}, func(rl *rule) bool { return rl == nil })
}

// lockRule gives the parts of cr, rule s, their Locker and response sharing; strict refuses a
// share rule on a store that keeps no responses.
func (m *Middleware) lockRule(cr *compiledRule, s rules.Spec, strict bool) error {
	store, base, err := m.baseFor(s)
	if err == nil && m.injected == "" {
		err = m.conf.CheckRuleStore(s)
	}
	if err == nil {
		err = m.shareParts(cr, s.Field, store, strict)
	}
	if err != nil {
		return err
	}
	parts := cr.parts()
	for _, rl := range parts {
		rl.stats = newRuleStats(rl.Name, cmp.Or(cr.spec.Key, "func"), store, cr.spec.Rule)
		rl.shadow, rl.onBusy = cr.spec.Shadow, cr.spec.OnBusy
	}
	l, err := m.ruleLocker(base, s.Rule, parts[0].stats) // its observer reports as the REST part
	if err != nil {
		field := s.Field
		if s.TTL > 0 && base.Store().Capabilities().CheckTTL(s.TTL) != nil {
			field += ".TTL" // longer than the store keeps a lock (ZooKeeper)
		}
		return rules.FieldError(field, "%v", err)
	}
	for _, rl := range parts {
		rl.locker = l
	}
	return nil
}
