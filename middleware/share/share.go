// Package share links response sharing (OnBusy share) into a service: while a request holds a
// rule's key, its duplicates wait and then get its response instead of running the handler. A
// service with share rules sets flmw.ResponseSharing = share.New in main (middleware.New
// refuses such rules without it), so that the others do not link the package. In one process
// the duplicates join the first request's singleflight; across processes the holder stores its
// response under Prefix + "replay:" + the key before it releases, for Replay (docs/share.md).
package share

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/zeromicro/go-zero/core/logx"
	"golang.org/x/sync/singleflight"
	"google.golang.org/grpc/codes"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/waitbudget"
	"github.com/flightlock/flightlock/middleware/internal/sharehook"
	"github.com/flightlock/flightlock/middleware/rules"
)

// New is response sharing for one Middleware, as middleware.ResponseSharing takes it.
func New(c sharehook.Config) sharehook.Group {
	return &group{conf: c}
}

type group struct {
	conf    sharehook.Config
	flights singleflight.Group // one run per key in this process
}

func (g *group) Rule(locks sharehook.Locks, r rules.Rule, plan *rules.Plan) sharehook.Rule {
	classes, _ := rules.ParseReplayStatus("", r.ReplayStatus) // checked by rules.CheckLockSettings
	return &rule{g: g, locks: locks, plan: plan, classes: classes, maxBytes: r.ReplayMaxBytes, ttl: r.Replay,
		// Rule.Wait, else the section's (even with WithLocker, whose wait is unknown).
		wait: cmp.Or(r.Wait, g.conf.Wait),
	}
}

// rule is the sharing of one transport's part of a share rule; classes[2] stores 2xx answers.
type rule struct {
	g        *group
	locks    sharehook.Locks
	plan     *rules.Plan
	classes  [6]bool
	maxBytes int
	ttl      time.Duration
	wait     time.Duration
}

// fingerprint identifies a request's payload: what a duplicate must repeat exactly.
func fingerprint(parts ...[]byte) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:", len(p))
		h.Write(p)
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

// panicError carries a handler's panic out of a shared flight: the request that ran it and its
// duplicates all answer 500; none hangs.
type panicError struct {
	value any
	stack []byte
}

func (p *panicError) Error() string {
	return fmt.Sprintf("flightlock: the shared handler panicked: %v", p.value)
}

// errLeaderLeft ends a shared run whose leading request left (gone, or answered busy) before
// the handler ran for it; the duplicates still waiting start another run instead.
var errLeaderLeft = errors.New("flightlock: the request leading a shared run left before it ran")

// errShareWait answers a duplicate whose wait for the run in flight used up its budget.
var errShareWait = fmt.Errorf("%w: the request in flight with this key did not finish within Wait", flightlock.ErrBusy)

// turn is one request's part in the shared runs of its key. A run it leads runs the handler
// only while the request still waits (start); once the handler runs, the request waits for it.
type turn struct {
	mu     sync.Mutex
	state  int                // guarded by mu: turnWaiting, turnRunning or turnLeft
	led    bool               // guarded by mu: the request leads a run (it leads one at most)
	cancel context.CancelFunc // guarded by mu: ends the lock wait of the run the request leads
}

const (
	turnWaiting = iota
	turnRunning // the handler runs, or ran, for this request
	turnLeft    // the request was answered without a run of its own: busy, or its context ended
)

// lead returns the lock-wait context of a run the request leads (leave cancels it), or false.
func (t *turn) lead(ctx context.Context) (context.Context, context.CancelFunc, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.state == turnLeft {
		return nil, nil, false
	}
	lctx, cancel := context.WithCancel(ctx)
	t.led, t.cancel = true, cancel
	return lctx, cancel, true
}

func (t *turn) start() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.state == turnLeft {
		return false
	}
	t.state = turnRunning
	return true
}

// abandon marks the request, whose handler ran, as gone: its run answers nobody else.
func (t *turn) abandon() {
	t.mu.Lock()
	t.state = turnLeft
	t.mu.Unlock()
}

// leave marks the request as answered without a run and ends the lock wait of a run it leads,
// unless the handler runs for it or, with lockBounds, the Locker ends that wait itself; it
// reports whether the request left.
func (t *turn) leave(lockBounds bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.state == turnRunning || lockBounds && t.led {
		return false
	}
	t.state = turnLeft
	if t.cancel != nil {
		t.cancel()
	}
	return true
}

func (t *turn) is(s int) (in, led bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.state == s, t.led
}

