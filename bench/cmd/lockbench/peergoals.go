package main

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/flightlock/flightlock/bench/internal/httpbench"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
)

// peerGoals are the goals that hold flightlock against the best peer rows and the floors, as
// the work grows and in memory, each computed from this run's figures: met or missed, with the
// measured ratio. A goal whose scenario (or row) did not run is left out.
func (r *report) peerGoals() []goal {
	var gs goalList
	add := func(name, target string, ratio float64, measure string, met bool) {
		gs = append(gs, goal{name, target, measure, met && !math.IsNaN(ratio)})
	}

	// Uncontended lock + unlock (scenario 1).
	fl, rl := find(r.s1, "flightlock"), find(r.s1, "redislock")
	gs.vs("1: uncontended lock + unlock", "p50 ≤ bsm/redislock's", fl, rl, p50, "bsm/redislock", mdfmt.Dur, fmt.Sprintf("; %s vs %s server commands, %s vs %s RT",
		mdfmt.Float(fl.med("reqs")), mdfmt.Float(rl.med("reqs")), mdfmt.Float(fl.med("rt")), mdfmt.Float(rl.med("rt"))), atMost(1))
	gs.vs("1: uncontended lock + unlock", "p50 ≤ 1.15x the SET PX + DEL floor", fl, find(r.s1, "setdel"), p50, "floor", mdfmt.Dur, "", atMost(1.15))

	// Many keys: scenario 4 (1,000 keys) and the largest point of scenario 8's key axis.
	manyKeys := func(name string, rs []*result) {
		fl := find(rs, "flightlock")
		gs.vs(name, "≥ 1.2x rueidislock", fl, find(rs, "rueidislock"), rate, "rueidislock", mdfmt.Int, " per second", atLeast(1.2))
		gs.vs(name, "≥ 1.3x the SET PX + DEL floor", fl, find(rs, "setdel"), rate, "floor", mdfmt.Int, " per second", atLeast(1.3))
	}
	manyKeys("4: 64 goroutines over 1,000 keys", r.s4)
	if ax := axisNamed(r.s8, "keys"); ax != nil {
		n := ax.Points[len(ax.Points)-1]
		manyKeys(fmt.Sprintf("8: 64 goroutines over %s keys", mdfmt.Int(float64(n))), ax.Res[n])
	}

	// HTTP (scenario 6).
	if s := r.s6; s != nil && s.Ping != nil {
		if ratio, ok := pairedRatio(find(s.Sat, "flightlock"), find(s.Sat, "redislock"), "rps"); ok {
			add(fmt.Sprintf("6: HTTP, saturation (wrk -c %d)", httpbench.SatConns), "≥ 1.1x the bsm/redislock middleware", ratio,
				fmt.Sprintf("%.2fx bsm/redislock (median of the repetitions' ratios)%s", ratio, errNote(find(s.Sat, "flightlock"))), ratio >= 1.1)
		}
		if _, rts, ok := s.added(find(s.Low, "flightlock")); ok {
			add(fmt.Sprintf("6: HTTP, low load (wrk -c %d)", httpbench.LowConns), "≤ +2.5 round trips over the bare handler", rts,
				fmt.Sprintf("+%.2f round trips (PING p50)", rts), rts <= 2.5)
		}
	}

	// Hot key: 64 goroutines (scenario 2), four processes (scenario 3).
	lead := func(name string, rs []*result) {
		ratio, fl, best := leadOf(rs)
		if best == nil {
			return
		}
		add(name, "≥ 10x the best peer row", ratio, fmt.Sprintf("%.1fx %s (%s vs %s CS/s)", ratio, best.Label, mdfmt.Int(fl.med("rate")), mdfmt.Int(best.med("rate"))), ratio >= 10)
	}
	lead("2: one hot key, 64 goroutines", r.s2[64])
	lead(fmt.Sprintf("3: one hot key, %d processes x %d goroutines", s3Procs, s3Goroutines), r.s3)

	// Scaling (scenario 8).
	if s := r.s8; s != nil {
		fallGoal := func(ax *s8Axis, x0, x1 int, what string) {
			if !slices.Contains(ax.Points, x0) || !slices.Contains(ax.Points, x1) {
				return
			}
			if f, ok := ax.fall("flightlock", "rate", x0, x1); ok {
				add("8: one hot key, "+what, "CS/s fall ≤ 2x", f, fmt.Sprintf("%s (%s → %s CS/s)", fallWords(f, ""),
					mdfmt.Int(find(ax.Res[x0], "flightlock").med("rate")), mdfmt.Int(find(ax.Res[x1], "flightlock").med("rate"))), f <= 2)
			}
		}
		if ax := axisNamed(s, "goroutines"); ax != nil {
			fallGoal(ax, 4, ax.Points[len(ax.Points)-1], fmt.Sprintf("4 → %s goroutines", mdfmt.Int(float64(ax.Points[len(ax.Points)-1]))))
		}
		if ax := axisNamed(s, "processes"); ax != nil {
			fallGoal(ax, 1, ax.Points[len(ax.Points)-1], fmt.Sprintf("1 → %d processes of %d goroutines", ax.Points[len(ax.Points)-1], s8ProcGoroutines))
		}
		worst, where := math.Inf(1), ""
		var behind []string
		for _, ax := range s {
			for _, x := range ax.Points {
				ratio, _, best := leadOf(ax.Res[x])
				if best == nil {
					continue
				}
				if ratio < worst {
					worst, where = ratio, fmt.Sprintf("%s %s: %s", mdfmt.Int(float64(x)), ax.Name, best.Label)
				}
				if ratio < 1 {
					behind = append(behind, fmt.Sprintf("%s %s (%.2fx %s)", mdfmt.Int(float64(x)), ax.Name, ratio, best.Label))
				}
			}
		}
		if where != "" {
			measure := fmt.Sprintf("closest: %.2fx at %s", worst, where)
			if len(behind) > 0 {
				measure += "; behind at " + strings.Join(behind, ", ")
			}
			add("8: every axis, every point", "flightlock ahead of every peer row", worst, measure, worst > 1)
		}
	}

	// Memory (scenario 9).
	if s := r.s9; s != nil && len(s.Sizes) > 0 {
		var worstHeap, worstAfter, afterGor float64
		var heapAt, afterAt string
		for _, n := range s.Sizes {
			fl := find(s.Held[n], "flightlock")
			if fl == nil {
				continue
			}
			if v := fl.med("heap"); v >= worstHeap {
				worstHeap, heapAt = v, mdfmt.Int(float64(n))
			}
			if v := fl.med("after_heap"); v >= worstAfter || afterAt == "" {
				worstAfter, afterAt = v, mdfmt.Int(float64(n))
			}
			afterGor = max(afterGor, fl.worst("after_gor"))
		}
		if heapAt != "" {
			var per []string
			for _, n := range s.Sizes {
				per = append(per, fmt.Sprintf("%s B at %s locks", mdfmt.Int(find(s.Held[n], "flightlock").med("heap")), mdfmt.Int(float64(n))))
			}
			add("9: held locks, watchdog on", "≤ 300 B of live heap per held lock", worstHeap/300,
				fmt.Sprintf("%s (%.2fx the goal at %s)", strings.Join(per, ", "), worstHeap/300, heapAt), worstHeap <= 300)
			add("9: after releasing them all", "≤ 16 B per lock still live, goroutines back to the baseline", worstAfter/16,
				fmt.Sprintf("%s B per lock at %s locks, %s goroutines above the baseline", mdfmt.Float(worstAfter), afterAt, mdfmt.Int(afterGor)),
				worstAfter <= 16 && afterGor <= 0)
		}
		n := s.Sizes[len(s.Sizes)-1]
		if fl := find(s.Held[n], "flightlock"); fl != nil {
			perLock := fl.med("gor")
			peak := fl.med("peak_gor") / float64(n)
			add(fmt.Sprintf("9: holding %s locks", mdfmt.Int(float64(n))), "no goroutine per held lock nor per renewal in flight (< 0.01 per lock, at rest and at the peak)", peak,
				fmt.Sprintf("%s goroutines per lock at rest; peak %s above the baseline = %s per lock", mdfmt.Float(perLock), mdfmt.Int(fl.med("peak_gor")), mdfmt.Float(peak)),
				perLock < 0.01 && peak < 0.01)
			gs.vs(fmt.Sprintf("9: holding %s locks", mdfmt.Int(float64(n))), "client CPU < rueidislock's", fl, find(s.Held[n], "rueidislock"), "ccpu_ms",
				"rueidislock", mdfmt.Float, " ms of CPU per second", func(r float64) bool { return r < 1 })
		}
	}
	if s := r.s9; s != nil && find(s.Waiters, "flightlock") != nil {
		fl := find(s.Waiters, "flightlock")
		for _, f := range []struct {
			metric, what string
			show         func(float64) string
		}{
			{"heap", "heap per waiter", mdfmt.Int}, {"gor", "goroutines per waiter", mdfmt.Float}, {"rt_s", "round trips while waiting", mdfmt.Int},
			{"next", "release → next grant", mdfmt.Dur}, {"all", "release → all served", mdfmt.Dur},
		} {
			var best *result
			for _, x := range s.Waiters {
				if x.Row == "flightlock" || x.worst("unserved") > 0 {
					continue // a row that left waiters unserved has no fair time to compare
				}
				if best == nil || x.med(f.metric) < best.med(f.metric) {
					best = x
				}
			}
			if best == nil {
				continue
			}
			v, b := fl.med(f.metric), best.med(f.metric)
			measure := fmt.Sprintf("%s vs %s (%s)", f.show(v), f.show(b), best.Label)
			if b > 0 {
				measure = fmt.Sprintf("%.2fx the best peer: ", v/b) + measure
			}
			gs = append(gs, goal{fmt.Sprintf("9: %s waiters on one key", mdfmt.Int(float64(s.W))), f.what + ": the best of all rows", measure,
				v <= b && fl.worst("unserved") == 0})
		}
	}
	return gs
}
