package main

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/bench/internal/redisserver"
	flmw "github.com/flightlock/flightlock/middleware"
)

// redisBackend is the Redis rows' store: a redis-server of their own, the many libraries of
// libs.go as rows (flightlock among them, each on a client of its own), and the counters only
// Redis gives: the commands by name (INFO commandstats) and, through each row's client, its
// round trips. It runs every scenario; 6b and 10-13 are its alone (extraScenarios).
type redisBackend struct {
	srv     *redisserver.Server
	addr    string
	version string          // the server's redis_version
	adm     *redis.Client   // a connection used only for measurement (INFO); its own commands are left out
	impls   map[string]impl // built once per row and reused across scenarios and repetitions
}

func (r *redisBackend) describe() string {
	return fmt.Sprintf("redis-server pid %d on %s", r.Pid(), r.addr)
}

func (r *redisBackend) start(*config) (err error) {
	if r.srv, err = redisserver.Start("lockbench-redis"); err == nil {
		r.addr, r.version = r.srv.Addr, r.srv.Version()
	}
	return err
}

func (r *redisBackend) attach(addr string)          { r.addr = addr }
func (r *redisBackend) Stop()                       { r.srv.Stop() }
func (r *redisBackend) Pid() int                    { return r.srv.Pid() }
func (r *redisBackend) workerArgs(*config) []string { return []string{"-addr", r.addr} }
func (r *redisBackend) peerGoroutines(int) error    { return nil }
func (r *redisBackend) dropGoroutinesBeyond(int)    {}
func (r *redisBackend) dupConf() flmw.LockConf {
	return flmw.LockConf{Redis: flmw.RedisConf{Host: r.addr}}
}

// open makes the measurement's connection; flightlock is one of the rows, on a client of its
// own, and has no store apart (newStore) nor a floor to copy (floorFrom).
func (r *redisBackend) open(*config) error {
	r.adm, r.impls = redis.NewClient(&redis.Options{Addr: r.addr, DisableIdentity: true, PoolSize: 1}), map[string]impl{}
	return nil
}

func (r *redisBackend) newStore() (closingStore, error) { return nil, nil }
func (r *redisBackend) floorFrom(string) error          { return nil }

func (r *redisBackend) close() {
	for _, im := range r.impls {
		im.close()
	}
}

// rows are the libraries of each scenario, each waiting strategy once where a key is hot.
func (r *redisBackend) rows(scenario int) []string {
	switch scenario {
	case 1:
		return []string{"flightlock", "redislock", "redsync", "gozero", "rueidislock", "store", "ping", "setdel"}
	case 4:
		return append(r.rows(2), "setdel")
	case 5:
		return []string{"flightlock", "redislock", "redsync", "gozero", "rueidislock"}
	}
	return []string{"flightlock", "redislock", "redislock-1ms", "redsync", "redsync-1ms", "gozero", "gozero-1ms", "rueidislock"}
}

// lockOf is the row's one impl, whatever the goroutine: every library's client is safe for
// concurrent use.
func (r *redisBackend) lockOf(row string, _ int) impl {
	if im, ok := r.impls[row]; ok {
		return im
	}
	spec, ok := rowByID(row)
	if !ok {
		fatalf("unknown row %q", row)
	}
	im, err := spec.build(r.addr, spec.client)
	check(err, "build %s: %v", row)
	r.impls[row] = im
	return im
}

// counters reads the server's commands (INFO commandstats: the calls per command, those Lua
// scripts run with redis.call included, next to the EVALSHA that ran them), without the INFO
// calls of the measurement itself.
func (r *redisBackend) counters() serverStats {
	stats, err := r.info("commandstats")
	check(err, "INFO commandstats: %v")
	st := serverStats{cmds: cmdDelta{}, ok: true}
	for name, rest := range stats {
		for kv := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok && name != "cmdstat_info" {
				n, _ := strconv.ParseInt(v, 10, 64)
				st.cmds[strings.TrimPrefix(name, "cmdstat_")] = n
				st.reqs += float64(n)
			}
		}
	}
	return st
}