// share runs a share rule for one request locked on keys, its stored response kept under
// replayKeys: it replays a stored response, or joins (or leads: see lead, which runs run) the
// flight of its key in this process, waiting within its own wait budget, then answering 409 /
// Aborted. Each waits on its own context, so one that leaves fails no other (errLeaderLeft).
func (rl *rule) share(ctx context.Context, keys, replayKeys []string, print string, run runFunc) (*record, error) {
	rkey := rules.ReplayPrefix + strings.Join(replayKeys, "+") // under the prefix of the rule's lock keys
	if rec, err := rl.load(ctx, rkey); err != nil {
		rl.locks.LogError(ctx, "reading a stored response failed; running the request", err)
	} else if rec != nil {
		rl.locks.CountShared("stored")
		return rec, matchPrint(rec, print)
	}
	budget := time.NewTimer(time.Until(waitbudget.Deadline(ctx, time.Now(), rl.wait)))
	defer budget.Stop()
	t := new(turn)
	for retry := false; ; retry = true {
		ch := rl.g.flights.DoChan(rkey, func() (any, error) { return rl.lead(ctx, t, keys, rkey, run) })
		var res singleflight.Result
		select {
		case res = <-ch:
		case <-budget.C:
			// The Locker's wait of the first run this request leads ends at this deadline with
			// the holder's Retry-After: that answer is left to it. Anyone else gives up here.
			if t.leave(!retry) {
				return nil, errShareWait
			}
			res = <-ch // the run this request leads: its own answer
		case <-ctx.Done():
			if t.leave(false) {
				return nil, errors.Join(flightlock.ErrBusy, ctx.Err())
			}
			res = <-ch // the handler runs for this very request: its own answer
		}
		left, led := t.is(turnLeft)
		if errors.Is(res.Err, errLeaderLeft) {
			switch {
			case !left:
				continue // the request that led the run left before it ran: lead or join the next
			case ctx.Err() != nil:
				return nil, errors.Join(flightlock.ErrBusy, ctx.Err())
			case led && errors.Is(res.Err, flightlock.ErrBusy):
				return nil, res.Err // its own wait for the lock ran out: busy, with the holder's Retry-After
			default:
				return nil, errShareWait
			}
		}
		if res.Err != nil {
			return nil, res.Err
		}
		rec := *res.Val.(*record) // a copy: replayed differs per caller
		if !led {
			rec.replayed = true
			rl.locks.CountShared("inflight")
		}
		return &rec, matchPrint(&rec, print)
	}
}

// matchPrint refuses a record produced by a request with another payload.
func matchPrint(rec *record, print string) error {
	if rec.Print != print {
		return sharehook.ErrPayloadMismatch
	}
	return nil
}

// runFunc runs the handler of a share rule on the lease's context, with the fence of the
// request's first lock, and says whether the rule stores the record it returns.
type runFunc func(ctx context.Context, fence int64) (rec *record, stores bool, err error)

// lead is the leader's run of a share rule for the request of ctx and t: it takes the lock,
// replays what another process's holder stored, or else runs the handler (on the lease's
// context) and stores the record before the release. The handler runs only while the request
// waits, else the run ends with errLeaderLeft. A panic is a panicError, logged once: all get 500.
func (rl *rule) lead(ctx context.Context, t *turn, keys []string, rkey string, run runFunc) (rec *record, err error) {
	lctx, cancel, ok := t.lead(ctx)
	if !ok {
		return nil, errLeaderLeft
	}
	defer cancel() // after the release below: it ends the lease's context, parent of the handler's
	h, err := rl.locks.Lock(lctx, keys)
	if err != nil {
		if lctx.Err() != nil || errors.Is(err, flightlock.ErrBusy) {
			// The request left or its wait ran out (busy): later duplicates, with wait left, go on.
			t.leave(false)
			return nil, fmt.Errorf("%w: %w", errLeaderLeft, err)
		}
		return nil, err
	}
	defer rl.locks.Release(ctx, h)
	if stored, err := rl.load(ctx, rkey); err == nil && stored != nil {
		rl.locks.CountShared("stored")
		return stored, nil
	}
	if lctx.Err() != nil || !t.start() {
		t.leave(false)
		return nil, errLeaderLeft
	}
	var stores bool
	func() {
		defer func() {
			if v := recover(); v != nil {
				pe := &panicError{value: v, stack: debug.Stack()}
				logx.WithContext(ctx).Errorf("%v\n%s", v, pe.stack)
				rec, err = nil, pe
			}
		}()
		rec, stores, err = run(h.Ctx, h.Group.Leases()[0].Fence())
	}()
	if err != nil {
		return nil, err
	}
	if ctx.Err() != nil && rec.cutShort() {
		// The request left while its handler ran on its context and was cut short: that answer
		// is the request's alone. Duplicates run the handler again; nothing is stored.
		t.abandon()
		return nil, fmt.Errorf("%w: it left while its handler ran", errLeaderLeft)
	}
	// Asked of the leases, not the context's cause: a request whose own context ended first
	// keeps Canceled as the cause after a later loss.
	if h.Group.Lost() {
		// Another holder may have run since and stored the response duplicates must get (the
		// store refuses a later grant's record for a loss after this look).
		rl.locks.LogError(ctx, "the lock was lost while the handler ran; its response is not stored for duplicates", flightlock.ErrLost)
		return rec, nil
	}
	rl.storeRecord(ctx, rkey, rec, stores)
	return rec, nil
}

