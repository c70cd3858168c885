package main

import (
	"context"
	"runtime"
	"strconv"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/bench/internal/contend"
	"github.com/flightlock/flightlock/bench/internal/guard"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
	"github.com/flightlock/flightlock/bench/internal/zsetsem"
	"github.com/flightlock/flightlock/lockstore/redisstore"
)

// Scenario 10 (Redis only): a counting semaphore of semPermits permits on one hot key, taken
// by s10Goroutines goroutines of one process, then by s3Procs processes of s3Goroutines
// goroutines each (scenario 3's workers). Rows: flightlock with WithPermits, and a
// naive sorted-set semaphore that polls (bench/internal/zsetsem). Its report is a document of
// its own (-primitives-out), so that the figures of scenarios 1-9 stay where they are.

// semPermits is the permits of the hot key (-permits; the workers get it too).
var semPermits = 3

const (
	// semPoll is how long the naive semaphore's refused taker sleeps before it tries again:
	// the fixed interval of the classic recipe, short enough not to flatter flightlock.
	semPoll = 5 * time.Millisecond
	// s10Goroutines is scenario 10's goroutines in one process, as scenario 2's largest.
	s10Goroutines = 64
)

// semaphoreRows are scenario 10's rows: each admits semPermits holders of a key at once.
func semaphoreRows() []rowSpec {
	return []rowSpec{
		{id: "flightlock-permits", lib: "flightlock, WithPermits(" + strconv.Itoa(semPermits) + ")",
			wait:    "permit hand-over + release notification",
			permits: semPermits, build: func(a string, s clientSetting) (impl, error) {
				return newFlightlock(a, s, flightlock.WithPermits(semPermits))
			}},
		{id: "zset-permits", lib: "naive ZSET semaphore (" + strconv.Itoa(semPermits) + " permits)",
			wait: "poll " + semPoll.String(), permits: semPermits, build: newZsetSem},
	}
}

// --- the naive ZSET semaphore as a row

type zsetSemImpl struct {
	goredisRow
	sem *zsetsem.Semaphore
}

func newZsetSem(addr string, s clientSetting) (impl, error) {
	c := newClient(addr, s)
	return &zsetSemImpl{goredisRow: c, sem: zsetsem.New(c.client, semPermits, lockTTL, semPoll)}, nil
}

func (z *zsetSemImpl) key(base string) string { return "zs:" + base }

func (z *zsetSemImpl) lock(ctx context.Context, key string) (any, error) {
	return z.sem.Acquire(ctx, key)
}

func (z *zsetSemImpl) tryLock(ctx context.Context, key string) (any, error) {
	p, err := z.sem.TryAcquire(ctx, key)
	return tried(p, err, zsetsem.ErrBusy)
}

func (z *zsetSemImpl) unlock(ctx context.Context, _ string, h any) error {
	return h.(*zsetsem.Permit).Release(ctx)
}

// --- holders that span their hold

// spanHolder marks its goroutine inside span, as a reader (a contend.ReadHolder's read) or as a
// holder of a permit or write, from the moment Lock returns a hold to the moment it calls
// Unlock, and yields the processor once in between (runtime.Gosched). The span lies within the
// hold's time on the server (entered after the grant, left before the release is sent), so a
// span guard that finds too many inside saw a real violation. The yield is what lets the bound
// be reached: a hold that never blocks is inside only while its goroutine runs, so without it
// no more than GOMAXPROCS holders (2 on the benchmark machine) could ever be seen at once,
// whatever the lock let through.
type spanHolder struct {
	contend.Holder
	span    guard.Guard
	reading bool // the current hold is a read
}

func (x *spanHolder) Lock(ctx context.Context, k int) (int64, error) {
	fence, err := x.Holder.Lock(ctx, k)
	if err == nil {
		rh, ok := x.Holder.(contend.ReadHolder)
		if x.reading = ok && rh.Reading(); x.reading {
			x.span.EnterRead()
		} else {
			x.span.Enter(0)
		}
		runtime.Gosched()
	}
	return fence, err
}

