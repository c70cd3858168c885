package main

import (
	"fmt"
	"slices"
	"strings"
	"unicode"

	"github.com/flightlock/flightlock/middleware"
	"github.com/flightlock/flightlock/middleware/rules"
)

// Key scopes: two requests exclude each other only when they render the same key, so every
// rule that locks one kind of value must lock it under one shape ("acct:{...}"). These checks
// compare the keys of a template with each other, and the keys of rules with each other, by
// their text alone: goctl's .api types (string, int64) and proto scalars do not tell an
// account from a user, so the API definitions are not used here.

// keyedRule is one key of a loaded rule that names a single value ("acct:{body.from}"),
// kept until every file is read so that rules are compared across sections and files.
type keyedRule struct {
	s      *section
	rule   int
	prefix string // the section's Prefix: keys under different prefixes never meet anyway
	kind   string // what the value is, by its field's name: valueKind
	ref    string
	key    rules.TemplateKey
}

// checkKeyParts warns of a multi-key template whose keys differ in namespace, one "acct:"
// and one bare, and records the rule's single-value keys for checkKeyScopes.
func (c *checker) checkKeyParts(s *section, i int, r middleware.Rule) {
	keys, err := rules.TemplateKeys(r.Key)
	if err != nil {
		return // Problems reported it
	}
	prefix, n := s.conf.Normalized().Prefix, r.Normalized()
	for _, k := range keys {
		c.counted = append(c.counted, countedKey{s: s, rule: i, prefix: prefix, shape: k.Shape, permits: max(r.Permits, 1),
			mode: n.Mode, fair: n.Fair})
		if len(k.Refs) != 1 {
			continue // a composite key ("idem:{uid}:{header.Idempotency-Key}") names no one value
		}
		if kind := valueKind(k.Refs[0]); kind != "" {
			c.keyed = append(c.keyed, keyedRule{s: s, rule: i, prefix: prefix, kind: kind, ref: k.Refs[0], key: k})
		}
	}
	if len(keys) < 2 {
		return
	}
	var bare, named []rules.TemplateKey
	for _, k := range keys {
		if k.Namespace() == "" {
			bare = append(bare, k)
		} else {
			named = append(named, k)
		}
	}
	if len(bare) == 0 || len(named) == 0 {
		return
	}
	ns := named[0].Namespace()
	fix := ""
	if slices.ContainsFunc(named, func(k rules.TemplateKey) bool { return k.Namespace() != ns }) {
		var all []string
		for _, k := range named {
			if !slices.Contains(all, k.Namespace()) {
				all = append(all, k.Namespace())
			}
		}
		fix = fmt.Sprintf("give it the namespace of the value it names (%s)", strings.Join(all, " or "))
	} else {
		parts := make([]string, len(keys))
		for j, k := range keys {
			parts[j] = k.Text
			if k.Namespace() == "" {
				parts[j] = ns + k.Text
			}
		}
		fix = fmt.Sprintf("write %q", strings.Join(parts, "+"))
	}
	c.warnAt(s, s.ruleNode(i, "Key"), "%s.Key: the key %s has no namespace while %s starts with %q, so it never meets the lock "+
		"of a rule that locks the same value as %s{...}, and both requests run at once; %s",
		s.field(fmt.Sprintf("Lock.Rules[%d]", i)), bare[0].Text, named[0].Text, ns, ns, fix)
}

// checkKeyScopes warns of a rule that locks a kind of value under another shape than the
// first rule that locks that kind, under the same Prefix, in any section of any file given:
// order:{body.uid} in one rule and user:{body.uid} in another never exclude each other. The
// first rule to lock a kind, in the order of the files and their rules, sets its shapes;
// each later rule that shares none of them is reported once per kind, at its Key.
func (c *checker) checkKeyScopes() {
	type scope struct{ prefix, kind string }
	first := make(map[scope][]keyedRule) // the keys of the first rule that locks a kind
	reported := make(map[string]bool)    // "file\x00section\x00rule\x00kind"
	for _, k := range c.keyed {
		sc := scope{k.prefix, k.kind}
		ref := first[sc]
		if ref == nil || ref[0].s == k.s && ref[0].rule == k.rule {
			first[sc] = append(ref, k)
			continue
		}
		if slices.ContainsFunc(ref, func(r keyedRule) bool { return r.key.Shape == k.key.Shape }) {
			continue
		}
		// A later key of this rule may still share a shape with the first rule: look at all of them.
		same := slices.ContainsFunc(c.keyed, func(o keyedRule) bool {
			return o.s == k.s && o.rule == k.rule && o.prefix == k.prefix && o.kind == k.kind &&
				slices.ContainsFunc(ref, func(r keyedRule) bool { return r.key.Shape == o.key.Shape })
		})
		id := fmt.Sprintf("%s\x00%s\x00%d\x00%s", k.s.file, k.s.path, k.rule, k.kind)
		if same || reported[id] {
			continue
		}
		reported[id] = true
		r := ref[0]
		other := r.s.field(fmt.Sprintf("Lock.Rules[%d]", r.rule))
		if r.s.file != k.s.file {
			other += fmt.Sprintf(" (%s:%d)", r.s.file, r.s.ruleNode(r.rule, "Key").Line)
		}
		why := ""
		if fieldName(r.ref) != fieldName(k.ref) {
			why = fmt.Sprintf(" (both name %s %s: their field names end in it)", article(k.kind), k.kind)
		}
		fix := strings.Replace(r.key.Shape, "{}", "{"+k.ref+"}", 1)
		c.warnAt(k.s, k.s.ruleNode(k.rule, "Key"), "%s.Key locks {%s} as %s, and %s locks {%s} as %s%s: the two rules never take "+
			"the same key for one %s, so they do not exclude each other; if they guard the same %s, lock it under one shape in both (%s)",
			k.s.field(fmt.Sprintf("Lock.Rules[%d]", k.rule)), k.ref, k.key.Text, other, r.ref, r.key.Text, why, k.kind, k.kind, fix)
	}
}

