package middleware

import (
	"cmp"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/lockstore"
	zeroredis "github.com/zeromicro/go-zero/core/stores/redis"
)

// Values of Rule.OnBusy and LockConf.OnStoreError.
const (
	onBusyReject      = "reject"
	onBusyWait        = "wait"
	storeErrorsClosed = "closed"
	storeErrorsOpen   = "open"
)

// LockConf configures a Middleware from a go-zero service config, as `Lock middleware.LockConf`.
// go-zero's conf loader fills the defaults in the tags; a LockConf built in Go gets the same
// defaults for its zero fields (an empty Prefix means "lock:", a zero TTL 10s, and so on).
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
	OnStoreError string `json:",default=closed,options=closed|open"`
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
	Type     string `json:",default=node,options=node|cluster"`
	User     string `json:",optional"`
	Pass     string `json:",optional"`
	Tls      bool   `json:",optional"`
	Protocol int    `json:",default=3,options=2|3"`
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
	Backoff  string        `json:",default=exponential,options=none|linear|exponential"`
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
	// Method is the REST route's HTTP method; empty matches any method.
	Method string `json:",optional"`
	// Path is the REST route's go-zero pattern, such as /api/sku/:sku/deduct.
	Path string `json:",optional"`
	// RPC is the zrpc full method name, such as /inventory.Inventory/Deduct.
	RPC string `json:",optional"`
	// Key is the key template; see Rule.
	Key string `json:",optional"`
	// OnBusy is what a request does when another holds the key: "reject" (default) answers
	// 409 / Aborted at once, "wait" queues up to the Wait budget first.
	OnBusy string `json:",default=reject,options=reject|wait"`
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
// (Lock.Rules[1].Key: ...). New calls it.
func (c LockConf) Validate() error {
	_, err := compileRules(c, nil)
	return err
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
	switch c.OnStoreError {
	case "", storeErrorsClosed, storeErrorsOpen:
	default:
		return fieldError("Lock.OnStoreError", `must be "closed" or "open", got %q`, c.OnStoreError)
	}
	switch c.Redis.Type {
	case "", zeroredis.NodeType, zeroredis.ClusterType:
	default:
		return fieldError("Lock.Redis.Type", `must be "node" or "cluster", got %q`, c.Redis.Type)
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
		return fieldError("Lock.Redis.Protocol", "must be 2 or 3, got %d", c.Redis.Protocol)
	}
	return c.Retry.check()
}

func (r RetryConf) check() error {
	switch r.Backoff {
	case "", "none", "linear", "exponential":
	default:
		return fieldError("Lock.Retry.Backoff", `must be "none", "linear" or "exponential", got %q`, r.Backoff)
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
	case "none":
		return flightlock.NoRetry()
	case "linear":
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

// zero returns go-zero's RedisConf for lockstore.NewFromConf.
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
	case r.Method != "" && !validMethod(r.Method):
		return fieldError(r.name+".Method", "unknown HTTP method %q", r.Method)
	case r.Method != "" && r.Path == "":
		return fieldError(r.name+".Path", "is empty but Method is %q", r.Method)
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
	switch r.OnBusy {
	case "", onBusyReject, onBusyWait:
		return nil
	default:
		return fieldError(name+".OnBusy", `must be "reject" or "wait", got %q`, r.OnBusy)
	}
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

func validMethod(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// fieldError names the bad field first, as go-zero's conf loader does.
func fieldError(field, format string, args ...any) error {
	return fmt.Errorf("%s: "+format, append([]any{field}, args...)...)
}
