package middleware

import (
	"errors"
	"fmt"
	"net/http"
	"path"
	"strings"

	"github.com/zeromicro/go-zero/core/search"
	"github.com/zeromicro/go-zero/rest/pathvar"
)

// routePattern is a go-zero route pattern such as /api/sku/:sku/deduct.
type routePattern struct {
	text   string
	segs   []string // cleaned path split on '/'; ":name" for a variable
	params []string // variable names
}

// parseRoute checks p the way go-zero's router does (it must start with '/', no empty
// segments) and that its variable names are unique.
func parseRoute(p string) (routePattern, error) {
	if err := search.NewTree().Add(p, struct{}{}); err != nil {
		return routePattern{}, err
	}
	clean := path.Clean(p)
	rp := routePattern{text: clean, segs: strings.Split(clean[1:], "/")}
	for _, s := range rp.segs {
		if s == "" && clean != "/" {
			return routePattern{}, errors.New("has an empty segment")
		}
		if name, ok := strings.CutPrefix(s, ":"); ok {
			if name == "" {
				return routePattern{}, errors.New("has a path variable without a name")
			}
			for _, prev := range rp.params {
				if prev == name {
					return routePattern{}, fmt.Errorf("has the path variable :%s twice", name)
				}
			}
			rp.params = append(rp.params, name)
		}
	}
	return rp, nil
}

func (rp routePattern) has(param string) bool {
	for _, p := range rp.params {
		if p == param {
			return true
		}
	}
	return false
}

// matches reports whether go-zero routed the request at cleanPath with path variables vars to
// this pattern. Comparing the variables as well as the path tells apart patterns that match
// the same path (/sku/:id and /sku/list): go-zero prefers the static one, and then sets no
// variable.
func (rp routePattern) matches(cleanPath string, vars map[string]string) bool {
	if len(vars) != len(rp.params) || cleanPath == "" || cleanPath[0] != '/' {
		return false
	}
	rest := cleanPath[1:]
	for i, seg := range rp.segs {
		var tok string
		if i == len(rp.segs)-1 {
			tok, rest = rest, ""
			if strings.IndexByte(tok, '/') >= 0 {
				return false
			}
		} else {
			var ok bool
			tok, rest, ok = strings.Cut(rest, "/")
			if !ok {
				return false
			}
		}
		if name, ok := strings.CutPrefix(seg, ":"); ok {
			if v, found := vars[name]; !found || v != tok {
				return false
			}
		} else if seg != tok {
			return false
		}
	}
	return true
}

// httpRoutes finds the rule of a REST request by method and route pattern.
type httpRoutes struct {
	byMethod map[string][]*rule // rules with a Method
	any      []*rule            // rules without a Method, tried after
}

func (h *httpRoutes) add(r *rule) {
	if r.method == "" {
		h.any = append(h.any, r)
		return
	}
	if h.byMethod == nil {
		h.byMethod = make(map[string][]*rule)
	}
	h.byMethod[r.method] = append(h.byMethod[r.method], r)
}

func (h *httpRoutes) empty() bool { return len(h.byMethod) == 0 && len(h.any) == 0 }

func (h *httpRoutes) match(r *http.Request) *rule {
	if h.empty() {
		return nil
	}
	clean := path.Clean(r.URL.Path) // as go-zero's router does
	vars := pathvar.Vars(r)
	for _, list := range [][]*rule{h.byMethod[r.Method], h.any} {
		for _, rl := range list {
			if rl.route.matches(clean, vars) {
				return rl
			}
		}
	}
	return nil
}
