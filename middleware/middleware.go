package middleware

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/middleware/internal/sharehook"
	"github.com/flightlock/flightlock/middleware/rules"
	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/core/proc"
	"github.com/zeromicro/go-zero/core/service"
)

// Middleware locks go-zero REST routes and zrpc methods per its rules. Build it once with New
// at start-up and share it: it is safe for concurrent use.
type Middleware struct {
	conf   LockConf           // normalized: the store choices of Route and RouteFunc rules
	locker *flightlock.Locker // the Lock section's store's (DefaultStore): Locker()
	// bases holds the base Locker of each store the rules lock in, by store name, and responses
	// its response store (nil: none). injected names the option ("WithLocker", "WithStore")
	// whose Locker every rule locks with, bases' only entry (see buildStores); else "".
	bases     map[string]*flightlock.Locker
	injected  string
	responses map[string]lockstore.ResponseStore
	closeMu   sync.Mutex                  // guards closers once New returned: Close and Shutdown may race
	closers   []func() error              // the stores New built; nil once closed
	listened  *atomic.Pointer[Middleware] // m, for go-zero's shutdown listener, until Close
	owners    ownerPolicy
	http      httpRoutes
	rpc       map[string]*rule
	rules     []*compiledRule // in config order, then the rules built in Go: for CheckRoutes and CheckMethods
	routedMu  sync.Mutex
	routed    []*compiledRule // guarded by routedMu: the rules of Route and RouteFunc, for CheckRoutes
	logs      *logSummary
	drain     drainer
	probe     atomic.Pointer[interceptorProbe] // Register's; nil before
	sharing   sharehook.Group                  // of share rules (middleware/share); nil if not linked
	// unaryIntercepting and streamIntercepting: that server interceptor was built (Register).
	unaryIntercepting, streamIntercepting atomic.Bool
}

// New validates c and builds the stores, the Lockers and the compiled rules, once. A LockConf
// naming no store runs on the embedded store (see EmbeddedStore and WithServiceMode).
func New(c LockConf, opts ...Option) (*Middleware, error) {
	c = c.Normalized() // the tags' defaults in zero fields; values in any case: "Wait", "post"
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	o.mode = strings.ToLower(o.mode)
	modeErr := rules.OneOf("WithServiceMode", o.mode, service.DevMode, service.TestMode, service.RtMode,
		service.PreMode, service.ProMode)
	switch {
	case modeErr != nil:
		return nil, modeErr
	case o.nilGiven != "":
		return nil, rules.FieldError(o.nilGiven, "is given nil: pass a Locker or a store, or leave the option out")
	case o.locker != nil && o.store != nil:
		// Every rule would lock with the Locker, and the store go unused.
		return nil, rules.FieldError("WithStore", "cannot be given with WithLocker, whose store every rule locks in: give one of them")
	case o.locker != nil && o.locker.Kind() != "lock":
		// A rule's Locker is o.locker.With(its options), which keeps o.locker's kind.
		return nil, rules.FieldError("WithLocker", "its Locker takes %s locks (WithRead, WithFair or WithPermits), "+
			"which every rule would inherit: pass a Locker without them, and give each rule its Mode, Fair or Permits", o.locker.Kind())
	case o.serverTimeout < 0:
		return nil, rules.FieldError("WithServerTimeout", "%d ms is negative (0 means no timeout)", o.serverTimeout)
	}
	compiled, err := compileRules(c, o.rules)
	if err != nil {
		return nil, err
	}
	logWaitsPastTimeout(c, compiled, time.Duration(o.serverTimeout)*time.Millisecond)
	logTrustWithoutSecret(c)
	m := &Middleware{conf: c, owners: ownerPolicy{trust: c.TrustOwner, to: c.PropagateTo, secret: []byte(c.OwnerSecret)},
		rpc: make(map[string]*rule), rules: compiled, logs: newLogSummary(), drain: drainer{grace: c.Drain, done: make(chan struct{})}}
	if err := m.build(o); err != nil {
		_ = m.Close()
		return nil, err
	}
	// go-zero's shutdown (SIGTERM, SIGINT, proc.Shutdown) drains m beside the servers' own
	// graceful stop. It keeps its listeners for the life of the process: this one reaches m
	// through a cell that Close empties, so that a closed Middleware can be collected.
	m.listened = new(atomic.Pointer[Middleware])
	m.listened.Store(m)
	listened := m.listened
	proc.AddShutdownListener(func() {
		if m := listened.Load(); m != nil {
			_ = m.Shutdown(context.Background())
		}
	})
	return m, nil
}

