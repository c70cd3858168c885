package main

import (
	"fmt"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/zeromicro/go-zero/tools/goctl/api/spec"
	"github.com/zeromicro/go-zero/tools/goctl/pkg/parser/api/parser"

	"github.com/flightlock/flightlock/internal/typo"
	"github.com/flightlock/flightlock/middleware"
	"github.com/flightlock/flightlock/middleware/rules"
)

// route is one route of an .api file, as go-zero's router serves it.
type route struct {
	method string // upper case
	path   string // with the @server block's prefix: what a rule's Path must name
	raw    string // as the service block writes it, without the prefix
	prefix string // the @server block's prefix, "" for none
	req    spec.Type
	file   string   // base name of the .api file
	mws    []string // the @server block's middleware
}

func (r route) String() string { return r.method + " " + r.path }

// apiGroup is the middleware list of one @server block of an .api file.
type apiGroup struct {
	mws  []string
	file string
}

// loadAPI reads an .api file with goctl's own parser (the one `goctl api go` runs), imports
// included.
func (c *checker) loadAPI(file string) error {
	// Read here, not by the parser: goctl's scanner exits the process (log.Fatalln) on a file
	// it cannot read.
	src, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	api, err := parser.Parse(file, src)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	base := filepath.Base(file)
	c.apiFiles = append(c.apiFiles, base)
	for _, g := range api.Service.Groups {
		prefix := strings.Trim(strings.TrimSpace(g.GetAnnotation(spec.RoutePrefixKey)), `"`)
		var mws []string
		for m := range strings.SplitSeq(g.GetAnnotation("middleware"), ",") {
			if m = strings.TrimSpace(m); m != "" {
				mws = append(mws, m)
			}
		}
		c.groups = append(c.groups, apiGroup{mws: mws, file: base})
		for _, r := range g.Routes {
			c.routes = append(c.routes, route{
				method: strings.ToUpper(r.Method),
				path:   path.Join("/", prefix, r.Path), // as goctl joins them (spec.Service.JoinPrefix)
				raw:    r.Path,
				prefix: prefix,
				req:    r.RequestType,
				file:   base,
				mws:    mws,
			})
		}
	}
	return nil
}

// checkRule checks one rule of s against the API definitions given.
func (c *checker) checkRule(s *section, i int, r middleware.Rule) {
	rest := r.Path != "" || r.Name != ""
	switch {
	case rest && c.apiFiles == nil && c.protos != nil:
		c.errorAt(s, s.ruleNode(i, "Path", "Method", "Name"),
			"%s locks a REST route (%s), but only .proto files were given: a zrpc service has no routes, lock its methods with "+
				"RPC: /package.Service/Method (or pass the REST service's .api with -api)",
			s.field(fmt.Sprintf("Lock.Rules[%d]", i)), restLabel(r))
	case rest && c.apiFiles != nil:
		c.checkREST(s, i, r)
	}
	if r.RPC != "" && c.protos != nil {
		c.checkRPC(s, i, r)
	}
}

// restLabel is a rule's route for messages: "POST /api/x", "/api/x" (any method) or its Name.
func restLabel(r middleware.Rule) string {
	switch {
	case r.Path == "":
		return "middleware " + r.Name
	case r.Method == "":
		return r.Path
	}
	return strings.ToUpper(r.Method) + " " + r.Path
}

func (c *checker) apiNames() string { return strings.Join(c.apiFiles, ", ") }

