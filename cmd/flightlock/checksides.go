package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/flightlock/flightlock/middleware"
	"github.com/flightlock/flightlock/middleware/rules"
)

// Two sides of one operation: a request that moves something between two entities (a transfer
// from one account to another) must lock both. A rule that locks only the source lets two
// transfers into one account run at once, and nothing fails: the balances are simply wrong.
// The request's fields say which fields are the two sides, by a side word at the start of
// their names (from/to, src/dst, ...); the rule's template says which of them it locks.

// sidePairs are the words that name the two sides of one operation: the giving side first,
// then the receiving one. A field whose name starts with a word of one side pairs with a field
// whose name starts with a word of the other side, when the rest of their names name one kind
// of value (valueKind): from and to, from_account and toAccountId, src_wallet and dst_wallet.
var sidePairs = [][2][]string{
	{{"from"}, {"to"}},
	{{"src"}, {"dst", "dest"}},
	{{"source"}, {"target", "destination"}},
	{{"sender"}, {"receiver", "recipient"}},
	{{"payer"}, {"payee"}},
	{{"debit"}, {"credit"}},
	{{"seller"}, {"buyer"}},
}

// rangeWords are kinds that name the bounds of a range, not entities: from_date and to_date
// select, they do not move anything between two dates, so locking one bound is no mistake.
var rangeWords = []string{"date", "time", "timestamp", "ts", "day", "month", "year", "page"}

// entityTypes are the .api and .proto types that an entity's key is written in. A float, a
// bool, a message or a time type is never an account: a pair of such fields is not checked.
// An integer cannot be told from a Unix time, so from/to as int64 dates are checked too.
var entityTypes = []string{
	"string",
	"int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64",
	"sint32", "sint64", "fixed32", "fixed64", "sfixed32", "sfixed64",
}

// side is where a field name stands in sidePairs.
type side struct {
	pair   int    // index in sidePairs
	giving bool   // the first side of the pair (from, src, ...)
	kind   string // what the rest of the name names: "account" for from_account_id, "" for from
}

// sideOf returns the side that a field name names, matched case-insensitively on its first
// word, and false for a name that names no side or the bound of a range.
func sideOf(name string) (side, bool) {
	words := nameWords(name)
	if len(words) == 0 {
		return side{}, false
	}
	for p, pair := range sidePairs {
		for s, ws := range pair {
			if !slices.Contains(ws, words[0]) {
				continue
			}
			kind := valueKind(strings.Join(words[1:], "_"))
			if slices.Contains(rangeWords, kind) {
				return side{}, false
			}
			return side{pair: p, giving: s == 0, kind: kind}, true
		}
	}
	return side{}, false
}

// otherSides reports whether field names a and b name the two sides of one operation: from
// and to, fromAccountId and to_account, but not from and to_account, nor from and from.
func otherSides(a, b string) bool {
	sa, okA := sideOf(a)
	sb, okB := sideOf(b)
	return okA && okB && sa.pair == sb.pair && sa.giving != sb.giving && sa.kind == sb.kind
}

// sideField is a top-level field of a request, as a key template may read it.
type sideField struct {
	name   string // the JSON, form or path name, or the proto name
	source string // "body", "form" or "path" for REST, "" for a proto field
	typ    string // its primitive type ("string", "int64"), "" for any other
	ref    string // the reference of the template that reads it, "" when it reads none
}

// entity reports whether f is of a type that an entity's key is written in.
func (f sideField) entity() bool { return slices.Contains(entityTypes, f.typ) }

// oneSided is a field that a template locks and the other side of it that it does not.
type oneSided struct{ locked, missing sideField }

// oneSidedFields returns, for each field of fields that the template reads, the first field
// that names its other side when the template reads no field of that other side. Fields of a
// type that names no entity pair with nothing.
func oneSidedFields(fields []sideField) []oneSided {
	var out []oneSided
	for _, f := range fields {
		if f.ref == "" || !f.entity() {
			continue
		}
		var others []sideField
		for _, o := range fields {
			if o.entity() && otherSides(f.name, o.name) {
				others = append(others, o)
			}
		}
		if len(others) == 0 || slices.ContainsFunc(others, func(o sideField) bool { return o.ref != "" }) {
			continue
		}
		if !slices.ContainsFunc(out, func(x oneSided) bool { return x.missing == others[0] }) {
			out = append(out, oneSided{locked: f, missing: others[0]})
		}
	}
	return out
}

// restSideFields are the fields that go-zero binds for route rt, each with the reference of
// refs that reads it. Headers are left out (no side of an operation travels in one), and so
// are nested JSON fields.
func restSideFields(rt route, refs []string) []sideField {
	var out []sideField
	for _, b := range bindings(rt) {
		if b.source == "header" {
			continue
		}
		f := sideField{name: b.name, source: b.source, typ: primitiveName(b.typ)}
		for _, ref := range refs {
			src, name := splitRESTRef(ref)
			if src == "query" {
				src = "form" // go-zero binds the query with form tags
			}
			if name == b.name && (src == "" || src == b.source) {
				f.ref = ref
				break
			}
		}
		out = append(out, f)
	}
	return out
}

