package main

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/zeromicro/go-zero/core/conf"
	yaml2 "gopkg.in/yaml.v2" // go-zero's YAML parser: a plain scalar's type is the one it sees
	"gopkg.in/yaml.v3"

	"github.com/flightlock/flightlock/internal/typo"
	"github.com/flightlock/flightlock/middleware"
)

var (
	lockConfType = reflect.TypeFor[middleware.LockConf]()
	durationType = reflect.TypeFor[time.Duration]()
)

// ignoredKeys are keys that a Lock section may hold although LockConf has no field for them:
// go-zero's RedisConf.DisableIdentity, so that a service's Redis section can be copied under
// Lock as it is (see middleware.RedisConf), and discov.EtcdConf.ID.
var ignoredKeys = map[reflect.Type][]string{
	reflect.TypeFor[middleware.RedisConf](): {"disableidentity"},
	// go-zero's discov.EtcdConf.ID (a service's registration lease), so that a zrpc service's
	// Etcd section can be copied under Lock (see middleware.EtcdConf).
	reflect.TypeFor[middleware.EtcdConf](): {"id"},
}

// walkSettings checks mapping n against struct type t as go-zero's conf loader reads it: keys
// matched to fields in any case (core/conf toLowerCaseKeyMap), unknown keys ignored, values
// of the field's type. It reports each unknown, repeated or mistyped setting, and returns the
// value nodes that go-zero would refuse, to leave out when the section is loaded.
func (c *checker) walkSettings(s *section, n *yaml.Node, t reflect.Type, path string) map[*yaml.Node]bool {
	drop := make(map[*yaml.Node]bool)
	c.walkValue(s, n, t, path, drop)
	return drop
}

// settingName is the name go-zero's loader matches a field by: its json tag's name, else the
// field's name (core/conf getTagName).
func settingName(f reflect.StructField) string {
	if tag, ok := f.Tag.Lookup("json"); ok {
		if name, _, _ := strings.Cut(tag, ","); strings.TrimSpace(name) != "" {
			return strings.TrimSpace(name)
		}
	}
	return f.Name
}

func (c *checker) walkValue(s *section, n *yaml.Node, t reflect.Type, path string, drop map[*yaml.Node]bool) {
	n = deref(n)
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // the zero value, as go-zero reads null
	}
	switch {
	case t == durationType:
		c.checkDuration(s, n, path, drop)
	case t.Kind() == reflect.Struct:
		if n.Kind != yaml.MappingNode {
			c.mistyped(s, n, path, "settings under it (a mapping)", drop)
			return
		}
		c.walkStruct(s, n, t, path, drop)
	case t.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			c.mistyped(s, n, path, "a list", drop)
			return
		}
		for i, item := range n.Content {
			c.walkValue(s, item, t.Elem(), fmt.Sprintf("%s[%d]", path, i), drop)
		}
	default:
		c.checkScalar(s, n, t, path, drop)
	}
}

func (c *checker) walkStruct(s *section, n *yaml.Node, t reflect.Type, path string, drop map[*yaml.Node]bool) {
	fields := make(map[string]reflect.StructField)
	var names []string
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		fields[strings.ToLower(settingName(f))] = f
		names = append(names, settingName(f))
	}
	seen := make(map[string]*yaml.Node) // lower-case key => first key node
	for _, p := range pairs(n) {
		lk := strings.ToLower(p.key.Value)
		f, known := fields[lk]
		if !known {
			if !slices.Contains(ignoredKeys[t], lk) {
				c.errorAt(s, p.key, "%s: unknown setting %q: go-zero ignores it%s", path, p.key.Value, suggest(p.key.Value, names, path))
			}
			continue
		}
		if first, dup := seen[lk]; dup {
			how := "go-zero keeps the last one"
			if first.Value != p.key.Value {
				how = "go-zero matches keys in any case and keeps one of them at random"
			}
			c.errorAt(s, p.key, "%s.%s is written twice (first at line %d): %s", path, settingName(f), first.Line, how)
			continue
		}
		seen[lk] = p.key
		c.walkValue(s, p.value, f.Type, path+"."+settingName(f), drop)
	}
}

// suggest names the setting that name probably meant, or lists those of path.
func suggest(name string, names []string, path string) string {
	if near := nearest(name, names); near != "" {
		return fmt.Sprintf(" (did you mean %s?)", near)
	}
	return fmt.Sprintf(" (the settings of %s are %s)", path, strings.Join(names, ", "))
}

