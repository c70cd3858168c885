package middleware

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/logx"
	"golang.org/x/sync/singleflight"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/etcdstore"
	"github.com/flightlock/flightlock/internal/waitbudget"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/middleware/rules"
)

// OnBusy "share": while a request holds the key, its duplicates wait (within the rule's Wait and
// their own deadline) and then get its response instead of running the handler. In one process
// the duplicates join the first request's flight (golang.org/x/sync/singleflight, in m.flights);
// across processes they queue for the lock, and the holder stores its response in the rule's
// store (Redis or etcd) under Prefix + "replay:" + the key (on etcd, after Etcd.Key) before it
// releases, for the rule's Replay time, so that a duplicate that gets the lock next, or
// arrives later, replays it without running the handler.

// ReplayedHeader marks a response that a duplicate received from the request that ran the
// handler (in this process or another), as payment APIs mark idempotent replays.
const ReplayedHeader = "Idempotent-Replayed"

// ErrPayloadMismatch answers a request of an OnBusy share rule whose key was used by a request
// with another payload (an idempotency key reused for a different request): 422
// Unprocessable Entity / InvalidArgument, as the IETF Idempotency-Key draft says.
var ErrPayloadMismatch = errors.New("flightlock: this key was used by a request with a different payload")

// record is a response as shared and stored: for REST the status, headers and body; for zrpc
// the reply message (type and bytes) or the error status. Fence is the fence of the run that
// produced it; Print the fingerprint of that request's payload.
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
}

// unshared headers belong to one response and are never replayed: a cookie is its client's,
// and the others describe the transfer, not the content.
var unshared = []string{"Set-Cookie", "Content-Length", "Date", "Connection", "Transfer-Encoding", "Trailer"}

// shareable is h without the unshared headers.
func shareable(h http.Header) http.Header {
	c := h.Clone()
	for _, k := range unshared {
		c.Del(k)
	}
	return c
}

// sharePolicy is what a share rule stores: the status classes (2 for 2xx, ...) and the size
// bound of a body, and for how long.
type sharePolicy struct {
	classes  [6]bool
	maxBytes int
	ttl      time.Duration
	wait     time.Duration // Rule.Wait, 0 for the section's (see shareWait)
}

func (p sharePolicy) storesHTTP(status int) bool {
	return status >= 100 && status < 600 && p.classes[status/100]
}

// fingerprint identifies a request's payload: what a duplicate must repeat exactly.
func fingerprint(parts ...[]byte) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(strconv.Itoa(len(p))))
		h.Write([]byte{':'})
		h.Write(p)
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

// replayStore is where share rules keep responses for duplicates in other processes: the
// store the rule locks in (redisReplays here, etcdReplays in share_etcd.go), so that a rule
// needs no second store and its responses fail over with its locks.
type replayStore interface {
	// load returns the stored response of key, nil when there is none.
	load(ctx context.Context, key string) (*record, error)
	// save stores rec under key for at least ttl, unless key holds something that is not a
	// stored response (a lock whose key renders as this one): that is never overwritten.
	save(ctx context.Context, key string, rec *record, ttl time.Duration) error
}

// newReplayStores returns the replay store of each base Locker's store, by store name, built
// once at start-up (no I/O). etcdPrefix is put before the keys of an etcd store, as its base
// Locker puts it before lock keys (Lock.Etcd.Key). A store that cannot keep responses gets a
// replay store that refuses, with the reason: New names it for a share rule in the config, and
// a share rule built in Go on it shares within its process only, its failures logged.
func newReplayStores(bases map[string]*flightlock.Locker, etcdPrefix string) map[string]replayStore {
	stores := make(map[string]replayStore, len(bases))
	for name, base := range bases {
		switch s := base.Store().(type) {
		case *lockstore.RedisStore:
			stores[name] = &redisReplays{client: s.Client()}
		case *etcdstore.Store:
			stores[name] = newEtcdReplays(s.Client(), etcdPrefix)
		default:
			stores[name] = refusedReplays{fmt.Errorf("OnBusy share stores responses in the rule's store, "+
				"a Redis or etcd store: the lock store %T is neither", s)}
		}
	}
	return stores
}

// refusedReplays is the replay store of a lock store that cannot keep responses.
type refusedReplays struct{ err error }

func (r refusedReplays) load(context.Context, string) (*record, error) { return nil, r.err }

func (r refusedReplays) save(context.Context, string, *record, time.Duration) error { return r.err }

// replaysOf is the replay store of the store rl locks in (every base store has one).
func (m *Middleware) replaysOf(rl *rule) replayStore { return m.replays[rl.stats.store] }

