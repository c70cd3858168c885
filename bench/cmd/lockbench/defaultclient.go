package main

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"

	"github.com/flightlock/flightlock/bench/internal/mdfmt"
)

// Scenario 13: the rows of scenarios 1, 8 (key axis) and 9 (holding) on a default go-redis client
// beside the tuned one the other scenarios use (clientSetting), every setting and library interleaved in each
// repetition so that both settings see the same machine state:
//   - uncontended lock + unlock (scenario 1's loop, -d1), with flightlock's RedisStore alone on
//     each setting, to split the latency between the store and the Locker;
//   - 64 goroutines over many keys (-s13-keys, scenario 8's loop for -d4);
//   - live heap per held lock and what is left after releasing (scenario 9's holding, -mem-locks).
//
// -client picks the settings. Rows that do not run on a go-redis client of ours (rueidislock)
// run once per repetition whatever it says.

// defaultSuffix turns a row id into the id of the same row on a default go-redis client.
const defaultSuffix = "@default"

// baseRow is the id of the row a scenario 13 row varies (the row itself when it varies none).
func baseRow(id string) string { return strings.TrimSuffix(id, defaultSuffix) }

// defaultVariants are the go-redis rows that scenario 13 runs on a default client too.
var defaultVariants = []string{"flightlock", "store", "redislock", "redislock-1ms", "ping", "setdel"}

// defaultClientRows are defaultVariants on a default client. flightlock is built as the outside
// benchmark built it: the store with its defaults, the common TTL and wait, nothing else (its
// tuned row adds a key prefix, which costs nothing measurable).
func defaultClientRows() []rowSpec {
	var out []rowSpec
	for _, r := range allRows() {
		if slices.Contains(defaultVariants, r.id) {
			r.id, r.client = r.id+defaultSuffix, defaultClient
			out = append(out, r)
		}
	}
	return out
}

// s13Pick is the rows of ids on every setting of settings, the settings of one library next
// to each other; a row without a default variant runs once.
func (b *bench) s13Pick(settings []clientSetting, ids ...string) []rowSpec {
	var out []string
	for _, id := range ids {
		if !slices.Contains(defaultVariants, id) {
			out = append(out, id)
			continue
		}
		for _, s := range settings {
			if s == defaultClient {
				out = append(out, id+defaultSuffix)
			} else {
				out = append(out, id)
			}
		}
	}
	return b.pick(out...)
}

type s13Results struct {
	Settings    []clientSetting   `json:"settings"`
	Uncontended []*result         `json:"uncontended"`
	KeyPoints   []int             `json:"key_points"`
	Keys        map[int][]*result `json:"keys"`
	Sizes       []int             `json:"sizes"`
	Held        map[int][]*result `json:"held"`
	// HeldCold is Held measured cold (bench.s9HoldCold), on the default client only: as a
	// program that measures its first locks sees them.
	HeldCold map[int][]*result `json:"held_cold"`
}

// s13Uncontended are the rows of the uncontended part: flightlock, its store alone, the peers
// the goals compare with, and the floors.
var s13Uncontended = []string{"flightlock", "store", "redislock", "rueidislock", "setdel", "ping"}

// s13Keys are the rows of the many-keys part. bsm/redislock polls every 1 ms: at 100 ms, the
// few operations that meet a held key (64 goroutines over 1,000 keys) would set its figure.
var s13Keys = []string{"flightlock", "redislock-1ms", "rueidislock", "setdel"}

