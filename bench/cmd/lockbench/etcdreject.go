package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/bench/internal/interleave"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Scenario 5 on etcd, reject mode, as for the Redis rows: a key is held in this
// process; one goroutine then tries it again and again for c.d5 (flightlock: TryLock on a
// Reject Locker of the same gate, which answers ErrBusy without an RPC; concurrency.Mutex:
// TryLock of a Mutex on another session, which puts its own key, reads the owner, finds
// another, deletes its key and answers ErrLocked), then s5Goroutines goroutines do the same
// at once for c.d5 (wall time per call over all of them, as a burst of double clicks would).

// s5Goroutines try the held key at once in the parallel part.
const s5Goroutines = 64

// rejectResult is one row of scenario 5 in one repetition.
type rejectResult struct {
	ns, allocs, bytes    float64       // per call, serial
	rpcs, fsyncs         float64       // etcd unary RPCs and WAL fsyncs per call, serial
	etcdCPU              time.Duration // etcd's CPU per call, serial
	wrong                int64         // calls that did not answer busy (serial and parallel)
	parNs, parRate       float64       // parallel: wall ns per call, calls per second
	parRPCs, parFsyncs   float64       // parallel: etcd unary RPCs and fsyncs per call
	calls, parCalls      int64
	firstErr             error // the first call that did not answer busy with another error
	serialWin, parWindow time.Duration
}

// tryer makes one attempt at the held key from goroutine i; busy reports a refusal, err any
// other failure; a grant is released before it returns (and counted as wrong by the caller).
type tryer func(ctx context.Context, i int) (busy bool, err error)

func (b *etcdBench) rejectRow(row string, rep int) rejectResult {
	ctx := context.Background()
	key := fmt.Sprintf("s7-%d", rep)
	var try tryer
	var release func()
	// How many calls between two reads of the clock: flightlock's refusal takes about a
	// hundred nanoseconds, of which time.Now would be a fair part; a Mutex's takes milliseconds.
	every := int64(1)
	switch row {
	case rowFlight:
		every = 256
		reject, err := b.l.With(flightlock.WithMode(flightlock.Reject))
		if err != nil {
			fatalf("s7: %v", err)
		}
		held, err := b.l.Lock(ctx, key)
		if err != nil {
			fatalf("s7 %s: hold: %v", row, err)
		}
		release = func() { _ = held.Release(ctx) }
		try = func(ctx context.Context, _ int) (bool, error) {
			l, err := reject.TryLock(ctx, key)
			if err == nil {
				_ = l.Release(ctx)
				return false, nil
			}
			return errors.Is(err, flightlock.ErrBusy), err
		}
	case rowMutex:
		if err := b.sessions(s5Goroutines); err != nil {
			fatalf("s7: %v", err)
		}
		held := concurrency.NewMutex(b.sess, "/mutex/"+key)
		if err := held.Lock(ctx); err != nil {
			fatalf("s7 %s: hold: %v", row, err)
		}
		release = func() { _ = held.Unlock(ctx) }
		// A Mutex is one session's, and two Mutexes of one session on one key would both be
		// granted: every goroutine tries on a session of its own, none the holder's.
		ms := make([]*concurrency.Mutex, s5Goroutines)
		for i := range ms {
			ms[i] = concurrency.NewMutex(b.hotSess[i], "/mutex/"+key)
		}
		try = func(ctx context.Context, i int) (bool, error) {
			err := ms[i].TryLock(ctx)
			if err == nil {
				_ = ms[i].Unlock(ctx)
				return false, nil
			}
			return errors.Is(err, concurrency.ErrLocked), err
		}
	}
	defer release()
	var r rejectResult
	note := func(busy bool, err error) {
		if !busy {
			atomic.AddInt64(&r.wrong, 1)
		}
	}

	// Serial: one goroutine retries the held key.
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	s0 := b.srv.stats()
	start := time.Now()
	deadline := start.Add(b.c.d5)
	var n int64
	for ; n == 0 || n%every != 0 || time.Now().Before(deadline); n++ {
		busy, err := try(ctx, 0)
		note(busy, err)
		if !busy && r.firstErr == nil {
			r.firstErr = err
		}
	}
	r.serialWin = time.Since(start)
	runtime.ReadMemStats(&m1)
	st := b.srv.stats().sub(s0)
	r.calls = n
	r.ns = float64(r.serialWin.Nanoseconds()) / float64(n)
	r.allocs = float64(m1.Mallocs-m0.Mallocs) / float64(n)
	r.bytes = float64(m1.TotalAlloc-m0.TotalAlloc) / float64(n)
	r.rpcs, r.fsyncs, r.etcdCPU = st.rpcs/float64(n), st.fsyncs/float64(n), st.cpu/time.Duration(n)

	// Parallel: s5Goroutines goroutines at once.
	var pn atomic.Int64
	var wg sync.WaitGroup
	p0 := b.srv.stats()
	pstart := time.Now()
	pdeadline := pstart.Add(b.c.d5)
	for i := range s5Goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var c int64
			for ; c == 0 || c%every != 0 || time.Now().Before(pdeadline); c++ {
				note(try(ctx, i))
			}
			pn.Add(c)
		}()
	}
	wg.Wait()
	r.parWindow = time.Since(pstart)
	pst := b.srv.stats().sub(p0)
	r.parCalls = pn.Load()
	r.parNs = float64(r.parWindow.Nanoseconds()) / float64(r.parCalls)
	r.parRate = float64(r.parCalls) / r.parWindow.Seconds()
	r.parRPCs, r.parFsyncs = pst.rpcs/float64(r.parCalls), pst.fsyncs/float64(r.parCalls)
	return r
}

// reject runs every row once per repetition, in the rotated order.
func (b *etcdBench) reject() map[string][]rejectResult {
	out := map[string][]rejectResult{}
	for rep := range b.c.reps {
		for _, row := range interleave.Rotate([]string{rowFlight, rowMutex}, rep) {
			r := b.rejectRow(row, rep)
			out[row] = append(out[row], r)
			progress("  5 reject      %-10s %s/call %.2f allocs %.2f RPCs/call; x%d: %s/call %.0f calls/s; not busy %d",
				row, etcdDur(time.Duration(r.ns)), r.allocs, r.rpcs, s5Goroutines, etcdDur(time.Duration(r.parNs)), r.parRate, r.wrong)
		}
	}
	return out
}