// decodeRecord reads the stored response v of key.
func decodeRecord(key string, v []byte) (*record, error) {
	var rec record
	if err := json.Unmarshal(v, &rec); err != nil {
		return nil, fmt.Errorf("stored response of %q: %w", key, err)
	}
	rec.replayed = true
	return &rec, nil
}

// Scripts on the store's own client (lockstore.Client is a Scripter: GET and SET through
// one-line scripts work on every go-redis client, Cluster included; the key is the only key).
var (
	replayGet = redis.NewScript(`return redis.call('GET', KEYS[1])`)
	// replaySet never overwrites what is not a stored response (a record is JSON: '{'): a lock
	// of another rule whose key renders as this one's replay key keeps its value and its owner.
	// Nor does it replace the record of a later grant of the lock (a larger fence than ARGV[3];
	// a save without a fence, of a degraded run, compares nothing): a holder that lost its lock
	// while its handler ran must not overwrite the response of the holder after it.
	// The fence is the record's "f", which json.Marshal writes just before the last field, "p"
	// (a hex fingerprint); strings in a record are JSON-escaped, so the pattern cannot match
	// inside one.
	replaySet = redis.NewScript(`local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 1) ~= '{' then
  return redis.error_reply('flightlock: ' .. KEYS[1] .. ' holds a lock, not a stored response')
end
if v then
  local f = tonumber(string.match(v, '"f":(%-?%d+),"p":"[^"]*"}$') or '')
  local mine = tonumber(ARGV[3])
  if f and mine > 0 and f > mine then
    return 0
  end
end
return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])`)
)

// redisReplays keeps responses in Redis, on the lock store's client.
type redisReplays struct {
	client lockstore.Client
}

func (s *redisReplays) load(ctx context.Context, key string) (*record, error) {
	v, err := replayGet.Run(ctx, s.client, []string{key}).Text()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return decodeRecord(key, []byte(v))
}

// save stores rec under key for ttl, in milliseconds.
func (s *redisReplays) save(ctx context.Context, key string, rec *record, ttl time.Duration) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	// Bounded as the etcd save is: it runs under the lock, on a context without the request's
	// cancellation.
	ctx, cancel := context.WithTimeout(ctx, replaySaveBound)
	defer cancel()
	return replaySet.Run(ctx, s.client, []string{key}, b, max(ttl.Milliseconds(), 1), rec.Fence).Err()
}

// panicError carries a handler's panic out of a shared flight: the request that ran it and its
// duplicates all answer 500, none hangs.
type panicError struct {
	value any
	stack []byte
}

func (p *panicError) Error() string {
	return fmt.Sprintf("flightlock: the shared handler panicked: %v", p.value)
}

// errLeaderLeft ends a shared run whose leading request left (its client went away, or its
// wait ran out and it was answered busy) before the handler ran for it: the handler does not
// run for a request that is no longer there, and the duplicates still waiting start another
// run, led by one of them, instead of getting that request's error.
var errLeaderLeft = errors.New("flightlock: the request leading a shared run left before it ran")

// errShareWait answers a duplicate whose wait for the run in flight used up the rule's wait
// budget: 409 with Retry-After / Aborted, as a wait for the lock does.
var errShareWait = fmt.Errorf("%w: the request in flight with this key did not finish within Wait", flightlock.ErrBusy)

// turn is one request's part in the shared runs of its key. A run that the request leads runs
// the handler for it only while the request still waits for the answer (start), so that no
// handler runs for a request already answered, busy or gone; once the handler runs, the
// request waits for it to return, as it would without a share rule.
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

// lead returns the context of the lock wait of a run the request leads, which leave cancels,
// or false when the request already left.
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

// start marks the handler as running for the request, unless it left.
func (t *turn) start() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.state == turnLeft {
		return false
	}
	t.state = turnRunning
	return true
}

// leave marks the request as answered without a run and ends the lock wait of a run it leads,
// unless the handler already runs for it, or unless it leads a run and lockBounds says that the
// Locker ends that run's wait itself; it reports whether the request left.
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

// is reports whether the request is in state s, and whether it led a run.
func (t *turn) is(s int) (in, led bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.state == s, t.led
}

// shareWait is the wait budget of rl: its Wait, else the section's (with WithLocker, the
// section's default where the injected Locker may have another; the root package does not
// tell its Locker's wait).
func (m *Middleware) shareWait(rl *rule) time.Duration { return cmp.Or(rl.share.wait, m.conf.Wait) }

