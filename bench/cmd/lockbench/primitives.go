package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/bench/internal/contend"
	"github.com/flightlock/flightlock/bench/internal/guard"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
	"github.com/flightlock/flightlock/bench/internal/pollrw"
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

// zsetSemImpl is the naive ZSET semaphore as a row.
type zsetSemImpl struct {
	goredisRow
	sem *zsetsem.Semaphore
}

func newZsetSem(addr string, s clientSetting) (impl, error) {
	c := newClient(addr, s, "zs:")
	return &zsetSemImpl{goredisRow: c, sem: zsetsem.New(c.client, semPermits, lockTTL, semPoll)}, nil
}

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
	return each(len(hs), func(i int) contend.Holder { return &spanHolder{Holder: hs[i], span: span} })
}

func (r *report) s10Section(w func(string, ...any)) {
	s := r.s10
	w("## 10. Semaphore: %d permits on one hot key\n\n", semPermits)
	w("Goroutines loop: take a permit of the one key, yield the processor once (`runtime.Gosched`), run the critical section,\n")
	w("give the permit back. Two atomic \"inside\" counters must never exceed %d: one around the critical section (its plain\n", semPermits)
	w("counter is incremented atomically here, as %d holders may run at once), one around the whole hold as the holder sees it\n", semPermits)
	w("(grant's return to release call, within the permit's time on the server). Without the yield a hold is inside only while\n")
	w("its goroutine runs, and on %d cores no more than %d holders could be seen at once. *violations* counts both checks (all\n", r.machine.CPUs, r.machine.CPUs)
	w("repetitions); *most holders at once* is the hold check's largest count (worst repetition): %d shows the bound was reached.\n\n", semPermits)
	w("%s\n", mdfmt.Head("row", "waiting for a busy key"))
	w("| %s | a waiter queues (FIFO) on a permit held in this process, whose release hands it over without a round trip;"+
		" a permit held elsewhere wakes it by its release notification, or the retry delays do |\n", semaphoreRows()[0].label())
	w("| %s | sleeps %v and tries again |\n", semaphoreRows()[1].label(), semPoll)
	w("\nflightlock runs in Wait mode with its defaults (%d store lanes), a %v TTL and a %v wait budget, on a go-redis v9 client\n", redisstore.DefaultLanes, lockTTL, waitBudget)
	w("of its own, as its mutex row; each permit is a lock of its own (`key`, `key#{tag}2` .. `key#{tag}%d`). The naive semaphore\n", semPermits)
	w("is the classic sorted-set recipe (`bench/internal/zsetsem`, written for this benchmark): one Lua script removes the\n")
	w("expired members (`ZREMRANGEBYSCORE` up to the server's `TIME`) and, if `ZCARD` < %d, adds the taker scored with its\n", semPermits)
	w("expiry, else refuses; a holder renews its score every TTL/3 and releases with `ZREM`. No queue, no notification.\n\n")
	s.tables(w, r, r.cfg.d10, true)
	w("flightlock's RT/CS is far below 1 for its hand-over, as its mutex's in scenarios 2 and 3. The checks were checked once,\n")
	w("by building the naive semaphore with 4 permits under the same 3-permit guards: both parts reported violations and 4 holders.\n\n")
}

// Scenario 11 (Redis only): a read-write lock on one hot key, built as scenario 10: s10Goroutines
// goroutines of one process, then s3Procs processes of s3Goroutines goroutines each, every
// Lock drawing a read with the mix's probability. Rows: flightlock (WithRead for reads, its
// plain Locker for writes) and a naive read-write lock that polls (bench/internal/pollrw).

// rwMixes are the percentages of reads scenario 11 runs.
var rwMixes = []int{90, 50}

// rwRows are scenario 11's rows.
func rwRows() []rowSpec {
	return []rowSpec{
		{id: "flightlock-rw", lib: "flightlock, WithRead for reads", wait: "a process's readers share one hold, and take turns with its writers in the gate; writer preference; release notification",
			rw: true, build: newFlightlockRW},
		{id: "poll-rw", lib: "naive SET NX + ZSET read-write lock", wait: "poll " + semPoll.String(), rw: true, build: newPollRW},
	}
}

