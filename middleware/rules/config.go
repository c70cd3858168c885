package rules

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/etcdstore/etcdconf"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/redisstore/redisconf"
	"github.com/flightlock/flightlock/zkstore/zkconf"
	"github.com/zeromicro/go-zero/core/conf"
)

// The values of the settings matched in any case, as normalized (lower case).
const (
	OnBusyReject       = "reject"
	OnBusyWait         = "wait"
	OnBusyShare        = "share"
	StoreErrorsClosed  = "closed"
	StoreErrorsOpen    = "open"
	BackoffNone        = "none"
	BackoffLinear      = "linear"
	BackoffExponential = "exponential"
	StoreRedis         = "redis"
	StoreEtcd          = "etcd"
	StoreZookeeper     = "zookeeper"
	ModeRead           = "read"
	ModeWrite          = "write"
)

// The store sections, each owned by its store's package (lockstore.Driver), which documents it.
type (
	RedisConf     = redisconf.Conf
	SentinelConf  = redisconf.SentinelConf
	EtcdConf      = etcdconf.Conf
	ZookeeperConf = zkconf.Conf
)

// Section is one store's section of a LockConf: its path in the YAML file and its driver.
type Section struct {
	Field string // "Lock.Etcd"
	lockstore.Driver
}

// Sections are the store sections of c, in the order Redis, etcd, ZooKeeper.
func (c LockConf) Sections() []Section {
	return []Section{{"Lock.Redis", c.Redis}, {"Lock.Etcd", c.Etcd}, {"Lock.Zookeeper", c.Zookeeper}}
}

// Section returns the section of the store named name; ok is false for no such store.
func (c LockConf) Section(name string) (s Section, ok bool) {
	for _, s := range c.Sections() {
		if s.Name() == name {
			return s, true
		}
	}
	return Section{}, false
}

// HTTPMethods are the values of Rule.Method, as normalized (upper case).
var HTTPMethods = []string{
	http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace,
}

// LockConf configures a Middleware from a go-zero service config, as `Lock middleware.LockConf`;
// docs/configuration.md gives each field in full. The tags hold the only defaults: go-zero's
// loader fills them, and New and Validate fill the zero fields of a LockConf built in Go from
// them (never a bool: false is a value). OnStoreError, Redis.Type, Redis.MaintNotifications,
// Retry.Backoff and a rule's OnBusy, Mode, Method, Store and OnStoreError match in any case; the
// tags have no options=, with which go-zero would refuse a bad value case-sensitively without
// naming the field; Validate names it.
type LockConf struct {
	// Redis is the shared Redis; without a Host, an embedded in-memory one that only this
	// Middleware sees, refused in go-zero's pre and pro modes (WithServiceMode).
	Redis RedisConf `json:",optional"`
	// Etcd and Zookeeper are the other stores. With several named, rules say which (Rule.Store).
	Etcd      EtcdConf      `json:",optional"`
	Zookeeper ZookeeperConf `json:",optional"`
	// Prefix is put before every rendered key; in etcd, after Etcd.Key.
	Prefix string `json:",default=lock:"`
	// TTL is how long a lock outlives a holder that died; a watchdog renews it every TTL/3.
	TTL time.Duration `json:",default=10s"`
	// MaxHold bounds how long one request keeps a lock.
	MaxHold time.Duration `json:",default=60s"`
	// Wait bounds how long a rule with OnBusy "wait" queues, ending a reserve before the deadline.
	Wait time.Duration `json:",default=2s"`
	// Retry is how a waiter polls a key held by another process between release notifications.
	Retry RetryConf `json:",optional"`
	// OnStoreError is what a locked route does when the store cannot be reached: "closed"
	// answers 503 / Unavailable; "open" runs the handler under this process's lock only.
	OnStoreError string `json:",default=closed"`
	// TrustOwner makes the zrpc server interceptors honour the lock owners an upstream service
	// propagated, which only re-enter locks they hold: only where untrusted clients cannot call.
	TrustOwner bool `json:",optional"`
	// PropagateTo names the downstream zrpc methods that receive the owners of the request's
	// locks: full methods ("/balance.Balance/Debit") or services ("/balance.Balance/").
	PropagateTo []string `json:",optional"`
	// OwnerSecret, when set, signs the owners sent, and TrustOwner accepts only those; every
	// service of a chain sets the same.
	OwnerSecret string `json:",optional"`
	// Drain is Middleware.Shutdown's grace period; keep it below Shutdown.WaitTime minus WrapUpTime.
	Drain time.Duration `json:",default=3s"`
	// TraceKeys puts a request's rendered keys (user ids...) in its lock span: flightlock.keys.
	TraceKeys bool `json:",optional"`
	// Rules says which routes and methods are locked, and on which keys.
	Rules []Rule `json:",optional"`
}

