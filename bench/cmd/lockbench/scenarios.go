package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/flightlock/flightlock/bench/internal/contend"
	"github.com/flightlock/flightlock/bench/internal/interleave"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
)

// bench holds what every scenario shares: the server, the admin connection and the settings.
type bench struct {
	addr  string
	adm   *admin
	cfg   config
	impls map[string]impl // built once per row and reused across scenarios and repetitions
}

func (b *bench) impl(r rowSpec) impl {
	if im, ok := b.impls[r.id]; ok {
		return im
	}
	im, err := r.build(b.addr, r.client)
	if err != nil {
		fatalf("build %s: %v", r.id, err)
	}
	b.impls[r.id] = im
	return im
}

// meter is the Redis meter of row im (nil: none), whose round trips it counts too.
func (b *bench) meter(im impl) meter { return redisMeter{b, im} }

// redisMeter reads the server's commands (INFO commandstats, without the INFO calls of the
// measurement itself) and CPU (INFO cpu), and a row's round trips.
type redisMeter struct {
	b  *bench
	im impl
}

func (m redisMeter) counters() serverStats {
	cmds, err := m.b.adm.commandStats(context.Background())
	if err != nil {
		fatalf("INFO commandstats: %v", err)
	}
	delete(cmds, "info")
	st := serverStats{cmds: cmds, ok: true}
	st.reqs = float64(st.cmds.total())
	if m.im != nil {
		st.rts = m.im.roundTrips()
	}
	return st
}

func (m redisMeter) serverCPU() time.Duration {
	return time.Duration(m.b.adm.cpuSeconds(context.Background()) * 1e9)
}

// perOpMicros are the server's and (with client) this process's CPU microseconds per op of st,
// as the Redis rows report them.
func perOpMicros(m metrics, st serverStats, ops int64, client bool) {
	ops = max(ops, 1)
	m["scpu"] = float64(st.cpu.Microseconds()) / float64(ops)
	if client {
		m["ccpu"] = float64(st.self.Microseconds()) / float64(ops)
	}
}

// onlyRows, when set (-rows), keeps only these rows, for profiling one library.
var onlyRows map[string]bool

func pick(ids ...string) []rowSpec {
	var out []rowSpec
	for _, id := range ids {
		if onlyRows != nil && !onlyRows[id] {
			continue
		}
		r, ok := rowByID(id)
		if !ok {
			fatalf("unknown row %q", id)
		}
		out = append(out, r)
	}
	return out
}

// lockRows are the rows that lock, each waiting strategy once.
func lockRows() []rowSpec {
	return pick("flightlock", "redislock", "redislock-1ms", "redsync", "redsync-1ms", "gozero", "gozero-1ms", "rueidislock")
}

// warm runs a few uncontended operations on each row so scripts are loaded and pools filled
// before anything is measured.
func (b *bench) warm(rows []rowSpec) {
	for _, r := range rows {
		if err := warmImpl(b.impl(r), "warm", 200); err != nil {
			fatalf("warm-up %s: %v", r.id, err)
		}
	}
}

// warmImpl takes and releases n keys named after prefix on im, and read locks too on a
// read-write row, so that its scripts are loaded and its connections open.
func warmImpl(im impl, prefix string, n int) error {
	ctx := context.Background()
	rim, rw := im.(rwImpl)
	for i := range n {
		k := im.key(fmt.Sprintf("%s:%d", prefix, i))
		h, err := im.lock(ctx, k)
		if err != nil {
			return err
		}
		_ = im.unlock(ctx, k, h)
		if rw {
			if h, err = rim.rlock(ctx, k); err != nil {
				return err
			}
			_ = rim.runlock(ctx, k, h)
		}
	}
	return nil
}

// results are the results of a scenario's rows, by row id.
type results map[string]*result

func newResults(rows []rowSpec) results {
	m := make(results)
	for _, r := range rows {
		m[r.id] = &result{Row: r.id, Label: r.label()}
	}
	return m
}

// add records one repetition of row id: its figures and the server command mix it ran.
func (rs results) add(id string, m metrics, mix string) {
	rs[id].Reps = append(rs[id].Reps, m)
	rs[id].Mix = mix
}

// repeat runs every row once per repetition, in the order rotated per repetition, and records
// the figures and command mix of each run.
func (b *bench) repeat(rows []rowSpec, run func(r rowSpec, rep int) (metrics, string)) []*result {
	res := newResults(rows)
	for rep := 0; rep < b.cfg.reps; rep++ {
		for _, r := range interleave.Rotate(rows, rep) {
			m, mix := run(r, rep)
			res.add(r.id, m, mix)
		}
	}
	return ordered(rows, res)
}

// atPoints runs every row at every point of an axis, reps times (interleave.Points), and
// records the figures and server command mix of each run, point by point, in the rows' order;
// spec names a row by its id and label.
func atPoints[R any](reps int, points []int, rows []R, spec func(R) (id, label string), run func(r R, x, rep int) (metrics, string)) map[int][]*result {
	out := make(map[int][]*result, len(points))
	for _, x := range points {
		for _, r := range rows {
			id, label := spec(r)
			out[x] = append(out[x], &result{Row: id, Label: label})
		}
	}
	interleave.Points(reps, points, rows, func(rep, x int, r R) {
		m, mix := run(r, x, rep)
		id, _ := spec(r)
		res := find(out[x], id)
		res.Reps, res.Mix = append(res.Reps, m), mix
	})
	return out
}

func ordered(rows []rowSpec, m results) []*result {
	var out []*result
	for _, r := range rows {
		out = append(out, m[r.id])
	}
	return out
}

