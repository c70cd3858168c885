package lockstore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultLanes is how many script calls a RedisStore keeps on the wire at once before it
// starts batching (WithLanes).
const DefaultLanes = 4

// pipeliner is what batching needs from the client; redis.Cmdable (every go-redis client)
// has it.
type pipeliner interface {
	Pipeline() redis.Pipeliner
}

// batcher sends the scripts of concurrent callers (acquire, refresh, release) to Redis.
//
// Up to lanes calls go out at once, each on its own pooled connection with its caller's
// context, as plain go-redis calls: at low concurrency nothing changes. A call that finds every
// lane busy queues; when a lane's call or batch returns, the lane takes the whole queue and
// sends it as one pipeline. Under load this turns N round trips into one on both sides (one
// write and one read system call for the client and for Redis), which is where a lock spends
// its CPU: the scripts themselves cost Redis microseconds, the system calls tens of them.
//
// A call waits for its reply once it is on the wire, as a plain go-redis call does: returning
// early would leave a command running unseen (an acquire whose lock nobody would release, or
// whose orphan release could overtake it). A call whose context ends while it is still queued
// is dropped and never sent. A batch is bounded by the earliest deadline among its callers, so
// nobody waits past their own deadline, even on a hung Redis.
//
// go-redis has an automatic pipeliner of its own (Client.AutoPipeline, v9.23, experimental),
// but there a call waits for its batch however short its context: against a stopped server a
// call with a 200 ms deadline returned after 35 s, which breaks "a hung Redis fails the
// request within its deadline".
type batcher struct {
	client   pipeliner
	scripter redis.Scripter // the same client, for calls on a free lane and EVAL after NOSCRIPT
	lanes    int

	mu    sync.Mutex
	busy  int           // guarded by mu: lanes with a call or a batch on the wire
	queue []*queuedCall // guarded by mu: calls waiting for a lane, oldest first
}

// Lifecycle of a queued call: queued -> sent (a lane took it) or queued -> abandoned (its
// caller left first). The CAS decides the race between the lane and the caller.
const (
	callQueued int32 = iota
	callSent
	callAbandoned
)

type queuedCall struct {
	ctx    context.Context
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd    // its reply; written by the lane, read by the caller after done
	done   chan struct{} // closed by the lane once cmd has its reply
	state  atomic.Int32
}

func newBatcher(client Client, lanes int) *batcher {
	p, ok := client.(pipeliner)
	if !ok || lanes <= 0 {
		return nil // calls go straight to the client
	}
	return &batcher{client: p, scripter: client, lanes: lanes}
}

// run runs script with keys and args, through a free lane or in the next batch.
func (b *batcher) run(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	b.mu.Lock()
	if b.busy < b.lanes {
		b.busy++
		b.mu.Unlock()
		cmd := script.Run(ctx, b.scripter, keys, args...)
		b.laneDone()
		return cmd
	}
	q := &queuedCall{ctx: ctx, script: script, keys: keys, args: args, done: make(chan struct{})}
	if n := len(b.queue); n >= compactAt && n&(n-1) == 0 {
		b.compactLocked()
	}
	b.queue = append(b.queue, q)
	b.mu.Unlock()

	select {
	case <-q.done:
		return q.cmd
	case <-ctx.Done():
		if q.state.CompareAndSwap(callQueued, callAbandoned) {
			cmd := redis.NewCmd(ctx) // never sent: nothing ran
			cmd.SetErr(context.Cause(ctx))
			return cmd
		}
		<-q.done // on the wire: its batch ends by this caller's deadline at the latest
		return q.cmd
	}
}

// compactAt is the queue length from which calls that gave up are dropped from the queue
// (checked at every power of two, so the work is amortised): on a hung Redis the lanes do not
// come back before their deadlines, and callers that left must not pile up meanwhile.
const compactAt = 1024

// compactLocked drops the calls whose callers gave up. b.mu must be held.
func (b *batcher) compactLocked() {
	kept := b.queue[:0]
	for _, q := range b.queue {
		if q.state.Load() != callAbandoned {
			kept = append(kept, q)
		}
	}
	clear(b.queue[len(kept):]) // let the dropped calls be collected
	b.queue = kept
}

// laneDone frees a lane, or hands it the queued calls as one batch.
func (b *batcher) laneDone() {
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.busy--
		b.mu.Unlock()
		return
	}
	batch := b.queue
	b.queue = nil
	b.mu.Unlock()
	go b.send(batch) // the lane stays busy until the batch returns
}

// send pipelines the calls of batch whose callers still wait, then frees its lane.
func (b *batcher) send(batch []*queuedCall) {
	defer b.laneDone()
	live := batch[:0]
	for _, q := range batch {
		if q.state.CompareAndSwap(callQueued, callSent) {
			live = append(live, q)
		}
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := batchContext(live)
	defer cancel()
	pipe := b.client.Pipeline()
	for _, q := range live {
		q.cmd = q.script.EvalSha(ctx, pipe, q.keys, q.args...) // queued; answered by Exec
	}
	_, _ = pipe.Exec(ctx) // each command carries its own reply or error
	for _, q := range live {
		if redis.HasErrorPrefix(q.cmd.Err(), "NOSCRIPT") {
			// The server lost its script cache (restart, SCRIPT FLUSH): EVAL loads it again.
			q.cmd = q.script.Eval(q.ctx, b.scripter, q.keys, q.args...)
		}
		close(q.done)
	}
}

// batchContext bounds a batch by the earliest deadline among its callers (none if no caller
// has one). Values (tracing) come from the first caller; cancellation comes from none, since
// a command on the wire is waited for.
func batchContext(live []*queuedCall) (context.Context, context.CancelFunc) {
	var earliest time.Time
	for _, q := range live {
		if d, ok := q.ctx.Deadline(); ok && (earliest.IsZero() || d.Before(earliest)) {
			earliest = d
		}
	}
	ctx := context.WithoutCancel(live[0].ctx)
	if earliest.IsZero() {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, earliest)
}
