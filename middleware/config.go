package middleware

import (
	"cmp"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/lockstore"
	zeroredis "github.com/zeromicro/go-zero/core/stores/redis"
)

// Values of Rule.OnBusy, LockConf.OnStoreError and RetryConf.Backoff, as normalized (lower
// case).
const (
	onBusyReject       = "reject"
	onBusyWait         = "wait"
	storeErrorsClosed  = "closed"
	storeErrorsOpen    = "open"
	backoffNone        = "none"
	backoffLinear      = "linear"
	backoffExponential = "exponential"
)

// httpMethods are the values of Rule.Method, as normalized (upper case).
var httpMethods = []string{
	http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace,
}

// LockConf configures a Middleware from a go-zero service config, as `Lock middleware.LockConf`.
// go-zero's conf loader fills the defaults in the tags; a LockConf built in Go gets the same
// defaults for its zero fields (an empty Prefix means "lock:", a zero TTL 10s, and so on).
//
// The words of OnStoreError, Redis.Type, Retry.Backoff and a rule's OnBusy and Method are
// matched in any case (OnBusy: Wait, Method: post as goctl's .api files spell it). The tags
// have no options= on purpose: go-zero's loader would refuse a bad value before Validate runs,
// case-sensitively and without naming the field (issue 9); Validate names it and lists the
// values it accepts.
type LockConf struct {
	// Redis is the shared Redis. Without a Host the locks live in an embedded in-memory Redis
	// that only this process sees: for development and tests, never for production.
	Redis RedisConf `json:",optional"`
	// Prefix is put before every rendered key (default "lock:").
	Prefix string `json:",default=lock:"`
	// TTL is how long a lock outlives a holder that died (default 10s); a watchdog renews it
	// every TTL/3 while the handler runs.
	TTL time.Duration `json:",default=10s"`
	// MaxHold bounds how long one request keeps a lock (default 60s).
	MaxHold time.Duration `json:",default=60s"`
	// Wait is how long a rule with OnBusy "wait" queues for a busy key (default 2s); the
	// request's deadline shortens it.
	Wait time.Duration `json:",default=2s"`
	// Retry is how a waiter polls a key held by another process between release notifications.
	Retry RetryConf `json:",optional"`
	// OnStoreError says what a locked route does when Redis cannot be reached: "closed"
	// (default) answers 503 / Unavailable; "open" runs the handler under this process's lock
	// only (a degraded lease: other processes are not excluded, Fence is 0), and counts
	// and logs it.
	OnStoreError string `json:",default=closed"`
	// TrustOwner makes the zrpc server interceptors honour lock owners that an upstream
	// service propagated in the call's metadata (UnaryClientInterceptor), so a downstream lock
	// of the same key re-enters instead of deadlocking. A handed-over owner only re-enters a
	// lock it holds, never a free key. Off by default: enable it only on services that
	// untrusted clients cannot call, and set OwnerSecret on both sides.
	TrustOwner bool `json:",optional"`
	// PropagateTo names the downstream zrpc methods that receive the owners of the locks a
	// request holds (UnaryClientInterceptor): full methods ("/balance.Balance/Debit") or whole
	// services ("/balance.Balance/"). Empty (the default): owners go nowhere.
	PropagateTo []string `json:",optional"`
	// OwnerSecret, when set, signs the owners sent downstream (HMAC-SHA256 of key, owner and
	// fence) and makes TrustOwner accept only owners signed with the same secret, so that only
	// services that share it can hand a lock over. Every service of a call chain sets the same.
	OwnerSecret string `json:",optional"`
	// Rules says which routes and methods are locked, and on which keys.
	Rules []Rule `json:",optional"`
}