// rwImpl is a row of a read-write lock: impl's lock is the write lock's, rlock the read
// lock's, and impl's unlock releases a hold of either kind.
type rwImpl interface {
	impl
	rlock(ctx context.Context, key string) (any, error)
}

// flightlockRWImpl is flightlock's read-write lock as a row.
type flightlockRWImpl struct {
	*flightlockImpl
	read *flightlock.Locker // WithRead, on the write Locker's store and gate
}

func newFlightlockRW(addr string, s clientSetting) (impl, error) {
	f, err := newFlightlock(addr, s)
	if err != nil {
		return nil, err
	}
	r, err := f.locker.With(flightlock.WithRead())
	if err != nil {
		return nil, err
	}
	return &flightlockRWImpl{flightlockImpl: f, read: r}, nil
}

func (f *flightlockRWImpl) rlock(ctx context.Context, key string) (any, error) {
	return f.read.Lock(ctx, key)
}

// pollRWImpl is the naive read-write lock as a row.
type pollRWImpl struct {
	goredisRow
	l *pollrw.RWLock
}

func newPollRW(addr string, s clientSetting) (impl, error) {
	c := newClient(addr, s, "prw:")
	return &pollRWImpl{goredisRow: c, l: pollrw.New(c.client, lockTTL, semPoll)}, nil
}

func (p *pollRWImpl) lock(ctx context.Context, key string) (any, error) { return p.l.Lock(ctx, key) }

func (p *pollRWImpl) tryLock(ctx context.Context, key string) (any, error) {
	h, err := p.l.TryLock(ctx, key)
	return tried(h, err, pollrw.ErrBusy)
}

func (p *pollRWImpl) unlock(ctx context.Context, _ string, h any) error {
	return h.(*pollrw.Hold).Release(ctx)
}

func (p *pollRWImpl) rlock(ctx context.Context, key string) (any, error) { return p.l.RLock(ctx, key) }

// rwHolder drives a read-write row as a contend.ReadHolder: each Lock is a read with
// probability reads/100 (math/rand/v2's source, per thread, so goroutines do not share one).
type rwHolder struct {
	im      rwImpl
	keys    []string
	reads   int
	k       int
	reading bool
	h       any
}

func (x *rwHolder) Lock(ctx context.Context, k int) (int64, error) {
	x.k, x.reading = k, rand.IntN(100) < x.reads
	var err error
	if x.reading {
		x.h, err = x.im.rlock(ctx, x.keys[k])
	} else {
		x.h, err = x.im.lock(ctx, x.keys[k])
	}
	return 0, err
}

func (x *rwHolder) Unlock(ctx context.Context) error { return x.im.unlock(ctx, x.keys[x.k], x.h) }

func (x *rwHolder) Reading() bool { return x.reading }

// s11Mix is scenario 11's rows at one mix.
type s11Mix struct {
	Reads int `json:"reads"` // percent of Locks that are reads
	inAndAcross
}

// s11Results are scenario 11's rows, mix by mix.
type s11Results struct {
	Mixes []s11Mix `json:"mixes"`
}

func (b *bench) scenario11() *s11Results {
	rows := b.pick("flightlock-rw", "poll-rw")
	out := &s11Results{}
	for _, mix := range rwMixes {
		s := b.inAndAcross(fmt.Sprintf("s11:%d", mix), rows, b.c.d11, mix)
		out.Mixes = append(out.Mixes, s11Mix{Reads: mix, inAndAcross: s})
	}
	return out
}