// DefaultStore is the store of a rule that names none: the one store c names, else Redis (the
// embedded one). ambiguous: c names several, and store is the first (Middleware.Locker's).
func (c LockConf) DefaultStore() (store string, ambiguous bool) {
	named := c.storeNames(true)
	if len(named) == 0 {
		return StoreRedis, false
	}
	return named[0], len(named) > 1
}

// storeNames are the stores of c's sections in order: those c names when named, else all.
func (c LockConf) storeNames(named bool) []string {
	var names []string
	for _, s := range c.Sections() {
		if !named || s.Configured() {
			names = append(names, s.Name())
		}
	}
	return names
}

// StoreOf is the store that rule s of c runs on, or a problem naming the field.
func (c LockConf) StoreOf(s Spec) (string, error) {
	if s.Store == "" {
		store, ambiguous := c.DefaultStore()
		if ambiguous {
			return "", FieldError(s.Field+".Store", "is empty, but Lock names several stores (a Redis by Redis.Host or Sentinel, "+
				"etcd by Etcd.Hosts, ZooKeeper by Zookeeper.Hosts): say which this rule locks in, %s", strings.Join(c.storeNames(true), " or "))
		}
		return store, nil
	}
	sec, ok := c.Section(s.Store)
	if !ok {
		return "", OneOf(s.Field+".Store", s.Store, c.storeNames(false)...)
	}
	if err := sec.Check(sec.Field, lockstore.Use{Field: s.Field}); err != nil { // a section that names no store
		return "", err
	}
	return s.Store, nil
}

// CheckRuleStore validates rule s's store and what its driver requires of s (Driver.Check).
func (c LockConf) CheckRuleStore(s Spec) error {
	store, err := c.StoreOf(s)
	if err != nil {
		return err
	}
	sec, _ := c.Section(store)
	u := lockstore.Use{Field: s.Field, Share: s.OnBusy == OnBusyShare}
	switch primary, _ := c.DefaultStore(); {
	case s.TTL > 0:
		u.TTLField, u.TTL = s.Field+".TTL", s.TTL
	case primary != store: // else Lock.TTL is checked once, with the scalars
		u.TTLField, u.TTL = "Lock.TTL", c.TTL
	}
	return sec.Check(sec.Field, u)
}

// RetryConf says how long a waiter sleeps between attempts on a key held elsewhere: Backoff
// "exponential" (default; Min to Max, jittered), "linear" (Min, 2*Min, ... up to Max) or
// "none", which refuses a Min, Max or Attempts other than its default (it would ignore them).
// Attempts caps the attempts per acquisition; 0 means until the wait budget ends.
type RetryConf struct {
	Backoff  string        `json:",default=exponential"`
	Min      time.Duration `json:",default=5ms"`
	Max      time.Duration `json:",default=200ms"`
	Attempts int           `json:",optional"`
}

