package main

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/bench/internal/contend"
	"github.com/flightlock/flightlock/bench/internal/guard"
	"github.com/flightlock/flightlock/bench/internal/interleave"
)

// implHolder drives a row (impl) as a contend.Holder, over keys already mapped to the row's
// own key names; a flightlock lease's fence is checked, other locks have none.
type implHolder struct {
	im   impl
	keys []string
	k    int
	h    any
}

func (x *implHolder) Lock(ctx context.Context, k int) (int64, error) {
	h, err := x.im.lock(ctx, x.keys[k])
	x.k, x.h = k, h
	return fenceOf(h), err
}

// fenceOf is the fence of a row's hold h: a flightlock lease's, 0 for a lock that has none.
func fenceOf(h any) int64 {
	if l, ok := h.(*flightlock.Lease); ok && l != nil {
		return l.Fence()
	}
	return 0
}

func (x *implHolder) Unlock(ctx context.Context) error { return x.im.unlock(ctx, x.keys[x.k], x.h) }

// each is n values, the i-th made by mk(i): a row's holders, a run's guards and keys, the
// cells of a list.
func each[T any](n int, mk func(i int) T) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = mk(i)
	}
	return out
}

// rowNames are keys as im names them.
func rowNames(im impl, keys []string) []string {
	return each(len(keys), func(i int) string { return im.key(keys[i]) })
}

// guardSums are the plain counts, violations and fence violations of gds added up.
func guardSums(gds []guard.Guard) (plain, violations, fence int64) {
	for _, gd := range gds {
		plain, violations, fence = plain+gd.Plain(), violations+gd.Violations(), fence+gd.FenceViolations()
	}
	return plain, violations, fence
}

// windowRun runs the holders hs over the keys of gs (one guard per key) in this process from a
// start 20 ms ahead for the window d (contend.Run, each Lock bounded at lockTimeout), on every
// store, and returns what m counted over the window too.
func windowRun(hs []contend.Holder, gs []guard.Guard, d, lockTimeout time.Duration, seed uint64, m meter) (contend.Result, serverStats) {
	start := time.Now().Add(20 * time.Millisecond)
	stc := make(chan serverStats, 1)
	go func() { stc <- windowStats(start, d, m) }()
	r := contend.Run(hs, gs, start, start.Add(d), seed, lockTimeout)
	return r, <-stc
}

// The uncontended rows (scenarios 1 and 13) and scenario 13's many-keys rows compare figures
// that differ by a few per cent on a shared machine whose speed drifts by more than that
// within seconds (run one after the other, 1.5 s per row, two runs of the same code disagreed
// by 1.6x on a ratio), so their rows take turns in short slices (interleave.Slices). Counters
// (server commands and CPU, client CPU, round trips, allocations) are read around each slice
// and summed, outside the timed operations.

// How long a row runs before the next row's turn in scenario 13's uncontended and many-keys parts.
const (
	s13UncontendedSlice = 25 * time.Millisecond
	s13KeysSlice        = 250 * time.Millisecond
)

// sliceSum is what one row (im) gathered over its slices.
type sliceSum struct {
	im               impl
	ops, errs        int64
	elapsed          time.Duration
	st               serverStats // the server's counters and the CPU, summed
	mallocs, bytes   uint64
	lat, lockLat     []int64
	inCalls, outside []int64  // per operation: time inside the client's calls, and the rest
	keys             []string // the row's keys, one per operation
	keysNext         int      // the next of the row's keys to lock
}