// serverCPU is INFO cpu's used_cpu_sys + used_cpu_user, finer than /proc's ticks (0 when
// unreadable).
func (r *redisBackend) serverCPU() time.Duration {
	f, _ := r.info("cpu")
	sys, _ := strconv.ParseFloat(f["used_cpu_sys"], 64)
	user, _ := strconv.ParseFloat(f["used_cpu_user"], 64)
	return time.Duration((sys + user) * 1e9)
}

// serverMemory is INFO memory's used_memory, in bytes (0 when unreadable).
func (r *redisBackend) serverMemory() int64 {
	f, _ := r.info("memory")
	n, _ := strconv.ParseInt(f["used_memory"], 10, 64)
	return n
}

// info is the fields of one INFO section, by name, read on the measurement's own connection.
func (r *redisBackend) info(section string) (map[string]string, error) {
	m, err := r.adm.InfoMap(context.Background(), section).Result()
	fields := map[string]string{}
	for _, f := range m {
		maps.Copy(fields, f)
	}
	return fields, err
}

func (r *redisBackend) notes() storeNotes {
	return storeNotes{name: "redis", title: "Redis", scenarios: []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}, peer: "redislock",
		reqUnit: "cmds", reqCol: "server cmds", cpuCol: "Redis CPU", floors: [][2]string{{"ping", "PING"}, {"setdel", "SET+DEL"}}, ping: "PING", s6Intro: (*report).s6Intro,
		machine: []string{fmt.Sprintf("| Redis | %s |", r.version)},
		head:    (*report).redisHead, goals: (*report).redisGoals, closing: (*report).redisClosing,
		rejectHow: "the others: one attempt without retry, which costs them a round trip", s9HoldNote: "Redis memory is the `used_memory` delta."}
}

// http is scenario 6, then its rows over a bare handler (6b).
func (r *redisBackend) http(b *bench) *s6Results {
	res := b.httpScenario(b.startSystem, s6Rows)
	if res.Note == "" {
		b.rep.s6bare = b.scenario6Bare()
	}
	return res
}

// extra runs the scenarios only Redis has.
func (r *redisBackend) extra(b *bench, scenario int) {
	switch scenario {
	case 10:
		s := b.inAndAcross("s10", b.pick("flightlock-permits", "zset-permits"), b.c.d10, 0)
		b.rep.s10 = &s
	case 11:
		b.rep.s11 = b.scenario11()
	case 12:
		s := b.inAndAcross("s12", b.pick("flightlock", "flightlock-fair"), b.c.d12, 0)
		b.rep.s12 = &s
	case 13:
		b.rep.s13 = b.scenario13()
	}
}

// redisAddr is the address of the Redis rows' server, for the scenarios only Redis runs.
func (b *bench) redisAddr() string { return b.be.(*redisBackend).addr }

// cmdDelta is calls per command: a commandstats snapshot, or the difference of two.
type cmdDelta map[string]int64

// rtCounter is a go-redis hook that counts round trips: one per processed command, one per
// pipeline. Pub/sub connections bypass hooks in go-redis, so SUBSCRIBE is not counted here
// (INFO commandstats counts it).
type rtCounter struct {
	n atomic.Int64
	// While timing (timeCalls), every command adds to inCalls its time from its hand-over to
	// go-redis to its reply: scenario 13 splits an operation's latency into the time inside
	// the client's calls and the time outside them, the library's own.
	timing  atomic.Bool
	inCalls atomic.Int64 // ns
}

// timeCalls starts timing the calls afresh (on) or stops; it returns the time inside them
// since the last call.
func (h *rtCounter) timeCalls(on bool) time.Duration {
	in := time.Duration(h.inCalls.Swap(0))
	h.timing.Store(on)
	return in
}

// callTimer is a row whose go-redis client carries an rtCounter (goredisRow).
type callTimer interface{ counter() *rtCounter }

// DialHook leaves dialling as it is: a dial is not a round trip of the row's commands.
func (h *rtCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *rtCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		if !h.timing.Load() {
			return next(ctx, cmd)
		}
		start := time.Now()
		err := next(ctx, cmd)
		h.inCalls.Add(int64(time.Since(start)))
		return err
	}
}

func (h *rtCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}
