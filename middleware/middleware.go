package middleware

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/embedded"
	"github.com/zeromicro/go-zero/core/logc"
	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/core/metric"
	"github.com/zeromicro/go-zero/core/service"
	"github.com/zeromicro/go-zero/core/trace"
)

// failOpenTotal counts requests served without their lock because Redis could not be reached
// and OnStoreError is "open". go-zero exports it when its Prometheus support is on.
var failOpenTotal = metric.NewCounterVec(&metric.CounterVecOpts{
	Namespace: "flightlock",
	Subsystem: "middleware",
	Name:      "fail_open_total",
	Help:      "Requests served without their lock because the lock store was unreachable.",
	Labels:    []string{"rule"},
})

// Middleware locks go-zero REST routes and zrpc methods per its rules. Build it once with New
// at start-up and share it: it is safe for concurrent use.
type Middleware struct {
	locker     *flightlock.Locker
	closeStore func() error // nil when the store was injected
	failOpen   bool
	owners     ownerPolicy
	http       httpRoutes
	rpc        map[string]*rule
	rules      []*compiledRule // in config order, then the rules built in Go: for CheckRoutes and CheckMethods
	routed     routedRules     // the rules of Route and RouteFunc, for CheckRoutes
	failOpens  atomic.Int64    // requests served without a lock (OnStoreError: open)
}

// rule is a compiled Rule.
type rule struct {
	name     string // for logs and metrics: "POST /api/order" or "/pkg.Svc/Method"
	method   string
	route    routePattern
	locker   *flightlock.Locker
	httpKeys httpKeys // nil for a zrpc-only rule
	rpcKeys  rpcKeys  // nil for a REST-only rule
	// fromMessage: the keys of a stream call come from its first message.
	fromMessage bool
}

// Option configures a Middleware.
type Option func(*options)

type options struct {
	locker *flightlock.Locker
	store  lockstore.Store // WithStore: build the Locker from the LockConf on this store
	rules  []spec          // rules built in Go
	mode   string          // WithServiceMode: go-zero's service mode; "" when not given
}

// WithServiceMode tells New the mode of the go-zero service it runs in: c.Mode of the
// service's RestConf or RpcServerConf (go-zero's ServiceConf.Mode: dev, test, rt, pre or pro,
// and pro when the YAML leaves it out). In pre and pro, a LockConf without Redis.Host is
// refused at start-up, naming Lock.Redis.Host, instead of falling back to the embedded
// in-memory store, whose locks no other process sees (issue 9); to run such a service on
// per-process locks on purpose, give it an embedded store with WithStore. In the other modes,
// and without this option, the embedded store is used and logged at error level.
func WithServiceMode(mode string) Option {
	return func(o *options) { o.mode = mode }
}

// WithStore makes the Middleware build its Locker from the LockConf (Prefix, TTL, MaxHold,
// Wait, Retry) on store instead of on a store of its own, so that several services of one
// process share one store (one connection pool, one embedded Redis). Each Middleware still
// has its own per-process gate, as separate processes would. Close leaves store open.
func WithStore(store lockstore.Store) Option {
	return func(o *options) { o.store = store }
}

// WithLocker makes the Middleware lock with l instead of a Locker and store of its own: the
// LockConf's Redis, Prefix, TTL, MaxHold, Wait and Retry are then ignored, while each rule's
// OnBusy, TTL and Wait still apply (through l.With). Close leaves l's store open.
func WithLocker(l *flightlock.Locker) Option {
	return func(o *options) { o.locker = l }
}

// WithHTTPRule adds a REST rule built in Go: r names the route (Method and Path) and its
// OnBusy, TTL and Wait; key computes the key instead of r.Key.
func WithHTTPRule(r Rule, key KeyFunc) Option {
	r = r.normalized()
	return func(o *options) {
		o.rules = append(o.rules, spec{Rule: Rule{Method: r.Method, Path: r.Path, OnBusy: r.OnBusy, TTL: r.TTL, Wait: r.Wait},
			name: fmt.Sprintf("WithHTTPRule(%s %s)", r.Method, r.Path), httpKey: key})
	}
}

// WithRPCRule adds a zrpc rule built in Go: r names the method (RPC) and its OnBusy, TTL
// and Wait; key computes the key instead of r.Key.
func WithRPCRule(r Rule, key RPCKeyFunc) Option {
	r = r.normalized()
	return func(o *options) {
		o.rules = append(o.rules, spec{Rule: Rule{RPC: r.RPC, OnBusy: r.OnBusy, TTL: r.TTL, Wait: r.Wait},
			name: fmt.Sprintf("WithRPCRule(%s)", r.RPC), rpcKey: key})
	}
}

