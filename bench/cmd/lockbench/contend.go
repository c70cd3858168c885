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

// contend runs g goroutines that lock a key, run its critical section, and unlock, until stop
// is closed (quota 0) or until quota critical sections have been run in all. Each operation
// takes a key drawn uniformly from keys (guarded by gds, one guard per key); with one key, all
// fight over it. Goroutines that are waiting when stop closes finish their critical section, so
// every counted one was real. Every Lock gives up at hardDeadline.
func contendImpl(im impl, keys []string, gds []guard.Guard, g int, start time.Time, stop <-chan struct{}, quota int64, hardDeadline time.Time) contendResult {
	hs := make([]contend.Holder, g)
	for i := range hs {
		hs[i] = &implHolder{im: im, keys: keys}
	}
	rt0 := im.roundTrips()
	r := contend.Run(hs, gds, start, uint64(start.UnixNano()), contend.Until(stop, quota, hardDeadline))
	r.Errors += r.ReleaseErrors
	r.ReleaseErrors = 0
	return contendResult{Result: r, RT: im.roundTrips() - rt0}
}