// share runs a share rule for one request: replay a stored response, or join (or lead) the
// flight of its key in this process. run is the leader's work (see lead): take the lock on
// the context it is given, replay what a previous holder stored, or run the handler and store
// its response; it returns the record.
//
// A request waits for the run it joined within its own wait budget (the rule's Wait from the
// moment it came, ending before its deadline as a wait for the lock does) and then answers
// 409 / Aborted: contention stays below 500, and the caller gets it before its deadline. Each
// request waits on its own context, so one that leaves fails no other: when the request
// leading the run leaves before the handler ran for it, the run ends with errLeaderLeft and
// the others start another.
func (m *Middleware) share(ctx context.Context, rl *rule, rkey, print string,
	run func(ctx context.Context, t *turn) (*record, error)) (*record, error) {
	if rec, err := m.replaysOf(rl).load(ctx, rkey); err != nil {
		m.logs.error(ctx, rl.stats, "reading a stored response failed; running the request", err)
	} else if rec != nil {
		m.countShare(rl, "stored")
		return rec, matchPrint(rec, print)
	}
	// A wait for a run in flight ends as a wait for the lock does.
	budget := time.NewTimer(time.Until(waitbudget.Deadline(ctx, time.Now(), m.shareWait(rl))))
	defer budget.Stop()
	t := new(turn)
	for retry := false; ; retry = true {
		ch := m.flights.DoChan(rkey, func() (any, error) { return run(ctx, t) })
		var res singleflight.Result
		select {
		case res = <-ch:
		case <-budget.C:
			// The first run this request leads waits for the lock within the Locker's wait, which
			// ends at this same deadline and answers busy with the holder's TTL (Retry-After):
			// that answer is left to it. A duplicate, or the leader of a later run (whose Locker
			// wait began after the request came), gives up here.
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
			m.countShare(rl, "inflight")
		}
		return &rec, matchPrint(&rec, print)
	}
}

// matchPrint refuses a record produced by a request with another payload.
func matchPrint(rec *record, print string) error {
	if rec.Print != print {
		return ErrPayloadMismatch
	}
	return nil
}

func (m *Middleware) countShare(rl *rule, how string) {
	if metricsOn() {
		sharedTotal.Inc(rl.stats.name, rl.stats.template, rl.stats.store, how)
	}
}

// replayKey is the key of the stored response of a request locked on keys.
func (m *Middleware) replayKey(keys []string) string {
	return m.prefix + rules.ReplayPrefix + strings.Join(keys, "+")
}

// serveShared is serveHTTP for a share rule.
func (m *Middleware) serveShared(rl *rule, w http.ResponseWriter, r *http.Request, next http.HandlerFunc, keys []string) {
	ctx := r.Context()
	body, err := readSharedBody(r)
	if err != nil {
		writeHTTPError(w, r, err)
		return
	}
	print := fingerprint([]byte(r.Method), []byte(r.URL.Path), []byte(r.URL.RawQuery), body)
	replayKeys := keys // the lock's keys; a template's values as written, when it has some
	if rl.HTTPReplayKeys != nil {
		raw, err := rl.HTTPReplayKeys(r)
		if err != nil {
			writeHTTPError(w, r, err)
			return
		}
		replayKeys = raw
	}
	rkey := m.replayKey(replayKeys)

	rec, err := m.share(ctx, rl, rkey, print, func(ctx context.Context, t *turn) (*record, error) {
		return m.runHTTPShared(ctx, t, rl, r, body, next, keys, rkey, print)
	})
	var pe *panicError
	switch {
	case errors.As(err, &pe):
		http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
		return
	case err != nil: // ErrPayloadMismatch among them: 422
		writeHTTPError(w, r, err)
		return
	}
	header := rec.Header
	if !rec.replayed && rec.own != nil {
		header = rec.own // the request that ran the handler answers with all of its headers
	}
	for k, vs := range header {
		w.Header()[k] = vs
	}
	if rec.replayed {
		w.Header().Set(ReplayedHeader, "true")
	}
	w.WriteHeader(rec.Status)
	_, _ = w.Write(rec.Body)
}

// readSharedBody reads r's body for the fingerprint, up to rules.MaxBodyBytes as the rules' keys read
// it (go-zero's MaxBytes checks Content-Length only: a chunked body has none), and puts it
// back for the handler. A longer body is refused 400 (ErrInvalidKey), unread past the bound.
func readSharedBody(r *http.Request) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, rules.MaxBodyBytes+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: read request body: %w", flightlock.ErrInvalidKey, err)
	case len(body) > rules.MaxBodyBytes:
		return nil, fmt.Errorf("%w: request body over %d bytes", flightlock.ErrInvalidKey, rules.MaxBodyBytes)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return body, nil
}

