// Package mdfmt formats the figures of the benchmark reports' Markdown tables and prose.
package mdfmt

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// Float prints 3 significant digits, without exponent for usual magnitudes.
func Float(v float64) string {
	if v == 0 {
		return "0"
	}
	a := math.Abs(v)
	switch {
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	case a >= 0.01:
		return strconv.FormatFloat(v, 'f', 3, 64)
	default:
		return strconv.FormatFloat(v, 'g', 2, 64)
	}
}

// Int rounds v and groups thousands: 123,456.
func Int(v float64) string {
	s, sign := strconv.FormatInt(int64(math.Round(v)), 10), ""
	if s[0] == '-' {
		sign, s = "-", s[1:]
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return sign + s
}

// Dur prints a duration in nanoseconds with 3 significant digits and its unit: "412 µs".
func Dur(ns float64) string {
	d := time.Duration(ns)
	switch {
	case ns == 0:
		return "0"
	case d < time.Microsecond:
		return Float(ns) + " ns"
	case d < time.Millisecond:
		return Float(ns/1e3) + " µs"
	case d < time.Second:
		return Float(ns/1e6) + " ms"
	default:
		return Float(ns/1e9) + " s"
	}
}

// SignedDur is Dur with its sign: "+412 µs", "-3.10 ms".
func SignedDur(ns float64) string {
	if ns < 0 {
		return "-" + Dur(-ns)
	}
	return "+" + Dur(ns)
}

// Head is a Markdown table's header row of cols and the rule under it (no newline after the rule).
func Head(cols ...string) string {
	return "| " + strings.Join(cols, " | ") + " |\n|" + strings.Repeat("---|", len(cols))
}
