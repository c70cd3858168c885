package main

import (
	"context"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/bench/internal/contend"
	"github.com/flightlock/flightlock/bench/internal/guard"
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

// holdersOf are n holders of one row, the i-th made by mk(i).
func holdersOf(n int, mk func(i int) contend.Holder) []contend.Holder {
	hs := make([]contend.Holder, n)
	for i := range hs {
		hs[i] = mk(i)
	}
	return hs
}

// rowNames are keys as im names them.
func rowNames(im impl, keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = im.key(k)
	}
	return out
}

// newGuards are n fresh guards, one per key.
func newGuards(n int) []guard.Guard {
	gds := make([]guard.Guard, n)
	for i := range gds {
		gds[i] = guard.New()
	}
	return gds
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