// checkREST checks a REST rule: the route it names, the read-only routes it locks, and the
// fields of its key.
func (c *checker) checkREST(s *section, i int, r middleware.Rule) {
	name := s.field(fmt.Sprintf("Lock.Rules[%d]", i))
	method := strings.ToUpper(r.Method)
	if method != "" && !slices.Contains(httpMethods, method) {
		return // not an HTTP method: Problems reported it
	}
	candidates := c.routes
	where := "of " + c.apiNames()
	if r.Name != "" {
		candidates = nil
		for _, rt := range c.routes {
			if slices.Contains(rt.mws, r.Name) {
				candidates = append(candidates, rt)
			}
		}
		if !c.namedMiddlewareListed(r.Name) {
			c.errorAt(s, s.ruleNode(i, "Name"), "%s.Name: no @server block of %s lists middleware: %s, so the rule locks nothing%s",
				name, c.apiNames(), r.Name, c.middlewareHint(r.Name))
			return
		}
		where = "of the @server blocks with middleware: " + r.Name
	}
	var matched []route
	for _, rt := range candidates {
		if (r.Path == "" || rt.path == path.Clean(r.Path)) && (method == "" || rt.method == method) {
			matched = append(matched, rt)
		}
	}
	if len(matched) == 0 {
		if r.Path == "" {
			return // a named rule whose block has no route of its Method: nothing to check
		}
		c.errorAt(s, s.ruleNode(i, "Path"), "%s.Path: %s matches no route %s%s", name, restLabel(r), where, nearestRoute(method, r.Path, candidates))
		return
	}
	for _, rt := range matched {
		c.stats(s.file).routes[rt.String()] = true
	}
	if method == "" {
		for _, rt := range matched {
			if rt.method == "GET" || rt.method == "HEAD" {
				c.errorAt(s, s.ruleNode(i, "Path", "Name"), "%s has no Method, so it locks the read-only route %s too: "+
					"name the method it protects (Method: %s), or write Method: %s to lock reads on purpose",
					name, rt, writeMethod(matched), rt.method)
				break
			}
		}
	}
	refs, err := rules.TemplateRefs(r.Key)
	if err != nil {
		return // Problems reported it
	}
	for _, ref := range refs {
		for _, rt := range matched {
			if msg := checkRESTRef(ref, rt); msg != "" {
				c.errorAt(s, s.ruleNode(i, "Key"), "%s.Key: {%s}: %s", name, ref, msg)
				break
			}
		}
		for _, rt := range matched {
			if msg, refuse := inexactRESTRef(ref, rt); msg != "" {
				report := c.warnAt
				if refuse {
					report = c.errorAt
				}
				report(s, s.ruleNode(i, "Key"), "%s.Key: {%s}: %s", name, ref, msg)
				break
			}
		}
	}
	c.checkSidesREST(s, i, r, matched, refs)
}

// httpMethods are the methods a rule may name (middleware's Rule.Method, in any case).
var httpMethods = []string{
	http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace,
}

// writeMethod is the method of the first matched route that is not read-only, for messages.
func writeMethod(matched []route) string {
	for _, rt := range matched {
		if rt.method != "GET" && rt.method != "HEAD" {
			return rt.method
		}
	}
	return "POST"
}

func (c *checker) namedMiddlewareListed(name string) bool {
	return slices.ContainsFunc(c.groups, func(g apiGroup) bool { return slices.Contains(g.mws, name) })
}

// middlewareHint names the middleware of the .api files that name probably meant.
func (c *checker) middlewareHint(name string) string {
	var all []string
	for _, g := range c.groups {
		for _, m := range g.mws {
			if !slices.Contains(all, m) {
				all = append(all, m)
			}
		}
	}
	switch near := nearest(name, all); {
	case near != "":
		return fmt.Sprintf(" (did you mean %s? Name matches the middleware name exactly)", near)
	case len(all) == 0:
		return " (no @server block has a middleware: add middleware: " + name + " to the block of the routes to lock)"
	}
	return " (the blocks list " + strings.Join(all, ", ") + ")"
}

// nearestRoute names the route that a rule's Method and Path probably meant, and what to
// change: the @server block's prefix left out, another method, other path variable names,
// another case, a misspelling.
func nearestRoute(method, p string, routes []route) string {
	p = path.Clean("/" + p)
	sameMethod := func(rt route) bool { return method == "" || rt.method == method }
	for _, rt := range routes {
		if rt.prefix != "" && path.Join("/", rt.raw) == p && sameMethod(rt) {
			return fmt.Sprintf(" (did you mean %s? the @server block's prefix: %s is part of the route, write Path: %s)", rt, rt.prefix, rt.path)
		}
	}
	for _, rt := range routes {
		if rt.path == p {
			return fmt.Sprintf(" (did you mean %s? the route's method is %s, write Method: %s)", rt, rt.method, rt.method)
		}
	}
	for _, rt := range routes {
		if rules.RouteShape(rt.path) == rules.RouteShape(p) && sameMethod(rt) {
			return fmt.Sprintf(" (did you mean %s? go-zero names the path variables as the route does, write Path: %s)", rt, rt.path)
		}
	}
	for _, rt := range routes {
		if strings.EqualFold(rt.path, p) && sameMethod(rt) {
			return fmt.Sprintf(" (did you mean %s? go-zero matches paths case-sensitively, write Path: %s)", rt, rt.path)
		}
	}
	// A misspelling: the nearest route at most typo.Edits(p) edits away, another method
	// counting one more, as the middleware's CheckRoutes bounds it; a route further than that
	// is another route, not the one meant, however long the path.
	best, bestD := route{}, typo.Edits(p)+1
	for _, rt := range routes {
		d := typo.Distance(p, rt.path)
		if !sameMethod(rt) {
			d++
		}
		if d < bestD {
			best, bestD = rt, d
		}
	}
	if best.path != "" {
		return fmt.Sprintf(" (did you mean %s?)", best)
	}
	return ""
}