// goZeroValue is the value of a scalar node as go-zero's YAML parser (yaml.v2, YAML 1.1: yes
// and on are booleans) reads it: an int, float64, bool or string.
func goZeroValue(n *yaml.Node) any {
	if n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) != 0 || n.Tag == "!!str" && n.Style&yaml.TaggedStyle != 0 {
		return n.Value
	}
	var v any
	if err := yaml2.Unmarshal([]byte(n.Value), &v); err != nil || v == nil {
		return n.Value
	}
	return v
}

// kindOf names a YAML value for messages.
func kindOf(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	switch goZeroValue(n).(type) {
	case int, int64, uint64, float64:
		return "the number " + n.Value
	case bool:
		return "the boolean " + n.Value
	}
	return strconv.Quote(n.Value)
}

// mistyped reports a value that go-zero's loader refuses for the field's type.
func (c *checker) mistyped(s *section, n *yaml.Node, path, want string, drop map[*yaml.Node]bool) {
	drop[n] = true
	c.errorAt(s, n, "%s is %s where go-zero wants %s: its loader refuses the file", path, kindOf(n), want)
}

func (c *checker) checkDuration(s *section, n *yaml.Node, path string, drop map[*yaml.Node]bool) {
	if n.Kind != yaml.ScalarNode {
		c.mistyped(s, n, path, "a duration such as 10s", drop)
		return
	}
	switch v := goZeroValue(n).(type) {
	case string:
		if _, err := time.ParseDuration(v); err != nil {
			drop[n] = true
			c.errorAt(s, n, "%s: %q is not a duration: go-zero's loader refuses it; write a number with a unit, such as 10s or 500ms", path, v)
		}
	case int, int64, uint64, float64:
		drop[n] = true
		c.errorAt(s, n, "%s: %s has no unit: go-zero's loader refuses a bare number for a duration; write %ss (seconds) or %sms", path, n.Value, n.Value, n.Value)
	default:
		c.mistyped(s, n, path, "a duration such as 10s", drop)
	}
}

func (c *checker) checkScalar(s *section, n *yaml.Node, t reflect.Type, path string, drop map[*yaml.Node]bool) {
	if n.Kind != yaml.ScalarNode {
		c.mistyped(s, n, path, "a single value", drop)
		return
	}
	v := goZeroValue(n)
	switch t.Kind() {
	case reflect.String:
		if _, ok := v.(string); !ok {
			drop[n] = true
			c.errorAt(s, n, "%s is %s where go-zero wants a string: its loader refuses the file; quote it: %s: %q",
				path, kindOf(n), path[strings.LastIndexAny(path, ".]")+1:], n.Value)
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			c.mistyped(s, n, path, "true or false", drop)
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		switch v.(type) {
		case int, int64, uint64:
		default:
			c.mistyped(s, n, path, "a whole number", drop)
		}
	}
}

// load loads s as go-zero does (conf.LoadFromYamlBytes into a LockConf), without the values
// that walkSettings found it would refuse, so that the other settings are still checked, and
// reports every problem that middleware.New would report (LockConf.Problems) at its line.
func (c *checker) load(s *section, drop map[*yaml.Node]bool) {
	b, err := yaml.Marshal(copyWithout(s.value, drop))
	if err == nil {
		err = conf.LoadFromYamlBytes(b, &s.conf)
	}
	var ce *middleware.ConfigError
	if err != nil && !errors.As(err, &ce) { // a ConfigError is Validate's: Problems lists it below
		c.errorAt(s, s.key, "%s: go-zero's loader refuses it: %v", s.path, err)
		return
	}
	s.loaded = true
	for _, p := range s.conf.Problems() {
		if errors.As(p, &ce) {
			if c.supersededByProto(s, ce.Field) {
				continue
			}
			c.errorAt(s, s.node(ce.Field), "%s: %v", s.field(ce.Field), ce.Err)
		} else {
			c.errorAt(s, s.key, "%s: %v", s.path, p)
		}
	}
}

// copyWithout returns a deep copy of n without the mapping entries whose value is in drop,
// with aliases replaced by what they name, so that the copy marshals on its own.
func copyWithout(n *yaml.Node, drop map[*yaml.Node]bool) *yaml.Node {
	n = deref(n)
	cp := *n
	cp.Anchor = ""
	cp.Content = nil
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if drop[deref(n.Content[i+1])] {
				continue
			}
			cp.Content = append(cp.Content, copyWithout(n.Content[i], drop), copyWithout(n.Content[i+1], drop))
		}
	default:
		for _, x := range n.Content {
			if !drop[deref(x)] {
				cp.Content = append(cp.Content, copyWithout(x, drop))
			}
		}
	}
	return &cp
}

