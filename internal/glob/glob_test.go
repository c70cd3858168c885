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
