package main

import (
	"context"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"time"

	"github.com/flightlock/flightlock/bench/internal/contend"
	"github.com/flightlock/flightlock/bench/internal/cpustat"
	"github.com/flightlock/flightlock/bench/internal/guard"
	"github.com/flightlock/flightlock/bench/internal/interleave"
)

// The uncontended rows (scenarios 1 and 13) and scenario 13's many-keys rows compare figures
// that differ by a few per cent on a shared machine whose speed drifts by more than that
// within seconds: run one after the other, 1.5 s per row, two runs of the same code disagreed
// by 1.6x on a ratio. So their rows take turns in short slices (interleave.Slices), as the
// other stores' scenario 1 does. Counters (server commands and CPU, client CPU, round trips,
// allocations) are read around each slice and summed, outside the timed operations.

// How long a row runs before the next row's turn in scenario 13's uncontended and many-keys parts.
const (
	s13UncontendedSlice = 25 * time.Millisecond
	s13KeysSlice        = 250 * time.Millisecond
)

// sliceSum is what one row gathered over its slices.
type sliceSum struct {
	ops, errs, rts    int64
	elapsed           time.Duration
	scpu              float64 // server CPU seconds
	ccpu              time.Duration
	mallocs, bytes    uint64
	cmds              cmdDelta
	lat, lockLat      []int64
	inCalls, outside  []int64 // per operation: time inside the client's calls, and the rest
	plain, violations int64
	waits             []int64
	firstErr          string
	keys              []string // the row's keys (uncontendedSliced: one per operation)
	keysNext          int      // the next of the row's keys to lock (uncontendedSliced)
}

// add counts the counters read before (s0) and now into the sum.
func (s *sliceSum) add(b *bench, s0 snap) {
	after := b.stats()
	for k, v := range diffStats(s0.cmds, after) {
		s.cmds[k] += v
	}
	s.scpu += b.adm.cpuSeconds(context.Background()) - s0.scpu
	s.ccpu += cpustat.Self() - s0.ccpu
}

// uncontendedSliced runs lock + unlock for rows in one repetition, one operation after the other
// on keys named after prefix, each row for d (or up to maxOps operations) in slices, and
// measures it: the whole operation's latency and, apart, the lock's and the unlock's, round
// trips, server commands, CPU and allocations per operation. With timeCalls, a row whose client
// times its calls (callTimer) has its operations split into the time inside them and the rest.
func (b *bench) uncontendedSliced(rows []rowSpec, prefix string, rep int, d, slice time.Duration, maxOps int, timeCalls bool) (map[string]metrics, map[string]cmdDelta) {
	sums := map[string]*sliceSum{}
	for _, r := range rows {
		ks := rowKeys(b.impl(r), fmt.Sprintf("%s:%d:", prefix, rep), maxOps)
		sums[r.id] = &sliceSum{cmds: cmdDelta{}, keys: ks, lat: make([]int64, 0, maxOps), lockLat: make([]int64, 0, maxOps)}
	}
	ctx := context.Background()
	runtime.GC()
	interleave.Slices(rows, rep, d, slice, func(r rowSpec, d time.Duration) (time.Duration, bool) {
		s, im := sums[r.id], b.impl(r)
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		s0, rt0 := b.snap(), im.roundTrips()
		var rc *rtCounter
		if ct, ok := im.(callTimer); ok && timeCalls {
			rc = ct.counter()
		}
		start := time.Now()
		end := start.Add(d)
		for s.keysNext < len(s.keys) {
			key := s.keys[s.keysNext]
			s.keysNext++
			if rc != nil {
				rc.timeCalls(true)
			}
			t0 := time.Now()
			h, err := im.lock(ctx, key)
			t1 := time.Now()
			if err == nil {
				err = im.unlock(ctx, key, h)
			}
			t2 := time.Now()
			s.lat = append(s.lat, int64(t2.Sub(t0)))
			s.lockLat = append(s.lockLat, int64(t1.Sub(t0)))
			if rc != nil {
				var in time.Duration
				for _, c := range rc.timeCalls(false) {
					in += c.end.Sub(c.start)
				}
				s.inCalls = append(s.inCalls, int64(in))
				s.outside = append(s.outside, int64(t2.Sub(t0)-in))
			}
			s.ops++
			if err != nil {
				s.errs++
			}
			if t2.After(end) {
				break
			}
		}
		ran := time.Since(start)
		s.elapsed += ran
		runtime.ReadMemStats(&m1)
		s.rts += im.roundTrips() - rt0
		s.mallocs += m1.Mallocs - m0.Mallocs
		s.bytes += m1.TotalAlloc - m0.TotalAlloc
		s.add(b, s0)
		return ran, s.keysNext < len(s.keys)
	})
	out, cmds := map[string]metrics{}, map[string]cmdDelta{}
	for _, r := range rows {
		s := sums[r.id]
		fn := float64(max(s.ops, 1))
		m := latencyMetrics(s.lat, s.lockLat)
		maps.Copy(m, metrics{
			"ops":    float64(s.ops),
			"opsps":  float64(s.ops) / s.elapsed.Seconds(),
			"rt":     float64(s.rts) / fn,
			"cmds":   float64(s.cmds.total()) / fn,
			"allocs": float64(s.mallocs) / fn,
			"bytes":  float64(s.bytes) / fn,
			"errors": float64(s.errs),
			"scpu":   s.scpu * 1e6 / fn,
			"ccpu":   float64(s.ccpu.Microseconds()) / fn,
		})
		if len(s.inCalls) > 0 {
			slices.Sort(s.inCalls)
			slices.Sort(s.outside)
			m["calls_p50"] = percentile(s.inCalls, 0.50)
			m["outside_p50"] = percentile(s.outside, 0.50)
		}
		out[r.id], cmds[r.id] = m, s.cmds
	}
	return out, cmds
}