// templateSources are the first names of a REST reference that say where its value comes from.
var templateSources = []string{"path", "form", "query", "body", "header", "jwt"}

// fieldName is a reference without its source: "body.from_account" is "from_account".
func fieldName(ref string) string {
	if src, rest, ok := strings.Cut(ref, "."); ok && slices.Contains(templateSources, src) {
		return rest
	}
	return ref
}

// idWords are the words that say how a value is written, not what it is: account_id,
// account_no and account name one account. A field named by them alone ({id}, {path.id})
// names no kind of value and is never compared.
var idWords = []string{"id", "ids", "uuid", "no", "num", "number", "code", "key", "sn", "name"}

// valueKind is the kind of value that reference ref names, by its field's name: the last
// word of it, once the words of idWords at its end are dropped, so that uid, from_account_id,
// toAccount and account.no are "uid", "account", "account" and "account". "" for a field
// named only by such words.
func valueKind(ref string) string {
	words := nameWords(fieldName(ref))
	for len(words) > 0 && slices.Contains(idWords, words[len(words)-1]) {
		words = words[:len(words)-1]
	}
	if len(words) == 0 {
		return ""
	}
	return words[len(words)-1]
}

// nameWords splits a field path into lower-case words at dots, underscores, dashes and
// lower-to-upper case changes: "fromAccount_ID" is from, account, id.
func nameWords(name string) []string {
	var words []string
	var cur []rune
	prevLower := false
	flush := func() {
		if len(cur) > 0 {
			words = append(words, strings.ToLower(string(cur)))
			cur = cur[:0]
		}
	}
	for _, r := range name {
		switch {
		case r == '.' || r == '_' || r == '-':
			flush()
			prevLower = false
			continue
		case unicode.IsUpper(r) && prevLower:
			flush()
		}
		cur = append(cur, r)
		prevLower = unicode.IsLower(r) || unicode.IsDigit(r)
	}
	flush()
	return words
}

// article is "a" or "an" for noun.
func article(noun string) string {
	if noun != "" && strings.ContainsRune("aeiou", rune(noun[0])) {
		return "an"
	}
	return "a"
}

// countedKey is one key of a loaded rule with the rule's kind of lock: its permit count (1
// for a lock), its Mode and Fair.
type countedKey struct {
	s       *section
	rule    int
	prefix  string
	shape   string // "export:{}"
	permits int
	mode    string // normalized: "", "read" or "write"
	fair    bool
}

// checkPermitCounts refuses two rules of two sections that lock keys of one shape with different Permits. Two
// counts share the lower one's permits (a lock is permit 1 of its key), so the higher count
// lets that many in beside the lower rule's holders. The first rule to lock a
// shape sets its count; each later rule with another count is reported once per shape.
func (c *checker) checkPermitCounts() {
	type scope struct{ prefix, shape string }
	first := make(map[scope]countedKey)
	reported := make(map[string]bool)
	for _, k := range c.counted {
		sc := scope{k.prefix, k.shape}
		f, ok := first[sc]
		if !ok {
			first[sc] = k
			continue
		}
		id := fmt.Sprintf("%s\x00%s\x00%d\x00%s", k.s.file, k.s.path, k.rule, k.shape)
		// Two rules of one section are refused by Problems (as at start-up); this is for rules
		// of two services' sections.
		if f.permits == k.permits || reported[id] || f.s == k.s {
			continue
		}
		reported[id] = true
		other := f.s.field(fmt.Sprintf("Lock.Rules[%d]", f.rule))
		if f.s.file != k.s.file {
			other += fmt.Sprintf(" (%s:%d)", f.s.file, f.s.ruleNode(f.rule, "Key").Line)
		}
		why := fmt.Sprintf("they share the first %d permits, so up to %d requests hold a key where one rule allows %d",
			min(f.permits, k.permits), max(f.permits, k.permits), min(f.permits, k.permits))
		if min(f.permits, k.permits) == 1 {
			why = fmt.Sprintf("a lock is permit 1 of its key's semaphore, so up to %d requests hold a key where one rule allows one",
				max(f.permits, k.permits))
		}
		c.errorAt(k.s, k.s.ruleNode(k.rule, "Key"), "%s locks %s with %s, and %s with %s: %s; give every rule on a key the same Permits",
			k.s.field(fmt.Sprintf("Lock.Rules[%d]", k.rule)), k.shape, permitWords(k), other, permitWords(f), why)
	}
}

// permitWords is a rule's permit count as a message says it, with its Mode when it has one.
func permitWords(k countedKey) string {
	switch {
	case k.permits > 1:
		return fmt.Sprintf("Permits: %d", k.permits)
	case k.mode != "":
		return "Mode: " + k.mode + " (no Permits)"
	}
	return "no Permits (a lock)"
}
