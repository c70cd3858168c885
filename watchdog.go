package flightlock

import (
	"container/heap"
	"context"
	"sync"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

// maxRenewers bounds a watchdog's goroutines that run renewals and end abandoned grants.
const maxRenewers = 32

// watchdog renews its holds every TTL/3 and cancels their leases with ErrLost before the store
// may expire them. Each hold has at most one pending event in one min-heap, behind one timer;
// I/O runs on at most maxRenewers goroutines, and the loss deadline never waits for a renewal.
//
// Lock order: a hold's mu before the watchdog's mu; the timer callback and the renewers take a
// hold's mu only after they have let go of the watchdog's.
type watchdog struct {
	clock clock
	epoch time.Time // instant 0: when the watchdog was made
	// settle is set for a clock without concurrentTimers (the tests', which fires timers in
	// Advance): a firing then waits for the renewals it started, so a test step sees them.
	settle bool

	mu      sync.Mutex
	heap    holdHeap   // guarded by mu: holds with a pending event, earliest first
	timer   clockTimer // guarded by mu: fires at armedAt when armed; nil before the first event
	armed   bool       // guarded by mu
	armedAt instant    // guarded by mu
	queue   []renewJob // guarded by mu: work for the renewers, oldest first
	workers int        // guarded by mu: renewer goroutines running
	idle    sync.Cond  // on mu: broadcast when the last renewer finds no work (settle)
}

// renewJob is one piece of a renewer's work: renew h, or end its abandoned grant.
type renewJob struct {
	h       *hold
	abandon bool
}

func newWatchdog(c clock) *watchdog {
	_, concurrent := c.(interface{ concurrentTimers() })
	w := &watchdog{clock: c, epoch: c.Now(), settle: !concurrent}
	w.idle.L = &w.mu
	return w
}

// schedule sets h's pending event at at, replacing the one it had. h.mu must be held.
func (w *watchdog) schedule(h *hold, at instant) {
	w.mu.Lock()
	h.due = at
	if h.slot == 0 {
		heap.Push(&w.heap, h)
	} else {
		heap.Fix(&w.heap, int(h.slot)-1)
	}
	if !w.armed || at < w.armedAt {
		w.armLocked(at)
	}
	w.mu.Unlock()
}

// unschedule drops h's pending event, if any. h.mu must be held. The timer stays armed: to
// stop and re-arm it on every uncontended Lock and Release would wake the network poller.
func (w *watchdog) unschedule(h *hold) {
	w.mu.Lock()
	if h.slot != 0 {
		heap.Remove(&w.heap, int(h.slot)-1)
	}
	w.mu.Unlock()
}

// armLocked makes the timer fire at at. w.mu must be held.
func (w *watchdog) armLocked(at instant) {
	d := max(time.Duration(at-w.now()), 0)
	w.armed, w.armedAt = true, at
	if w.timer == nil {
		w.timer = w.clock.AfterFunc(d, w.fire)
		return
	}
	w.timer.Reset(d)
}

// fire runs on the clock timer: each hold whose event is due acts on it (onDue).
func (w *watchdog) fire() {
	now := w.now()
	var buf [16]*hold
	due := buf[:0]
	w.mu.Lock()
	w.armed = false
	for len(w.heap) > 0 && w.heap[0].due <= now {
		due = append(due, heap.Pop(&w.heap).(*hold))
	}
	if len(w.heap) > 0 {
		w.armLocked(w.heap[0].due)
	}
	w.mu.Unlock()
	for _, h := range due {
		h.onDue()
	}
	w.startRenewers() // after the loop: the renewals due together are queued together
	if w.settle {
		w.mu.Lock()
		for w.workers > 0 {
			w.idle.Wait()
		}
		w.mu.Unlock()
	}
}

// instant is nanoseconds since a watchdog's epoch: 8 bytes, not a time.Time's 24 (per hold).
type instant int64

func (i instant) add(d time.Duration) instant { return i + instant(d) }

// now is the current instant, from the monotonic clock.
func (w *watchdog) now() instant { return instant(w.clock.Since(w.epoch)) }

// enqueue queues a job for the renewers; fire starts them once it has queued every job due.
func (w *watchdog) enqueue(j renewJob) {
	w.mu.Lock()
	w.queue = append(w.queue, j) // a full array moves the jobs left: a busy queue does not grow
	w.mu.Unlock()
}

// startRenewers starts a renewer for every maxBatch queued jobs, within maxRenewers in all.
func (w *watchdog) startRenewers() {
	w.mu.Lock()
	n := min(maxRenewers-w.workers, (len(w.queue)+maxBatch-1)/maxBatch) // never negative
	w.workers += n
	w.mu.Unlock()
	for range n {
		go w.renewer()
	}
}

// renewer runs queued jobs until none is left, batching a keeper's renewals up to maxBatch.
func (w *watchdog) renewer() {
	var batch []*hold
	for {
		w.mu.Lock()
		if len(w.queue) == 0 {
			w.workers--
			w.queue = nil
			if w.workers == 0 {
				w.idle.Broadcast()
			}
			w.mu.Unlock()
			return
		}
		j := w.queue[0]
		batch = append(batch[:0], j.h)
		n := 1
		for ; !j.abandon && len(batch) < maxBatch && n < len(w.queue); n++ {
			next := w.queue[n]
			if next.abandon || next.h.k != j.h.k {
				break
			}
			batch = append(batch, next.h)
		}
		clear(w.queue[:n])
		w.queue = w.queue[n:]
		w.mu.Unlock()
		if j.abandon {
			// Reported before the slot, and its site, passes on; ErrNotHeld is the usual answer.
			j.h.k.reportAbandoned(j.h)
			_ = j.h.k.endGrantBy(context.Background(), j.h)
		} else {
			renew(batch)
		}
		clear(batch) // let ended holds be collected while the renewer waits for work
	}
}

// maxBatch bounds the renewals of one keeper that a renewer sends together.
const maxBatch = 512

// renew refreshes the locks of holds, which share one keeper, as one RefreshAll.
func renew(holds []*hold) {
	k := holds[0].k
	live := holds[:0:0]
	batch := make([]lockstore.Renewal, 0, len(holds))
	var latest instant
	for _, h := range holds {
		if deadline, ok := h.renewBegin(); ok {
			live = append(live, h)
			batch = append(batch, lockstore.Renewal{Key: h.key, Owner: h.owner(), TTL: k.ttl})
			latest = max(latest, deadline)
		}
	}
	if len(live) == 0 {
		return
	}
	// Bounded by the batch's latest loss deadline, as a timeout: instants are the keeper's.
	ctx, cancel := context.WithTimeout(context.Background(), k.untilInstant(latest))
	sent := k.nowInstant()
	errs := k.store.RefreshAll(ctx, batch)
	cancel()
	for i, h := range live {
		h.renewEnd(sent, errs[i])
	}
}

// holdHeap is a container/heap of holds ordered by hold.due; hold.slot is a hold's index plus
// one, 0 off the heap. Its watchdog's mu must be held.
type holdHeap []*hold

func (q holdHeap) Len() int { return len(q) }

func (q holdHeap) Less(i, j int) bool { return q[i].due < q[j].due }

func (q holdHeap) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].slot, q[j].slot = int32(i+1), int32(j+1)
}