// Rule locks one REST route (Method and Path), one zrpc method (RPC), or both, on the keys
// that Key renders from each request; docs/configuration.md gives each field in full.
//
// Key is a template such as "order:{body.uid}": {name} references (REST: path, query, form, body,
// header and jwt, each read as go-zero's httpx.Parse reads it for the handler; zrpc: a request
// field by proto name, or header), "+" joining keys locked all or nothing, and text containing ':'
// between two references. A missing, empty or ambiguous value answers 400 / InvalidArgument.
//
// Rules whose key is computed in Go are added with WithHTTPRule, WithRPCRule and RouteFunc.
type Rule struct {
	// Name gives the rule to Named(Name)'s middleware, for a goctl @server(middleware: Name)
	// group, instead of Handle. Path and Method narrow it; rules sharing a name each need theirs.
	Name string `json:",optional"`
	// Method is the REST route's HTTP method, in any case; empty matches any method.
	Method string `json:",optional"`
	// Path is the REST route's go-zero pattern, such as /api/sku/:sku/deduct.
	Path string `json:",optional"`
	// RPC is the zrpc full method name, such as /inventory.Inventory/Deduct.
	RPC string `json:",optional"`
	// Key is the key template; see Rule.
	Key string `json:",optional"`
	// OnBusy is what a request does when another holds the key: "wait" queues (FIFO) up to Wait,
	// then answers 409 / Aborted; "reject" answers so at once; "share" gets the holder's response.
	OnBusy string `json:",default=wait"`
	// Replay is how long a share rule stores a response of the ReplayStatus classes, up to
	// ReplayMaxBytes, for later duplicates. On other rules, a value of these three other than the
	// default is refused.
	Replay         time.Duration `json:",default=10s"`
	ReplayStatus   string        `json:",default=2xx"`
	ReplayMaxBytes int           `json:",default=65536"`
	// TTL and Wait override LockConf's when positive; a reject rule never waits: no Wait.
	TTL  time.Duration `json:",optional"`
	Wait time.Duration `json:",optional"`
	// Shadow runs the rule without enforcing it: each request it would have refused or queued
	// is counted in flightlock_shadow_conflicts_total. Its locks live under Prefix + "shadow:".
	Shadow bool `json:",optional"`
	// Store is where the rule locks, "redis", "etcd" or "zookeeper" (empty: the one Lock names).
	// A share rule cannot lock in ZooKeeper, which keeps no responses.
	Store string `json:",optional"`
	// OnStoreError overrides LockConf.OnStoreError for this rule.
	OnStoreError string `json:",optional"`
	// Permits makes the rule a semaphore (flightlock.WithPermits): 2 to flightlock.MaxPermits
	// requests may hold a key at once. Left out (0), the rule is a lock; 1 is refused.
	Permits int `json:",optional"`
	// Mode makes the rule's locks one side of a read-write lock (flightlock.WithRead): "read"
	// (reads of a key run together) or "write". Empty is a plain lock, excluding as a write.
	Mode string `json:",optional"`
	// ReadOnly allows a read rule on a method other than GET or HEAD, which usually write.
	ReadOnly bool `json:",optional"`
	// Fair grants each key in request order across processes, without single flight (WithFair).
	Fair bool `json:",optional"`
}

// Validate reports the first bad field of c, named as in the YAML (Lock.Rules[1].Key: ...),
// wrapping ErrConfig; New calls it, go-zero's loader only when LockConf is the whole config.
func (c LockConf) Validate() error {
	_, err := Compile(c.Normalized(), nil)
	return err
}

// Problems reports every bad field of c, each a *ConfigError, for tools (flightlock check):
// the scalar settings, then each rule compiled after the good rules before it. Validate
// returns the same first one, unless a rule conflicts with an earlier one (two Permits of one
// key) and a later rule is bad alone: Compile checks each rule alone before comparing them.
func (c LockConf) Problems() []error {
	n := c.Normalized()
	ps := n.problems()
	base := n
	base.Rules = nil
	// The rules compile against n's store sections; a bad TTL or OnStoreError, which every rule
	// reads, gives way to its default, so that it is reported once, with the scalars.
	def := LockConf{}.Normalized()
	for _, p := range ps {
		var ce *ConfigError
		switch {
		case !errors.As(p, &ce):
		case ce.Field == "Lock.TTL":
			base.TTL = def.TTL
		case ce.Field == "Lock.OnStoreError":
			base.OnStoreError = def.OnStoreError
		}
	}
	var good []Spec
	for i, r := range n.Rules {
		s := Spec{Rule: r, Field: fmt.Sprintf("Lock.Rules[%d]", i)}
		if _, err := base.compileRules(append(good[:len(good):len(good)], s)); err != nil {
			ps = append(ps, err)
			continue
		}
		good = append(good, s)
	}
	return ps
}