// New validates c and builds the store, the Locker and the compiled rules, once. Without a
// Redis host the store is an embedded in-memory Redis, logged as an error (development only),
// and refused in go-zero's pre and pro modes (WithServiceMode). With Redis.NonBlock false, New
// fails when Redis does not answer a ping within Redis.PingTimeout.
func New(c LockConf, opts ...Option) (*Middleware, error) {
	c = c.normalized() // the tags' defaults in zero fields; values in any case: "Wait", "post"
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	o.mode = strings.ToLower(o.mode)
	if err := oneOf("WithServiceMode", o.mode, service.DevMode, service.TestMode, service.RtMode,
		service.PreMode, service.ProMode); err != nil {
		return nil, err
	}
	rules, err := compileRules(c, o.rules)
	if err != nil {
		return nil, err
	}
	m := &Middleware{
		locker:   o.locker,
		failOpen: c.OnStoreError == storeErrorsOpen,
		owners:   ownerPolicy{trust: c.TrustOwner, to: c.PropagateTo},
		rpc:      make(map[string]*rule),
		rules:    rules,
	}
	if c.OwnerSecret != "" {
		m.owners.secret = []byte(c.OwnerSecret)
	}
	switch {
	case m.locker != nil:
	case o.store != nil:
		if m.locker, err = lockerOn(o.store, c); err != nil {
			return nil, err
		}
	default:
		if m.locker, m.closeStore, err = newLocker(c, o.mode); err != nil {
			return nil, err
		}
	}
	for _, cr := range rules {
		l, err := m.ruleLocker(cr.spec.Rule)
		if err != nil {
			_ = m.Close()
			return nil, fieldError(cr.spec.name, "%v", err)
		}
		if cr.http != nil {
			cr.http.locker = l
			if cr.spec.Name == "" { // a named rule locks through its Named middleware only
				m.http.add(cr.http)
			}
		}
		if cr.rpc != nil {
			cr.rpc.locker = l
			m.rpc[cr.spec.RPC] = cr.rpc
		}
	}
	return m, nil
}

// MustNew is New for start-up code: it exits through logx.Must on a bad config.
func MustNew(c LockConf, opts ...Option) *Middleware {
	m, err := New(c, opts...)
	logx.Must(err)
	return m
}

// Locker returns the Locker the Middleware locks with, for handlers that lock more keys
// themselves. Locks it takes share the Middleware's per-process gate.
func (m *Middleware) Locker() *flightlock.Locker { return m.locker }

// Close closes the store the Middleware built (not one given with WithLocker).
func (m *Middleware) Close() error {
	if m.closeStore == nil {
		return nil
	}
	closeStore := m.closeStore
	m.closeStore = nil
	return closeStore()
}

// newLocker builds the store that c.Redis describes and the Locker on it, for a service in
// go-zero mode mode ("" when unknown). Without a host the store is the embedded one, never
// silently: refused in pre and pro, logged at error level otherwise (issue 9).
func newLocker(c LockConf, mode string) (*flightlock.Locker, func() error, error) {
	var (
		store *lockstore.RedisStore
		err   error
	)
	if c.Redis.Host == "" {
		if mode == service.PreMode || mode == service.ProMode {
			return nil, nil, fieldError("Lock.Redis.Host", "is empty in %s mode: the embedded in-memory Redis would give "+
				"each process locks of its own; set the shared Redis (for per-process locks on purpose, pass an embedded "+
				"store with WithStore)", mode)
		}
		logx.Errorf("flightlock: Lock.Redis.Host is not set (service mode %q): locks live in an embedded in-memory Redis "+
			"that no other process shares, for development only; New refuses this in pre and pro mode (WithServiceMode)", cmp.Or(mode, "unknown"))
		store, err = embedded.New(c.Redis.storeOptions()...)
	} else {
		store, err = NewStore(c.Redis.zero(), c.Redis.storeOptions()...)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("Lock.Redis: %w", err)
	}
	l, err := lockerOn(store, c)
	if err != nil {
		_ = store.Close()
		return nil, nil, err
	}
	return l, store.Close, nil
}

