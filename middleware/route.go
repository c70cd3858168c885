package middleware

import (
	"fmt"
	"maps"
	"net/http"
	"path"
	"slices"

	"github.com/zeromicro/go-zero/core/search"
	"github.com/zeromicro/go-zero/rest/pathvar"
)

// routerMethods are the methods go-zero's router accepts: a rule without Method is in each tree.
var routerMethods = [...]string{
	http.MethodDelete, http.MethodGet, http.MethodHead, http.MethodOptions,
	http.MethodPatch, http.MethodPost, http.MethodPut,
}

// httpRoutes finds the rule that names the route go-zero's router dispatched a request to. A
// server.Use middleware sees the method, the path and the route's variables (pathvar.Vars),
// not the route. So the rule patterns sit in core/search.Trees, as the router's do, one per
// method and set of variable names: search.Tree's precedence picks the pattern the router
// picks, and the pattern found must yield the very values the router set. A rule /sku/:id thus
// never locks a request routed to /sku/list or /sku/:sku; what stays ambiguous (/p/:x and
// /:x/p on /p/p) is resolved as the router resolves it.
type httpRoutes struct {
	byMethod map[string][]routeTree // built by New, read-only after
}

// routeTree holds the rule patterns of one method that declare the same variable names.
type routeTree struct {
	params []string     // the variable names of every pattern in tree
	tree   *search.Tree // cleaned pattern => *rule
}

// add puts a rule with a Path in the tree of its method, or of every method the router
// accepts; compileRules refused two rules on one pattern and method, so it cannot fail.
func (h *httpRoutes) add(r *rule) {
	if h.byMethod == nil {
		h.byMethod = make(map[string][]routeTree)
	}
	methods := []string{r.Method}
	if r.Method == "" {
		methods = routerMethods[:]
	}
	for _, method := range methods {
		if err := h.treeFor(method, r.Route.Params).Add(r.Route.Text, r); err != nil {
			panic(fmt.Sprintf("flightlock: rule %s: %v", r.Name, err))
		}
	}
}

func (h *httpRoutes) treeFor(method string, params []string) *search.Tree {
	for _, t := range h.byMethod[method] {
		if len(t.params) == len(params) && !slices.ContainsFunc(params, func(p string) bool { return !slices.Contains(t.params, p) }) {
			return t.tree
		}
	}
	t := routeTree{params: params, tree: search.NewTree()}
	h.byMethod[method] = append(h.byMethod[method], t)
	return t.tree
}

func (h *httpRoutes) match(r *http.Request) *rule {
	trees := h.byMethod[r.Method]
	if len(trees) == 0 {
		return nil
	}
	vars := pathvar.Vars(r)
	for _, t := range trees {
		if !t.declares(vars) {
			continue
		}
		found, ok := t.tree.Search(path.Clean(r.URL.Path)) // as the router searches
		if !ok || !maps.Equal(found.Params, vars) {
			return nil
		}
		return found.Item.(*rule)
	}
	return nil
}

// declares reports whether t's patterns declare exactly the variables in vars.
func (t *routeTree) declares(vars map[string]string) bool {
	return len(t.params) == len(vars) && !slices.ContainsFunc(t.params, func(p string) bool {
		_, ok := vars[p]
		return !ok
	})
}