// Normalized returns c with the tags' defaults in its zero fields and the words matched in any
// case as they are compared (Method upper case, the others lower), on copies of c's slices.
func (c LockConf) Normalized() LockConf {
	withDefaults(&c)
	c.OnStoreError = strings.ToLower(c.OnStoreError)
	c.Redis.Type = strings.ToLower(c.Redis.Type)
	c.Redis.MaintNotifications = strings.ToLower(c.Redis.MaintNotifications)
	c.Retry.Backoff = strings.ToLower(c.Retry.Backoff)
	c.Etcd.Hosts = slices.Clone(c.Etcd.Hosts) // nil stays nil
	c.Zookeeper.Hosts = slices.Clone(c.Zookeeper.Hosts)
	c.Rules = slices.Clone(c.Rules)
	for i, r := range c.Rules {
		c.Rules[i] = r.Normalized()
	}
	return c
}

// Normalized returns r as LockConf.Normalized returns a rule, for rules built in Go too.
func (r Rule) Normalized() Rule {
	withDefaults(&r)
	r.Method = strings.ToUpper(r.Method)
	r.OnBusy = strings.ToLower(r.OnBusy)
	r.Store = strings.ToLower(r.Store)
	r.OnStoreError = strings.ToLower(r.OnStoreError)
	r.Mode = strings.ToLower(r.Mode)
	return r
}

// withDefaults fills the zero fields of *v with its type's tag defaults. FillDefault fails only
// on a malformed tag, a bug every test would hit: hence the panic.
func withDefaults[T any](v *T) {
	var def T
	if err := conf.FillDefault(&def); err != nil {
		panic(fmt.Sprintf("flightlock: the tags of %T: %v", def, err))
	}
	fillZero(reflect.ValueOf(v).Elem(), reflect.ValueOf(def))
}

// fillZero sets each zero field of the struct dst to def's, recursively (conf.FillDefault
// refuses a struct with any field set), but bools (false is a value) and slices (the defaults
// have none; rules are normalized one by one).
func fillZero(dst, def reflect.Value) {
	for i := range dst.NumField() {
		f := dst.Field(i)
		switch {
		case !f.CanSet():
		case f.Kind() == reflect.Struct:
			fillZero(f, def.Field(i))
		case f.Kind() == reflect.Bool, f.Kind() == reflect.Slice:
		case f.IsZero():
			f.Set(def.Field(i))
		}
	}
}

// problems validates the scalar settings of c.
func (c LockConf) problems() []error {
	var prefix error
	if len(c.Prefix) >= flightlock.MaxKeyLen {
		prefix = FieldError("Lock.Prefix", "is %d bytes, a whole key may have %d", len(c.Prefix), flightlock.MaxKeyLen)
	}
	ps := []error{negative("Lock.TTL", c.TTL), negative("Lock.MaxHold", c.MaxHold), negative("Lock.Wait", c.Wait), prefix,
		OneOf("Lock.OnStoreError", c.OnStoreError, StoreErrorsClosed, StoreErrorsOpen), checkPropagateTo(c.PropagateTo)}
	for _, s := range c.Sections() {
		ps = append(ps, s.Validate(s.Field, c.Prefix)...)
	}
	if store, _ := c.DefaultStore(); c.TTL >= 0 {
		sec, _ := c.Section(store)
		ps = append(ps, sec.Check(sec.Field, lockstore.Use{TTLField: "Lock.TTL", TTL: c.TTL}))
	}
	ps = append(ps, c.Retry.problems()...)
	return slices.DeleteFunc(ps, func(err error) bool { return err == nil })
}

