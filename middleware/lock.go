package middleware

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/middleware/internal/sharehook"
	"github.com/flightlock/flightlock/middleware/rules"
	"github.com/zeromicro/go-zero/core/logx"
	oteltrace "go.opentelemetry.io/otel/trace"
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

// ruleLocker derives a rule's Locker from its store's base Locker: same store and gate, the
// rule's mode, overrides and observer. A shadow rule's never waits and keeps its locks apart
// (rules.ShadowPrefix), so it holds back no enforced request.
func (m *Middleware) ruleLocker(base *flightlock.Locker, r Rule, stats *ruleStats) (*flightlock.Locker, error) {
	failOpen := cmp.Or(r.OnStoreError, m.conf.OnStoreError) == rules.StoreErrorsOpen
	opts := []flightlock.Option{flightlock.WithMode(flightlock.Reject), flightlock.WithFailOpen(failOpen),
		flightlock.WithObserver(stats.observer(m.logs))}
	if (r.OnBusy == rules.OnBusyWait || r.OnBusy == rules.OnBusyShare) && !r.Shadow {
		opts[0] = flightlock.WithMode(flightlock.Wait)
	}
	if r.Shadow {
		// After the base's prefix (on etcd, Etcd.Key): inside the section's key space.
		opts = append(opts, flightlock.WithPrefix(base.Prefix()+rules.ShadowPrefix), flightlock.WithFailOpen(false))
	}
	opts = append(opts, r.LockOptions()...) // a shadow rule's too: it tries the kind of lock the rule takes
	return base.With(opts...)
}

// held is one request's lock, from m.lock to m.release.
type held = sharehook.Held

// lock takes the keys of one request, rendered with keyErr, and measures, traces and logs it:
// a key that cannot be built is refused (a shadow rule counts it: lockShadow); a degraded
// lease (OnStoreError "open") is counted and logged.
func (m *Middleware) lock(ctx context.Context, rl *rule, keys []string, keyErr error) (held, error) {
	switch {
	case rl.shadow:
		return m.lockShadow(ctx, rl, keys, keyErr), nil
	case keyErr != nil:
		if metricsOn() {
			acquireDuration.ObserveFloat(0, rl.stats.with(outcomeInvalidKey, "none")...)
		}
		// Logged: a template naming a field requests never carry refuses every request, and the
		// access log alone does not say why.
		m.logs.error(ctx, rl.stats, "request refused: its lock key cannot be built", keyErr)
		return held{}, keyErr
	}
	st, metrics := rl.stats, metricsOn()
	if metrics {
		waitingGauge.Inc(st.labels...)
	}
	start := time.Now()
	lctx, span := m.traceAcquire(ctx, rl, keys)
	g, err := rl.locker.LockAll(lctx, keys...)
	waited := time.Since(start)
	outcome := outcomeOf(ctx, g, err)
	endAcquireSpan(span, st, outcome, g, waited, err)
	if metrics {
		waitingGauge.Dec(st.labels...)
		acquireDuration.ObserveFloat(ms(waited), st.with(outcome, grantOf(st, g))...)
	}
	if errors.Is(err, ErrNestedLock) {
		if why := m.owners.refusal(ctx); why != nil {
			err = fmt.Errorf("%w: %w", err, why)
		}
		m.logs.error(ctx, st, "nested call refused: its caller holds the key", err)
	}
	switch outcome {
	case outcomeDegraded:
		st.count(failOpenTotal)
		st.count(storeErrorTotal, "acquire")
		m.logs.error(ctx, st, "lock store unreachable, running under this process's lock only (OnStoreError: open)",
			errors.New("degraded lease"), logx.Field("waited", waited))
		fallthrough
	case outcomeAcquired:
		if metrics {
			heldGauge.Inc(st.labels...)
			for _, l := range g.Leases() {
				if l.Grant() == flightlock.GrantHandoff {
					handoffTotal.Inc(st.labels...)
				}
			}
		}
		return held{Group: g, Ctx: g.Context(), At: start.Add(waited)}, nil
	case outcomeStoreError:
		st.count(storeErrorTotal, "acquire")
		m.logs.error(ctx, st, "lock store unreachable, request refused (OnStoreError: closed)", err,
			logx.Field("waited", waited))
		return held{}, fmt.Errorf("%w: %w", errStore, err)
	case outcomeBusy:
		st.count(busyTotal)
	}
	return held{}, hintBusy(err, &rl.holds)
}

// shadowBound bounds a shadow rule's try-lock: a round trip's delay, even if the store is down.
const shadowBound = 50 * time.Millisecond

// lockShadow runs a shadow rule: it tries the lock, never waiting, counts a conflict where
// enforcing would have held the request back (a bad key too) by what the rule would have done
// (its OnBusy, invalid_key, store_error), and lets the request through on its own context. A
// lock it got is released after the handler, so that concurrent duplicates see it.
func (m *Middleware) lockShadow(ctx context.Context, rl *rule, keys []string, keyErr error) held {
	err := keyErr
	if err == nil {
		sctx, cancel := context.WithTimeout(ctx, shadowBound)
		g, lerr := rl.locker.LockAll(sctx, keys...)
		cancel()
		if lerr == nil {
			return held{Group: g, Ctx: ctx, At: time.Now()}
		}
		err = lerr
	}
	would := outcomeOf(ctx, nil, err)
	switch {
	case keyErr != nil:
		would = outcomeInvalidKey
	case would == outcomeBusy:
		would = rl.onBusy
	case would == outcomeDraining, would == outcomeCanceled:
		return held{Ctx: ctx} // draining, or the request is gone: nothing enforcing would have changed
	case would == outcomeStoreError:
		m.logs.error(ctx, rl.stats, "shadow rule: lock store unreachable", err)
	}
	rl.stats.count(shadowConflictTotal, would)
	return held{Ctx: ctx}
}

// release releases a request's lock after the handler, on ctx without its cancellation (timeout).
func (m *Middleware) release(ctx context.Context, rl *rule, h held) {
	if h.Group == nil {
		return
	}
	if rl.shadow {
		_ = h.Group.Release(context.WithoutCancel(ctx)) // a failure is left to the TTL: it held nobody back
		return
	}
	st := rl.stats
	lost := h.Group.Lost() // not the context's cause: a request that ended first keeps Canceled
	if lost {
		// The counter was bumped when the watchdog found out.
		oteltrace.SpanFromContext(ctx).AddEvent("flightlock.lost")
		m.logs.error(ctx, st, "lock lost while the handler ran (renewals failed until its TTL, MaxHold ran out, "+
			"or the store no longer had it: expired, or freed by flightlock unlock)", flightlock.ErrLost,
			logx.Field("fence", h.Group.Leases()[0].Fence()))
	}
	heldFor := time.Since(h.At)
	rl.holds.observe(heldFor)
	if metricsOn() {
		heldGauge.Dec(st.labels...)
		holdDuration.ObserveFloat(ms(heldFor), st.labels...)
	}
	ctx = context.WithoutCancel(ctx)
	if err := h.Group.Release(ctx); err != nil && !(lost && errors.Is(err, flightlock.ErrNotHeld)) {
		// The lock expires with its TTL; nothing of another owner was touched.
		if !errors.Is(err, flightlock.ErrNotHeld) {
			st.count(storeErrorTotal, "release")
		}
		m.logs.error(ctx, st, "release failed", err)
	}
}
