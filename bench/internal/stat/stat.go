// Package stat holds the small statistics the benchmark commands share.
package stat

import "slices"

// Percentile is the p-th percentile (0 < p ≤ 1) of values (nanoseconds), nearest rank; 0 for
// none. It sorts values in place, so a second percentile of them costs one pass.
func Percentile(values []int64, p float64) float64 {
	if len(values) == 0 {
		return 0
	}
	slices.Sort(values)
	i := int(p*float64(len(values))+0.5) - 1
	i = min(max(i, 0), len(values)-1)
	return float64(values[i])
}

// Median is the median of v (the mean of the two middle values for an even count); 0 for none.
// v is not modified.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