// RedisConf mirrors go-zero's redis.RedisConf with an optional Host: no Host means the
// embedded store. Type is "node" (default) or "cluster" (Host lists seeds, comma separated).
//
// Lanes is how many lock script calls go to Redis at once, each as a round trip of its own;
// further concurrent calls wait for the next free lane and share one pipeline. 0 means the
// default (lockstore.DefaultLanes, 4); -1 sends every call on its own, like a plain client.
type RedisConf struct {
	Host     string `json:",optional"`
	Type     string `json:",default=node"`
	User     string `json:",optional"`
	Pass     string `json:",optional"`
	Tls      bool   `json:",optional"`
	Protocol int    `json:",default=3"`
	Lanes    int    `json:",optional"`
}

// storeOptions are the lockstore options that r sets.
func (r RedisConf) storeOptions() []lockstore.Option {
	switch {
	case r.Lanes < 0:
		return []lockstore.Option{lockstore.WithLanes(0)}
	case r.Lanes > 0:
		return []lockstore.Option{lockstore.WithLanes(r.Lanes)}
	}
	return nil
}

// RetryConf says how long a waiter sleeps between attempts on a key held elsewhere: Backoff
// "exponential" (default; from Min to Max, jittered), "linear" (Min, 2*Min, ... up to Max)
// or "none" (one attempt). Attempts caps the attempts per acquisition; 0 means until the wait
// budget ends.
type RetryConf struct {
	Backoff  string        `json:",default=exponential"`
	Min      time.Duration `json:",default=5ms"`
	Max      time.Duration `json:",default=200ms"`
	Attempts int           `json:",optional"`
}

// Rule locks one REST route (Method and Path), one zrpc method (RPC), or both, on the keys
// that Key renders from each request.
//
// Key is a template: literal text with {name} references, for example "order:{body.uid}". For
// REST a reference names its source: {path.x}, {query.x}, {form.x} (an urlencoded or multipart
// body), {body.a.b} (a dotted path into a JSON body), {header.X-Name} and {jwt.claim} (a custom
// claim that go-zero's JWT handler put in the context). Each source is read only when, and as,
// go-zero's httpx.Parse reads it, so that the key is built from the value the handler binds: a
// JSON body only with a Content-Length above 0 and a Content-Type containing application/json,
// and {query.x} and {form.x} are refused when the query and the form body, which go-zero binds
// as one form, hold more than one distinct value of x. A bare {name} is looked up in every
// source Parse could bind it from, in Parse's order: path variable, form (query and body),
// header, top-level JSON body field; it is refused as ambiguous when they give different
// values, so prefer the explicit form. For zrpc a reference names a field of the request
// message by its proto name ({sku}, nested {order.uid}), and {header.x} reads the call's
// metadata. "+" joins keys that are locked together, all or nothing, in a canonical order:
// "acct:{from}+acct:{to}". Two references in one key must be separated by literal text
// containing ':', so that different values never render the same key. A reference that is
// missing, empty or ambiguous fails the request with 400 / InvalidArgument.
//
// Rules whose key is computed in Go are added with WithHTTPRule, WithRPCRule and RouteFunc.
type Rule struct {
	// Method is the REST route's HTTP method, in any case (post is POST); empty matches any
	// method.
	Method string `json:",optional"`
	// Path is the REST route's go-zero pattern, such as /api/sku/:sku/deduct.
	Path string `json:",optional"`
	// RPC is the zrpc full method name, such as /inventory.Inventory/Deduct.
	RPC string `json:",optional"`
	// Key is the key template; see Rule.
	Key string `json:",optional"`
	// OnBusy is what a request does when another holds the key: "reject" (default) answers
	// 409 / Aborted at once, "wait" queues up to the Wait budget first.
	OnBusy string `json:",default=reject"`
	// TTL and Wait override LockConf's for this rule when positive.
	TTL  time.Duration `json:",optional"`
	Wait time.Duration `json:",optional"`
}

// spec is a Rule to compile, with the Go key functions of rules built in Go (go-zero's conf
// loader refuses func fields, so they cannot live in Rule).
type spec struct {
	Rule
	name    string // prefix of error messages: "Lock.Rules[2]"
	httpKey KeyFunc
	rpcKey  RPCKeyFunc
}