// runHTTPShared is the leader's run of a REST share rule (see share and lead); ctx is r's.
func (m *Middleware) runHTTPShared(ctx context.Context, t *turn, rl *rule, r *http.Request, body []byte,
	next http.HandlerFunc, keys []string, rkey, print string) (*record, error) {
	return m.lead(ctx, t, rl, keys, rkey, func(ctx context.Context, fence int64) (*record, bool, error) {
		rr := &recorder{header: http.Header{}, status: http.StatusOK}
		r = r.WithContext(ctx)
		r.Body = io.NopCloser(bytes.NewReader(body))
		next(rr, r)
		rec := &record{Status: rr.status, Header: shareable(rr.header), Body: rr.body.Bytes(), Fence: fence,
			Print: print, own: rr.header}
		return rec, rl.share.storesHTTP(rec.Status), nil
	})
}

// lead is the leader's run of a share rule, for both transports, for the request of ctx and t:
// it takes the lock, replays what a holder in another process stored just before releasing, or
// else runs the handler (run, on the lease's context, with its fence) and stores the record
// when stores says the rule keeps responses of its kind, before the lock is released. The
// handler runs with the leading request's context (its values and deadline) and only while
// that request still waits: when it left first, the run ends with errLeaderLeft and the lock,
// if taken, is released unused. A panic in run becomes a panicError, logged once, as go-zero's
// recover handler would log it: every duplicate answers 500.
func (m *Middleware) lead(ctx context.Context, t *turn, rl *rule, keys []string, rkey string,
	run func(ctx context.Context, fence int64) (rec *record, stores bool, err error)) (rec *record, err error) {
	lctx, cancel, ok := t.lead(ctx)
	if !ok {
		return nil, errLeaderLeft
	}
	defer cancel() // after the release below: it ends the lease's context, parent of the handler's
	h, err := m.lock(lctx, rl, keys)
	if err != nil {
		if lctx.Err() != nil || errors.Is(err, flightlock.ErrBusy) {
			// The request left, or its client went away, while it waited, or its own wait for
			// the lock ran out (it answers busy, with the holder's Retry-After): duplicates
			// that came after it have wait left, and go on without it (they were
			// all answered 409 at the leader's deadline).
			t.leave(false)
			return nil, fmt.Errorf("%w: %w", errLeaderLeft, err)
		}
		return nil, err
	}
	defer m.release(ctx, rl, h)
	if stored, err := m.replaysOf(rl).load(ctx, rkey); err == nil && stored != nil {
		m.countShare(rl, "stored")
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
		rec, stores, err = run(h.ctx, fenceOf(h))
	}()
	if err != nil {
		return nil, err
	}
	// Asked of the leases, not the context's cause: a request whose own context ended first
	// keeps Canceled as the cause after a later loss.
	if h.g != nil && h.g.Lost() {
		// The lock was lost while the handler ran: another holder may have run it since and
		// stored its response, which duplicates must get, not this one. The save
		// itself refuses to replace a record of a later grant (replaySet), for a loss that
		// comes after this look.
		m.logs.error(ctx, rl.stats, "the lock was lost while the handler ran; its response is not stored for duplicates", flightlock.ErrLost)
		return rec, nil
	}
	m.storeRecord(ctx, rl, rkey, rec, stores)
	return rec, nil
}

// storeRecord stores rec for the rule's Replay time when the rule stores its kind of response
// and it fits the size bound, before the lock is released (the caller releases after).
func (m *Middleware) storeRecord(ctx context.Context, rl *rule, rkey string, rec *record, stores bool) {
	p := rl.share
	switch {
	case !stores:
		return
	case len(rec.Body) > p.maxBytes:
		m.countShare(rl, "too_large")
		m.logs.error(ctx, rl.stats, "response too large to share across processes",
			fmt.Errorf("%d bytes, ReplayMaxBytes %d", len(rec.Body), p.maxBytes))
		return
	}
	if err := m.replaysOf(rl).save(context.WithoutCancel(ctx), rkey, rec, p.ttl); err != nil {
		m.logs.error(ctx, rl.stats, "storing the response for duplicates failed", err)
	}
}

// fenceOf is the fence of a request's first lock, 0 without one.
func fenceOf(h held) int64 {
	if h.g == nil || len(h.g.Leases()) == 0 {
		return 0
	}
	return h.g.Leases()[0].Fence()
}

// recorder captures a handler's response for sharing.
type recorder struct {
	header http.Header
	status int
	wrote  bool
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if !r.wrote {
		r.status, r.wrote = status, true
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.wrote = true
	return r.body.Write(b)
}