func (r *report) s11Section(w func(string, ...any)) {
	s := r.s11
	w("## 11. Read-write lock on one hot key\n\n")
	w("Goroutines loop: draw a read (with the mix's probability) or a write, take the read or the write lock of the one key,\n")
	w("yield the processor once, run the critical section, release. The two checks of scenario 10 run in every hold: a writer\n")
	w("must find nobody inside, a reader no writer; a writer increments a plain counter (a lost update shows as a shortfall)\n")
	w("and a reader reads it twice (a write between the two is a violation). *most holders at once* is the most readers the\n")
	w("hold check saw (worst repetition): above 1, reads shared. Reads/s and writes/s are the critical sections of each kind\n")
	w("over the run's time, their waits apart (wait p50, p99 and max: the writes'); RT and server commands are per critical section.\n\n")
	w("%s\n", mdfmt.Head("row", "waiting for a busy key"))
	w("| %s | the readers of a process share one store read hold (the first takes it, those that come meanwhile wait for it and join, "+
		"those within the handoff window join it with no round trip, the last releases it);"+
		" a write is the mutex's Locker, with its gate and hand-over between the goroutines of a process; while a writer of the process"+
		" holds or waits for the key, the process's readers queue behind it in the gate and then share its store lock together (handed"+
		" on as between writers, no store command); a writer refused because of readers marks the key and new readers wait for it;"+
		" waiters wake on the release notification or the retry delays |\n", rwRows()[0].label())
	w("| %s | a writer `SET w NX PX`, polling every %v while another writer holds it, then polls `ZCOUNT` of the readers every %v until none is left;"+
		" a reader pipelines `ZADD` of itself + `PEXPIRE` + `EXISTS w`, and if a writer holds `w` takes itself out (`ZREM`) and polls `EXISTS w` every %v |\n",
		rwRows()[1].label(), semPoll, semPoll, semPoll)
	w("\nflightlock gets the settings of scenario 10; its reader is `Locker.With(WithRead())` of its writer, sharing its gate.\n")
	w("The naive lock (`bench/internal/pollrw`, written for this benchmark) excludes by the order of its steps: a writer sets\n")
	w("its mark before it counts readers, a reader joins before it looks at the mark, so of two that overlap one sees the other;\n")
	w("new readers back off while a writer holds the mark or waits, so it prefers writers too. It has no renewal (its holds are\n")
	w("far inside the TTL), which makes it cheaper, not dearer.\n\n")
	for _, mix := range s.Mixes {
		w("### %d%% reads, %d%% writes\n\n", mix.Reads, 100-mix.Reads)
		mix.tables(w, r, r.cfg.d11, false)
	}
	w("Compare the rows at the same mix and setting, not across mixes (the mix sets how often readers must drain for a writer).\n")
	w("Server cmds/CS includes refused attempts and polls; RT/CS can be far below the 2 a read costs flightlock because its store\n")
	w("sends the script calls beyond its %d lanes as pipelines, one round trip each. The write waits' p99 and max are what a\n", redisstore.DefaultLanes)
	w("writer waits behind the readers. The checks were checked once, with naive readers that ignore the write mark: every\n")
	w("part, both mixes, in one process and across processes, reported violations.\n\n")
}

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

func (r *report) s12Section(w func(string, ...any)) {
	s := r.s12
	def, _ := rowByID("flightlock") // flightlock's mutex row, the default
	w("## 12. What fairness costs: one hot key, default against WithFair\n\n")
	w("Scenario 2's loop and checks with flightlock's default Locker and the same Locker made `WithFair()`, with the settings\n")
	w("of scenario 10.\n\n")
	w("%s\n", mdfmt.Head("row", "waiting for a busy key"))
	w("| %s | one Lock per key and process goes to Redis; the process's other goroutines queue on it and a release hands the key"+
		" to the next of them without a round trip (up to `WithHandoff`'s limits); a key held elsewhere wakes the waiter by its release notification |\n", def.label())
	w("| %s | every Lock takes a place in the key's line in Redis, ordered by when it began, and only the first in line may take the"+
		" free key; no gate and no hand-over in the process; each release wakes the first waiter of each process, which looks"+
		" again (the others keep their places with a look every 500 ms) |\n", fairRows()[0].label())
	w("\n")
	s.tables(w, r, r.cfg.d12, true)
	w("The CS/s ratio of the two rows is the price of the order at this contention (%d waiters on one key). Server cmds/CS\n", s10Goroutines)
	w("says where it goes: the default passes grants between a process's goroutines without Redis; with WithFair each grant\n")
	w("costs the first waiter's look, the release, and the other waiters' looks to keep their places, growing with processes\n")
	w("and waiters. What the order buys shows in how close the wait's p50 is to its max, and in `fair` across processes.\n\n")
}
