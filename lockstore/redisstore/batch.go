package redisstore

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultLanes is how many script calls a RedisStore sends at once before it batches.
const DefaultLanes = 4

// pipeliner is what batching needs from the client; every go-redis client has it.
type pipeliner interface {
	Pipeline() redis.Pipeliner
}

// batcher sends concurrent callers' scripts: up to lanes at once as plain go-redis calls on own
// connections and contexts (no late hook: a reply go-redis gave up on is gone). Others queue;
// a lane whose call or batch returns sends the whole queue as one pipeline: under load N round
// trips and their system calls (a lock's CPU) become one.
//
// Nobody waits past their own deadline, even on a hung Redis (go-redis's AutoPipeline makes a
// call wait for its batch however short its context). A batch is bounded by its callers'
// latest deadline (batchContext), so a neighbour's short one never fails a call early, and
// each caller leaves on its own context:
//   - a call whose context ends while queued is dropped, never sent;
//   - a call whose context ends on the wire returns at once with context.Cause. The command
//     still runs, and the lane hands its reply (or the batch's failure) to the call's late
//     hook, in a goroutine of its own so a slow clean-up never holds the lane. An acquire
//     needs one (RedisStore.releaseOnReply), or a lock nobody learns of stays held until its
//     TTL; a late refresh extends a lock its holder still releases, a late release did its job.
type batcher struct {
	client   pipeliner
	scripter redis.Scripter // the same client, for calls on a free lane
	lanes    int

	mu    sync.Mutex
	busy  int           // guarded by mu: lanes with a call or a batch on the wire
	queue []*queuedCall // guarded by mu: calls waiting for a lane, oldest first
}

// Lifecycle of a queued call, each step a CAS deciding the race between lane and caller:
// queued -> abandoned (the caller left first; never sent), or queued -> sent, then sent ->
// answered (the reply goes to the caller) or sent -> left (the caller left; it goes to late).
const (
	callQueued int32 = iota
	callAbandoned
	callSent
	callAnswered
	callLeft
)

type queuedCall struct {
	ctx    context.Context
	script *redis.Script
	keys   []string
	args   []any
	late   func(*redis.Cmd) // nil, or the clean-up of a reply that arrives after the caller left
	cmd    *redis.Cmd       // its reply; written by the lane, read by the caller after done
	done   chan struct{}    // closed by the lane once cmd has its reply and the caller waits
	state  atomic.Int32
}

func newBatcher(client Client, lanes int) *batcher {
	p, ok := client.(pipeliner)
	if !ok || lanes <= 0 {
		return nil // calls go straight to the client
	}
	return &batcher{client: p, scripter: client, lanes: lanes}
}

// run runs script on a free lane or in the next batch; late, if not nil, is its late hook.
func (b *batcher) run(ctx context.Context, script *redis.Script, keys []string, late func(*redis.Cmd), args ...any) *redis.Cmd {
	b.mu.Lock()
	if b.busy < b.lanes {
		b.busy++
		b.mu.Unlock()
		cmd := script.Run(ctx, b.scripter, keys, args...)
		b.laneDone()
		return cmd
	}
	q := &queuedCall{ctx: ctx, script: script, keys: keys, args: args, late: late, done: make(chan struct{})}
	if n := len(b.queue); n >= compactAt && n&(n-1) == 0 {
		// Drop the calls whose callers gave up. DeleteFunc clears the tail: they can be collected.
		b.queue = slices.DeleteFunc(b.queue, func(q *queuedCall) bool { return q.state.Load() == callAbandoned })
	}
	b.queue = append(b.queue, q)
	b.mu.Unlock()

	select {
	case <-q.done:
		return q.cmd
	case <-ctx.Done():
		// Queued: never sent, nothing ran. On the wire: the lane hands the reply to late.
		if q.state.CompareAndSwap(callQueued, callAbandoned) || q.state.CompareAndSwap(callSent, callLeft) {
			cmd := redis.NewCmd(ctx)
			cmd.SetErr(context.Cause(ctx))
			return cmd
		}
		<-q.done // answered: the lane is closing done
		return q.cmd
	}
}

// compactAt is the queue length from which abandoned calls are dropped (at each power of two,
// amortised), so that on a hung Redis they do not pile up.
const compactAt = 1024

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
	pipeline(ctx, b.client, live)
	for _, q := range live {
		if q.state.CompareAndSwap(callSent, callAnswered) {
			close(q.done)
		} else if q.late != nil {
			go q.late(q.cmd) // its caller left while it was on the wire; never on the lane
		}
	}
}

// pipeline runs calls (each callSent) in one pipeline on client, setting each one's cmd.
func pipeline(ctx context.Context, client pipeliner, calls []*queuedCall) {
	pipe := client.Pipeline()
	for _, q := range calls {
		q.cmd = q.script.EvalSha(ctx, pipe, q.keys, q.args...) // queued; answered by Exec
	}
	_, _ = pipe.Exec(ctx) // each command carries its own reply or error

	// The server lost its script cache: EVAL loads the scripts again in one more pipeline, but
	// not for a call whose caller left (nothing ran); its hook sees the NOSCRIPT error.
	var again []*queuedCall
	for _, q := range calls {
		if redis.HasErrorPrefix(q.cmd.Err(), "NOSCRIPT") && q.state.Load() == callSent {
			again = append(again, q)
		}
	}
	if len(again) > 0 {
		pipe := client.Pipeline()
		for _, q := range again {
			q.cmd = q.script.Eval(ctx, pipe, q.keys, q.args...)
		}
		_, _ = pipe.Exec(ctx)
	}
}

// batchContext is a batch's context (see batcher): its callers' latest deadline (none if one
// has none), with the first's values.
func batchContext(live []*queuedCall) (context.Context, context.CancelFunc) {
	ctx := context.WithoutCancel(live[0].ctx)
	var latest time.Time
	for _, q := range live {
		d, ok := q.ctx.Deadline()
		if !ok {
			return ctx, func() {}
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(ctx, latest)
}
