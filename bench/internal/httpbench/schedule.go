package httpbench

import (
	"fmt"
	"time"

	"github.com/flightlock/flightlock/bench/internal/cpustat"
	"github.com/flightlock/flightlock/bench/internal/interleave"
	"github.com/flightlock/flightlock/bench/internal/stat"
)

// The load of the HTTP end-to-end scenario: one connection for latency, SatConns for
// saturation, LowRounds low-load rounds per repetition.
const (
	LowConns  = 1
	SatConns  = 32
	LowRounds = 3
)

// Schedule is how the HTTP end-to-end scenario loads its systems: every system warmed up,
// then per repetition LowRounds low-load rounds (each a RoundTrip and one run of every system
// at LowConns for Low) and one saturation run of every system at SatConns for Sat, the
// systems in an order rotated per round and per repetition, so that no row always runs first.
type Schedule struct {
	Reps     int
	Low, Sat time.Duration // whole seconds (WholeSeconds)
	// Measure runs wrk once against s (Wrk.RunCPU) and returns the run's figures: RunCPU's
	// and whatever the command counts around it.
	Measure func(s *System, conns int, d time.Duration, expect float64) (map[string]float64, error)
	// RoundTrip is the median latency (ns) of the store's cheapest round trip, measured at the
	// start of every low-load round: the unit of a row's added latency.
	RoundTrip func() float64
	// Logf reports progress; SatNote, when set, adds to a saturation run's line.
	Logf    func(format string, args ...any)
	SatNote func(m map[string]float64) string
}

// Loads are a Schedule's figures: per system (by ID) one map per low-load round (with "round",
// counted over all repetitions) and one per saturation run (with "rep"); the round trip of
// every round; and the cores this process used with every system up and no load.
type Loads struct {
	Low, Sat   map[string][]map[string]float64
	RoundTrips []float64
	IdleCPU    float64
}

// Run loads the systems as the Schedule says. A warm-up (two runs of a second at SatConns per
// system: connections opened, scripts loaded or leases granted, then the throughput that sizes
// the uids of each run) that fails a request is an error.
func (sc Schedule) Run(systems []*System) (Loads, error) {
	loads := Loads{Low: map[string][]map[string]float64{}, Sat: map[string][]map[string]float64{}}
	for _, s := range systems {
		for range 2 {
			m, err := sc.Measure(s, SatConns, time.Second, 10_000)
			if err != nil {
				return loads, err
			}
			s.RPS = m["rps"]
			if e := m["errors"]; e > 0 {
				return loads, fmt.Errorf("%s: %d failed requests in the warm-up", s.ID, int64(e))
			}
		}
		sc.Logf("warm-up %-10s %6.0f req/s", s.ID, s.RPS)
	}

	// What the process burns with no load at all (the systems' timers, pollers, keep-alives
	// and go-zero's own collectors): part of every run's service CPU.
	idle0, t0 := cpustat.Self(), time.Now()
	time.Sleep(time.Second)
	loads.IdleCPU = (cpustat.Self() - idle0).Seconds() / time.Since(t0).Seconds()

	for rep := range sc.Reps {
		// Low load: short rounds, each with its own round trip and every row, so that each row's
		// added latency is taken against the no-lock row and the round trip of its own round
		// (this 2-core machine drifts by more than a round trip between runs).
		for k := range LowRounds {
			round := rep*LowRounds + k
			loads.RoundTrips = append(loads.RoundTrips, sc.RoundTrip())
			for _, s := range interleave.Rotate(systems, round) {
				m, err := sc.Measure(s, LowConns, sc.Low, s.RPS*sc.Low.Seconds())
				if err != nil {
					return loads, err
				}
				m["round"] = float64(round)
				loads.Low[s.ID] = append(loads.Low[s.ID], m)
				sc.Logf("rep %d.%d c=%-2d %-10s %6.0f req/s p50 %v p99 %v err %d", rep+1, k+1, LowConns, s.ID,
					m["rps"], ms(m["p50"]), ms(m["p99"]), int64(m["errors"]))
			}
		}
		for _, s := range interleave.Rotate(systems, rep) {
			m, err := sc.Measure(s, SatConns, sc.Sat, s.RPS*sc.Sat.Seconds())
			if err != nil {
				return loads, err
			}
			m["rep"] = float64(rep)
			loads.Sat[s.ID] = append(loads.Sat[s.ID], m)
			s.RPS = max(s.RPS, m["rps"])
			note := ""
			if sc.SatNote != nil {
				note = " " + sc.SatNote(m)
			}
			sc.Logf("rep %d   c=%-2d %-10s %6.0f req/s p50 %v p99 %v err %d%s", rep+1, SatConns, s.ID,
				m["rps"], ms(m["p50"]), ms(m["p99"]), int64(m["errors"]), note)
		}
	}
	return loads, nil
}

// ms rounds a latency in ns for a progress line.
func ms(ns float64) time.Duration { return time.Duration(ns).Round(10 * time.Microsecond) }

// Added is how much the low-load runs x add to base's median latency, runs of the same rounds
// (Loads.Low): the median over the rounds of x's p50 minus base's p50 of the same round, and of
// that difference divided by the round's round trip (rt, by round: Loads.RoundTrips).
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
// same repetition (Loads.Sat): rows run one after the other, so a repetition disturbed by the
// machine moves both, and the ratio less than either.
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
