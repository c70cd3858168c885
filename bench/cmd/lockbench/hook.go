package main

import (
	"context"
	"net"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// rtCounter is a go-redis hook that counts round trips: one per processed command, one per
// pipeline. Pub/sub connections bypass hooks in go-redis, so SUBSCRIBE is not counted here
// (INFO commandstats counts it).
type rtCounter struct {
	n atomic.Int64
}

func (h *rtCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return next(ctx, network, addr)
	}
}

func (h *rtCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h *rtCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

func (h *rtCounter) load() int64 { return h.n.Load() }