// binding is a request field as go-zero's httpx.Parse binds it: source "path", "form",
// "body" (json tag) or "header", and the name it binds.
type binding struct {
	source string
	name   string
	typ    spec.Type
	tag    string // as written: form:"uid"
}

// templateSource maps go-zero's tags to the key template's sources.
var templateSource = map[string]string{"path": "path", "form": "form", "json": "body", "header": "header"}

// bindings returns the fields that go-zero binds for route rt: its request type's tagged
// members (inline members flattened), and the route's path variables.
func bindings(rt route) []binding {
	var out []binding
	for _, seg := range strings.Split(rt.path, "/") {
		if v, ok := strings.CutPrefix(seg, ":"); ok {
			out = append(out, binding{source: "path", name: v, tag: fmt.Sprintf("path %s", seg)})
		}
	}
	return append(out, memberBindings(members(rt.req))...)
}

func members(t spec.Type) []spec.Member {
	switch t := t.(type) {
	case spec.DefineStruct:
		return t.Members
	case spec.NestedStruct:
		return t.Members
	case spec.PointerType:
		return members(t.Type)
	}
	return nil
}

func memberBindings(ms []spec.Member) []binding {
	var out []binding
	for _, m := range ms {
		if m.IsInline {
			out = append(out, memberBindings(members(m.Type))...)
			continue
		}
		tags, err := spec.Parse(m.Tag)
		if err != nil {
			continue
		}
		for _, tg := range tags.Tags() {
			if src, ok := templateSource[tg.Key]; ok && tg.Name != "" && tg.Name != "-" {
				out = append(out, binding{source: src, name: tg.Name, typ: m.Type, tag: fmt.Sprintf("%s:%q", tg.Key, tg.Name)})
			}
		}
	}
	return out
}

// sourceName words a template source for messages.
var sourceName = map[string]string{"path": "the path", "form": "the form (query or form body)", "body": "the JSON body", "header": "the header"}

// splitRESTRef splits a REST template reference into its source and name: "query.uid" is
// query and uid, "body.order.uid" body and order.uid; a bare "uid" has no source.
func splitRESTRef(ref string) (src, name string) {
	if src, name, dotted := strings.Cut(ref, "."); dotted {
		return src, name
	}
	return "", ref
}

// checkRESTRef checks one reference of a key template against what go-zero binds for route
// rt, and returns what is wrong, or "".
func checkRESTRef(ref string, rt route) string {
	src, name := splitRESTRef(ref)
	want := src
	switch src {
	case "jwt":
		return "" // claims are not part of the request type
	case "query":
		want = "form" // go-zero binds the query with form tags
	case "", "path", "form", "body", "header":
	default:
		return "" // an unknown source: Problems reported it
	}
	head, nested, _ := strings.Cut(name, ".")
	if src != "body" {
		head, nested = name, ""
	}
	bs := bindings(rt)
	eq := func(b binding) bool {
		if b.source == "header" {
			return strings.EqualFold(b.name, head)
		}
		return b.name == head
	}
	var other *binding
	for _, b := range bs {
		if !eq(b) {
			continue
		}
		if want == "" || b.source == want {
			if nested != "" {
				return checkNested(rt, b, nested)
			}
			return ""
		}
		if other == nil {
			other = &b
		}
	}
	switch {
	case other != nil:
		return fmt.Sprintf("go-zero binds %s of %s from %s, tagged %s, not from %s: write {%s.%s}",
			head, reqName(rt), sourceName[other.source], other.tag, sourceName[want], other.source, other.name)
	case src == "header":
		return "" // a header the handler does not bind (Idempotency-Key) is still there to read
	}
	return fmt.Sprintf("%s binds no %s%s", describe(rt), head, hasFields(head, bs))
}