// problems validates the settings of r, one problem (or nil) per field.
func (r RetryConf) problems() []error {
	maxErr := negative("Lock.Retry.Max", r.Max)
	if maxErr == nil && r.Max > 0 && r.Max < r.Min {
		maxErr = FieldError("Lock.Retry.Max", "%v is below Min %v", r.Max, r.Min)
	}
	ps := []error{OneOf("Lock.Retry.Backoff", r.Backoff, BackoffNone, BackoffLinear, BackoffExponential),
		negative("Lock.Retry.Min", r.Min), maxErr, negative("Lock.Retry.Attempts", r.Attempts)}
	if r.Backoff != BackoffNone {
		return ps
	}
	// One attempt, no pause: the pacing would be ignored. (A default equals a value written out.)
	var def RetryConf
	withDefaults(&def)
	for _, f := range []setting{{"Min", r.Min != def.Min}, {"Max", r.Max != def.Max}, {"Attempts", r.Attempts != def.Attempts && r.Attempts != 1}} {
		if f.set {
			ps = append(ps, FieldError("Lock.Retry."+f.field, "is set with Backoff none, which makes one attempt and never pauses: "+
				"leave %s out, or choose Backoff linear or exponential", f.field))
		}
	}
	return ps
}

// negative names field when v, a duration or a count, is below zero.
func negative[T time.Duration | int](field string, v T) error {
	if v < 0 {
		return FieldError(field, "must not be negative, got %v", v)
	}
	return nil
}

// Strategy returns the flightlock retry strategy r describes, once normalized.
func (r RetryConf) Strategy() flightlock.Retry {
	var s flightlock.Retry
	switch r.Backoff {
	case BackoffNone:
		return flightlock.NoRetry()
	case BackoffLinear:
		linear := flightlock.LinearRetry(r.Min)
		s = func(attempt int) (time.Duration, bool) {
			d, ok := linear(attempt)
			return min(d, r.Max), ok
		}
	default:
		s = flightlock.ExponentialRetry(r.Min, r.Max)
	}
	if r.Attempts > 0 {
		s = flightlock.LimitRetry(s, r.Attempts)
	}
	return s
}

// checkRule validates the settings of a rule other than its key template.
func checkRule(r Spec, storeErrors string) error {
	switch {
	case r.Path == "" && r.RPC == "" && r.Name == "":
		return FieldError(r.Field, "names no Path, RPC method or Name: it would lock nothing")
	case r.Name != "" && (r.HTTPKey != nil || r.RPCKey != nil):
		// Named returns the middleware of a named rule; Handle and the interceptors skip it.
		return FieldError(r.Field+".Name", "is set on a rule whose key a function computes: a named rule is locked only by "+
			"the middleware Named returns; leave Name out, or use RouteFunc for a route group")
	case r.Name != "" && r.RPC != "":
		// Named returns a REST middleware; zrpc methods are locked by the interceptors.
		return FieldError(r.Field+".RPC", "is set on the named rule %s, a REST middleware: lock %s in a rule without a Name", r.Name, r.RPC)
	case r.Key != "" && (r.HTTPKey != nil || r.RPCKey != nil):
		return FieldError(r.Field+".Key", "is set on a rule whose key a function computes: leave it out")
	case r.HTTPKey != nil && r.RPC != "":
		return FieldError(r.Field+".RPC", "is set on a rule whose key function reads REST requests: lock %s in a rule of its own", r.RPC)
	case r.RPCKey != nil && r.Path != "":
		return FieldError(r.Field+".Path", "is set on a rule whose key function reads zrpc calls: lock %s in a rule of its own", r.Path)
	case r.RPCKey != nil && r.Method != "":
		return FieldError(r.Field+".Method", "is set on a rule whose key function reads zrpc calls: leave it out")
	case r.Key == "" && ((r.Path != "" || r.Name != "") && r.HTTPKey == nil || r.RPC != "" && r.RPCKey == nil):
		return FieldError(r.Field+".Key", "is empty")
	case r.Method != "" && r.Path == "" && r.Name == "":
		return FieldError(r.Field+".Path", "is empty but Method is %q", r.Method)
	}
	var rpcErr error
	if r.RPC != "" {
		rpcErr = checkFullMethod(r.Field+".RPC", r.RPC)
	}
	return cmp.Or(OneOf(r.Field+".Method", r.Method, HTTPMethods...), rpcErr, CheckLockSettings(r.Field, r.Rule, storeErrors))
}

