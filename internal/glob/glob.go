// Package glob matches keys against the glob patterns of Redis's SCAN MATCH, so that a pattern means
// the same on every store's inspector.
package glob

import "strings"

// Escape escapes the bytes of s that a pattern reads as a glob (* ? [ ] \), so that
// Match(Escape(s)+rest, ...) matches s literally; other bytes, UTF-8 or not, stay as they are.
func Escape(s string) string { return escaper.Replace(s) }

var escaper = strings.NewReplacer(`*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`, `\`, `\\`)

// Match reports whether s matches pattern as Redis's SCAN MATCH reads it (stringmatchlen,
// byte by byte): * any run, ? one byte, [abc], [^abc] and [a-z] sets, \ escapes the next
// byte; an unterminated [ set ends the pattern.
func Match(pattern, s string) bool {
	for len(pattern) > 0 {
		if pattern[0] == '*' {
			pattern = strings.TrimLeft(pattern, "*")
			for i := 0; i <= len(s); i++ {
				if Match(pattern, s[i:]) {
					return true
				}
			}
			return false
		}
		if len(s) == 0 {
			return false // every other token takes one byte
		}
		switch pattern[0] {
		case '?':
		case '[':
			var match, not bool
			if pattern, match, not = matchSet(pattern[1:], s[0]); match == not {
				return false
			}
			if len(pattern) == 0 {
				return len(s) == 1 // the unterminated set ended the pattern
			}
		case '\\':
			if len(pattern) >= 2 {
				pattern = pattern[1:]
			}
			fallthrough
		default:
			if pattern[0] != s[0] {
				return false
			}
		}
		s, pattern = s[1:], pattern[1:]
	}
	return len(s) == 0
}

// matchSet reads a [set] (pattern starts after its '['), and returns the pattern from its
// closing ']' on ("" for an unterminated set, which ends the pattern, as in Redis), whether c is
// in the set, and whether the set is negated ([^...]).
func matchSet(pattern string, c byte) (rest string, match, not bool) {
	pattern, not = strings.CutPrefix(pattern, "^")
	for len(pattern) > 0 && pattern[0] != ']' {
		switch {
		case pattern[0] == '\\' && len(pattern) >= 2:
			pattern = pattern[1:]
			match = match || pattern[0] == c
		case len(pattern) >= 3 && pattern[1] == '-':
			lo, hi := min(pattern[0], pattern[2]), max(pattern[0], pattern[2])
			match = match || lo <= c && c <= hi
			pattern = pattern[2:]
		default:
			match = match || pattern[0] == c
		}
		pattern = pattern[1:]
	}
	return pattern, match, not
}
