package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unicode"

	"github.com/emicklei/proto" // the parser goctl rpc reads .proto files with

	"github.com/flightlock/flightlock/middleware"
	"github.com/flightlock/flightlock/middleware/rules"
)

// rpcMethod is one method of a .proto service: /package.Service/Method and its request.
type rpcMethod struct {
	full    string // "/inventory.Inventory/Reserve"
	pkg     string // "inventory"
	service string // "inventory.Inventory"
	name    string // "Reserve"
	input   string // full name of the request message, "" when not in the files given
	file    string // base name of the .proto file
}

// protoMessage is a message of a .proto file, by its fields' proto names.
type protoMessage struct {
	full   string
	fields []protoField
}

type protoField struct {
	name     string
	typ      string // full name of a message type, or "" for a scalar, an enum or an unknown type
	raw      string // the type as written: "string", "int64", "google.protobuf.Timestamp"
	repeated bool   // repeated or map
}

// loadProto reads a .proto file with github.com/emicklei/proto.
func (c *checker) loadProto(file string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	p := proto.NewParser(f)
	p.Filename(file)
	def, err := p.Parse()
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	base := filepath.Base(file)
	c.protos = append(c.protos, base)
	if c.messages == nil {
		c.messages = make(map[string]*protoMessage)
	}
	pkg := ""
	for _, e := range def.Elements {
		if p, ok := e.(*proto.Package); ok {
			pkg = p.Name
		}
	}
	type pending struct {
		m     *proto.Message
		scope string // full name of the message
	}
	var msgs []pending
	var collect func(scope string, es []proto.Visitee)
	collect = func(scope string, es []proto.Visitee) {
		for _, e := range es {
			if m, ok := e.(*proto.Message); ok && !m.IsExtend {
				full := qualify(scope, m.Name)
				msgs = append(msgs, pending{m, full})
				collect(full, m.Elements)
			}
		}
	}
	collect(pkg, def.Elements)
	known := make(map[string]bool)
	for _, m := range msgs {
		known[m.scope] = true
	}
	for _, m := range msgs {
		pm := &protoMessage{full: m.scope}
		var add func(es []proto.Visitee)
		add = func(es []proto.Visitee) {
			for _, e := range es {
				switch f := e.(type) {
				case *proto.NormalField:
					pm.fields = append(pm.fields, protoField{name: f.Name, typ: resolve(m.scope, f.Type, known), raw: f.Type, repeated: f.Repeated})
				case *proto.MapField:
					pm.fields = append(pm.fields, protoField{name: f.Name, repeated: true})
				case *proto.OneOfField:
					pm.fields = append(pm.fields, protoField{name: f.Name, typ: resolve(m.scope, f.Type, known), raw: f.Type})
				case *proto.Oneof:
					add(f.Elements)
				}
			}
		}
		add(m.m.Elements)
		c.messages[m.scope] = pm
	}
	for _, e := range def.Elements {
		svc, ok := e.(*proto.Service)
		if !ok {
			continue
		}
		for _, se := range svc.Elements {
			if r, ok := se.(*proto.RPC); ok {
				service := qualify(pkg, svc.Name)
				c.rpcs = append(c.rpcs, rpcMethod{
					full: "/" + service + "/" + r.Name, pkg: pkg, service: service, name: r.Name,
					input: resolve(pkg, r.RequestType, known), file: base,
				})
			}
		}
	}
	return nil
}

func qualify(scope, name string) string {
	if scope == "" {
		return name
	}
	return scope + "." + name
}

// resolve finds the message a type name refers to from scope, as protobuf resolves names:
// from the innermost scope outwards; "" when no message of the files given has that name.
func resolve(scope, typ string, known map[string]bool) string {
	if full, ok := strings.CutPrefix(typ, "."); ok {
		if known[full] {
			return full
		}
		return ""
	}
	for s := scope; ; {
		if full := qualify(s, typ); known[full] {
			return full
		}
		if s == "" {
			return ""
		}
		if i := strings.LastIndexByte(s, '.'); i >= 0 {
			s = s[:i]
		} else {
			s = ""
		}
	}
}

func (c *checker) protoNames() string { return strings.Join(c.protos, ", ") }

// checkRPC checks an RPC rule: the method it names and the fields of its key.
func (c *checker) checkRPC(s *section, i int, r middleware.Rule) {
	name := s.field(fmt.Sprintf("Lock.Rules[%d]", i))
	svc, method, ok := strings.Cut(strings.TrimPrefix(r.RPC, "/"), "/")
	if !strings.HasPrefix(r.RPC, "/") || !ok || svc == "" || method == "" {
		return // malformed: Problems reported it
	}
	m, found := c.method(r.RPC)
	if !found {
		c.errorAt(s, s.ruleNode(i, "RPC"), "%s.RPC: %s matches no method of %s%s", name, r.RPC, c.protoNames(), c.nearestMethod(svc, method))
		return
	}
	c.stats(s.file).methods[m.full] = true
	refs, err := rules.TemplateRefs(r.Key)
	if err != nil || m.input == "" {
		return
	}
	for _, ref := range refs {
		if strings.HasPrefix(ref, "header.") {
			continue // the call's metadata
		}
		if msg := c.checkField(m.input, strings.Split(ref, ".")); msg != "" {
			c.errorAt(s, s.ruleNode(i, "Key"), "%s.Key: {%s}: %s", name, ref, msg)
		}
	}
	c.checkSidesRPC(s, i, r, m.input, refs)
}

