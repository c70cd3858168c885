package main

import (
	"cmp"
	"slices"
	"strings"

	"github.com/flightlock/flightlock/bench/internal/mdfmt"
	"github.com/flightlock/flightlock/bench/internal/stat"
)

// metrics is one repetition of one row: named figures, all float64, as the shared loops
// (httpbench, dupBursts) return them.
type metrics = map[string]float64

// result collects every repetition of a row in one scenario configuration.
type result struct {
	Row   string    `json:"row"`   // row id
	Label string    `json:"label"` // row label
	Reps  []metrics `json:"reps"`
	Mix   string    `json:"mix,omitempty"` // server command mix of the last repetition, per op
	// FirstErrs are the first error of each repetition ("": none), where a row keeps them.
	FirstErrs []string `json:"first_errors,omitempty"`
}

// med is the median of one figure over the repetitions that have it.
func (r *result) med(name string) float64 {
	var v []float64
	for _, m := range r.reps() {
		if x, ok := m[name]; ok {
			v = append(v, x)
		}
	}
	return stat.Median(v)
}

// worst is the largest value of one figure over the repetitions (0 for none).
func (r *result) worst(name string) float64 {
	var w float64
	for _, m := range r.reps() {
		w = max(w, m[name])
	}
	return w
}

// reps are the repetitions of r (none for a nil r).
func (r *result) reps() []metrics {
	if r == nil {
		return nil
	}
	return r.Reps
}

// sum is the total of one figure over the repetitions.
func (r *result) sum(name string) float64 {
	var t float64
	for _, m := range r.reps() {
		t += m[name]
	}
	return t
}

// percentile of sorted durations (nanoseconds), nearest rank.
var percentile = stat.Percentile

// mixString formats a command delta divided by ops, biggest first: "evalsha 1, get 1, set 2".
func mixString(d cmdDelta, ops int64) string {
	if ops <= 0 {
		return ""
	}
	type kv struct {
		k string
		v int64
	}
	var all []kv
	for k, v := range d {
		all = append(all, kv{k, v})
	}
	slices.SortFunc(all, func(a, b kv) int { return cmp.Or(cmp.Compare(b.v, a.v), cmp.Compare(a.k, b.k)) })
	var parts []string
	for _, e := range all {
		per := float64(e.v) / float64(ops)
		if per < 0.005 {
			continue
		}
		parts = append(parts, strings.ToUpper(e.k)+" "+mdfmt.Float(per))
	}
	return strings.Join(parts, ", ")
}