// contendSliced is scenario 8's many-keys loop (bench.contendFor, g goroutines over keys) for
// rows at once, in slices. Each row has keys of its own.
func (b *bench) contendSliced(rows []rowSpec, keys map[string][]string, g int, d time.Duration, rep int) (map[string]metrics, map[string]string) {
	sums := map[string]*sliceSum{}
	guards := map[string][]guard.Guard{}
	for _, r := range rows {
		sums[r.id] = &sliceSum{cmds: cmdDelta{}}
		guards[r.id] = newGuards(len(keys[r.id]))
	}
	interleave.Slices(rows, rep, d, s13KeysSlice, func(r rowSpec, slice time.Duration) (time.Duration, bool) {
		s, im := sums[r.id], b.impl(r)
		var s0 snap
		var rt0 int64
		cr := windowRun(implHolders(im, keys[r.id], g), guards[r.id], slice, waitBudget, uint64(rep), func(end bool) {
			if end {
				s.add(b, s0)
				s.rts += im.roundTrips() - rt0
			} else {
				s0, rt0 = b.snap(), im.roundTrips()
			}
		})
		s.ops += cr.Ops
		s.errs += cr.Errors + cr.ReleaseErrors
		s.elapsed += slice
		s.waits = append(s.waits, cr.Waits...)
		if s.firstErr == "" {
			s.firstErr = cr.FirstErr
		}
		return slice, true
	})
	out, errs := map[string]metrics{}, map[string]string{}
	for _, r := range rows {
		s := sums[r.id]
		s.plain, s.violations = guardSums(guards[r.id])
		m := contendMetrics(contendResult{Result: contend.Result{Ops: s.ops, Elapsed: int64(s.elapsed), Errors: s.errs, Waits: s.waits}, RT: s.rts}, s.cmds, s.plain, s.violations)
		fn := float64(max(s.ops, 1))
		m["scpu"] = s.scpu * 1e6 / fn
		m["ccpu"] = float64(s.ccpu.Microseconds()) / fn
		out[r.id], errs[r.id] = m, s.firstErr
	}
	return out, errs
}
