package rules

import (
	"strings"
	"testing"
)

// canonicalNumber writes every way of writing one number alike, and keeps different integers
// apart at any length (snowflake ids above 2^53 must not share a lock with their neighbours).
func TestCanonicalNumber(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"7", "7"}, {"07", "7"}, {"007", "7"}, {"+7", "7"}, {"-7", "-7"}, {"-007", "-7"},
		{"0", "0"}, {"-0", "0"}, {"+0", "0"}, {"000", "0"},
		{"1.0", "1"}, {"1e0", "1"}, {"1E0", "1"}, {"10e-1", "1"}, {"1.5", "1.5"}, {"-1.50", "-1.5"},
		{"-0.0", "0"}, {".5", "0.5"}, {"1e20", "100000000000000000000"},
		{"1844674407370955161", "1844674407370955161"}, {"1844674407370955162", "1844674407370955162"},
		{"123456789012345678901234567890", "123456789012345678901234567890"},
		// Any length: 65 zeros before a 7 are 7, not a second lock on 7.
		{strings.Repeat("0", 65) + "7", "7"}, {"-" + strings.Repeat("0", 900) + "42", "-42"},
		// What ParseFloat reads too: underscores, hexadecimal floats; integral floats as digits.
		{"1_000", "1000"}, {"0x1p0", "1"}, {"0X1P-2", "0.25"}, {"1e21", "1000000000000000000000"},
		{"1000000000000000000000", "1000000000000000000000"},
		// Not numbers: as written.
		{"", ""}, {"abc", "abc"}, {"7a", "7a"}, {"+-7", "+-7"}, {"7-", "7-"}, {"-", "-"}, {"1e", "1e"},
		{"0x10", "0x10"}, {"Inf", "Inf"}, {"NaN", "NaN"}, {"1e400", "1e400"}, {"1 2", "1 2"}, {"e5", "e5"},
		{"deadbeef", "deadbeef"}, {"_1", "_1"},
	} {
		if got := canonicalNumber(tc.in); got != tc.want {
			t.Errorf("canonicalNumber(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// canonicalValue writes every spelling that go-zero binds as one bool, and every spelling of
// one infinity or of NaN, alike; what go-zero binds as no bool and no float stays as written.
func TestCanonicalValue(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"1", "1"}, {"true", "1"}, {"TRUE", "1"}, {"True", "1"}, {"tRuE", "1"},
		{"0", "0"}, {"false", "0"}, {"FALSE", "0"}, {"False", "0"}, {"00", "0"},
		{"fal\u017fe", "0"}, // strings.EqualFold folds the long s to s, as go-zero compares
		{"Inf", "Inf"}, {"inf", "Inf"}, {"+Inf", "Inf"}, {"+INF", "Inf"}, {"Infinity", "Inf"}, {"+infinity", "Inf"},
		{"-Inf", "-Inf"}, {"-inf", "-Inf"}, {"-INFINITY", "-Inf"},
		{"NaN", "NaN"}, {"nan", "NaN"}, {"NAN", "NaN"},
		// As written: no bool, and ParseFloat reads no value (or go-zero refuses the overflow).
		{"t", "t"}, {"f", "f"}, {"yes", "yes"}, {"truee", "truee"}, {" true", " true"}, {"+nan", "+nan"},
		{"infin", "infin"}, {"Infinity!", "Infinity!"}, {"1e400", "1e400"}, {"-1e400", "-1e400"},
		{"info", "info"}, {"nano", "nano"}, {"+-inf", "+-inf"}, {"-", "-"}, {"+infinityy", "+infinityy"},
		// Numbers as canonicalNumber writes them.
		{"07", "7"}, {"1.0", "1"}, {"-0", "0"},
	} {
		if got := canonicalValue(tc.in); got != tc.want {
			t.Errorf("canonicalValue(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