func (c *checker) method(full string) (rpcMethod, bool) {
	i := slices.IndexFunc(c.rpcs, func(m rpcMethod) bool { return m.full == full })
	if i < 0 {
		return rpcMethod{}, false
	}
	return c.rpcs[i], true
}

// nearestMethod names the method that /svc/method probably meant: the same in another case,
// the service without its package, a misspelling; else it lists what there is.
func (c *checker) nearestMethod(svc, method string) string {
	full := "/" + svc + "/" + method
	for _, m := range c.rpcs {
		if strings.EqualFold(m.full, full) {
			return fmt.Sprintf(" (did you mean %s? gRPC matches full method names case-sensitively)", m.full)
		}
	}
	if !strings.Contains(svc, ".") {
		for _, m := range c.rpcs {
			if m.pkg != "" && strings.EqualFold(m.service, m.pkg+"."+svc) && strings.EqualFold(m.name, method) {
				return fmt.Sprintf(" (did you mean %s? a full method name starts with the proto package: package %s;)", m.full, m.pkg)
			}
		}
	}
	fulls := make([]string, len(c.rpcs))
	for i, m := range c.rpcs {
		fulls[i] = m.full
	}
	if near := nearest(full, fulls); near != "" {
		return fmt.Sprintf(" (did you mean %s?)", near)
	}
	var names []string
	for _, m := range c.rpcs {
		if m.service == svc {
			names = append(names, m.name)
		}
	}
	if len(names) > 0 {
		return fmt.Sprintf(" (%s has %s)", svc, strings.Join(names, ", "))
	}
	var svcs []string
	for _, m := range c.rpcs {
		if !slices.Contains(svcs, m.service) {
			svcs = append(svcs, m.service)
		}
	}
	return fmt.Sprintf(" (no service %s; the files have %s)", svc, strings.Join(svcs, ", "))
}

// checkField checks a field path of a key template in message msg, as the zrpc key templates
// read it (middleware/rpckey.go): proto names, singular messages down to a singular scalar.
func (c *checker) checkField(msg string, path []string) string {
	for i, name := range path {
		pm := c.messages[msg]
		if pm == nil {
			return "" // a message of another file: not checked
		}
		j := slices.IndexFunc(pm.fields, func(f protoField) bool { return f.name == name })
		if j < 0 {
			return unknownProtoField(pm, name)
		}
		f := pm.fields[j]
		last := i == len(path)-1
		switch {
		case f.repeated:
			return fmt.Sprintf("%s.%s is repeated: a key needs a single value", pm.full, name)
		case last && f.typ != "":
			return fmt.Sprintf("%s.%s is a message: name one of its fields ({%s.x})", pm.full, name, strings.Join(path, "."))
		case !last && f.typ == "":
			return fmt.Sprintf("%s.%s is not a message", pm.full, name)
		}
		msg = f.typ
	}
	return ""
}

// unknownProtoField words a field name that message pm lacks: the one probably meant when the
// name was written the Go way (AccountId) or the JSON way (accountId), and the proto names.
func unknownProtoField(pm *protoMessage, name string) string {
	names := make([]string, len(pm.fields))
	hint := ""
	for i, f := range pm.fields {
		names[i] = f.name
		if fold(f.name) == fold(name) || jsonName(f.name) == name {
			hint = fmt.Sprintf("did you mean {%s}? ", f.name)
		}
	}
	return fmt.Sprintf("%s has no field %q (%skey templates name fields by their proto names: %s)",
		pm.full, name, hint, strings.Join(names, ", "))
}

// jsonName is protoc's JSON name of a field: account_id is accountId.
func jsonName(name string) string {
	var b strings.Builder
	up := false
	for _, r := range name {
		switch {
		case r == '_':
			up = true
		case up:
			b.WriteRune(unicode.ToUpper(r))
			up = false
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// supersededByProto reports whether a problem of Problems on field f is one that the .proto
// files given answer better: the key of an RPC-only rule whose method they define. Problems
// checks those fields only against the descriptors linked into this binary (methodInput), which
// are not the service's.
func (c *checker) supersededByProto(s *section, f string) bool {
	var i int
	if n, err := fmt.Sscanf(f, "Lock.Rules[%d].Key", &i); n != 1 || err != nil || !strings.HasSuffix(f, "].Key") {
		return false
	}
	if i < 0 || i >= len(s.conf.Rules) {
		return false
	}
	r := s.conf.Rules[i]
	if r.RPC == "" || r.Path != "" || r.Name != "" {
		return false
	}
	if _, err := rules.TemplateRefs(r.Key); err != nil {
		return false // a syntax error, which no .proto file answers
	}
	m, ok := c.method(r.RPC)
	return ok && m.input != ""
}
