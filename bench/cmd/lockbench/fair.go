package main

import (
	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
	"github.com/flightlock/flightlock/lockstore/redisstore"
)

// Scenario 12 (Redis only): what fairness costs. flightlock's default mutex against the same
// Locker made WithFair, on one hot key: s10Goroutines goroutines of one process, then s3Procs
// processes of s3Goroutines goroutines each, with scenario 2's guard. A fair Lock keeps its
// place in a line in Redis and talks to Redis itself (no gate, no hand-over in the process),
// and each release wakes every waiter: the rows show the throughput, the round trips and the
// server commands that buys, and how evenly the processes got through.

// fairRows are scenario 12's rows besides flightlock's default.
func fairRows() []rowSpec {
	return []rowSpec{
		{id: "flightlock-fair", lib: "flightlock, WithFair()", wait: "a place in a line in Redis + release notification to each process's first waiter",
			build: func(a string, s clientSetting) (impl, error) { return newFlightlock(a, s, flightlock.WithFair()) }},
	}
}

// --- the report

func (r *report) s12Section(w func(string, ...any)) {
	s := r.s12
	w("## 12. What fairness costs: one hot key, default against WithFair\n\n")
	w("Scenario 2's loop and guard (take the one key, run the critical section, release; an atomic \"inside\" counter that\n")
	w("must read 1 and a plain counter that a lost update leaves short) with flightlock's default Locker and the same Locker\n")
	w("made `WithFair()`, with the settings of scenario 10. RT/CS is the client's round trips per critical section (go-redis\n")
	w("hook; pub/sub connections not counted), server cmds/CS every command Redis ran per critical section (INFO\n")
	w("commandstats, commands inside scripts included); wait = the call to holding the key. Medians over %d repetitions, rows\n", r.cfg.reps)
	w("rotated per repetition.\n\n")
	w("%s\n", mdfmt.Head("row", "waiting for a busy key"))
	w("| %s | one Lock per key and process goes to Redis; the process's other goroutines queue on it and a release hands the key"+
		" to the next of them without a round trip (up to `WithHandoff`'s limits); a key held elsewhere wakes the waiter by its release notification |\n", defaultRow().label())
	w("| %s | every Lock takes a place in the key's line in Redis, ordered by when it began, and only the first in line may take the"+
		" free key; no gate and no hand-over in the process; each release wakes the first waiter of each process, which looks"+
		" again (the others keep their places with a look every 500 ms) |\n", fairRows()[0].label())
	w("\n")
	s.tables(w, r, r.cfg.d12, true)
	w("How to read it: the CS/s ratio of the two rows is the price of the order at this contention (%d waiters on one key);\n", s10Goroutines)
	w("server cmds/CS says where it goes: with the default, grants pass between goroutines of a process without Redis, so it is\n")
	w("far below 1; with WithFair each grant costs the first waiter's look, the release, and the other waiters' looks to keep\n")
	w("their places, so it grows with the processes and the waiters. RT/CS is one round trip per script call in the mix; it\n")
	w("would fall below the calls only if more of them were in flight than the store's %d lanes, which then go out as\n", redisstore.DefaultLanes)
	w("pipelines. What the order buys shows in how close the wait's p50 is to its max, and in `fair` across processes.\n\n")
}

// defaultRow is flightlock's mutex row, scenario 12's default.
func defaultRow() rowSpec {
	r, _ := rowByID("flightlock")
	return r
}