// lockerOn builds the Locker that c, normalized (its defaults filled from the tags), describes
// on store. Locks carry the host, pid and go-zero trace id of their holder beside the owner
// token, for operators (GET lock:order:42).
func lockerOn(store lockstore.Store, c LockConf) (*flightlock.Locker, error) {
	host, _ := os.Hostname()
	holder := "host=" + strings.ReplaceAll(host, " ", "_") + " pid=" + strconv.Itoa(os.Getpid())
	l, err := flightlock.New(store,
		flightlock.WithPrefix(c.Prefix),
		flightlock.WithTTL(c.TTL),
		flightlock.WithMaxHold(c.MaxHold),
		flightlock.WithWait(c.Wait),
		flightlock.WithRetry(c.Retry.strategy()),
		flightlock.WithMetadata(func(ctx context.Context) string {
			if id := trace.TraceIDFromContext(ctx); id != "" {
				return holder + " trace=" + id
			}
			return holder
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("Lock: %w", err)
	}
	return l, nil
}

// ruleLocker derives the Locker of one rule: same store and gate, the rule's mode and
// overrides. r is normalized, so OnBusy holds its tag's default when the rule left it out.
func (m *Middleware) ruleLocker(r Rule) (*flightlock.Locker, error) {
	opts := []flightlock.Option{flightlock.WithMode(flightlock.Reject), flightlock.WithFailOpen(m.failOpen)}
	if r.OnBusy == onBusyWait {
		opts[0] = flightlock.WithMode(flightlock.Wait)
	}
	if r.TTL > 0 {
		opts = append(opts, flightlock.WithTTL(r.TTL))
	}
	if r.Wait > 0 {
		opts = append(opts, flightlock.WithWait(r.Wait))
	}
	return m.locker.With(opts...)
}

// compiledRule is a rule as compiled for each transport: the REST and zrpc parts share the
// Locker but not the key plan.
type compiledRule struct {
	spec spec
	http *rule // REST part, or nil
	rpc  *rule // zrpc part, or nil
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
		rl.httpKeys = funcHTTPKeys(s.httpKey)
		return rl, nil
	}
	keys, err := parseTemplate(s.Key)
	if err != nil {
		return nil, fieldError(s.name+".Key", "%v", err)
	}
	plan, err := bindPlan(keys, bindHTTP(route))
	if err != nil {
		return nil, fieldError(s.name+".Key", "%v", err)
	}
	rl.httpKeys = templateHTTPKeys(plan)
	return rl, nil
}

// compileRPC compiles the zrpc part of a rule.
func compileRPC(s spec) (*rule, error) {
	rl := &rule{name: s.RPC}
	if s.rpcKey != nil {
		rl.rpcKeys = funcRPCKeys(s.rpcKey)
		rl.fromMessage = true
		return rl, nil
	}
	keys, err := parseTemplate(s.Key)
	if err != nil {
		return nil, fieldError(s.name+".Key", "%v", err)
	}
	plan, err := bindPlan(keys, bindRPC(methodInput(s.RPC)))
	if err != nil {
		return nil, fieldError(s.name+".Key", "%v", err)
	}
	rl.rpcKeys = templateRPCKeys(plan)
	rl.fromMessage = usesMessage(keys)
	return rl, nil
}

// lock takes the keys of one request. With OnStoreError "open" the Locker turns an
// unreachable store into degraded leases that hold the per-process gate only: the handler
// then runs excluded from the other requests of this process but not of other processes, and
// the request is counted and logged.
func (m *Middleware) lock(ctx context.Context, rl *rule, keys []string) (*flightlock.Group, error) {
	g, err := rl.locker.LockAll(ctx, keys...)
	if err == nil {
		for _, lease := range g.Leases() {
			if lease.Degraded() {
				m.failOpens.Add(1)
				failOpenTotal.Inc(rl.name)
				logc.Errorf(ctx, "flightlock: %s: lock store unreachable, running under this process's lock only (OnStoreError: open)", rl.name)
				break
			}
		}
		return g, nil
	}
	if !storeFailure(ctx, err) {
		return nil, err
	}
	logc.Errorf(ctx, "flightlock: %s: lock store unreachable, refusing the request (OnStoreError: closed): %v", rl.name, err)
	return nil, fmt.Errorf("%w: %w", errStore, err)
}

// release releases a group after the handler returned, on a context that keeps ctx's values
// but not its cancellation: go-zero's timeout handler cancels the request context while the
// handler may still run, and the lock must be released all the same.
func (m *Middleware) release(ctx context.Context, rl *rule, g *flightlock.Group) {
	ctx = context.WithoutCancel(ctx)
	if err := g.Release(ctx); err != nil {
		// The lock expires with its TTL; nothing of another owner was touched.
		logc.Errorf(ctx, "flightlock: %s: release: %v", rl.name, err)
	}
}

// storeFailure reports whether err means the store could not be reached, as opposed to
// contention, a bad key, or the request's own context ending.
func storeFailure(ctx context.Context, err error) bool {
	return !errors.Is(err, flightlock.ErrBusy) && !errors.Is(err, flightlock.ErrInvalidKey) && ctx.Err() == nil
}