// CheckLockSettings validates a rule's lock settings (all but the key and what it locks);
// storeErrors is the Lock section's OnStoreError, which a rule without its own follows.
func CheckLockSettings(name string, r Rule, storeErrors string) error {
	if err := cmp.Or(negative(name+".TTL", r.TTL), negative(name+".Wait", r.Wait),
		OneOf(name+".OnBusy", r.OnBusy, OnBusyReject, OnBusyWait, OnBusyShare),
		OneOf(name+".OnStoreError", r.OnStoreError, StoreErrorsClosed, StoreErrorsOpen)); err != nil {
		return err
	}
	switch {
	case r.Wait > 0 && r.OnBusy == OnBusyReject:
		// A reject rule answers a busy key at once, shadowed or not: its Wait would go unused.
		return FieldError(name+".Wait", "is set on a rule with OnBusy reject, which never waits: leave Wait out, or use OnBusy wait")
	case r.Permits == 1:
		return FieldError(name+".Permits", "1 is a lock, which has no Permits: leave Permits out for a lock, or give 2 to %d for a semaphore", flightlock.MaxPermits)
	case r.Permits < 0 || r.Permits > flightlock.MaxPermits:
		return FieldError(name+".Permits", "must be 2 to %d (leave it out for a lock), got %d", flightlock.MaxPermits, r.Permits)
	case r.Permits > 1 && r.OnBusy == OnBusyShare:
		return FieldError(name+".Permits", "cannot be set with OnBusy share: a shared response is one run's, and %d may run at once", r.Permits)
	}
	if err := checkLockKind(name, r, storeErrors); err != nil {
		return err
	}
	if r.OnBusy != OnBusyShare {
		return checkNoReplay(name, r)
	}
	switch {
	case r.Shadow:
		return FieldError(name+".Shadow", "cannot be set with OnBusy share: a shared response is not a shadow's to give")
	case r.Replay <= 0:
		return FieldError(name+".Replay", "must be positive, got %v", r.Replay)
	}
	_, err := ParseReplayStatus(name+".ReplayStatus", r.ReplayStatus)
	return cmp.Or(negative(name+".ReplayMaxBytes", r.ReplayMaxBytes), err)
}

// checkLockKind validates Mode and Fair against the rest of a rule (as CheckLockSettings), in
// the rule's own words for what flightlock.New would refuse.
func checkLockKind(name string, r Rule, storeErrors string) error {
	if err := OneOf(name+".Mode", r.Mode, ModeRead, ModeWrite); err != nil {
		return err
	}
	read := r.Mode == ModeRead
	switch {
	case r.Mode != "" && r.Permits > 1:
		return FieldError(name+".Permits", "cannot be set with Mode %s: permits beyond the first are keys apart from the read-write lock "+
			"of the key, so they would exclude neither reads nor writes; drop Permits, or Mode for a semaphore", r.Mode)
	case read && r.Method != "" && r.Method != http.MethodGet && r.Method != http.MethodHead && !r.ReadOnly:
		// Read-locked writes would run together, silently.
		return FieldError(name+".Mode", "is read on %s, a method whose requests usually write, and reads run beside each other: "+
			"use Mode write (or leave Mode out) for a handler that writes, or set ReadOnly: true on the rule if this %s only reads", r.Method, r.Method)
	case r.ReadOnly && !read:
		return FieldError(name+".ReadOnly", "is set on a rule without Mode read: it only lets a read rule be on a method other than GET or HEAD")
	case read && r.Fair:
		return FieldError(name+".Fair", "cannot be set with Mode read: reads of a key run together, there is no line to keep; "+
			"set Fair on the write rules, or drop it")
	case read && r.OnBusy == OnBusyShare:
		return FieldError(name+".OnBusy", "cannot be share with Mode read: a shared response is one run's, and reads of a key "+
			"run together anyway; use wait or reject")
	case r.Fair && r.Permits > 1:
		return FieldError(name+".Fair", "cannot be set with Permits: a semaphore of %d permits keeps no line; drop Fair or Permits", r.Permits)
	}
	if !read && !r.Fair {
		return nil
	}
	what := "a read lock"
	if !read {
		what = "a fair lock"
	}
	// Read and fair locks are taken outside the per-process gate a rule falling open runs under.
	switch {
	case r.OnStoreError == StoreErrorsOpen:
		return FieldError(name+".OnStoreError", "cannot be open for %s: it has no per-process lock to fall back on "+
			"when the store is down; set closed", what)
	case r.OnStoreError == "" && storeErrors == StoreErrorsOpen:
		return FieldError(name+".OnStoreError", "is empty, so the rule follows Lock.OnStoreError: open, and %s has no "+
			"per-process lock to fall back on when the store is down; set OnStoreError: closed on the rule", what)
	}
	return nil
}

