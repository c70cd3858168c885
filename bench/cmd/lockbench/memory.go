package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/flightlock/flightlock/bench/internal/mdfmt"
)

// Scenario 9: what each held lock and each waiter costs (s9Section says what is measured).
// Rows that renew (flightlock's watchdog, rueidislock's extend loop) hold for d9hold, long
// enough for every lock to be renewed; rows that cannot renew hold for at most s9HoldNoRenew,
// since their keys would expire.

const (
	s9Acquirers   = 32
	s9Warm        = 10000 // locks taken and released before a row's baseline (s9HoldOn)
	s9HoldNoRenew = 2 * time.Second
	s9Settle      = 500 * time.Millisecond
	s9Arrive      = 250 * time.Millisecond // waiters arrive spread over this, within the settling
	s9WaitWindow  = time.Second            // settle + window stay well inside rueidisWait
	s9ServeBound  = 30 * time.Second
)

// renewing says whether a row keeps its locks alive while held.
func renewing(id string) bool {
	id = baseRow(id)
	return id == "flightlock" || id == "rueidislock"
}

// renews says how a row keeps its locks alive while held.
var renews = map[string]string{
	"flightlock":  "watchdog: every TTL/3, renewals due together pipelined",
	"rueidislock": "a goroutine per lock, every KeyValidity/2",
	"redislock":   "none (Refresh exists, called by hand; not run here)",
	"redsync":     "none (Extend exists, called by hand; not run here)",
	"gozero":      "none",
}

type s9Results struct {
	Held    map[int][]*result `json:"held"`
	Sizes   []int             `json:"sizes"`
	Waiters []*result         `json:"waiters"`
	W       int               `json:"w"`
}

func (b *bench) scenario9() *s9Results {
	out := &s9Results{Held: map[int][]*result{}, Sizes: b.cfg.memLocks, W: b.cfg.memWaiters}
	holdRows := pick("flightlock", "redislock", "redsync", "gozero", "rueidislock")
	b.warm(holdRows)
	for _, n := range b.cfg.memLocks {
		res := newResults(holdRows)
		for _, r := range holdRows {
			m := b.s9Hold(r, n)
			res[r.id].Reps = append(res[r.id].Reps, m)
			progress("s9 hold %-7d %-12s %6.0f B/lock, %.3f goroutines/lock, peak +%.0f, redis %.0f B/lock, cpu %.0f ms/s, %.0f cmds/s; after release %.1f B/lock, %+.0f goroutines, err %d",
				n, r.id, m["heap"], m["gor"], m["peak_gor"], m["redis"], m["ccpu_ms"], m["cmds_s"], m["after_heap"], m["after_gor"], int64(m["errors"]))
		}
		out.Held[n] = ordered(holdRows, res)
	}
	if b.cfg.memWaiters > 0 {
		rows := lockRows()
		res := newResults(rows)
		for _, r := range rows {
			m := b.s9Wait(r, b.cfg.memWaiters)
			res[r.id].Reps = append(res[r.id].Reps, m)
			progress("s9 wait %-14s %6.0f B/waiter, %.2f goroutines/waiter, %.0f RT/s, first grant %s, all %s, unserved %d",
				r.id, m["heap"], m["gor"], m["rt_s"], mdfmt.Dur(m["next"]), mdfmt.Dur(m["all"]), int64(m["errors"]))
		}
		out.Waiters = ordered(rows, res)
	}
	return out
}

func (b *bench) s9Hold(r rowSpec, n int) metrics { return b.s9HoldOn(r, b.impl(r), n, true) }

// s9HoldCold is s9Hold as a program that measures its first locks would see it: a client and a
// Locker made for the measurement, nothing locked before the baseline, so that the connections
// the locks open and anything the library fills on first use count as the locks' memory.
func (b *bench) s9HoldCold(r rowSpec, n int) metrics {
	im, err := r.build(b.addr, r.client)
	if err != nil {
		fatalf("build %s: %v", r.id, err)
	}
	defer im.close()
	m := b.s9HoldOn(r, im, n, false)
	if f, ok := im.(*flightlockImpl); ok {
		// What the client's pool kept of the connections the locks opened, at go-redis's
		// default buffer sizes: 32 KiB to read and 32 KiB to write on a pool connection, 128 KiB
		// each on a connection of its pipeline pool.
		st := f.client.PoolStats()
		conns, pipes := float64(st.TotalConns), 0.0
		if st.PipelineStats != nil {
			pipes = float64(st.PipelineStats.TotalConns)
		}
		m["conns"], m["pipe_conns"] = conns, pipes
		m["conn_bytes"] = (conns*64*1024 + pipes*256*1024) / float64(n)
	}
	return m
}

// s9HoldOn measures n locks held at once on im (holdRun); warm fills the client's pool first:
// then it holds the connections the locks will use before the baseline (go-redis keeps 32 KiB
// read and 32 KiB write buffers per connection), the client's fixed cost, not the locks'. A
// warm-up of 128 locks leaves the pool smaller than 10,000 locks grow it, and "after release"
// would count the connections the acquisition opened as the locks' memory.
func (b *bench) s9HoldOn(r rowSpec, im impl, n int, warm bool) metrics {
	warmN := 0
	if warm {
		warmN = s9Warm
	}
	window := b.cfg.d9hold
	if !renewing(r.id) {
		window = min(window, s9HoldNoRenew)
	}
	m, st, h := holdRun(im, fmt.Sprintf("s9:%d:", n), n, warmN, 0, window, func() int64 { return b.adm.usedMemory(context.Background()) }, b.meter(im))
	if h.FirstErr != nil {
		progress("s9 hold %d %s: %v", n, r.id, h.FirstErr)
	}
	secs := window.Seconds()
	delete(m, "release")
	m["redis"] = (float64(h.ServerHolding) - float64(h.ServerBefore)) / float64(n)
	m["window"], m["ccpu_ms"] = secs, float64(st.self.Microseconds())/1e3/secs
	m["cmds_s"], m["rt_s"] = st.reqs/secs, float64(st.rts)/secs
	return m
}

