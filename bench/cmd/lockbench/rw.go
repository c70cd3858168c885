package main

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/bench/internal/contend"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
	"github.com/flightlock/flightlock/bench/internal/pollrw"
	"github.com/flightlock/flightlock/lockstore/redisstore"
)

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

// rwImpl is a row of a read-write lock: impl's lock and unlock are the write lock's.
type rwImpl interface {
	impl
	rlock(ctx context.Context, key string) (any, error)
	runlock(ctx context.Context, key string, h any) error
}

// --- flightlock's read-write lock as a row

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

func (f *flightlockRWImpl) runlock(ctx context.Context, _ string, h any) error {
	return h.(*flightlock.Lease).Release(ctx)
}

// --- the naive read-write lock as a row

type pollRWImpl struct {
	goredisRow
	l *pollrw.RWLock
}

func newPollRW(addr string, s clientSetting) (impl, error) {
	c := newClient(addr, s)
	return &pollRWImpl{goredisRow: c, l: pollrw.New(c.client, lockTTL, semPoll)}, nil
}

func (p *pollRWImpl) key(base string) string { return "prw:" + base }

func (p *pollRWImpl) lock(ctx context.Context, key string) (any, error) { return p.l.Lock(ctx, key) }

func (p *pollRWImpl) tryLock(ctx context.Context, key string) (any, error) {
	h, err := p.l.TryLock(ctx, key)
	return tried(h, err, pollrw.ErrBusy)
}

func (p *pollRWImpl) unlock(ctx context.Context, _ string, h any) error {
	return h.(*pollrw.Hold).Release(ctx)
}

func (p *pollRWImpl) rlock(ctx context.Context, key string) (any, error) { return p.l.RLock(ctx, key) }

func (p *pollRWImpl) runlock(ctx context.Context, key string, h any) error {
	return p.unlock(ctx, key, h)
}

// --- holders

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

func (x *rwHolder) Unlock(ctx context.Context) error {
	if x.reading {
		return x.im.runlock(ctx, x.keys[x.k], x.h)
	}
	return x.im.unlock(ctx, x.keys[x.k], x.h)
}

func (x *rwHolder) Reading() bool { return x.reading }

// rwHolders are n holders of im on keys (already the row's key names), reads% of whose Locks
// are reads.
func rwHolders(im impl, keys []string, n, reads int) []contend.Holder {
	rim, ok := im.(rwImpl)
	if !ok {
		fatalf("row %T keeps no read locks", im)
	}
	return holdersOf(n, func(int) contend.Holder { return &rwHolder{im: rim, keys: keys, reads: reads} })
}

// --- scenario 11

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

// --- the report

func (r *report) s11Section(w func(string, ...any)) {
	s := r.s11
	w("## 11. Read-write lock on one hot key\n\n")
	w("Goroutines loop: draw a read (with the mix's probability) or a write, take the read or the write lock of the one key,\n")
	w("yield the processor once, run the critical section, release. Two checks run in every hold, as in scenario 10: one around\n")
	w("the critical section itself and one around the whole hold as the holder sees it (grant's return to release call). In\n")
	w("both, a writer counts itself in and must find nobody inside, neither a writer nor a reader; a reader counts itself in\n")
	w("and must find no writer; a writer increments a plain counter (a lost update shows as a shortfall) and a reader reads\n")
	w("it twice (a write between the two reads is a violation). *violations* counts all of it (all repetitions); *most\n")
	w("holders at once* is the largest count of readers the hold check saw (worst repetition): above 1 shows that reads did\n")
	w("share. Reads/s and writes/s are the critical sections of each kind over the run's time; their waits (the call to\n")
	w("holding the lock) are apart (wait p50, p99 and max: the writes'). Medians over %d repetitions, rows rotated per\n", r.cfg.reps)
	w("repetition; RT and server commands per critical section (read or write) are counted as in scenario 10.\n\n")
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
	w("\nflightlock gets the settings of scenario 10 (%v TTL, %v wait budget, %d store lanes, a client of its own); its\n", lockTTL, waitBudget, redisstore.DefaultLanes)
	w("reader is `Locker.With(WithRead())` of its writer, so both share the process's gate. The naive lock\n")
	w("(`bench/internal/pollrw`, written for this benchmark) excludes by the order of its steps: a writer sets its mark before\n")
	w("it counts readers, a reader joins before it looks at the mark, so of two that overlap one sees the other; new readers\n")
	w("back off while a writer holds the mark or waits for readers to leave, so it prefers writers too. It has no renewal (its\n")
	w("holds are far inside the TTL), which makes it cheaper, not dearer.\n\n")
	for _, mix := range s.Mixes {
		w("### %d%% reads, %d%% writes\n\n", mix.Reads, 100-mix.Reads)
		mix.tables(w, r, r.cfg.d11, false)
	}
	w("How to read it: compare the rows' reads/s and writes/s at the same mix and setting, not across mixes (the mix sets how\n")
	w("often readers must drain for a writer). Server cmds/CS is the work Redis does per critical section, refused attempts and\n")
	w("polls included; RT/CS can be far below the 2 a read costs flightlock because its store sends the script calls beyond\n")
	w("its %d lanes as pipelines, which the client counts as one round trip each. *most holders at once* above 1 is the sign\n", redisstore.DefaultLanes)
	w("that reads shared at all; the write waits' p99 and max are what a writer waits behind the readers.\n")
	w("The checks were themselves checked once, by building the naive lock with readers that ignore the write mark: every\n")
	w("part, both mixes, in one process and across processes, then reported violations.\n\n")
}