func (b *bench) scenario13() *s13Results {
	st := b.c.clients
	out := &s13Results{Settings: st, KeyPoints: b.c.s13Keys, Keys: map[int][]*result{}, Sizes: b.c.memLocks, HeldCold: map[int][]*result{}}

	rows := b.s13Pick(st, s13Uncontended...)
	b.warm(rows)
	for rep := range b.c.reps {
		ms, _ := b.uncontended(rows, "s13u", rep, b.c.d1, s13UncontendedSlice, true)
		for _, r := range rows {
			m := ms[r.id]
			out.Uncontended = addRep(out.Uncontended, r, m, "", "")
			progress("s13 rep %d uncontended %-22s p50 %s (lock %s, unlock %s; in calls %s, outside %s) %.2f RT/op CPU µs/op client %.1f Redis %.1f allocs/op %.1f (%.0f B) errors %d", rep+1, r.id,
				mdfmt.Dur(m[p50]), mdfmt.Dur(m["lock_p50"]), mdfmt.Dur(m["unlock_p50"]), mdfmt.Dur(m["calls_p50"]), mdfmt.Dur(m["outside_p50"]), m[rt], m[ccpu]/1e3, m[scpu]/1e3, m["allocs"], m["bytes"], int64(m[failures]))
		}
	}

	if len(out.KeyPoints) > 0 {
		rows := b.s13Pick(st, s13Keys...)
		b.warm(rows)
		for rep := range b.c.reps {
			for _, x := range out.KeyPoints {
				ms, errs := b.contendSliced(rows, fmt.Sprintf("s13k:%d:%d:", x, rep), x, s8KeyGoroutines, b.c.d4, rep)
				for _, r := range rows {
					m := ms[r.id]
					out.Keys[x] = addRep(out.Keys[x], r, m, "", errs[r.id])
					progress("s13 rep %d keys=%-6d %-22s %9.0f CS/s cmds/CS %.3f CPU µs/CS client %.1f Redis %.1f violations %d errors %d %s", rep+1, x, r.id,
						m[rate], m[reqs], m[ccpu]/1e3, m[scpu]/1e3, int64(m[violations]), int64(m[failures]), errs[r.id])
				}
			}
		}
	}

	if len(out.Sizes) > 0 {
		out.Held = atPoints(b.c.reps, out.Sizes, b.s13Pick(st, "flightlock"), func(r rowSpec, n, rep int) (metrics, string) {
			m, err := b.holdRow(r, n)
			progress("s13 rep %d hold %-7d %-22s %6.0f B/lock, stack %.0f B/lock, %.3f goroutines/lock; after release %.1f B/lock, %+.0f goroutines, errors %d",
				rep+1, n, r.id, m["heap"], m["stack"], m["gor"], m["after_heap"], m["after_gor"], int64(m[failures]))
			if r.client == defaultClient {
				c := b.s9HoldCold(r, n)
				out.HeldCold[n] = addRep(out.HeldCold[n], r, c, "", "")
				progress("s13 rep %d hold %-7d %-22s cold: %6.0f B/lock; after release %.1f B/lock, %+.0f goroutines, errors %d; pool %.0f + %.0f pipeline connections, %.1f B/lock of buffers",
					rep+1, n, r.id, c["heap"], c["after_heap"], c["after_gor"], int64(c[failures]), c["conns"], c["pipe_conns"], c["conn_bytes"])
			}
			return m, errString(err)
		})
	}
	return out
}

// on is the result of base's row on setting s among rs (a row that does not vary stands for
// every setting).
func on(rs []*result, base string, s clientSetting) *result {
	if s == defaultClient {
		if x := find(rs, base+defaultSuffix); x != nil {
			return x
		}
	}
	return find(rs, base)
}

// s13Label names a row in scenario 13's tables: its library (the waiting strategy too where
// the row has a twin that waits otherwise), and a row that has no go-redis client of ours says
// that its one run fills both settings' columns.
func s13Label(x *result, withWait bool) string {
	spec, ok := rowByID(x.Row)
	if !ok {
		return x.Label
	}
	l := spec.lib
	if withWait {
		l = spec.label()
	}
	if !slices.Contains(defaultVariants, baseRow(x.Row)) {
		l += " (its own client: one run, in every setting's column)"
	}
	return l
}

