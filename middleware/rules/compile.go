package rules

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"strings"
)

// Spec is a Rule to compile with a Go rule's key function, which go-zero's loader refuses in Rule.
type Spec struct {
	Rule
	Field   string // prefix of error messages: "Lock.Rules[2]"
	HTTPKey KeyFunc
	RPCKey  RPCKeyFunc
}

// Compiled is a rule as compiled for each transport: the parts share the settings, not a plan.
type Compiled struct {
	Spec Spec
	HTTP *Plan // the REST part, or nil
	RPC  *Plan // the zrpc part, or nil
}

// Plan is the part of a rule that one transport runs: how a request's keys are rendered.
type Plan struct {
	Name   string // for logs and metrics: "POST /api/order" or "/pkg.Svc/Method"
	Method string // REST: the rule's method, "" for any
	Route  Route  // REST: the rule's route pattern, empty for a named rule without a Path
	// HTTPKeys renders a REST request's keys, RPCKeys a zrpc call's (from its context and
	// message): the other is nil. HTTPReplayKeys renders a template's keys with the values as
	// written (not canonical), for a share rule's stored responses; nil for a KeyFunc rule.
	HTTPKeys       func(r *http.Request) ([]string, error)
	HTTPReplayKeys func(r *http.Request) ([]string, error)
	RPCKeys        func(ctx context.Context, req any) ([]string, error)
	FromMessage    bool // the keys of a stream call come from its first message
}

// Compile checks c and compiles its rules, then extra (built in Go); both come normalized.
func Compile(c LockConf, extra []Spec) ([]*Compiled, error) {
	if err := cmp.Or(c.problems()...); err != nil {
		return nil, err
	}
	return c.compileRules(extra)
}

// compileRules compiles c's rules, then extra, against c's settings, unchecked.
func (c LockConf) compileRules(extra []Spec) ([]*Compiled, error) {
	specs := make([]Spec, 0, len(c.Rules)+len(extra))
	for i, r := range c.Rules {
		specs = append(specs, Spec{Rule: r, Field: fmt.Sprintf("Lock.Rules[%d]", i)})
	}
	specs = append(specs, extra...)
	out := make([]*Compiled, 0, len(specs))
	seenRPC := make(map[string]string)
	seenName := make(map[string][]Spec) // Rule.Name => the rules of that name so far
	for _, s := range specs {
		if err := checkRule(s, c.OnStoreError); err != nil {
			return nil, err
		}
		if err := c.CheckRuleStore(s); err != nil {
			return nil, err
		}
		if s.Name != "" {
			if err := checkSharedName(s, seenName[s.Name]); err != nil {
				return nil, err
			}
			seenName[s.Name] = append(seenName[s.Name], s)
		}
		cr := &Compiled{Spec: s}
		if s.Path != "" || s.Name != "" { // a named rule is a REST middleware, with or without a Path
			rl, err := CompileHTTP(s)
			if err != nil {
				return nil, err
			}
			rl.Name = cmp.Or(rl.Name, s.Name) // logs and metrics of a named rule without a Path
			for _, prev := range out {
				// A route is locked by one rule, named or not: two would lock it twice.
				if prev.HTTP != nil && prev.HTTP.Overlaps(rl) {
					return nil, FieldError(s.Field+".Path", "%s %s is already locked by %s", s.Method, s.Path, prev.Spec.Field)
				}
			}
			cr.HTTP = rl
		}
		if s.RPC != "" {
			if prev, dup := seenRPC[s.RPC]; dup {
				return nil, FieldError(s.Field+".RPC", "%s is already locked by %s", s.RPC, prev)
			}
			seenRPC[s.RPC] = s.Field
			rl, err := compileRPC(s)
			if err != nil {
				return nil, err
			}
			cr.RPC = rl
		}
		out = append(out, cr)
	}
	if err := checkRuleSet(specs); err != nil {
		return nil, err
	}
	return out, nil
}

