package rules

import (
	"errors"
	"fmt"
	"strings"

	"github.com/flightlock/flightlock"
)

// TemplateKeys returns the "+"-joined keys of the key template s, or its syntax error as
// Validate words it; each transport binds the references (bindPlan).
func TemplateKeys(s string) ([]TemplateKey, error) {
	if s == "" {
		return nil, errors.New("is empty")
	}
	var (
		out  []TemplateKey
		k    TemplateKey
		from int // start of k in s
		lit  int // start of k's current literal text
	)
	for i := 0; i <= len(s); i++ {
		c := byte('+') // the end of s ends the last key as a '+' does
		if i < len(s) {
			c = s[i]
		}
		switch {
		case c == '{':
			end := strings.IndexByte(s[i+1:], '}')
			if end < 0 {
				return nil, fmt.Errorf("has an unclosed '{' at offset %d", i)
			}
			name := s[i+1 : i+1+end]
			if err := checkRefName(name); err != nil {
				return nil, fmt.Errorf("{%s}: %v", name, err)
			}
			k.lits, k.Refs = append(k.lits, s[lit:i]), append(k.Refs, name)
			i += end + 1
			lit = i + 1
		case c == '}':
			return nil, fmt.Errorf("has an unopened '}' at offset %d", i)
		case c == '+':
			k.Text, k.lits = s[from:i], append(k.lits, s[lit:i])
			k.Shape = strings.Join(k.lits, "{}")
			if k.Text == "" {
				return nil, fmt.Errorf("has an empty key at offset %d (%q)", from, s)
			}
			if err := k.checkSeparators(); err != nil {
				return nil, err
			}
			out, k, from, lit = append(out, k), TemplateKey{}, i+1, i+1
		case c < 0x20 || c == 0x7f:
			return nil, fmt.Errorf("has a control byte %#02x at offset %d", c, i)
		}
	}
	return out, nil
}

// TemplateRefs returns the references of the key template s as written between the braces
// ("body.uid"), in order, or its syntax error, for tools (flightlock check).
func TemplateRefs(s string) ([]string, error) {
	keys, err := TemplateKeys(s)
	var refs []string
	for _, k := range keys {
		refs = append(refs, k.Refs...)
	}
	return refs, err
}

// TemplateKey is one "+"-joined key of a key template, for tools that compare rules' keys.
type TemplateKey struct {
	Text string // the key as written: "acct:{body.from}"
	// Shape is Text with each reference written {}: "acct:{}"; keys of one shape render alike.
	Shape string
	Refs  []string // the references, in order, as written between the braces: "body.from"
	lits  []string // the literal text around the references: one more than Refs
}

// Namespace is the literal text of k before its first reference: "acct:" for "acct:{id}", ""
// for a key that starts with a reference.
func (k TemplateKey) Namespace() string {
	ns, _, _ := strings.Cut(k.Shape, "{}")
	return ns
}

// checkSeparators requires a ':' in the text between two references: values never hold a
// bare ':' (escape), so it marks where each ends; with "{a}-{b}", ("x-y", "z") and ("x",
// "y-z") would both render "x-y-z".
func (k TemplateKey) checkSeparators() error {
	for i := 1; i < len(k.Refs); i++ {
		if !strings.Contains(k.lits[i], ":") {
			return fmt.Errorf("{%s} and {%s} in %q must be separated by text containing ':' so that different values cannot render the same key", k.Refs[i-1], k.Refs[i], k.Text)
		}
	}
	return nil
}

// checkRefName accepts dotted names of letters, digits, '_' and '-'.
func checkRefName(name string) error {
	if name == "" {
		return errors.New("empty reference")
	}
	for part := range strings.SplitSeq(name, ".") {
		if part == "" {
			return errors.New("empty name between dots")
		}
		for _, c := range []byte(part) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
				return fmt.Errorf("character %q is not allowed in a reference", c)
			}
		}
	}
	return nil
}

