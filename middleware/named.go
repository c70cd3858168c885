package middleware

import (
	"fmt"
	"strings"

	"github.com/flightlock/flightlock/middleware/rules"
	"github.com/zeromicro/go-zero/rest"
)

// Named returns the rest.Middleware of the rule of the LockConf whose Name is name, for the
// route group of a goctl @server(middleware: name) block: goctl's NewServiceContext sets its
// ServiceContext field of that name to it, and the rule's key stays in the YAML.
// It locks the requests of the group as Route locks them: those of the rule's Method and
// Path when they are set, every request of the group when neither is; the others pass
// through untouched. Several rules may share a name when each has its own Method or Path (a
// group with a GET that reads and a PUT that writes one resource): a request is locked by the
// first of them, in config order, that matches it. Handle leaves named rules alone, so a request is locked once.
//
// A name that no rule has is an error naming it ("Lock.Rules: has no rule named StockLock").
// CheckRoutes reports a named rule that no Named middleware built and put on a route
// (rest.WithMiddlewares does, when goctl's RegisterHandlers adds the group), and checks the
// Method and Path of the others. Named is for route groups: server.Use takes Handle.
func (m *Middleware) Named(name string) (rest.Middleware, error) {
	var rls []*rule
	for _, cr := range m.rules {
		if cr.spec.Name == name {
			rls = append(rls, cr.http)
		}
	}
	if len(rls) == 0 {
		return nil, m.unknownName(name)
	}
	m.routed.build(name)
	return m.groupMiddleware(rls, func() { m.routed.wrap(name) }), nil
}

// MustNamed is Named for goctl's NewServiceContext, which returns no error: it exits through
// mustStart (one line, exit status 1) when no rule has the name, as MustNew does on a bad config.
func (m *Middleware) MustNamed(name string) rest.Middleware {
	mw, err := m.Named(name)
	mustStart(err)
	return mw
}

// unknownName is Named's error for a name that no rule has, with the name it probably meant
// (goctl middleware names are Go identifiers, matched exactly).
func (m *Middleware) unknownName(name string) error {
	if name == "" {
		return rules.FieldError("Named", "the name is empty")
	}
	var names []string
	for _, cr := range m.rules {
		if n := cr.spec.Name; n != "" {
			if strings.EqualFold(n, name) {
				return rules.FieldError("Lock.Rules", "has no rule named %s (did you mean %s?)", name, n)
			}
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return rules.FieldError("Lock.Rules", "has no rule named %s: no rule has a Name", name)
	}
	return rules.FieldError("Lock.Rules", "has no rule named %s; the named rules are %s", name, strings.Join(names, ", "))
}

// ruleLabel names a rule in CheckRoutes' errors: its place in the config, and its Name when
// it has one ("Lock.Rules[0] (StockLock)").
func ruleLabel(s rules.Spec) string {
	if s.Name == "" {
		return s.Field
	}
	return fmt.Sprintf("%s (%s)", s.Field, s.Name)
}
