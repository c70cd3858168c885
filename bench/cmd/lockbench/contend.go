package main

import (
	"context"
	"time"

	"github.com/flightlock/flightlock/bench/internal/contend"
	"github.com/flightlock/flightlock/bench/internal/guard"
)

// contendResult is what the goroutines of one Redis run report: the shared loop's result (an
// Unlock that failed is an error here, as a Lock that failed), and the client's round trips.
type contendResult struct {
	contend.Result
	RT int64 `json:"rt"`
}

// implHolder drives a Redis row (impl) as a contend.Holder, over keys already mapped to the
// row's own key names.
type implHolder struct {
	im   impl
	keys []string
	k    int
	h    any
}

func (x *implHolder) Lock(ctx context.Context, k int) (int64, error) {
	h, err := x.im.lock(ctx, x.keys[k])
	x.k, x.h = k, h
	return 0, err
}

func (x *implHolder) Unlock(ctx context.Context) error { return x.im.unlock(ctx, x.keys[x.k], x.h) }

// implHolders are n holders of im on keys.
func implHolders(im impl, keys []string, n int) []contend.Holder {
	return holdersOf(n, func(int) contend.Holder { return &implHolder{im: im, keys: keys} })
}

// holdersOf are n holders of one row, the i-th made by mk(i).
func holdersOf(n int, mk func(i int) contend.Holder) []contend.Holder {
	hs := make([]contend.Holder, n)
	for i := range hs {
		hs[i] = mk(i)
	}
	return hs
}

// newGuards are n fresh guards, one per key.
func newGuards(n int) []guard.Guard {
	gds := make([]guard.Guard, n)
	for i := range gds {
		gds[i] = guard.New()
	}
	return gds
}

// guardSums are the plain counts and violations of gds added up.
func guardSums(gds []guard.Guard) (plain, violations int64) {
	for _, gd := range gds {
		plain += gd.Plain()
		violations += gd.Violations()
	}
	return plain, violations
}

// contendImpl runs the holders hs of im (each operation on a key of gds, one guard per key)
// from start until stop is closed (quota 0) or until quota critical sections have been run in
// all. Goroutines that are waiting when stop closes finish their critical section, so every
// counted one was real. Every Lock gives up at hardDeadline.
func contendImpl(im impl, hs []contend.Holder, gds []guard.Guard, start time.Time, stop <-chan struct{}, quota int64, hardDeadline time.Time) contendResult {
	rt0 := im.roundTrips()
	r := contend.Run(hs, gds, start, uint64(start.UnixNano()), contend.Until(stop, quota, hardDeadline))
	r.Errors += r.ReleaseErrors
	r.ReleaseErrors = 0
	return contendResult{Result: r, RT: im.roundTrips() - rt0}
}

// timedRun runs the holders hs of im in this process for d from a start 20 ms ahead, and
// measures them: measure turns the loop's result and the server's commands into the row's
// figures, to which the server's and this process's CPU per critical section are added.
func (b *bench) timedRun(im impl, hs []contend.Holder, gds []guard.Guard, d time.Duration, measure func(contendResult, cmdDelta) metrics) (metrics, contendResult, cmdDelta) {
	s0 := b.snap()
	start := time.Now().Add(20 * time.Millisecond)
	stop := make(chan struct{})
	t := time.AfterFunc(time.Until(start)+d, func() { close(stop) })
	cr := contendImpl(im, hs, gds, start, stop, 0, start.Add(d+waitBudget))
	t.Stop()
	delta := diffStats(s0.cmds, b.stats())
	m := measure(cr, delta)
	b.cpu(m, s0, cr.Ops, true)
	return m, cr, delta
}

// contendFor runs g goroutines of this process for d over keys (the row's key names), each
// operation on a key drawn uniformly, with scenario 2's critical section and checks on every
// key; a floor row locks nothing, so its checks count no violation.
func (b *bench) contendFor(r rowSpec, keys []string, g int, d time.Duration) (metrics, contendResult, cmdDelta) {
	im := b.impl(r)
	gds := newGuards(len(keys))
	return b.timedRun(im, implHolders(im, keys, g), gds, d, func(cr contendResult, delta cmdDelta) metrics {
		plain, viol := guardSums(gds)
		m := contendMetrics(cr, delta, plain, viol)
		if r.floor {
			m["violations"] = 0
		}
		return m
	})
}