// inexactRESTRef returns what is wrong when a field that ref reads for route rt has a type
// whose values the key cannot render as the handler binds them, and whether the rule must be
// refused for it (else it is a warning); "" when every field it reads is fine.
//
// The middleware does not know the handler's types: it renders every spelling of one bool,
// and of one number, in one form, as go-zero binds them (so bool and integer fields are
// exact), and keeps integers exact at any length (two ids never share a key). A float field
// binds more spellings as one value than that: ParseFloat(s, 32) reads 16777216 and 16777217,
// 0.1 and 0.10000000149, as one float32, and ParseFloat(s, 64) reads 9007199254740992 and
// 9007199254740993 as one float64. Two requests on one entity then render two keys and both
// hold "their" lock. For a float32 that is any value with more than 7 digits, so the rule is
// refused; for a float64 only integers beyond 2^53, a warning.
func inexactRESTRef(ref string, rt route) (msg string, refuse bool) {
	src, name, dotted := strings.Cut(ref, ".")
	if !dotted {
		src, name = "", ref
	}
	want := src
	switch src {
	case "query":
		want = "form"
	case "", "path", "form", "body", "header":
	default:
		return "", false // jwt claims are not part of the request type
	}
	head, nested, _ := strings.Cut(name, ".")
	if src != "body" {
		head, nested = name, ""
	}
	for _, b := range bindings(rt) {
		if b.source == "header" && !strings.EqualFold(b.name, head) || b.source != "header" && b.name != head ||
			want != "" && b.source != want {
			continue
		}
		t, field := b.typ, b.name
		if nested != "" {
			t, field = nestedType(t, nested)
		}
		switch primitiveName(t) {
		case "float32":
			return fmt.Sprintf("%s: %s is a float32, which binds many written numbers as one value (16777216 and "+
				"16777217, 0.1 and 0.10000000149) that the key renders apart, so two requests on one entity could "+
				"both hold the lock: lock on an integer or a string field", describe(rt), field), true
		case "float64":
			return fmt.Sprintf("%s: %s is a float64, which binds integers beyond 2^53 written apart (9007199254740992 "+
				"and 9007199254740993) as one value that the key renders apart: lock on an integer or a string field",
				describe(rt), field), false
		}
	}
	return "", false
}

// nestedType follows the rest of a {body.a.b} path from t, the type of the member that binds
// a, to the type of the last field and its name; nil when the path leaves the known types.
func nestedType(t spec.Type, nested string) (spec.Type, string) {
	field := ""
	for part := range strings.SplitSeq(nested, ".") {
		var next spec.Type
		for _, b := range memberBindings(members(t)) {
			if b.source == "body" && b.name == part {
				next = b.typ
			}
		}
		if next == nil {
			return nil, part
		}
		t, field = next, part
	}
	return t, field
}

// primitiveName is the name of t's primitive type, through pointers ("float32" for *float32);
// "" for any other type.
func primitiveName(t spec.Type) string {
	switch t := t.(type) {
	case spec.PrimitiveType:
		return t.RawName
	case spec.PointerType:
		return primitiveName(t.Type)
	}
	return ""
}

// checkNested checks the rest of a {body.a.b} path in the type of the member that binds a.
func checkNested(rt route, b binding, nested string) string {
	t, field := b.typ, b.name
	for part := range strings.SplitSeq(nested, ".") {
		if p, ok := t.(spec.PrimitiveType); ok {
			return fmt.Sprintf("%s: %s is a %s, not a JSON object", describe(rt), field, p.RawName)
		}
		ms := members(t)
		if ms == nil {
			return "" // a map or an interface: any field may be there
		}
		var next spec.Type
		var names []binding
		for _, bb := range memberBindings(ms) {
			if bb.source == "body" {
				names = append(names, bb)
				if bb.name == part {
					next = bb.typ
				}
			}
		}
		if next == nil {
			return fmt.Sprintf("%s: %s has no JSON field %s%s", describe(rt), t.Name(), part, hasFields(part, names))
		}
		t, field = next, part
	}
	return ""
}

func reqName(rt route) string {
	if rt.req == nil {
		return rt.String()
	}
	return rt.req.Name()
}

// describe names a route and its request type for messages.
func describe(rt route) string {
	if rt.req == nil {
		return fmt.Sprintf("%s (%s) has no request type and", rt, rt.file)
	}
	return fmt.Sprintf("%s (request %s of %s)", rt, rt.req.Name(), rt.file)
}

// hasFields lists the references a template could use, with the one name probably meant.
func hasFields(name string, bs []binding) string {
	if len(bs) == 0 {
		return ": it binds nothing"
	}
	refs := make([]string, 0, len(bs))
	names := make([]string, 0, len(bs))
	for _, b := range bs {
		ref := "{" + b.source + "." + b.name + "}"
		if !slices.Contains(refs, ref) {
			refs = append(refs, ref)
			names = append(names, b.name)
		}
	}
	hint := ""
	if near := nearest(name, names); near != "" {
		hint = fmt.Sprintf(" (did you mean %s?)", refs[slices.Index(names, near)])
	}
	return fmt.Sprintf("%s; it has %s", hint, strings.Join(refs, ", "))
}
