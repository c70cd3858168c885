package stat

import "testing"

func TestPercentileSortsValuesInPlace(t *testing.T) {
	v := []int64{50, 10, 40, 20, 30}
	for _, c := range []struct{ p, want float64 }{{0.2, 10}, {0.5, 30}, {0.99, 50}, {1, 50}} {
		if got := Percentile(v, c.p); got != c.want {
			t.Errorf("Percentile(%v) = %v, want %v", c.p, got, c.want)
		}
	}
	if v[0] != 10 || v[4] != 50 {
		t.Errorf("values not sorted in place: %v", v)
	}
}