// --- scenario 1: uncontended lock + release, a distinct key per operation, one goroutine.

// s1MaxOps bounds the operations of one row per repetition (its keys are made before the rows
// run): at 10 µs an operation, -d1 up to 2s.
const s1MaxOps = 200000

func (b *bench) scenario1() []*result {
	rows := pick("flightlock", "redislock", "redsync", "gozero", "rueidislock", "store", "ping", "setdel")
	b.warm(rows)
	res := newResults(rows)
	for rep := 0; rep < b.cfg.reps; rep++ {
		ms, cmds := b.uncontendedSliced(rows, "s1", rep, b.cfg.d1, s1Slice, s1MaxOps, false)
		for _, r := range rows {
			m := ms[r.id]
			res.add(r.id, m, mixString(cmds[r.id], int64(m["ops"])))
			progress("s1 rep %d %-14s %8.0f op/s p50 %s", rep+1, r.id, m["opsps"], mdfmt.Dur(m["p50"]))
		}
	}
	return ordered(rows, res)
}

// latencyMetrics are the p50 and p99 of lock + unlock operations whose whole latencies are
// lat, and the p50s of their lock parts (lockLat) and unlock parts (the difference). It sorts
// lat and lockLat in place.
func latencyMetrics(lat, lockLat []int64) metrics {
	unlockLat := make([]int64, len(lat))
	for i := range unlockLat {
		unlockLat[i] = lat[i] - lockLat[i]
	}
	slices.Sort(lat)
	slices.Sort(lockLat)
	slices.Sort(unlockLat)
	return metrics{
		"p50":        percentile(lat, 0.50),
		"p99":        percentile(lat, 0.99),
		"lock_p50":   percentile(lockLat, 0.50),
		"unlock_p50": percentile(unlockLat, 0.50),
	}
}

// --- scenario 2: one key, one process, g goroutines.

// s2Goroutines are the goroutine counts of scenario 2; the chart uses all, the table 16 and 64.
var s2Goroutines = []int{1, 4, 16, 64}

func (b *bench) scenario2() map[int][]*result {
	rows := lockRows()
	b.warm(rows)
	return atPoints(b.cfg.reps, s2Goroutines, rows, rowSpec.spec, func(r rowSpec, g, rep int) (metrics, string) {
		d := b.cfg.d2
		if g < 16 {
			d = b.cfg.d2small
		}
		m, cr, st := b.contendFor(r, []string{b.impl(r).key(fmt.Sprintf("s2:%d:%d", g, rep))}, g, d, 0)
		progress("s2 rep %d g=%-2d %-14s %9.0f cs/s rt/cs %.2f p99 %s viol %d err %d %s", rep+1, g, r.id, m["csps"], m["rt"], mdfmt.Dur(m["p99"]), int64(m["violations"]), cr.Errors, cr.FirstErr)
		return m, mixString(st.cmds, cr.Ops)
	})
}

func contendMetrics(cr contend.Result, st serverStats, plain, violations int64) metrics {
	slices.Sort(cr.Waits)
	ops := max(cr.Ops, 1)
	lost := cr.Ops - plain
	return metrics{
		"ops":        float64(cr.Ops),
		"csps":       float64(cr.Ops) / (float64(cr.Elapsed) / 1e9),
		"rt":         float64(st.rts) / float64(ops),
		"cmds":       st.reqs / float64(ops),
		"p50":        percentile(cr.Waits, 0.50),
		"p99":        percentile(cr.Waits, 0.99),
		"max":        percentile(cr.Waits, 1),
		"violations": float64(violations + max(lost, 0)),
		"errors":     float64(cr.Errors),
	}
}

// --- scenario 4: 64 goroutines over 1,000 keys.

// manyKeys is how many keys the operations of scenario 4 draw from, on every store.
const manyKeys = 1000

func (b *bench) scenario4() []*result {
	rows := append(lockRows(), pick("setdel")...)
	b.warm(rows)
	return b.repeat(rows, func(r rowSpec, rep int) (metrics, string) {
		m, cr, st := b.contendFor(r, rowKeys(b.impl(r), fmt.Sprintf("s4:%d:", rep), manyKeys), hotGoroutines, b.cfg.d4, uint64(rep))
		m["opsps"] = m["csps"]
		delete(m, "csps")
		progress("s4 rep %d %-14s %9.0f op/s rt/op %.2f err %d %s", rep+1, r.id, m["opsps"], m["rt"], cr.Errors, cr.FirstErr)
		return m, mixString(st.cmds, max(cr.Ops, 1))
	})
}

// --- scenario 5: reject mode, duplicates of a key held in this process.

func (b *bench) scenario5() []*result {
	rows := pick("flightlock", "redislock", "redsync", "gozero", "rueidislock")
	b.warm(rows)
	return b.repeat(rows, func(r rowSpec, rep int) (metrics, string) {
		im := b.impl(r)
		parts, st, wrong, _ := rejectRun(im, func(int) impl { return im }, im.key(fmt.Sprintf("s5:%d", rep)), b.cfg.d5, b.meter(im))
		fn := float64(parts[0].calls)
		m := metrics{"ns": parts[0].perCall(), "allocs": parts[0].allocs, "bytes": parts[0].bytes, "cmds": st[0].reqs / fn,
			"rt": float64(st[0].rts) / fn, "wrong": float64(wrong), "par_ns": parts[1].perCall(), "par_ops": parts[1].rate()}
		progress("s5 rep %d %-14s %s/op %.2f allocs %.3f cmds/op", rep+1, r.id, mdfmt.Dur(m["ns"]), m["allocs"], m["cmds"])
		return m, ""
	})
}