// build builds m's stores and base Lockers (buildStores), response sharing and rule Lockers.
func (m *Middleware) build(o options) error {
	if err := m.buildStores(o); err != nil {
		return err
	}
	if ResponseSharing != nil {
		m.sharing = ResponseSharing(sharehook.Config{Wait: m.conf.Wait, HTTPError: writeHTTPError, RPCError: rpcError})
	}
	for _, cr := range m.rules {
		if err := m.lockRule(cr, cr.spec, true); err != nil {
			return err
		}
		if cr.http != nil && cr.spec.Name == "" { // a named rule locks through its Named middleware only
			m.http.add(cr.http)
		}
		if cr.rpc != nil {
			m.rpc[cr.spec.RPC] = cr.rpc
		}
	}
	return nil
}

// MustNew is New for start-up code: a bad config stops the service with one line naming the
// field, on stderr and in the log, and exit status 1 (no logx.Must stack trace).
func MustNew(c LockConf, opts ...Option) *Middleware {
	m, err := New(c, opts...)
	mustStart(err)
	return m
}

// exit ends the process; a variable so that a test can see that mustStart would exit.
var exit = os.Exit

// mustStart stops a service that cannot start: a line on stderr and in the log, exit status 1.
func mustStart(err error) {
	if err == nil {
		return
	}
	fmt.Fprintln(os.Stderr, err)
	logx.Error(err.Error())
	exit(1)
}

// The configuration and the key functions live in package rules, which the flightlock CLI's
// check shares, and each store's section in its config package; they are named here as a
// go-zero service writes them (Lock middleware.LockConf) and documented where they live.
type (
	LockConf      = rules.LockConf
	Rule          = rules.Rule
	RedisConf     = rules.RedisConf
	SentinelConf  = rules.SentinelConf
	EtcdConf      = rules.EtcdConf
	ZookeeperConf = rules.ZookeeperConf
	RetryConf     = rules.RetryConf
	ConfigError   = rules.ConfigError
	KeyFunc       = rules.KeyFunc
	RPCKeyFunc    = rules.RPCKeyFunc
)

// Option configures a Middleware.
type Option func(*options)

type options struct {
	locker        *flightlock.Locker
	store         lockstore.Store
	rules         []rules.Spec // rules built in Go
	mode          string       // WithServiceMode's; "" when not given
	serverTimeout int64        // WithServerTimeout's; 0 when not given
	// nilGiven names the first of WithLocker and WithStore given nil, which New refuses: taken
	// as not given, it would build a store of its own in their place.
	nilGiven string
}

// WithServiceMode tells New the go-zero service mode (c.Mode of its RestConf or
// RpcServerConf). In pre and pro, a LockConf naming no store is refused rather than run on the
// embedded store, whose locks no other process sees (WithStore does so on purpose); otherwise
// the embedded store is used and logged at error level.
func WithServiceMode(mode string) Option {
	return func(o *options) { o.mode = mode }
}

// WithServerTimeout tells New the server timeout in milliseconds (c.Timeout of its RestConf or
// RpcServerConf; 0 means none), so that New logs each waiting rule whose Wait is not below it:
// its caller would get the busy answer with no time left to retry.
func WithServerTimeout(ms int64) Option {
	return func(o *options) { o.serverTimeout = ms }
}

// WithStore builds the Middleware's Locker from the LockConf on store, so that services of one
// process share one store (each Middleware keeps its own gate). If the LockConf names etcd or
// ZooKeeper, store replaces the store of its kind only; else every rule locks in store, and one
// whose Store names another is refused. A nil store is refused. Close leaves store open.
func WithStore(store lockstore.Store) Option {
	return func(o *options) {
		o.store = store
		if store == nil {
			o.nilGiven = cmp.Or(o.nilGiven, "WithStore")
		}
	}
}