func (q *holdHeap) Push(x any) {
	h := x.(*hold)
	*q = append(*q, h)
	h.slot = int32(len(*q))
}

func (q *holdHeap) Pop() any {
	n := len(*q) - 1
	h := (*q)[n]
	(*q)[n] = nil
	*q = shrink((*q)[:n])
	h.slot = 0
	return h
}

// shrink returns s, or a copy in a smaller array once s fills a quarter of its array.
func shrink[T any](s []T) []T {
	if cap(s) <= 64 || len(s) > cap(s)/4 {
		return s
	}
	return append(make([]T, 0, 2*len(s)), s...)
}

// clock is where a hold's life reads the time and arms its watchdog (a manual one in tests).
// Context deadlines stay on the system clock: nothing else can drive a context.
type clock interface {
	Now() time.Time
	// Since is Now().Sub(t), on the system clock half the cost of Now (monotonic only).
	Since(t time.Time) time.Duration
	AfterFunc(d time.Duration, f func()) clockTimer
}

// clockTimer is the part of *time.Timer the watchdog uses.
type clockTimer interface {
	Reset(d time.Duration) bool
	Stop() bool
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) Since(t time.Time) time.Duration { return time.Since(t) }

func (systemClock) AfterFunc(d time.Duration, f func()) clockTimer { return time.AfterFunc(d, f) }

// concurrentTimers: the clock's timers fire on goroutines of their own (watchdog.settle).
func (systemClock) concurrentTimers() {}