// protoSideFields are the singular scalar fields of message pm, each with the reference of
// refs that reads it; nested fields are left out.
func protoSideFields(pm *protoMessage, refs []string) []sideField {
	var out []sideField
	for _, pf := range pm.fields {
		if pf.repeated || pf.typ != "" {
			continue
		}
		f := sideField{name: pf.name, typ: pf.raw}
		if slices.Contains(refs, pf.name) {
			f.ref = pf.name
		}
		out = append(out, f)
	}
	return out
}

// checkSidesREST warns of a REST rule whose key locks one side of a pair of request fields of
// a route it matched and not the other; once per missing field.
func (c *checker) checkSidesREST(s *section, i int, r middleware.Rule, matched []route, refs []string) {
	var warned []string
	for _, rt := range matched {
		if rt.req == nil {
			continue
		}
		for _, o := range oneSidedFields(restSideFields(rt, refs)) {
			// Named as the template names the locked side: with the source that binds it when
			// the template writes sources ({query.to} beside {query.from}), bare when it does not.
			missing := o.missing.name
			if src, _, dotted := strings.Cut(o.locked.ref, "."); dotted {
				if src != "query" || o.missing.source != "form" {
					src = o.missing.source
				}
				missing = src + "." + missing
			}
			if slices.Contains(warned, missing) {
				continue
			}
			warned = append(warned, missing)
			c.warnSides(s, i, r, rt.req.Name(), o, missing)
		}
	}
}

// checkSidesRPC is checkSidesREST for an RPC rule and the request message of its method.
func (c *checker) checkSidesRPC(s *section, i int, r middleware.Rule, msg string, refs []string) {
	pm := c.messages[msg]
	if pm == nil {
		return
	}
	for _, o := range oneSidedFields(protoSideFields(pm, refs)) {
		c.warnSides(s, i, r, pm.full, o, o.missing.name)
	}
}

// warnSides words the warning of a rule that locks o.locked of request type req and not
// o.missing, which its template would read as {missing}, with the template that locks both.
func (c *checker) warnSides(s *section, i int, r middleware.Rule, req string, o oneSided, missing string) {
	keys, err := rules.TemplateKeys(r.Key)
	if err != nil {
		return
	}
	locked, _ := sideOf(o.locked.name)
	other, _ := sideOf(o.missing.name)
	noun := entityNoun(locked.kind, keys, o.locked.ref)
	// The fix locks the missing side as the template locks the other: a key of the same shape,
	// right after it, so that a rule that locks either account alone meets it.
	single := slices.IndexFunc(keys, func(k rules.TemplateKey) bool { return len(k.Refs) == 1 && k.Refs[0] == o.locked.ref })
	parts := make([]string, 0, len(keys)+2)
	for j, k := range keys {
		parts = append(parts, k.Text)
		if j == single {
			parts = append(parts, strings.Replace(k.Shape, "{}", "{"+missing+"}", 1))
		}
	}
	if single < 0 {
		// Read only inside a composite key (idem:{from}:{nonce}), which locks no side alone:
		// each side needs a key of its own.
		parts = append(parts, noun+":{"+o.locked.ref+"}", noun+":{"+missing+"}")
	}
	into := "into"
	if other.giving {
		into = "out of"
	}
	c.warnAt(s, s.ruleNode(i, "Key"), "%s.Key locks {%s} but not {%s}, the other side of %s: %s %s %s %s %s races another "+
		"that locks it; lock both sides: %q (the same %s twice is one lock)",
		s.field(fmt.Sprintf("Lock.Rules[%d]", i)), o.locked.ref, missing, req,
		article(operation(req)), operation(req), into, article(noun), noun, strings.Join(parts, "+"), noun)
}

// operation is what a request type does, for messages: "transfer" for TransferReq and
// bank.TransferRequest, "request" when its name says more than one word.
func operation(req string) string {
	if i := strings.LastIndexByte(req, '.'); i >= 0 {
		req = req[i+1:]
	}
	words := nameWords(req)
	for len(words) > 0 && slices.Contains([]string{"req", "request", "args", "input", "in"}, words[len(words)-1]) {
		words = words[:len(words)-1]
	}
	if len(words) != 1 {
		return "request"
	}
	return words[0]
}

// entityNoun is what the two sides are, for messages: the kind their names share, else the
// namespace of the key that locks ref alone ("acct:" is an account), else "entity".
func entityNoun(kind string, keys []rules.TemplateKey, ref string) string {
	if kind != "" {
		return kind
	}
	i := slices.IndexFunc(keys, func(k rules.TemplateKey) bool { return len(k.Refs) == 1 && k.Refs[0] == ref })
	if i < 0 {
		return "entity"
	}
	switch ns := strings.ToLower(strings.TrimRight(keys[i].Namespace(), ":/-_.")); {
	case ns == "acct" || ns == "acc":
		return "account" // the usual namespace of an account, which reads as English spelt out
	case ns != "" && !strings.ContainsAny(ns, ":/-_.{}"):
		return ns
	}
	return "entity"
}