// getter resolves one reference for a request of a transport (S); err wraps ErrInvalidKey.
type getter[S any] func(src S) (value string, ok bool, err error)

// keyPlan is a key template bound to one transport: it renders every key of a request,
// escaping the values; a missing or empty value is an ErrInvalidKey.
type keyPlan[S any] func(src S) ([]string, error)

func bindPlan[S any](keys []TemplateKey, bind func(ref string) (getter[S], error)) (keyPlan[S], error) {
	gets := make([][]getter[S], len(keys)) // per key, a getter per reference
	for i, k := range keys {
		gets[i] = make([]getter[S], len(k.Refs))
		for j, ref := range k.Refs {
			var err error
			if gets[i][j], err = bind(ref); err != nil {
				return nil, err
			}
		}
	}
	return func(src S) ([]string, error) {
		out := make([]string, 0, len(keys))
		var b strings.Builder
		for i, k := range keys {
			b.Reset()
			b.WriteString(k.lits[0])
			for j, get := range gets[i] {
				v, ok, err := get(src)
				if err != nil {
					return nil, err
				}
				if !ok || v == "" {
					return nil, fmt.Errorf("%w: no value for {%s}", flightlock.ErrInvalidKey, k.Refs[j])
				}
				escape(&b, v)
				b.WriteString(k.lits[j+1])
			}
			out = append(out, b.String())
		}
		return out, nil
	}, nil
}

// namespace is a start of keys that the middleware writes itself, under the rules' Prefix.
type namespace struct{ prefix, holds string } // holds: what lives there, for messages

// ReplayPrefix is put after LockConf.Prefix before the keys of stored responses (share rules).
const ReplayPrefix = "replay:"

// ShadowPrefix is put after LockConf.Prefix before the keys of shadow rules, so that a shadow
// rule never holds back an enforced request.
const ShadowPrefix = "shadow:"

// internalNamespaces are the middleware's own keys, which an enforced rule's key never starts
// with: a lock on a stored response would corrupt the record (acquire.lua appends to the
// value), and one among a shadow rule's would hold back requests a shadow rule must never
// affect. Templates are checked at start-up (checkOwnKeys), rendered keys per request (apart).
var internalNamespaces = [...]namespace{
	{ReplayPrefix, "the stored responses of share rules"},
	{ShadowPrefix, "the locks of shadow rules"},
}

// internalNamespace returns the namespace of internalNamespaces that key starts with, or nil.
func internalNamespace(key string) *namespace {
	for i := range internalNamespaces {
		if strings.HasPrefix(key, internalNamespaces[i].prefix) {
			return &internalNamespaces[i]
		}
	}
	return nil
}

// checkOwnKeys refuses an enforced rule's template whose text starts a key in internalNamespaces.
func checkOwnKeys(keys []TemplateKey) error {
	for _, k := range keys {
		if ns := internalNamespace(k.lits[0]); ns != nil {
			return fmt.Errorf("%q puts its keys among %s (%s*), which a lock would corrupt or hold back: "+
				"start it with another word", k.Text, ns.holds, ns.prefix)
		}
	}
	return nil
}

// apart passes on the keys of a request of s, or refuses an enforced rule's among
// internalNamespaces without naming the key, which the client reads (a shadow rule's are apart).
func (s Spec) apart(keys []string, err error) ([]string, error) {
	if err != nil || s.Shadow {
		return keys, err
	}
	for _, k := range keys {
		if ns := internalNamespace(k); ns != nil {
			return nil, fmt.Errorf("%w: the key starts with %q, among %s", flightlock.ErrInvalidKey, ns.prefix, ns.holds)
		}
	}
	return keys, nil
}

// escape writes v to b with '%', ':', '+', '{', '}', control bytes and DEL percent-encoded,
// so that a value cannot forge a separator, a join or a hash tag; escaping '%' itself keeps
// different values different.
func escape(b *strings.Builder, v string) {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c == 0x7f || strings.IndexByte("%:+{}", c) >= 0 {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&0xf])
		} else {
			b.WriteByte(c)
		}
	}
}