// Validate reports the first bad field of c, named as in the YAML file
// (Lock.Rules[1].Key: ...), in an error that wraps flightlock.ErrConfig. New calls it. go-zero's
// conf loader calls it too when LockConf is the config it loads, but not for a LockConf inside a
// service's config: there New reports a bad field at start-up.
func (c LockConf) Validate() error {
	_, err := compileRules(c.normalized(), nil)
	return err
}

// normalized returns c with the words matched in any case spelled as the checks and the
// Middleware compare them: OnStoreError, Redis.Type, Retry.Backoff and rule OnBusy in lower
// case, rule Method in upper case. c's Rules are copied, not changed. New and Validate call it
// once, before anything reads c.
func (c LockConf) normalized() LockConf {
	c.OnStoreError = strings.ToLower(c.OnStoreError)
	c.Redis.Type = strings.ToLower(c.Redis.Type)
	c.Retry.Backoff = strings.ToLower(c.Retry.Backoff)
	if c.Rules != nil {
		rules := make([]Rule, len(c.Rules))
		for i, r := range c.Rules {
			rules[i] = r.normalized()
		}
		c.Rules = rules
	}
	return c
}

// normalized returns r with OnBusy in lower case and Method in upper case, for rules built in
// Go (WithHTTPRule, WithRPCRule, Route) as for those of a LockConf.
func (r Rule) normalized() Rule {
	r.Method = strings.ToUpper(r.Method)
	r.OnBusy = strings.ToLower(r.OnBusy)
	return r
}

// check validates the scalar settings of c.
func (c LockConf) check() error {
	switch {
	case c.TTL < 0:
		return fieldError("Lock.TTL", "must not be negative, got %v", c.TTL)
	case c.MaxHold < 0:
		return fieldError("Lock.MaxHold", "must not be negative, got %v", c.MaxHold)
	case c.Wait < 0:
		return fieldError("Lock.Wait", "must not be negative, got %v", c.Wait)
	case len(c.Prefix) >= flightlock.MaxKeyLen:
		return fieldError("Lock.Prefix", "is %d bytes, a whole key may have %d", len(c.Prefix), flightlock.MaxKeyLen)
	}
	if err := oneOf("Lock.OnStoreError", c.OnStoreError, storeErrorsClosed, storeErrorsOpen); err != nil {
		return err
	}
	if err := oneOf("Lock.Redis.Type", c.Redis.Type, zeroredis.NodeType, zeroredis.ClusterType); err != nil {
		return err
	}
	if err := checkPropagateTo(c.PropagateTo); err != nil {
		return err
	}
	if c.Redis.Lanes < -1 {
		return fieldError("Lock.Redis.Lanes", "must be -1 (no batching), 0 (the default) or a number of lanes, got %d", c.Redis.Lanes)
	}
	switch c.Redis.Protocol {
	case 0, 2, 3:
	default:
		return fieldError("Lock.Redis.Protocol", "must be one of 2, 3; got %d", c.Redis.Protocol)
	}
	return c.Retry.check()
}

func (r RetryConf) check() error {
	if err := oneOf("Lock.Retry.Backoff", r.Backoff, backoffNone, backoffLinear, backoffExponential); err != nil {
		return err
	}
	switch {
	case r.Min < 0:
		return fieldError("Lock.Retry.Min", "must not be negative, got %v", r.Min)
	case r.Max < 0:
		return fieldError("Lock.Retry.Max", "must not be negative, got %v", r.Max)
	case r.Max > 0 && r.Max < r.Min:
		return fieldError("Lock.Retry.Max", "%v is below Min %v", r.Max, r.Min)
	case r.Attempts < 0:
		return fieldError("Lock.Retry.Attempts", "must not be negative, got %d", r.Attempts)
	}
	return nil
}

