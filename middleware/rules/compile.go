package rules

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"path"
	"slices"
	"strings"

	"github.com/zeromicro/go-zero/core/search"
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
		if err := cmp.Or(checkRule(s, c.OnStoreError), c.CheckRuleStore(s)); err != nil {
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

// checkRuleSet refuses enforced rules of one Lock section that lock one key in ways that
// cannot exclude each other: keys of one shape with different Permits, or with Fair on one
// rule only (the other jumps the line), and a read and a write rule of one route whose keys
// differ in shape (reads would see half-done writes). flightlock check compares sections.
func checkRuleSet(specs []Spec) error {
	firstCount := make(map[string]Spec)    // shape => the first rule that locks it
	firstFairness := make(map[string]Spec) // shape => the first rule that could be fair
	shapes := make([][]string, len(specs))
	for i, s := range specs {
		if s.Shadow || s.Key == "" {
			continue
		}
		keys, err := TemplateKeys(s.Key)
		if err != nil {
			continue // checkRule reported it
		}
		for _, k := range keys {
			shapes[i] = append(shapes[i], k.Shape)
			if f, ok := firstCount[k.Shape]; !ok {
				firstCount[k.Shape] = s
			} else if fp, sp := max(f.Permits, 1), max(s.Permits, 1); fp != sp {
				return FieldError(s.Field+".Permits", "%s locks %s with %s, and %s with %s: a lock is permit 1 of its key's "+
					"semaphore, so the rules share permits and up to %d requests hold a key where one rule allows %d; "+
					"give every rule on a key the same Permits", s.Field, k.Shape, permitWords(s), f.Field,
					permitWords(f), max(fp, sp), min(fp, sp))
			}
			if isRead(s) {
				continue // a read rule cannot be fair: a waiting writer holds new reads back
			}
			if f, ok := firstFairness[k.Shape]; !ok {
				firstFairness[k.Shape] = s
			} else if f.Fair != s.Fair {
				fair, unfair := s.Field, f.Field
				if !s.Fair {
					fair, unfair = f.Field, s.Field
				}
				return FieldError(s.Field+".Fair", "%s locks %s with Fair and %s without it: only fair rules keep the key's "+
					"line, so a request of %s takes the key whenever it is free, ahead of the fair waiters; "+
					"make every rule on a key fair, or none", fair, k.Shape, unfair, unfair)
			}
		}
	}
	for i, r := range specs {
		if !isRead(r) || r.Path == "" || len(shapes[i]) == 0 {
			continue
		}
		for j, w := range specs {
			if !isWrite(w) || len(shapes[j]) == 0 || !sameRoute(r.Path, w.Path) || shareShape(shapes[i], shapes[j]) {
				continue
			}
			at := r
			if j > i {
				at = w // the later rule is the one reported, as above
			}
			return FieldError(at.Field+".Key", "%s reads %s and %s writes %s on the same route %s: a read lock excludes "+
				"only the writers of its own key, so these two never exclude each other and reads see half-done writes; "+
				"lock one key in both", r.Field, strings.Join(shapes[i], "+"), w.Field, strings.Join(shapes[j], "+"), r.Path)
		}
	}
	return nil
}

func isRead(s Spec) bool  { return strings.EqualFold(s.Mode, "read") }
func isWrite(s Spec) bool { return !s.Shadow && !isRead(s) && s.Permits <= 1 }

// sameRoute reports whether two route patterns are one route, variable names aside.
func sameRoute(a, b string) bool { return a != "" && b != "" && RouteShape(a) == RouteShape(b) }

func shareShape(a, b []string) bool {
	return slices.ContainsFunc(a, func(x string) bool { return slices.Contains(b, x) })
}

// permitWords is how a message names a rule's count: "Permits: 3", "Mode: read (no Permits)".
func permitWords(s Spec) string {
	switch {
	case s.Permits > 1:
		return fmt.Sprintf("Permits: %d", s.Permits)
	case s.Mode != "":
		return fmt.Sprintf("Mode: %s (no Permits)", strings.ToLower(s.Mode))
	}
	return "no Permits (a lock)"
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

// Route is a go-zero route pattern such as /api/sku/:sku/deduct.
type Route struct {
	Text   string   // cleaned with path.Clean, as go-zero's router registers it
	Params []string // variable names, in order
}

// parseRoute checks p the way go-zero's search tree does (it must start with '/', no empty
// segments), and that its variable names are named and unique, which the key templates need.
func parseRoute(p string) (Route, error) {
	if err := search.NewTree().Add(p, struct{}{}); err != nil {
		return Route{}, err
	}
	rp := Route{Text: path.Clean(p)}
	if rp.Text == "/" {
		return rp, nil
	}
	for _, s := range strings.Split(rp.Text[1:], "/") {
		name, ok := strings.CutPrefix(s, ":")
		switch {
		case !ok:
		case name == "":
			return Route{}, errors.New("has a path variable without a name")
		case slices.Contains(rp.Params, name):
			return Route{}, fmt.Errorf("has the path variable :%s twice", name)
		default:
			rp.Params = append(rp.Params, name)
		}
	}
	return rp, nil
}

// RouteShape is a route pattern with its variable names left out (/sku/:id and /sku/:uid are
// /sku/:), for suggestions of the route a rule meant.
func RouteShape(p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		if strings.HasPrefix(s, ":") {
			segs[i] = ":"
		}
	}
	return strings.Join(segs, "/")
}
