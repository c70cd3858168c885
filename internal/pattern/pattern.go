// Package pattern holds what the middleware and the CLI's check both need of go-zero route
// patterns, so that their suggestions agree.
package pattern

import "strings"

// Shape is a route pattern with its variable names left out: /sku/:id and /sku/:uid have the
// one shape /sku/:, so a rule naming the right route with another variable name is found.
func Shape(p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		if strings.HasPrefix(s, ":") {
			segs[i] = ":"
		}
	}
	return strings.Join(segs, "/")
}