// strategy returns the flightlock retry strategy r describes.
func (r RetryConf) strategy() flightlock.Retry {
	lo := cmp.Or(r.Min, 5*time.Millisecond)
	hi := cmp.Or(r.Max, 200*time.Millisecond)
	var s flightlock.Retry
	switch r.Backoff {
	case backoffNone:
		return flightlock.NoRetry()
	case backoffLinear:
		linear := flightlock.LinearRetry(lo)
		s = func(attempt int) (time.Duration, bool) {
			d, ok := linear(attempt)
			return min(d, hi), ok
		}
	default:
		s = flightlock.ExponentialRetry(lo, hi)
	}
	if r.Attempts > 0 {
		s = flightlock.LimitRetry(s, r.Attempts)
	}
	return s
}

// zero returns go-zero's RedisConf for NewStore.
func (r RedisConf) zero() zeroredis.RedisConf {
	return zeroredis.RedisConf{
		Host:     r.Host,
		Type:     cmp.Or(r.Type, zeroredis.NodeType),
		User:     r.User,
		Pass:     r.Pass,
		Tls:      r.Tls,
		Protocol: cmp.Or(r.Protocol, 3),
	}
}

// checkRule validates the settings of a rule other than its key template.
func checkRule(r spec) error {
	switch {
	case r.Path == "" && r.RPC == "":
		return fieldError(r.name, "names neither a Path nor an RPC method")
	case r.Key == "" && (r.Path != "" && r.httpKey == nil || r.RPC != "" && r.rpcKey == nil):
		return fieldError(r.name+".Key", "is empty")
	case r.Method != "" && r.Path == "":
		return fieldError(r.name+".Path", "is empty but Method is %q", r.Method)
	}
	if err := oneOf(r.name+".Method", r.Method, httpMethods...); err != nil {
		return err
	}
	if r.RPC != "" {
		if err := checkFullMethod(r.RPC); err != nil {
			return fieldError(r.name+".RPC", "%v", err)
		}
	}
	return checkLockSettings(r.name, r.Rule)
}

// checkLockSettings validates a rule's OnBusy, TTL and Wait.
func checkLockSettings(name string, r Rule) error {
	switch {
	case r.TTL < 0:
		return fieldError(name+".TTL", "must not be negative, got %v", r.TTL)
	case r.Wait < 0:
		return fieldError(name+".Wait", "must not be negative, got %v", r.Wait)
	}
	return oneOf(name+".OnBusy", r.OnBusy, onBusyReject, onBusyWait)
}

// checkFullMethod accepts gRPC full method names: /package.Service/Method.
func checkFullMethod(m string) error {
	rest, ok := strings.CutPrefix(m, "/")
	if !ok {
		return fmt.Errorf("%q must start with '/': /package.Service/Method", m)
	}
	svc, method, ok := strings.Cut(rest, "/")
	if !ok || svc == "" || method == "" || strings.Contains(method, "/") {
		return fmt.Errorf("%q is not of the form /package.Service/Method", m)
	}
	return nil
}

// validMethod reports whether m is an HTTP method, as normalized (upper case).
func validMethod(m string) bool { return slices.Contains(httpMethods, m) }

// oneOf checks that v, normalized, is empty (the default) or one of allowed, and otherwise
// names the field and the values it accepts: Lock.Rules[0].OnBusy: must be one of reject,
// wait; got "bogus".
func oneOf(field, v string, allowed ...string) error {
	if v == "" || slices.Contains(allowed, v) {
		return nil
	}
	return fieldError(field, "must be one of %s; got %q", strings.Join(allowed, ", "), v)
}

// fieldError names the bad field first, as go-zero's conf loader does, in an error that wraps
// flightlock.ErrConfig.
func fieldError(field, format string, args ...any) error {
	return &configError{field: field, err: fmt.Errorf(format, args...)}
}

// configError is a bad setting: Error names the field first ("Lock.Rules[1].OnBusy: ..."),
// and errors.Is matches flightlock.ErrConfig as well as what err wraps.
type configError struct {
	field string
	err   error
}

func (e *configError) Error() string   { return e.field + ": " + e.err.Error() }
func (e *configError) Unwrap() []error { return []error{flightlock.ErrConfig, e.err} }
