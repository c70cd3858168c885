package middleware

import (
	"fmt"
	"slices"
	"strings"

	"github.com/flightlock/flightlock/middleware/rules"
	"github.com/zeromicro/go-zero/rest"
)

// Named returns the rest.Middleware of the LockConf rules named name, for the route group of a
// goctl @server(middleware: name) block, keeping the key in the YAML. It locks the requests of
// the group as Route does, by the first rule of that name in config order that matches. A name
// no rule has is an error; CheckRoutes reports a named rule whose middleware is on no route.
func (m *Middleware) Named(name string) (rest.Middleware, error) {
	crs := slices.DeleteFunc(slices.Clone(m.rules), func(cr *compiledRule) bool { return cr.spec.Name != name })
	if len(crs) == 0 {
		return nil, m.unknownName(name)
	}
	return m.groupMiddleware(crs), nil
}

// MustNamed is Named for goctl's NewServiceContext: an unknown name stops the service.
func (m *Middleware) MustNamed(name string) rest.Middleware {
	mw, err := m.Named(name)
	mustStart(err)
	return mw
}

// unknownName is Named's error for a name no rule has, with the one probably meant (goctl
// middleware names are Go identifiers, matched exactly).
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

// ruleLabel names a rule in CheckRoutes' errors: "Lock.Rules[0] (StockLock)".
func ruleLabel(s rules.Spec) string {
	if s.Name == "" {
		return s.Field
	}
	return fmt.Sprintf("%s (%s)", s.Field, s.Name)
}