// Overlaps reports whether p and q lock requests of one route: the same cleaned Path, and
// methods that can meet (an empty one meets any).
func (p *Plan) Overlaps(q *Plan) bool {
	return p.Route.Text != "" && p.Route.Text == q.Route.Text && (p.Method == "" || q.Method == "" || p.Method == q.Method)
}

// checkSharedName refuses s when an earlier rule of its Name (prev) locks the same requests.
func checkSharedName(s Spec, prev []Spec) error {
	for _, p := range prev {
		if (s.Method == "" && s.Path == "") || (p.Method == "" && p.Path == "") ||
			(strings.EqualFold(p.Method, s.Method) && p.Path == s.Path) {
			return FieldError(s.Field+".Name", "%s is already the name of %s; rules that share a name each need "+
				"their own Method or Path, the requests of the group they lock", s.Name, p.Field)
		}
	}
	return nil
}

// CompileHTTP compiles the REST part of a rule.
func CompileHTTP(s Spec) (*Plan, error) {
	rl := &Plan{Method: s.Method}
	var route *Route
	if s.Path != "" {
		rp, err := parseRoute(s.Path)
		if err != nil {
			return nil, FieldError(s.Field+".Path", "bad route pattern %q: %v", s.Path, err)
		}
		rl.Route, route = rp, &rp
		rl.Name = cmp.Or(s.Method, "*") + " " + rp.Text
	}
	if s.HTTPKey != nil {
		rl.HTTPKeys = func(r *http.Request) ([]string, error) { return s.apart(userKey(s.HTTPKey(r))) }
		return rl, nil
	}
	_, plan, err := compileKey(s, bindHTTP(route))
	if err != nil {
		return nil, err
	}
	rl.HTTPKeys = func(r *http.Request) ([]string, error) { return s.apart(plan(&httpSource{r: r})) }
	// The values as the request wrote them: "007" and "7" share a lock, but never a response.
	rl.HTTPReplayKeys = func(r *http.Request) ([]string, error) { return plan(&httpSource{r: r, raw: true}) }
	return rl, nil
}

// compileKey parses s's key template, refuses one among internalNamespaces (unless s is a
// shadow rule, whose keys live apart) and binds it with bind.
func compileKey[S any](s Spec, bind func(ref string) (getter[S], error)) ([]TemplateKey, keyPlan[S], error) {
	keys, err := TemplateKeys(s.Key)
	if err == nil && !s.Shadow {
		err = checkOwnKeys(keys)
	}
	var plan keyPlan[S]
	if err == nil {
		plan, err = bindPlan(keys, bind)
	}
	if err != nil {
		return nil, nil, FieldError(s.Field+".Key", "%v", err)
	}
	return keys, plan, nil
}

// compileRPC compiles the zrpc part of a rule.
func compileRPC(s Spec) (*Plan, error) {
	rl := &Plan{Name: s.RPC}
	if s.RPCKey != nil {
		rl.RPCKeys = func(ctx context.Context, req any) ([]string, error) { return s.apart(userKey(s.RPCKey(ctx, req))) }
		rl.FromMessage = true
		return rl, nil
	}
	keys, plan, err := compileKey(s, bindRPC(methodInput(s.RPC)))
	if err != nil {
		return nil, err
	}
	rl.RPCKeys = func(ctx context.Context, req any) ([]string, error) {
		return s.apart(plan(rpcSource{ctx: ctx, req: req}))
	}
	rl.FromMessage = usesMessage(keys)
	return rl, nil
}

// ParseReplayStatus reads Rule.ReplayStatus: status classes ("2xx", "4xx"), comma separated.
func ParseReplayStatus(field, s string) ([6]bool, error) {
	var classes [6]bool
	for _, c := range strings.Split(s, ",") {
		c = strings.ToLower(strings.TrimSpace(c))
		if len(c) != 3 || c[1:] != "xx" || c[0] < '1' || c[0] > '5' {
			return classes, FieldError(field, "must list status classes such as 2xx,4xx; got %q", s)
		}
		classes[c[0]-'0'] = true
	}
	return classes, nil
}
