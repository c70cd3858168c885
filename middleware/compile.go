package middleware

import (
	"cmp"
	"context"
	"fmt"
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

// ResponseSharing is the response sharing of OnBusy share rules; nil (the default) refuses such
// a rule at start-up. A service with share rules sets it in main (see package share):
//
//	flmw.ResponseSharing = share.New // github.com/flightlock/flightlock/middleware/share
var ResponseSharing func(sharehook.Config) sharehook.Group

// responseSharingLine is the line that sets ResponseSharing, as an error names it.
const responseSharingLine = "flmw.ResponseSharing = share.New (github.com/flightlock/flightlock/middleware/share)"

// ReplayedHeader (REST) and ReplayedMetadata (zrpc response header metadata) mark a response a
// duplicate received from the request that ran the handler, as payment APIs mark replays.
const (
	ReplayedHeader   = sharehook.ReplayedHeader
	ReplayedMetadata = sharehook.ReplayedMetadata
)

// ErrPayloadMismatch answers a request of an OnBusy share rule whose key was used by a request
// with another payload: 422 / InvalidArgument, as the IETF Idempotency-Key draft says.
var ErrPayloadMismatch = sharehook.ErrPayloadMismatch

// shareParts gives the parts of cr, a rule locking in store, their response sharing if its
// OnBusy is share: an error without ResponseSharing, and, when strict, on a store keeping no
// responses (a Route rule on one shares within its process only).
func (m *Middleware) shareParts(cr *compiledRule, field, store string, strict bool) error {
	if cr.spec.OnBusy != rules.OnBusyShare {
		return nil
	}
	if m.sharing == nil {
		return rules.FieldError(field+".OnBusy", "is share, and this binary does not link response sharing: "+
			"add %s to the service's main.go", responseSharingLine)
	}
	responses := m.responses[store]
	var noResponses error
	if responses == nil {
		noResponses = fmt.Errorf("OnBusy share stores responses in the rule's store, "+
			"a Redis or etcd store: the lock store %T is neither", m.bases[store].Store())
		if strict {
			return rules.FieldError(field+".OnBusy", "%v", noResponses)
		}
	}
	for _, rl := range cr.parts() {
		locks := sharehook.Locks{Responses: responses, NoResponses: noResponses,
			Lock:        func(ctx context.Context, keys []string) (sharehook.Held, error) { return m.lock(ctx, rl, keys, nil) },
			Release:     func(ctx context.Context, h sharehook.Held) { m.release(ctx, rl, h) },
			LogError:    func(ctx context.Context, what string, err error) { m.logs.error(ctx, rl.stats, what, err) },
			CountShared: func(how string) { rl.stats.count(sharedTotal, how) },
		}
		rl.share = m.sharing.Rule(locks, cr.spec.Rule, rl.Plan)
	}
	return nil
}