// sibling returns the value of the key name in the mapping that holds the Lock section (the
// service's own Mode and Timeout), or nil.
func (s *section) sibling(name string) *yaml.Node {
	if p := lookup(s.parent, name); p != nil {
		return deref(p.value)
	}
	return nil
}

// checkStore reports a section that would run on the embedded in-memory store: an error in
// go-zero's pre and pro modes (pro is the default of ServiceConf.Mode), where New refuses it,
// a warning in dev, test and rt. A section that names no store at all is told the stores it
// may name (Redis, etcd or ZooKeeper); one on etcd or ZooKeeper whose rules say Store: redis
// lacks a Redis only.
func (c *checker) checkStore(s *section, topRedis bool) {
	r := s.conf.Redis
	if r.Host != "" || r.Sentinel.MasterName != "" || !locksInRedis(s.conf) {
		return
	}
	mode, how := "pro", "no Mode: go-zero's default is pro"
	if m := s.sibling("Mode"); m != nil && m.Value != "" {
		mode, how = strings.ToLower(m.Value), "Mode: "+m.Value
	}
	at := s.node("Lock.Redis")
	hint := ""
	if topRedis {
		hint = "; the file's top-level Redis section is not read by flightlock: copy it under " + s.path
	}
	missing := fmt.Sprintf("%s.Redis has no Host, and its rules with Store: redis lock there", s.path)
	set := fmt.Sprintf("%s.Redis.Host (or Sentinel)", s.path)
	if len(s.conf.Etcd.Hosts) == 0 && len(s.conf.Zookeeper.Hosts) == 0 {
		missing = fmt.Sprintf("%s names no store, neither Redis.Host (or Sentinel) nor Etcd.Hosts nor Zookeeper.Hosts", s.path)
		set = fmt.Sprintf("%s.Redis.Host (or Sentinel), %s.Etcd.Hosts or %s.Zookeeper.Hosts", s.path, s.path, s.path)
	}
	if mode == "pre" || mode == "pro" {
		c.errorAt(s, at, "%s (%s): the locks would live in an embedded in-memory Redis that no other instance shares, "+
			"and middleware.New refuses to start; set %s%s", missing, how, set, hint)
		return
	}
	c.warnAt(s, at, "%s (%s): the locks live in an embedded in-memory Redis that only this Middleware sees (not another process, "+
		"nor another Middleware of this one without WithStore), "+
		"for development only; set %s before pre or pro%s", missing, how, set, hint)
}

// locksInRedis reports whether a rule of c locks in Redis: every rule when c names neither
// etcd nor ZooKeeper (Hosts), else those that say Store: redis. A section on etcd or ZooKeeper
// only never touches the embedded Redis.
func locksInRedis(c middleware.LockConf) bool {
	if len(c.Etcd.Hosts) == 0 && len(c.Zookeeper.Hosts) == 0 {
		return true
	}
	for _, r := range c.Rules {
		if strings.EqualFold(r.Store, "redis") {
			return true
		}
	}
	return false
}

// Server timeouts that go-zero uses when the config sets none, in milliseconds:
// zrpc.RpcServerConf.Timeout and rest.RestConf.Timeout (`json:",default=..."`).
const (
	defaultRPCTimeout  = 2000
	defaultRESTTimeout = 3000
)

// serverTimeout is go-zero's server timeout for rule r of s, in milliseconds (0: none), and
// where it comes from, for messages: the Timeout beside the Lock section (rest.RestConf and
// zrpc.RpcServerConf both name it so), else go-zero's default for the rule's transport.
func (s *section) serverTimeout(r middleware.Rule) (ms int64, from string) {
	if t := s.sibling("Timeout"); t != nil {
		if v, ok := goZeroValue(t).(int); ok {
			return int64(v), "the service's Timeout"
		}
	}
	if r.RPC != "" {
		return defaultRPCTimeout, "go-zero's zrpc default"
	}
	return defaultRESTTimeout, "go-zero's REST default"
}

// handlerShare is the part of the server's timeout that a rule's Wait must leave to the
// handler (1/handlerShare): a request that waits for a lock starts its handler that much
// closer to go-zero's deadline. A third is what the defaults leave (Wait 2s against the REST
// Timeout of 3000ms), so a service on the defaults gets no warning.
const handlerShare = 3

