package rules

import (
	"fmt"
	"slices"
	"strings"
)

// checkRuleSet refuses enforced rules of one Lock section that lock one key in ways that
// cannot exclude each other: keys of one shape with different Permits, or with Fair on one
// rule only (the other jumps the line), and a read and a write rule of one route whose keys
// differ in shape (reads would see half-done writes). flightlock check compares sections.
func checkRuleSet(specs []Spec) error {
	firstCount := make(map[string]Spec)    // shape => the first rule that locks it
	firstFairness := make(map[string]Spec) // shape => the first rule that could be fair
	shapes := make([][]string, len(specs))
	for i, s := range specs {
		if s.Shadow || s.Key == "" {
			continue
		}
		keys, err := TemplateKeys(s.Key)
		if err != nil {
			continue // checkRule reported it
		}
		for _, k := range keys {
			shapes[i] = append(shapes[i], k.Shape)
			if f, ok := firstCount[k.Shape]; !ok {
				firstCount[k.Shape] = s
			} else if fp, sp := max(f.Permits, 1), max(s.Permits, 1); fp != sp {
				return FieldError(s.Field+".Permits", "%s locks %s with %s, and %s with %s: a lock is permit 1 of its key's "+
					"semaphore, so the rules share permits and up to %d requests hold a key where one rule allows %d; "+
					"give every rule on a key the same Permits", s.Field, k.Shape, permitWords(s), f.Field,
					permitWords(f), max(fp, sp), min(fp, sp))
			}
			if isRead(s) {
				continue // a read rule cannot be fair: a waiting writer holds new reads back
			}
			if f, ok := firstFairness[k.Shape]; !ok {
				firstFairness[k.Shape] = s
			} else if f.Fair != s.Fair {
				fair, unfair := s.Field, f.Field
				if !s.Fair {
					fair, unfair = f.Field, s.Field
				}
				return FieldError(s.Field+".Fair", "%s locks %s with Fair and %s without it: only fair rules keep the key's "+
					"line, so a request of %s takes the key whenever it is free, ahead of the fair waiters; "+
					"make every rule on a key fair, or none", fair, k.Shape, unfair, unfair)
			}
		}
	}
	for i, r := range specs {
		if !isRead(r) || r.Path == "" || len(shapes[i]) == 0 {
			continue
		}
		for j, w := range specs {
			if !isWrite(w) || len(shapes[j]) == 0 || !sameRoute(r.Path, w.Path) || shareShape(shapes[i], shapes[j]) {
				continue
			}
			at := r
			if j > i {
				at = w // the later rule is the one reported, as above
			}
			return FieldError(at.Field+".Key", "%s reads %s and %s writes %s on the same route %s: a read lock excludes "+
				"only the writers of its own key, so these two never exclude each other and reads see half-done writes; "+
				"lock one key in both", r.Field, strings.Join(shapes[i], "+"), w.Field, strings.Join(shapes[j], "+"), r.Path)
		}
	}
	return nil
}

func isRead(s Spec) bool  { return strings.EqualFold(s.Mode, "read") }
func isWrite(s Spec) bool { return !s.Shadow && !isRead(s) && s.Permits <= 1 }

// sameRoute reports whether two route patterns are one route, variable names aside.
func sameRoute(a, b string) bool { return a != "" && b != "" && RouteShape(a) == RouteShape(b) }

func shareShape(a, b []string) bool {
	return slices.ContainsFunc(a, func(x string) bool { return slices.Contains(b, x) })
}

// permitWords is how a message names a rule's count: "Permits: 3", "Mode: read (no Permits)".
func permitWords(s Spec) string {
	switch {
	case s.Permits > 1:
		return fmt.Sprintf("Permits: %d", s.Permits)
	case s.Mode != "":
		return fmt.Sprintf("Mode: %s (no Permits)", strings.ToLower(s.Mode))
	}
	return "no Permits (a lock)"
}