// LockOptions are the flightlock options of r's own settings, normalized and checked.
func (r Rule) LockOptions() []flightlock.Option {
	var opts []flightlock.Option
	if r.TTL > 0 {
		opts = append(opts, flightlock.WithTTL(r.TTL))
	}
	if r.Wait > 0 {
		opts = append(opts, flightlock.WithWait(r.Wait))
	}
	if r.Permits > 1 {
		opts = append(opts, flightlock.WithPermits(r.Permits))
	}
	if r.Mode == ModeRead {
		opts = append(opts, flightlock.WithRead())
	}
	if r.Fair {
		opts = append(opts, flightlock.WithFair())
	}
	return opts
}

// LockMode is the mode r's locks take, as traces and tools name it: "read" for Mode read,
// "write" for every other rule (plain locks and permits exclude as a write does).
func (r Rule) LockMode() string { return cmp.Or(r.Mode, ModeWrite) }

// checkNoReplay refuses a replay setting other than its default on r, not a share rule.
func checkNoReplay(name string, r Rule) error {
	def := Rule{}.Normalized()
	for _, f := range []setting{{"Replay", r.Replay != def.Replay}, {"ReplayStatus", r.ReplayStatus != def.ReplayStatus},
		{"ReplayMaxBytes", r.ReplayMaxBytes != def.ReplayMaxBytes}} {
		if f.set {
			return FieldError(name+"."+f.field, "is set on a rule with OnBusy %s, which keeps no responses: only OnBusy share replays; leave %s out", r.OnBusy, f.field)
		}
	}
	return nil
}

// setting is a field, and whether it holds other than its default.
type setting struct {
	field string
	set   bool
}

// checkFullMethod accepts gRPC full method names, /package.Service/Method.
func checkFullMethod(field, m string) error {
	rest, ok := strings.CutPrefix(m, "/")
	if !ok {
		return FieldError(field, "%q must start with '/': /package.Service/Method", m)
	}
	svc, method, ok := strings.Cut(rest, "/")
	if !ok || svc == "" || method == "" || strings.Contains(method, "/") {
		return FieldError(field, "%q is not of the form /package.Service/Method", m)
	}
	return nil
}

// OneOf accepts v, normalized, empty (the default) or one of allowed.
func OneOf(field, v string, allowed ...string) error {
	if v == "" || slices.Contains(allowed, v) {
		return nil
	}
	return FieldError(field, "must be one of %s; got %q", strings.Join(allowed, ", "), v)
}

// FieldError names the bad field first, as go-zero's loader does, in a *ConfigError (which
// wraps flightlock.ErrConfig).
func FieldError(field, format string, args ...any) error {
	return lockstore.FieldError(field, format, args...)
}

// ConfigError is a bad setting, as Validate, Problems and New report it; see lockstore.ConfigError.
type ConfigError = lockstore.ConfigError

// checkPropagateTo accepts "/package.Service/" and "/package.Service/Method".
func checkPropagateTo(to []string) error {
	for i, t := range to {
		if svc, ok := strings.CutSuffix(t, "/"); ok && strings.Count(svc, "/") == 1 && strings.HasPrefix(svc, "/") && len(svc) > 1 {
			continue
		}
		if field := fmt.Sprintf("Lock.PropagateTo[%d]", i); checkFullMethod(field, t) != nil {
			return FieldError(field, "%q is neither /package.Service/ nor /package.Service/Method", t)
		}
	}
	return nil
}