// storeRecord stores rec for Replay if the rule stores its kind and it fits, before the release.
func (rl *rule) storeRecord(ctx context.Context, rkey string, rec *record, stores bool) {
	switch {
	case !stores:
		return
	case len(rec.Body) > rl.maxBytes:
		rl.locks.CountShared("too_large")
		rl.locks.LogError(ctx, "response too large to share across processes",
			fmt.Errorf("%d bytes, ReplayMaxBytes %d", len(rec.Body), rl.maxBytes))
		return
	}
	if err := rl.save(context.WithoutCancel(ctx), rkey, rec, rl.ttl); err != nil {
		rl.locks.LogError(ctx, "storing the response for duplicates failed", err)
	}
}

// record is a response as shared and stored: for REST the status, headers and body; for zrpc
// the reply message or the error status. Fence is the fence of the run that produced it, Print
// the fingerprint of that request's payload.
type record struct {
	Status int         `json:"s,omitempty"` // HTTP status
	Header http.Header `json:"h,omitempty"`
	Body   []byte      `json:"b,omitempty"`  // HTTP body, or the zrpc reply's wire bytes
	Type   string      `json:"t,omitempty"`  // zrpc: the reply message's full name
	Code   int         `json:"c,omitempty"`  // zrpc: the status code of an error reply
	Msg    string      `json:"m,omitempty"`  // zrpc: its message
	St     []byte      `json:"st,omitempty"` // zrpc: its whole status (google.rpc.Status), details included
	Fence  int64       `json:"f"`
	Print  string      `json:"p"`

	replayed bool        // not stored: the record came from another run than the caller's own
	own      http.Header // not stored: every header of the leader's own response
	reply    any         // not stored: the zrpc reply the leader's handler returned
	err      error       // not stored: the zrpc error the leader's handler returned
	silent   bool        // not stored: the REST handler wrote nothing
}

// cutShort reports an answer that may tell of its request's end rather than of the operation:
// a handler that wrote nothing, a 5xx, a zrpc Canceled, DeadlineExceeded or Unknown. Any other
// answer stands (a redirect, a 4xx: the operation may be done).
func (r *record) cutShort() bool {
	switch {
	case r.err != nil:
		c := codes.Code(r.Code)
		return c == codes.Canceled || c == codes.DeadlineExceeded || c == codes.Unknown
	case r.Type != "": // a zrpc reply
		return false
	}
	return r.silent || r.Status >= 500
}

// load returns the stored response of key, nil when there is none. A share rule keeps
// responses in the response store of the store it locks in, so that they fail over with its
// locks; keys are relative to the prefix of the rule's lock keys.
func (rl *rule) load(ctx context.Context, key string) (*record, error) {
	if rl.locks.Responses == nil {
		return nil, rl.locks.NoResponses
	}
	v, err := rl.locks.Responses.Load(ctx, key)
	if err != nil || v == nil {
		return nil, err
	}
	var rec record
	if err := json.Unmarshal(v, &rec); err != nil {
		return nil, fmt.Errorf("stored response of %q: %w", key, err)
	}
	rec.replayed = true
	return &rec, nil
}

// save stores rec under key for at least ttl, unless key holds something else than a stored
// response (a lock whose key renders as this one) or the record of a later grant.
func (rl *rule) save(ctx context.Context, key string, rec *record, ttl time.Duration) error {
	if rl.locks.Responses == nil {
		return rl.locks.NoResponses
	}
	b, err := json.Marshal(rec) // ends with "f" and "p", as lockstore.ResponseStore needs
	if err != nil {
		return err
	}
	return rl.locks.Responses.Save(ctx, key, b, rec.Fence, ttl)
}
