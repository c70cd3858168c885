package rules

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/zeromicro/go-zero/core/search"
)

// Route is a go-zero route pattern such as /api/sku/:sku/deduct.
type Route struct {
	Text   string   // cleaned with path.Clean, as go-zero's router registers it
	Params []string // variable names, in order
}

// parseRoute checks p the way go-zero's search tree does (it must start with '/', no empty
// segments), and that its variable names are named and unique, which the key templates need.
func parseRoute(p string) (Route, error) {
	if err := search.NewTree().Add(p, struct{}{}); err != nil {
		return Route{}, err
	}
	rp := Route{Text: path.Clean(p)}
	if rp.Text == "/" {
		return rp, nil
	}
	for _, s := range strings.Split(rp.Text[1:], "/") {
		name, ok := strings.CutPrefix(s, ":")
		switch {
		case !ok:
		case name == "":
			return Route{}, errors.New("has a path variable without a name")
		case slices.Contains(rp.Params, name):
			return Route{}, fmt.Errorf("has the path variable :%s twice", name)
		default:
			rp.Params = append(rp.Params, name)
		}
	}
	return rp, nil
}

// RouteShape is a route pattern with its variable names left out (/sku/:id and /sku/:uid are
// /sku/:), for suggestions of the route a rule meant.
func RouteShape(p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		if strings.HasPrefix(s, ":") {
			segs[i] = ":"
		}
	}
	return strings.Join(segs, "/")
}