// WithLocker makes the Middleware lock with l, not a Locker and store of its own: the
// LockConf's Redis, Prefix, TTL, MaxHold, Wait and Retry are ignored, each rule's OnBusy, TTL
// and Wait still apply (through l.With). Every rule locks in l's store: one whose Store names
// another is refused, and so are WithStore beside it, a nil l, and an l whose locks are not
// plain (WithRead, WithFair, WithPermits): each rule says its own kind. The rules' locks
// report to the middleware's metrics and logs, not to l's Observer. Close leaves l's store open.
func WithLocker(l *flightlock.Locker) Option {
	return func(o *options) {
		o.locker = l
		if l == nil {
			o.nilGiven = cmp.Or(o.nilGiven, "WithLocker")
		}
	}
}

// WithHTTPRule adds a REST rule built in Go: r as a Lock.Rules entry, but key computes the key,
// so r.Key, r.Name (a Named middleware's) and r.RPC (which key cannot read) must be empty.
func WithHTTPRule(r Rule, key KeyFunc) Option {
	r = r.Normalized()
	return func(o *options) {
		o.rules = append(o.rules, rules.Spec{Rule: r, Field: fmt.Sprintf("WithHTTPRule(%s)", strings.TrimSpace(r.Method+" "+r.Path)), HTTPKey: key})
	}
}

// WithRPCRule adds a zrpc rule built in Go: r as a Lock.Rules entry, but key computes the key,
// so r.Key (and r.Method, r.Path and r.Name, which key cannot read) must be empty.
func WithRPCRule(r Rule, key RPCKeyFunc) Option {
	r = r.Normalized()
	return func(o *options) {
		o.rules = append(o.rules, rules.Spec{Rule: r, Field: fmt.Sprintf("WithRPCRule(%s)", r.RPC), RPCKey: key})
	}
}

// Locker returns the Locker of the Lock section's store (LockConf.DefaultStore), for handlers
// that lock more keys themselves; its locks share the rules' gate.
func (m *Middleware) Locker() *flightlock.Locker { return m.locker }

// Close closes the stores the Middleware built, with their clients (not one given with
// WithLocker or WithStore), once; it is safe beside Shutdown (go-zero's listener).
func (m *Middleware) Close() error {
	if m.listened != nil {
		m.listened.Store(nil) // go-zero's shutdown has nothing left to drain here
	}
	m.closeMu.Lock()
	closers := m.closers
	m.closers = nil
	m.closeMu.Unlock()
	var errs []error
	for _, c := range closers {
		errs = append(errs, c())
	}
	return errors.Join(errs...)
}

// buildStores sets m's base Lockers: the injected one (WithLocker; WithStore when c names
// Redis only, or no store), or one per store that c names or its rules lock in, a WithStore
// store in the place of the one of its kind.
func (m *Middleware) buildStores(o options) error {
	c := m.conf
	m.bases = make(map[string]*flightlock.Locker)
	m.responses = make(map[string]lockstore.ResponseStore)
	primary, ambiguous := c.DefaultStore()
	if o.locker != nil || o.store != nil {
		switch {
		case o.locker != nil:
			m.injected = "WithLocker"
		case primary == rules.StoreRedis && !ambiguous:
			m.injected = "WithStore"
		}
		l, store := o.locker, o.store
		if l != nil {
			store = l.Store()
		}
		// What the store says of itself (lockstore.Describer), else one without responses.
		name, prefix := cmp.Or(store.Capabilities().Name, rules.StoreRedis), c.Prefix
		if sec, ok := c.Section(name); ok && m.injected == "" {
			prefix = sec.KeyPrefix(c.Prefix)
		}
		b := &lockstore.Backend{Name: name, Store: store, Prefix: prefix}
		if d, ok := store.(lockstore.Describer); ok {
			b = d.Describe(prefix)
		}
		if l == nil {
			var err error
			if l, err = baseOn(b, c); err != nil {
				return err
			}
		}
		m.bases[b.Name], m.responses[b.Name] = l, b.Responses
		if m.injected != "" {
			m.locker = l
			return nil
		}
	}
	used := map[string]bool{primary: true}
	for _, cr := range m.rules {
		used[cr.spec.Store] = true
	}
	for _, sec := range c.Sections() {
		// A section naming no store is opened (embedded) only if rules use it and it may be.
		if m.bases[sec.Name()] != nil || !sec.Configured() && (!used[sec.Name()] || sec.Check(sec.Field, lockstore.Use{}) != nil) {
			continue
		}
		b, err := openSection(sec, c, o.mode)
		if err != nil {
			return err
		}
		l, err := baseOn(b, c)
		if err != nil {
			_ = b.Close()
			return err
		}
		closeStore := b.Close
		if b.CloseEndsHolds {
			// Locks a drain left held end when the process exits, as on Redis with their TTL.
			closeStore = func() error {
				if m.drain.leftHolds.Load() {
					return nil
				}
				return b.Close()
			}
		}
		m.bases[sec.Name()], m.responses[sec.Name()], m.closers = l, b.Responses, append(m.closers, closeStore)
	}
	m.locker = m.bases[primary]
	return nil
}