// uncontended runs scenario 1's loop for rows in one repetition rep: lock + unlock on each
// row, one operation after the other on up to s1MaxOps keys named after prefix (made before the
// rows run), each row for d in turns of slice from rep, with the counters of the row's meter
// read around each slice. It returns each row's latency (the lock's and the unlock's apart),
// what the server counted, CPU and allocations per operation, with timeCalls (on a row whose
// client times its calls, callTimer) the time inside the client's calls and the rest, and the
// server command mix per operation.
func (b *bench) uncontended(rows []rowSpec, prefix string, rep int, d, slice time.Duration, timeCalls bool) (map[string]metrics, map[string]string) {
	sums := make([]*sliceSum, len(rows))
	for i, r := range rows {
		im := b.impl(r)
		sums[i] = &sliceSum{im: im, keys: rowKeys(im, fmt.Sprintf("%s:%d:", prefix, rep), s1MaxOps), st: serverStats{ok: true},
			lat: make([]int64, 0, s1MaxOps), lockLat: make([]int64, 0, s1MaxOps)}
	}
	ctx := context.Background()
	runtime.GC()
	interleave.Slices(sums, rep, d, slice, func(s *sliceSum, d time.Duration) (time.Duration, bool) {
		im := s.im
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		s0 := readStats(meter{b.be, im}, false)
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
				in := rc.timeCalls(false)
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
		s.mallocs += m1.Mallocs - m0.Mallocs
		s.bytes += m1.TotalAlloc - m0.TotalAlloc
		s.st = s.st.add(readStats(meter{b.be, im}, true).sub(s0))
		return ran, s.keysNext < len(s.keys)
	})
	out, mixes := map[string]metrics{}, map[string]string{}
	for i, r := range rows {
		s := sums[i]
		fn := float64(max(s.ops, 1))
		unlockLat := make([]int64, len(s.lat)) // each operation's whole latency less its lock's
		for i := range unlockLat {
			unlockLat[i] = s.lat[i] - s.lockLat[i]
		}
		m := metrics{p50: percentile(s.lat, 0.50), p99: percentile(s.lat, 0.99), "lock_p50": percentile(s.lockLat, 0.50), "unlock_p50": percentile(unlockLat, 0.50)}
		m["ops"], m[rate], m[failures] = float64(s.ops), float64(s.ops)/s.elapsed.Seconds(), float64(s.errs)
		m["allocs"], m["bytes"] = float64(s.mallocs)/fn, float64(s.bytes)/fn
		perOpFigures(m, s.st, s.ops)
		if len(s.inCalls) > 0 {
			m["calls_p50"] = percentile(s.inCalls, 0.50)
			m["outside_p50"] = percentile(s.outside, 0.50)
		}
		out[r.id], mixes[r.id] = m, mixString(s.st.cmds, s.ops)
	}
	return out, mixes
}

// contendSliced is scenario 8's many-keys loop (bench.contendRun, g goroutines over n keys
// named after prefix, each row on keys of its own) for rows at once, in slices.
func (b *bench) contendSliced(rows []rowSpec, prefix string, n, g int, d time.Duration, rep int) (map[string]metrics, map[string]string) {
	crs, sts, guards, keys := map[string]*contend.Result{}, map[string]serverStats{}, map[string][]guard.Guard{}, map[string][]string{}
	for _, r := range rows {
		// A sum starts known (ok), as uncontended's do: add keeps ok only while every slice's is.
		crs[r.id], guards[r.id], sts[r.id] = &contend.Result{}, each(n, func(int) guard.Guard { return guard.New() }), serverStats{ok: true}
		keys[r.id] = rowKeys(b.impl(r), prefix, n)
	}
	interleave.Slices(rows, rep, d, s13KeysSlice, func(r rowSpec, slice time.Duration) (time.Duration, bool) {
		im := b.impl(r)
		hs := each(g, func(int) contend.Holder { return &implHolder{im: im, keys: keys[r.id]} })
		cr, st := windowRun(hs, guards[r.id], slice, b.c.lockTimeout, uint64(rep), b.meter(r.id))
		crs[r.id].Add(cr)
		crs[r.id].Elapsed += cr.Elapsed
		sts[r.id] = sts[r.id].add(st)
		return slice, true
	})
	out, errs := map[string]metrics{}, map[string]string{}
	for _, r := range rows {
		plain, viol, fence := guardSums(guards[r.id])
		out[r.id], errs[r.id] = contendMetrics(r, *crs[r.id], sts[r.id], plain, viol, fence, 0), crs[r.id].FirstErr
	}
	return out, errs
}
