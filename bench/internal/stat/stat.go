// Package stat holds the small statistics the benchmark commands share.
package stat

import "slices"

// Percentile is the p-th percentile (0 < p ≤ 1) of sorted values (nanoseconds), nearest rank;
// 0 for none.
func Percentile(sorted []int64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	i = min(max(i, 0), len(sorted)-1)
	return float64(sorted[i])
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