// checkWaits warns of a waiting rule whose wait budget is not below the server's timeout
// (the middleware ends the wait before the deadline, with a reserve for the busy answer, so
// the Wait written is never what a request waits), or leaves the handler less than a third of
// it.
func (c *checker) checkWaits(s *section) {
	for i, r := range s.conf.Rules {
		onBusy := strings.ToLower(r.OnBusy)
		if r.Shadow || onBusy != "" && onBusy != "wait" && onBusy != "share" {
			continue
		}
		wait, from := s.conf.Wait, "Lock.Wait"
		if r.Wait > 0 {
			wait, from = r.Wait, fmt.Sprintf("Lock.Rules[%d].Wait", i)
		}
		ms, what := s.serverTimeout(r)
		timeout := time.Duration(ms) * time.Millisecond
		switch {
		case ms <= 0 || wait <= timeout-timeout/handlerShare:
		case wait >= timeout:
			c.warnAt(s, s.ruleNode(i, "Wait", "OnBusy", "Key"),
				"%s waits up to %v (%s), not below the server's Timeout of %dms (%s): the middleware ends the wait before "+
					"the server times out, so it never waits %v; set Wait below Timeout",
				s.field(fmt.Sprintf("Lock.Rules[%d]", i)), wait, s.field(from), ms, what, wait)
		default:
			c.warnAt(s, s.ruleNode(i, "Wait", "OnBusy", "Key"),
				"%s waits up to %v (%s), which leaves the handler less than a third of the server's Timeout of %dms (%s): "+
					"a request that waits that long starts its handler with %v left before go-zero times it out; "+
					"set Wait to at most two thirds of Timeout (%v)",
				s.field(fmt.Sprintf("Lock.Rules[%d]", i)), wait, s.field(from), ms, what, timeout-wait, timeout-timeout/handlerShare)
		}
	}
}

// checkMaxHold warns of a section whose MaxHold is below the server's timeout of one of its
// rules: the watchdog stops renewing a lock MaxHold after its grant, and the lock is lost at
// most one TTL later, while go-zero lets the handler run until Timeout. A handler that
// outlives its lock has its context cancelled, and another request may take the key while it
// still runs.
func (c *checker) checkMaxHold(s *section) {
	n := s.conf.Normalized() // MaxHold: 0 is the default, as New reads it
	var worst int64
	var what string
	for _, r := range s.conf.Rules {
		if ms, from := s.serverTimeout(r); ms > worst {
			worst, what = ms, from
		}
	}
	if worst <= 0 || n.MaxHold >= time.Duration(worst)*time.Millisecond {
		return
	}
	c.warnAt(s, s.node("Lock.MaxHold"), "%s is %v, below the server's Timeout of %dms (%s): the watchdog stops renewing a lock "+
		"MaxHold after its grant and the lock is lost at most one TTL (%v) later, so a handler that go-zero still lets run "+
		"can outlive its lock: its context is cancelled (a goctl handler then answers 400 \"context canceled\") and another "+
		"request may take the key while it runs; set MaxHold above Timeout",
		s.field("Lock.MaxHold"), n.MaxHold, worst, what, n.TTL)
}

// checkOwnerTrust warns of a section that honours propagated lock owners (TrustOwner) without
// checking their signature (no OwnerSecret): a client that reaches the service and knows a
// holder's owner token enters that lock beside the holder. middleware.New logs the same.
func (c *checker) checkOwnerTrust(s *section) {
	if !s.conf.TrustOwner || s.conf.OwnerSecret != "" {
		return
	}
	c.warnAt(s, s.node("Lock.TrustOwner"), "%s is on without %s: the service honours any lock owner a caller names, "+
		"so a client that can reach it and knows a holder's owner token enters that lock beside its holder; "+
		"set the same OwnerSecret here and on the services that call it",
		s.field("Lock.TrustOwner"), s.field("Lock.OwnerSecret"))
}

// nearest returns the candidate that name most probably meant: the same in another case or
// with other underscores, else the one within a small edit distance, else "".
func nearest(name string, candidates []string) string {
	for _, c := range candidates {
		if fold(c) == fold(name) {
			return c
		}
	}
	best, bestD := "", typo.Edits(name)
	for _, c := range candidates {
		if d := typo.Distance(strings.ToLower(name), strings.ToLower(c)); d <= bestD && (best == "" || d < typo.Distance(strings.ToLower(name), strings.ToLower(best))) {
			best = c
		}
	}
	return best
}

// fold is a name without case and underscores: AccountId, accountId and account_id fold alike.
func fold(s string) string { return strings.ToLower(strings.ReplaceAll(s, "_", "")) }
