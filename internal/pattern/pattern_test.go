package pattern

import "testing"

func TestShape(t *testing.T) {
	for p, want := range map[string]string{
		"/api/sku/:sku/deduct": "/api/sku/:/deduct",
		"/api/sku/:id/deduct":  "/api/sku/:/deduct",
		"/a/b":                 "/a/b",
		"/:x":                  "/:",
		"":                     "",
	} {
		if got := Shape(p); got != want {
			t.Errorf("Shape(%q) = %q, want %q", p, got, want)
		}
	}
}
