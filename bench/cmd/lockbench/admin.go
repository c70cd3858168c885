package main

import (
	"context"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// admin is a connection used only for measurement (INFO); its own commands are subtracted.
type admin struct {
	c *redis.Client
}

func newAdmin(addr string) *admin {
	return &admin{c: redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true, PoolSize: 1})}
}

// commandStats returns the calls per command from INFO commandstats. Commands run by Lua
// scripts (redis.call) are counted too, next to the EVALSHA that ran them.
func (a *admin) commandStats(ctx context.Context) (cmdDelta, error) {
	s, err := a.c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	out := cmdDelta{}
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				out[strings.TrimPrefix(name, "cmdstat_")] = n
			}
		}
	}
	return out, nil
}

// cmdDelta is calls per command: a commandstats snapshot, or the difference of two.
type cmdDelta map[string]int64

func diffStats(before, after cmdDelta) cmdDelta {
	d := make(cmdDelta)
	for k, v := range after {
		if n := v - before[k]; n > 0 {
			d[k] = n
		}
	}
	return d
}

func (d cmdDelta) total() int64 {
	var t int64
	for _, v := range d {
		t += v
	}
	return t
}

// cpuSeconds returns the server's used_cpu_sys + used_cpu_user (INFO cpu).
func (a *admin) cpuSeconds(ctx context.Context) float64 {
	m, err := a.c.InfoMap(ctx, "cpu").Result()
	if err != nil {
		return 0
	}
	sys, _ := strconv.ParseFloat(m["CPU"]["used_cpu_sys"], 64)
	user, _ := strconv.ParseFloat(m["CPU"]["used_cpu_user"], 64)
	return sys + user
}

// usedMemory returns the server's used_memory (INFO memory), in bytes.
func (a *admin) usedMemory(ctx context.Context) int64 {
	m, err := a.c.InfoMap(ctx, "memory").Result()
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(m["Memory"]["used_memory"], 10, 64)
	return n
}