// defaultClientGoals are the goals set on a default go-redis client (and, for comparison, on the
// tuned one).
func (r *report) defaultClientGoals() []goal {
	s := r.s13
	if s == nil {
		return nil
	}
	var gs goalList
	for _, c := range s.Settings {
		name := func(what string) string { return fmt.Sprintf("%s, %s client", what, c) }
		fl, rl := on(s.Uncontended, "flightlock", c), on(s.Uncontended, "redislock", c)
		gs.vs(name("uncontended lock + unlock"), "p50 ≤ bsm/redislock's", fl, rl, p50, "bsm/redislock", mdfmt.Dur, fmt.Sprintf("; lock %s vs %s, unlock %s vs %s",
			mdfmt.Dur(fl.med("lock_p50")), mdfmt.Dur(rl.med("lock_p50")), mdfmt.Dur(fl.med("unlock_p50")), mdfmt.Dur(rl.med("unlock_p50"))), atMost(1))
		for _, x := range s.KeyPoints {
			if fl, rd := on(s.Keys[x], "flightlock", c), on(s.Keys[x], "rueidislock", c); fl != nil && rd != nil {
				gs.vs(name(fmt.Sprintf("64 goroutines over %s keys", mdfmt.Int(float64(x)))), "≥ 1.2x rueidislock", fl, rd, rate, "rueidislock", mdfmt.Int,
					fmt.Sprintf(" per second; repetitions %s vs %s", spread(fl, "rate"), spread(rd, "rate")), func(r float64) bool { return r >= 1.2 && fl.worst("violations") == 0 })
			}
		}
		// The cold holding (bench.s9HoldCold) runs on the default client only.
		for _, part := range []struct {
			held map[int][]*result
			name func(string) string
			cold bool
		}{{s.Held, name, false}, {s.HeldCold, func(what string) string { return what + ", default client, cold" }, true}} {
			for i, n := range s.Sizes {
				fl := on(part.held[n], "flightlock", c)
				if fl == nil || part.cold && c != defaultClient {
					continue
				}
				gs = append(gs, goal{part.name(fmt.Sprintf("%s held locks", mdfmt.Int(float64(n)))), "≤ 300 B of live heap per held lock",
					fmt.Sprintf("%s B per lock (repetitions %s)", mdfmt.Int(fl.med("heap")), spread(fl, "heap")), fl.med("heap") <= 300})
				if i > 0 {
					continue
				}
				kept := ","
				if part.cold {
					kept = fmt.Sprintf(", of it %s B the buffers of the connections the client's pool kept (%s + %s pipeline);",
						mdfmt.Float(fl.med("conn_bytes")), mdfmt.Int(fl.med("conns")), mdfmt.Int(fl.med("pipe_conns")))
				}
				gs = append(gs, goal{part.name(fmt.Sprintf("after releasing %s", mdfmt.Int(float64(n)))), "≤ 16 B per lock left",
					fmt.Sprintf("%s B per lock (repetitions %s)%s %s goroutines above the baseline", mdfmt.Float(fl.med("after_heap")),
						spread(fl, "after_heap"), kept, mdfmt.Int(fl.worst("after_gor"))), fl.med("after_heap") <= 16})
			}
		}
	}
	return gs
}

// durOrDash is the median of a duration metric, or "-" for a row that has none.
func durOrDash(x *result, metric string) string {
	if len(x.Reps) == 0 || x.Reps[0][metric] == 0 {
		return "-"
	}
	return mdfmt.Dur(x.med(metric))
}

// spread is the lowest and highest repetition of a figure.
func spread(x *result, metric string) string {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, m := range x.Reps {
		lo, hi = min(lo, m[metric]), max(hi, m[metric])
	}
	if len(x.Reps) == 0 {
		return "-"
	}
	f := mdfmt.Int
	if hi < 100 {
		f = mdfmt.Float
	}
	return f(lo) + "-" + f(hi)
}