func (b *bench) s9Wait(r rowSpec, w int) metrics {
	im := b.impl(r)
	m, st, res := waitRun(im, func(int) impl { return im }, im.key("s9w:"+strconv.Itoa(w)), w, nil, waitBudget, b.meter(im))
	if res.FirstErr != nil {
		progress("s9 wait %s: %v", r.id, res.FirstErr)
	}
	secs := s9WaitWindow.Seconds()
	m["rt_s"], m["cmds_s"], m["ccpu_ms"] = float64(st.rts)/secs, st.reqs/secs, float64(st.self.Microseconds())/1e3/secs
	m["errors"], m["early"] = float64(int64(w)-res.Served), m[violations]
	return m
}

func (r *report) s9Section(w func(string, ...any)) {
	s := r.s9
	w("What each held lock and each waiter costs the process and Redis; one repetition (counts, except CPU and grant times).\n\n")
	if len(s.Sizes) > 0 {
		w("**Holding.** The process takes n locks on distinct keys (%d goroutines at once), holds them, then releases them\n", s9Acquirers)
		w("all. Heap (`HeapAlloc` after two `runtime.GC()`), stacks (`StackInuse`) and goroutines are per lock above the row's\n")
		w("baseline, taken once the keys are built and up to %d locks of other keys were taken and released (so the client's\n", s9Warm)
		w("pool holds its connections); peak is the most goroutines above it, sampled every 2 ms. Redis memory is the\n")
		w("`used_memory` delta. Rows that renew hold for %v (flightlock renews every TTL/3 = %v, rueidislock every\n", r.cfg.d9hold, (lockTTL / 3).Round(time.Millisecond))
		w("KeyValidity/2 = %v)", lockTTL/2)
		if whole(r.cfg.d9hold, lockTTL/3) && whole(r.cfg.d9hold, lockTTL/2) {
			w(", a whole number of both periods, so the window sees the same renewals of every lock")
		}
		w("; rows without\nrenewal hold for %v, since their keys would run out. CPU is this process's user + system time per second of\n", min(r.cfg.d9hold, s9HoldNoRenew))
		w("the window; commands per second are `INFO commandstats` deltas. After release: heap still live above the baseline per\n")
		w("lock, and goroutines above the baseline (waited for up to 2 s to exit).\n\n")
		w("%s\n", mdfmt.Head("row", "renewal", "locks", "heap B/lock", "stack B/lock", "goroutines/lock", "peak goroutines", "Redis B/lock", "client CPU ms/s", "server cmds/s", "RT/s", "acquire all", "after release: B/lock", "after release: goroutines", "errors"))
		for _, n := range s.Sizes {
			for _, x := range s.Held[n] {
				lib := x.Label // holding does not wait: the library's name says it
				if spec, ok := rowByID(x.Row); ok {
					lib = spec.lib
				}
				w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", lib, renews[x.Row], mdfmt.Int(float64(n)),
					mdfmt.Int(x.med("heap")), mdfmt.Int(x.med("stack")), mdfmt.Float(x.med("gor")), mdfmt.Int(x.med("peak_gor")), mdfmt.Int(x.med("redis")),
					mdfmt.Float(x.med("ccpu_ms")), mdfmt.Int(x.med("cmds_s")), mdfmt.Int(x.med("rt_s")), mdfmt.Dur(x.med("acquire")),
					mdfmt.Float(x.med("after_heap")), mdfmt.Int(x.med("after_gor")), mdfmt.Int(x.worst("errors")))
			}
		}
		w("\n")
	}
	if len(s.Waiters) > 0 {
		w("**Waiting.** One key is held in this process; %s goroutines wait for it (each `lock` in its row's waiting\n", mdfmt.Int(float64(s.W)))
		w("strategy, bounded to %v), arriving evenly over %v (started at once, the fixed-interval pollers would retry in\n", s9Settle+s9WaitWindow+s9ServeBound, s9Arrive)
		w("lockstep). After %v of settling, heap and goroutines above the baseline taken before they started, per waiter (the\n", s9Settle)
		w("waiting goroutine itself is one), then %v of waiting: round trips, server commands and client CPU per second, all\n", s9WaitWindow)
		w("waiters together. Then the key is released; each waiter, once granted, releases at once. Next grant and all served\n")
		w("are times from the release call.\n\n")
		w("%s\n", mdfmt.Head("row", "heap B/waiter", "stack B/waiter", "goroutines/waiter", "RT/s while waiting", "server cmds/s", "client CPU ms/s", "release → next grant", "release → all served", "unserved", "granted while held"))
		for _, x := range s.Waiters {
			w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", x.Label, mdfmt.Int(x.med("heap")), mdfmt.Int(x.med("stack")), mdfmt.Float(x.med("gor")),
				mdfmt.Int(x.med("rt_s")), mdfmt.Int(x.med("cmds_s")), mdfmt.Float(x.med("ccpu_ms")), mdfmt.Dur(x.med("next")), mdfmt.Dur(x.med("all")),
				mdfmt.Int(x.worst("errors")), mdfmt.Int(x.worst("early")))
		}
		w("\n")
	}
}

// whole says whether d is a whole number of periods p (to the millisecond).
func whole(d, p time.Duration) bool {
	n := (d + p/2) / p
	return n > 0 && (d-n*p).Abs() <= time.Millisecond
}
