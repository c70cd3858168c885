package rules

import "testing"

func TestRouteShapeLeavesVariableNamesOut(t *testing.T) {
	for p, want := range map[string]string{
		"/api/sku/:sku/deduct": "/api/sku/:/deduct",
		"/api/sku/:id/deduct":  "/api/sku/:/deduct",
		"/a/b":                 "/a/b",
		"/:x":                  "/:",
		"":                     "",
	} {
		if got := RouteShape(p); got != want {
			t.Errorf("RouteShape(%q) = %q, want %q", p, got, want)
		}
	}
}
