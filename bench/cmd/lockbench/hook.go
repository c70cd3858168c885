package main

import (
	"context"
	"net"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// rtCounter is a go-redis hook that counts round trips: one per processed command, one per
// pipeline. Pub/sub connections bypass hooks in go-redis, so SUBSCRIBE is not counted here
// (INFO commandstats counts it).
type rtCounter struct {
	n atomic.Int64
	// calls, while set (timeCalls), gets the start and the end of every command: scenario 13
	// splits an operation's latency into the time inside the client's calls and the time
	// outside them, the library's own.
	calls atomic.Pointer[[]callSpan]
}

// callSpan is when one command was handed to go-redis and when its reply came back.
type callSpan struct{ start, end time.Time }

// timeCalls starts recording calls into a fresh list (on) or stops and returns what was
// recorded. Only for a row driven by one goroutine at a time: the list is not locked.
func (h *rtCounter) timeCalls(on bool) []callSpan {
	if on {
		h.calls.Store(&[]callSpan{})
		return nil
	}
	if p := h.calls.Swap(nil); p != nil {
		return *p
	}
	return nil
}

// callTimer is a row whose go-redis client carries an rtCounter (goredisRow).
type callTimer interface{ counter() *rtCounter }

func (h *rtCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return next(ctx, network, addr)
	}
}

func (h *rtCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		p := h.calls.Load()
		if p == nil {
			return next(ctx, cmd)
		}
		start := time.Now()
		err := next(ctx, cmd)
		*p = append(*p, callSpan{start, time.Now()})
		return err
	}
}

func (h *rtCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

func (h *rtCounter) load() int64 { return h.n.Load() }