func (x *spanHolder) Unlock(ctx context.Context) error {
	if x.reading {
		x.span.ExitRead()
	} else {
		x.span.Exit()
	}
	return x.Holder.Unlock(ctx)
}

// Reading makes a spanHolder a contend.ReadHolder: it says whether the current hold is a read.
func (x *spanHolder) Reading() bool { return x.reading }

// spanHolders wraps every holder in a spanHolder on span.
func spanHolders(hs []contend.Holder, span guard.Guard) []contend.Holder {
	out := make([]contend.Holder, len(hs))
	for i, h := range hs {
		out[i] = &spanHolder{Holder: h, span: span}
	}
	return out
}

// --- the report

func (r *report) s10Section(w func(string, ...any)) {
	s := r.s10
	w("## 10. Semaphore: %d permits on one hot key\n\n", semPermits)
	w("Goroutines loop: take a permit of the one key, yield the processor once (`runtime.Gosched`), run the critical section,\n")
	w("give the permit back. Two checks run in every hold, each an atomic \"inside\" counter that must never exceed %d: one\n", semPermits)
	w("around the critical section itself (as in scenarios 2 and 3; its plain counter is incremented atomically here, since %d\n", semPermits)
	w("holders may run at once), and one around the whole hold as the holder sees it, from the grant's return to the release\n")
	w("call, which lies within the permit's time on the server. The yield is there so that the bound can be reached: a hold\n")
	w("that never blocks is inside only while its goroutine runs, so on %d cores no more than %d holders could be seen at once,\n", r.machine.CPUs, r.machine.CPUs)
	w("whatever the semaphore let through. *violations* counts both checks (all repetitions); *most holders at once* is the\n")
	w("largest count the hold check saw (worst repetition): %d shows that the bound was reached and held. Wait = time from\n", semPermits)
	w("the call to holding a permit. Medians over %d repetitions; in each, the rows run one after\n", r.cfg.reps)
	w("the other in an order rotated per repetition. RT and server commands are counted as in the main report (pub/sub\n")
	w("connections are not in RT).\n\n")
	w("%s\n", mdfmt.Head("row", "waiting for a busy key"))
	w("| %s | a waiter queues (FIFO) on a permit held in this process, whose release hands it over without a round trip;"+
		" a permit held elsewhere wakes it by its release notification, or the retry delays do |\n", semaphoreRows()[0].label())
	w("| %s | sleeps %v and tries again |\n", semaphoreRows()[1].label(), semPoll)
	w("\nflightlock runs in Wait mode with its defaults (retry delays, hand-off window, %d store lanes) but for the settings every\n", redisstore.DefaultLanes)
	w("row of the main report gets: a %v TTL and a %v wait budget (a Lock that runs out of it would count as an error),\n", lockTTL, waitBudget)
	w("on a go-redis v9 client of its own, built as for flightlock's mutex row. Each permit is a lock of its own (`key`, `key#{tag}2` .. `key#{tag}%d`).\n", semPermits)
	w("The naive semaphore is the classic sorted-set recipe (`bench/internal/zsetsem`, written for this benchmark): one Lua\n")
	w("script removes the expired members (`ZREMRANGEBYSCORE` up to the server's `TIME`) and, if `ZCARD` < %d, adds the\n", semPermits)
	w("taker scored with its expiry (%v TTL), else refuses; a refused taker sleeps %v and tries again; a holder renews\n", lockTTL, semPoll)
	w("its score every TTL/3 from a goroutine of its own and releases with `ZREM`. No queue, no notification.\n\n")
	s.tables(w, r, r.cfg.d10, true)
	w("flightlock's RT/CS is far below 1 for the reason its mutex's is in scenarios 2 and 3: a permit released while a waiter\n")
	w("of the same process queues on it passes to that waiter without a round trip (up to the hand-off limits of `WithHandoff`).\n")
	w("The checks were themselves checked once, by building the naive semaphore with 4 permits under the same 3-permit guards:\n")
	w("both parts then reported violations and 4 holders at once.\n\n")
}