// baseFor returns the store that rule s locks in and its base Locker. With an injected Locker
// every rule locks with it, and a rule naming another Store is refused: it would lock where
// no other process of that rule looks.
func (m *Middleware) baseFor(s rules.Spec) (string, *flightlock.Locker, error) {
	if m.injected != "" {
		for name, l := range m.bases { // its only entry
			if s.Store != "" && s.Store != name {
				return "", nil, rules.FieldError(s.Field+".Store", "is %s, but every rule locks in the %s store given with %s: "+
					"leave Store out, or lock %s rules in a Middleware of their own", s.Store, name, m.injected, s.Store)
			}
			return name, l, nil
		}
	}
	store, err := m.conf.StoreOf(s)
	if err != nil {
		return "", nil, err
	}
	if l := m.bases[store]; l != nil {
		return store, l, nil
	}
	return "", nil, rules.FieldError(s.Field+".Store", "is %s, but the Lock section names no %s store", store, store)
}

// drainStragglers is how long handlers get to return once the grace period ended and their
// contexts were cancelled: with the default Drain, within go-zero's default Shutdown.WaitTime.
const drainStragglers = time.Second

// drainer runs a Middleware's drain once, from go-zero's shutdown listeners or Shutdown.
type drainer struct {
	grace time.Duration
	once  sync.Once
	done  chan struct{} // closed when the drain ended; err is set before
	err   error
	// leftHolds: the drain ended with locks still held, so a store whose Close would end those
	// holds stays open (set before Shutdown closes the stores; read by their closers).
	leftHolds atomic.Bool
}

// Shutdown drains the Middleware once, for LockConf.Drain or until ctx ends, then closes the stores
// it built. Handlers still running then have their contexts cancelled and up to a second more to
// return, so it may return up to a second after ctx ends; another call meanwhile waits while its ctx lets it.
// Locks still held then are not released, as their handlers may run: they run out with their TTL
// (on ZooKeeper, the session) once the process exits. go-zero's shutdown listeners call it (New
// registers one); call it where the service stops otherwise.
func (m *Middleware) Shutdown(ctx context.Context) error {
	first := false
	m.drain.once.Do(func() { first = true })
	if !first {
		select {
		case <-m.drain.done:
			return m.drain.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	err := m.drainAll(ctx, m.drain.grace)
	if err != nil {
		logx.Errorw("flightlock: shutdown: handlers still hold locks after the grace period; their contexts were cancelled",
			logx.Field("grace", m.drain.grace), logx.Field("error", err.Error()))
		if err = m.drainAll(context.WithoutCancel(ctx), drainStragglers); err != nil {
			logx.Errorw("flightlock: shutdown: locks left to their TTL: their handlers did not return",
				logx.Field("error", err.Error()))
		}
	}
	m.drain.leftHolds.Store(err != nil)
	if cerr := m.Close(); cerr != nil && err == nil {
		err = cerr
	}
	m.drain.err = err
	close(m.drain.done)
	return err
}

// drainAll drains every base Locker of m at once, within timeout and ctx.
func (m *Middleware) drainAll(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	lockers := slices.Collect(maps.Values(m.bases))
	errs := make([]error, len(lockers))
	var wg sync.WaitGroup
	for i, l := range lockers {
		wg.Go(func() { errs[i] = l.Drain(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}
