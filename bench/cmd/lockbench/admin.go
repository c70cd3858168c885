package main

import (
	"context"
	"maps"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// admin is a connection used only for measurement (INFO); its own commands are subtracted.
type admin struct {
	c *redis.Client
}

// commandStats returns the calls per command from INFO commandstats. Commands run by Lua
// scripts (redis.call) are counted too, next to the EVALSHA that ran them.
func (a *admin) commandStats(ctx context.Context) (cmdDelta, error) {
	stats, err := a.info(ctx, "commandstats")
	out := cmdDelta{}
	for name, rest := range stats {
		for kv := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				out[strings.TrimPrefix(name, "cmdstat_")] = n
			}
		}
	}
	return out, err
}

// info is the fields of one INFO section, by name.
func (a *admin) info(ctx context.Context, section string) (map[string]string, error) {
	m, err := a.c.InfoMap(ctx, section).Result()
	fields := map[string]string{}
	for _, f := range m {
		maps.Copy(fields, f)
	}
	return fields, err
}

// cmdDelta is calls per command: a commandstats snapshot, or the difference of two.
type cmdDelta map[string]int64

func (d cmdDelta) total() int64 {
	var t int64
	for _, v := range d {
		t += v
	}
	return t
}

// cpuSeconds returns the server's used_cpu_sys + used_cpu_user (INFO cpu; 0 when unreadable).
func (a *admin) cpuSeconds(ctx context.Context) float64 {
	f, _ := a.info(ctx, "cpu")
	sys, _ := strconv.ParseFloat(f["used_cpu_sys"], 64)
	user, _ := strconv.ParseFloat(f["used_cpu_user"], 64)
	return sys + user
}

// usedMemory returns the server's used_memory (INFO memory), in bytes (0 when unreadable).
func (a *admin) usedMemory(ctx context.Context) int64 {
	f, _ := a.info(ctx, "memory")
	n, _ := strconv.ParseInt(f["used_memory"], 10, 64)
	return n
}

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