func (r *report) s13Section(w func(string, ...any)) {
	s := r.s13
	both := slices.Contains(s.Settings, tunedClient) && slices.Contains(s.Settings, defaultClient)
	w("The rows of scenarios 1, 8 (key axis) and 9 (holding) on a go-redis v9 client with **default options**\n")
	w("(`redis.NewClient(&redis.Options{Addr: addr})`: pool 10 x GOMAXPROCS, no `ContextTimeoutEnabled`, `CLIENT SETINFO` on\n")
	w("every new connection, which Redis 7.0 refuses and go-redis ignores) beside the **tuned** client of the other scenarios.\n")
	w("On the default client flightlock has only its defaults, `flightlock.New(redisstore.New(client), WithTTL(%v),\n", lockTTL)
	w("WithWait(%v))`, and bsm/redislock the same client; rueidislock has no go-redis client and runs once per repetition.\n", waitBudget)
	w("Every row of every setting takes turns in slices (%v uncontended, %v over many keys), as in scenario 1. Run alone with:\n\n", s13UncontendedSlice, s13KeysSlice)
	w("```\ncd bench && go run ./cmd/lockbench -scenario 13 -reps %d -client both -out /tmp/s13.md\n```\n\n", r.cfg.reps)
	settings := s.Settings

	w("### Uncontended lock + unlock, a distinct key per operation\n\n")
	w("Scenario 1's loop, %v per row and repetition, lock and unlock also timed apart. \"x bsm\" is the p50 over\n", r.cfg.d1)
	w("bsm/redislock's on the same setting; \"in calls\" is the time inside the go-redis client's calls (a hook stamps each\n")
	w("command; the round trips and Redis's work), \"outside\" the library's own (p50s over the operations).\n\n")
	w("| row |")
	for _, c := range settings {
		w(" %s: p50 | lock p50 | unlock p50 | in calls p50 | outside p50 | p99 | x bsm | RT/op | client CPU µs/op | Redis CPU µs/op |", c)
	}
	w(" server cmds/op |\n|---|%s---|\n", strings.Repeat("---|", 10*len(settings)))
	for _, base := range s13Uncontended {
		x0 := on(s.Uncontended, base, settings[0])
		if x0 == nil {
			continue
		}
		w("| %s |", s13Label(x0, false))
		for _, c := range settings {
			x, bsm := on(s.Uncontended, base, c), on(s.Uncontended, "redislock", c)
			if x == nil {
				w("%s", strings.Repeat(" |", 10))
				continue
			}
			ratio := "-"
			if bsm != nil {
				ratio = fmt.Sprintf("%.2f", x.med("p50")/bsm.med("p50"))
			}
			w(" %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |", mdfmt.Dur(x.med("p50")), mdfmt.Dur(x.med("lock_p50")), mdfmt.Dur(x.med("unlock_p50")),
				durOrDash(x, "calls_p50"), durOrDash(x, "outside_p50"), mdfmt.Dur(x.med("p99")), ratio, mdfmt.Float(x.med("rt")), mdfmt.Float(x.med("ccpu")/1e3), mdfmt.Float(x.med("scpu")/1e3))
		}
		w(" %s |\n", mdfmt.Float(x0.med("reqs")))
	}
	w("\n")

	w("**The split.** flightlock's `RedisStore` alone (`Acquire` + `Release`, no Locker) against the whole Locker: flightlock -\n")
	w("store is the Locker's own part, store - bsm what the store's scripts and its path through go-redis add over bsm's.\n\n")
	w("%s\n", mdfmt.Head("setting", "flightlock p50", "store alone p50", "Locker's part", "bsm p50", "store - bsm", "flightlock - bsm", "lock: flightlock / store / bsm", "unlock: flightlock / store / bsm", "in calls: flightlock / store / bsm", "outside: flightlock / store / bsm", "Redis CPU µs/op: flightlock / store / bsm"))
	for _, c := range settings {
		fl, st, bsm := on(s.Uncontended, "flightlock", c), on(s.Uncontended, "store", c), on(s.Uncontended, "redislock", c)
		if fl == nil || st == nil || bsm == nil {
			continue
		}
		d := func(a, b float64) string { return fmt.Sprintf("%+.1f µs", (a-b)/1e3) }
		three := func(m string) string {
			return mdfmt.Dur(fl.med(m)) + " / " + mdfmt.Dur(st.med(m)) + " / " + mdfmt.Dur(bsm.med(m))
		}
		cpu := mdfmt.Float(fl.med("scpu")/1e3) + " / " + mdfmt.Float(st.med("scpu")/1e3) + " / " + mdfmt.Float(bsm.med("scpu")/1e3)
		w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", c, mdfmt.Dur(fl.med("p50")), mdfmt.Dur(st.med("p50")), d(fl.med("p50"), st.med("p50")),
			mdfmt.Dur(bsm.med("p50")), d(st.med("p50"), bsm.med("p50")), d(fl.med("p50"), bsm.med("p50")), three("lock_p50"), three("unlock_p50"),
			three("calls_p50"), three("outside_p50"), cpu)
	}
	w("\n")
	if both {
		fl, fld := on(s.Uncontended, "flightlock", tunedClient), on(s.Uncontended, "flightlock", defaultClient)
		bsm, bsmd := on(s.Uncontended, "redislock", tunedClient), on(s.Uncontended, "redislock", defaultClient)
		if fl != nil && fld != nil && bsm != nil && bsmd != nil {
			w("Default over tuned, p50: flightlock %.2fx, bsm/redislock %.2fx.\n\n", fld.med("p50")/fl.med("p50"), bsmd.med("p50")/bsm.med("p50"))
		}
	}

	if len(s.KeyPoints) > 0 {
		w("### 64 goroutines over many keys\n\n")
		w("Scenario 8's key axis, %v per row, point and repetition. Each cell: critical sections per second; server commands ·\n", r.cfg.d4)
		w("RT per critical section; CPU µs per critical section, client + Redis; the repetitions' lowest-highest. Client and\n")
		w("Redis share %d cores, so the CPU a row spends per critical section bounds its rate.\n\n| row |", runtime.NumCPU())
		for _, x := range s.KeyPoints {
			for _, c := range settings {
				w(" %s keys, %s |", mdfmt.Int(float64(x)), c)
			}
		}
		w("\n|---|%s\n", strings.Repeat("---|", len(s.KeyPoints)*len(settings)))
		for _, base := range s13Keys {
			x0 := on(s.Keys[s.KeyPoints[0]], base, settings[0])
			if x0 == nil {
				continue
			}
			w("| %s |", s13Label(x0, true))
			for _, x := range s.KeyPoints {
				for _, c := range settings {
					v := on(s.Keys[x], base, c)
					cell := fmt.Sprintf(" %s<br>%s · %s<br>%s + %s µs<br>%s", mdfmt.Int(v.med("rate")), mdfmt.Float(v.med("reqs")), mdfmt.Float(v.med("rt")),
						mdfmt.Float(v.med("ccpu")/1e3), mdfmt.Float(v.med("scpu")/1e3), spread(v, "rate"))
					if e := v.worst("errors"); e > 0 {
						cell += "<br>" + mdfmt.Int(e) + " errors"
					}
					if vi := v.worst("violations"); vi > 0 {
						cell += "<br>**" + mdfmt.Int(vi) + " violations**"
					}
					w("%s |", cell)
				}
			}
			w("\n")
		}
		w("| flightlock / rueidislock |")
		for _, x := range s.KeyPoints {
			for _, c := range settings {
				fl, rd := on(s.Keys[x], "flightlock", c), on(s.Keys[x], "rueidislock", c)
				w(" %.2fx |", fl.med("rate")/rd.med("rate"))
			}
		}
		w("\n\n")
	}

	if len(s.Sizes) > 0 {
		w("### Live heap per held lock\n\n")
		w("Scenario 9's holding (flightlock only, its watchdog renewing for %v), %d times, settings and sizes interleaved:\n", r.cfg.d9hold, r.cfg.reps)
		w("heap above the baseline per held lock, and what is still live per lock after release. Warm rows fill the client's\n")
		w("pool before the baseline; *cold* rows measure a client and Locker made for the measurement, so the connections the\n")
		w("locks open count as theirs (go-redis v9.23 keeps 64 KiB of buffers per pool connection, 256 KiB per pipeline one).\n\n")
		w("%s\n", mdfmt.Head("setting", "locks", "heap B/lock", "repetitions", "stack B/lock", "goroutines/lock", "after release: B/lock", "repetitions", "after release: goroutines", "errors"))
		for _, n := range s.Sizes {
			row := func(setting string, x *result, kept string) {
				w("| %s | %s | %s | %s | %s | %s | %s%s | %s | %s | %s |\n", setting, mdfmt.Int(float64(n)), mdfmt.Int(x.med("heap")), spread(x, "heap"),
					mdfmt.Int(x.med("stack")), mdfmt.Float(x.med("gor")), mdfmt.Float(x.med("after_heap")), kept, spread(x, "after_heap"),
					mdfmt.Int(x.worst("after_gor")), mdfmt.Int(x.worst("errors")))
			}
			for _, c := range settings {
				if x := on(s.Held[n], "flightlock", c); x != nil {
					row(string(c), x, "")
				}
				if x := on(s.HeldCold[n], "flightlock", c); x != nil && c == defaultClient {
					row(string(c)+", cold", x, fmt.Sprintf(" (of it %s B/lock: the buffers of the %s + %s pipeline connections the pool kept)",
						mdfmt.Float(x.med("conn_bytes")), mdfmt.Int(x.med("conns")), mdfmt.Int(x.med("pipe_conns"))))
				}
			}
		}
		w("\n")
	}

	if gs := r.defaultClientGoals(); len(gs) > 0 {
		w("### Goals on a default go-redis client\n\nThe goals are set on the default client; the tuned client's rows are there to compare.\n\n")
		goalTable(w, gs)
	}
}
