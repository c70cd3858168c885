package typo

import "testing"

func TestDistanceCountsInsertionsDeletionsAndSubstitutions(t *testing.T) {
	for _, tt := range []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"", "abc", 3},
		{"abc", "", 3},
		{"/api/pay", "/api/pay", 0},
		{"/api/payy", "/api/pay", 1},
		{"/api/pya", "/api/pay", 2},
		{"Chek", "Check", 1},
		{"kitten", "sitting", 3},
	} {
		if got := Distance(tt.a, tt.b); got != tt.want {
			t.Errorf("Distance(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
		if got := Distance(tt.b, tt.a); got != tt.want {
			t.Errorf("Distance(%q, %q) = %d, want %d (symmetric)", tt.b, tt.a, got, tt.want)
		}
	}
}

func TestEditsGrowsWithTheNameUpToThree(t *testing.T) {
	for name, want := range map[string]int{"": 1, "ab": 1, "abc": 2, "abcdef": 3, "/api/orders/:id/pay": 3} {
		if got := Edits(name); got != want {
			t.Errorf("Edits(%q) = %d, want %d", name, got, want)
		}
	}
}
