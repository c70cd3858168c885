package httpbench

import "github.com/flightlock/flightlock/bench/internal/stat"

// The load of the HTTP end-to-end scenario: one connection for latency, SatConns for
// saturation, LowRounds low-load rounds per repetition (lockbench's loadSystems).
const (
	LowConns  = 1
	SatConns  = 32
	LowRounds = 3
)

// Added is how much the low-load runs x add to base's median latency, runs of the same rounds
// (each with its "round"): the median over the rounds of x's p50 minus base's p50 of the same
// round, and of that difference divided by the round's round trip (rt, by round).
func Added[M ~map[string]float64](x, base []M, rt []float64) (ns, rts float64, ok bool) {
	var diffs, ratios []float64
	pair(x, base, "round", "p50", func(m M, b float64) {
		if k := int(m["round"]); k < len(rt) && rt[k] > 0 {
			diffs = append(diffs, m["p50"]-b)
			ratios = append(ratios, (m["p50"]-b)/rt[k])
		}
	})
	if len(diffs) == 0 {
		return 0, 0, false
	}
	return stat.Median(diffs), stat.Median(ratios), true
}

// Paired is the median over the repetitions of the saturation runs x's metric over y's in the
// same repetition (each with its "rep"): rows run one after the other, so a repetition
// disturbed by the machine moves both, and the ratio less than either.
func Paired[M ~map[string]float64](x, y []M, metric string) (float64, bool) {
	var ratios []float64
	pair(x, y, "rep", metric, func(m M, v float64) {
		if v > 0 {
			ratios = append(ratios, m[metric]/v)
		}
	})
	if len(ratios) == 0 {
		return 0, false
	}
	return stat.Median(ratios), true
}

// pair calls f with every run of x that y has a run of the same by ("round", "rep") for, and
// that run's metric.
func pair[M ~map[string]float64](x, y []M, by, metric string, f func(m M, v float64)) {
	of := map[float64]float64{}
	for _, m := range y {
		of[m[by]] = m[metric]
	}
	for _, m := range x {
		if v, ok := of[m[by]]; ok {
			f(m, v)
		}
	}
}
