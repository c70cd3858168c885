// Package benchflag parses the flag values of the benchmark command: lists of points, the
// scenario set, and flags that must be read before the others because they choose the
// others' defaults.
package benchflag

import (
	"fmt"
	"strconv"
	"strings"
)

// Ints parses a comma-separated list of ascending positive integers ("_" may group digits:
// 100_000); "" is an empty list.
func Ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(strings.ReplaceAll(f, "_", ""))
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("not a positive integer: %q", f)
		}
		if len(out) > 0 && n <= out[len(out)-1] {
			return nil, fmt.Errorf("%q: want ascending numbers", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// Scenarios parses a comma-separated list of scenario numbers from 1 to last.
func Scenarios(s string, last int) (map[int]bool, error) {
	set := map[int]bool{}
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > last {
			return nil, fmt.Errorf("%q is not a scenario (1-%d)", f, last)
		}
		set[n] = true
	}
	return set, nil
}

// Peek returns the value of flag name in args (-name v, -name=v, with one dash or two) before
// the flags are parsed, for a flag that chooses other flags' defaults; boolean flags given
// without a value read "true". ok is false when args do not set it.
func Peek(args []string, name string, boolean bool) (value string, ok bool) {
	for i, a := range args {
		if a == "--" {
			break
		}
		a = strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		if v, found := strings.CutPrefix(a, name+"="); found {
			value, ok = v, true
			continue
		}
		if a != name {
			continue
		}
		switch {
		case boolean:
			value, ok = "true", true
		case i+1 < len(args):
			value, ok = args[i+1], true
		}
	}
	return value, ok
}
