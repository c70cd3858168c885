package glob

import "testing"

// TestGlobMatch: the inspector's glob reads patterns as Redis's SCAN MATCH does.
func TestGlobMatch(t *testing.T) {
	cases := []struct {
		pattern, s string
		want       bool
	}{
		{"*", "", true}, {"*", "order:a/b", true}, {"order:*", "order:42", true}, {"order:*", "acct:1", false},
		{"o*:4?", "order:42", true}, {"o*:4?", "order:4", false}, {"a**b", "axyb", true}, {"*:*:*", "a:b", false},
		{"[ab]x", "bx", true}, {"[^ab]x", "bx", false}, {"[^ab]x", "cx", true}, {"[a-c]1", "b1", true}, {"[c-a]1", "b1", true},
		{"[a-c]1", "d1", false}, {`\*`, "*", true}, {`\*`, "a", false}, {`[\]]`, "]", true}, {"a?", "a", false},
		{"order:42", "order:42", true}, {"order:4", "order:42", false}, {"[ab", "a", true}, {"", "", true}, {"", "a", false},
	}
	for _, c := range cases {
		if got := Match(c.pattern, c.s); got != c.want {
			t.Errorf("Match(%q, %q) = %v, want %v", c.pattern, c.s, got, c.want)
		}
	}
}

// An escaped string matches itself and nothing else, whatever glob bytes it holds, and keeps
// doing so with a pattern after it.
func TestEscapedStringMatchesOnlyItself(t *testing.T) {
	// A key is bytes: one that is not UTF-8 is escaped as it is, not as runes.
	for _, s := range []string{"", "plain", "a*b", "a?b", "[ab]", `back\slash`, "lock:export:acme#{12575}", "\xff*\xfe"} {
		if !Match(Escape(s), s) {
			t.Errorf("Match(Escape(%q), %q) = false", s, s)
		}
		if !Match(Escape(s)+"#*", s+"#2") {
			t.Errorf("Match(Escape(%q)+\"#*\", %q) = false", s, s+"#2")
		}
		if other := s + "x"; Match(Escape(s), other) {
			t.Errorf("Match(Escape(%q), %q) = true", s, other)
		}
	}
	if Match(Escape("a*b"), "axxb") {
		t.Error(`Escape("a*b") matches "axxb": the star was read as a glob`)
	}
}
