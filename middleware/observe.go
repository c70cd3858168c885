package middleware

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/middleware/rules"
	"github.com/zeromicro/go-zero/core/logc"
	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/core/metric"
	"github.com/zeromicro/go-zero/core/prometheus"
	ztrace "github.com/zeromicro/go-zero/core/trace"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	oteltrace "go.opentelemetry.io/otel/trace"
)

// The metrics go through go-zero's core/metric, on the service's own Prometheus endpoint, and
// cost nothing when that is off. They are labelled by rule, key template and store, never by a
// rendered key (user ids, no bound). Durations are in milliseconds, as go-zero's.
var (
	acquireDuration = ruleHistogram("acquire_duration_ms", "Time to take a request's lock, by outcome (acquired, degraded, busy, store_error, invalid_key, draining, canceled) and by how it was granted (redis, etcd or zookeeper: by the store; handoff, reentry, joined, borrowed, pass; none when not acquired).",
		[]float64{0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000}, "outcome", "grant")
	holdDuration = ruleHistogram("hold_duration_ms", "How long a request held its lock: from the grant to the release.",
		[]float64{1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000})
	busyTotal           = ruleCounter("busy_total", "Requests answered busy (409 Conflict / Aborted) because another holder had the key.")
	lostTotal           = ruleCounter("lost_total", "Locks lost while held: a renewal was refused or could not reach Redis in time; the handler's context was cancelled with ErrLost.")
	driftTotal          = ruleCounter("drift_total", "Acquisitions that found their key held by a lock of another kind (another Permits count, Fair beside no Fair): instances of one service whose rules differ.")
	abandonedTotal      = ruleCounter("abandoned_total", "Locks given up with a lease never released (a forgotten Release, or a handler stuck past MaxHold): each blocked its key for MaxHold plus a TTL.")
	handoffTotal        = ruleCounter("handoffs_total", "Locks handed from one request to the next in this process without a round trip to the store.")
	renewalTotal        = ruleCounter("renewals_total", "Watchdog renewals of held locks, by result (ok, failed).", "result")
	storeErrorTotal     = ruleCounter("store_errors_total", "Lock store (Redis, etcd or ZooKeeper) errors, by operation (acquire, release).", "op")
	failOpenTotal       = ruleCounter("fail_open_total", "Requests served under this process's lock only because the lock store was unreachable (OnStoreError: open).")
	shadowConflictTotal = ruleCounter("shadow_conflicts_total", "Requests of a shadow rule that enforcing it would have held back, by what it would have done (reject, wait, invalid_key, store_error).", "would")
	sharedTotal         = ruleCounter("shared_total", "Requests of share rules answered without running the handler, by where the response came from (inflight: a request of this process; stored: the rule's store, Redis or etcd), and responses too large to store (too_large).", "how")
	heldGauge           = ruleGauge("held", "Requests holding their lock now.")
	waitingGauge        = ruleGauge("waiting", "Requests taking their lock now: queued for a busy key, or waiting for Redis.")
)

var ruleLabels = []string{"rule", "key", "store"}

// ruleCounter, ruleHistogram and ruleGauge make a metric labelled by ruleLabels, then extra.
func ruleCounter(name, help string, extra ...string) metric.CounterVec {
	return metric.NewCounterVec(&metric.CounterVecOpts{Namespace: "flightlock", Name: name, Help: help,
		Labels: append(slices.Clip(ruleLabels), extra...)})
}

func ruleHistogram(name, help string, buckets []float64, extra ...string) metric.HistogramVec {
	return metric.NewHistogramVec(&metric.HistogramVecOpts{Namespace: "flightlock", Name: name, Help: help,
		Labels: append(slices.Clip(ruleLabels), extra...), Buckets: buckets})
}

func ruleGauge(name, help string) metric.GaugeVec {
	return metric.NewGaugeVec(&metric.GaugeVecOpts{Namespace: "flightlock", Name: name, Help: help, Labels: ruleLabels})
}

// The outcomes of an acquisition, as labelled.
const (
	outcomeAcquired   = "acquired"
	outcomeDegraded   = "degraded"
	outcomeBusy       = "busy"
	outcomeStoreError = "store_error"
	outcomeInvalidKey = "invalid_key"
	outcomeDraining   = "draining"
	outcomeCanceled   = "canceled"
)

// ruleStats is what the metrics, traces and logs of one rule say about it.
type ruleStats struct {
	name     string   // "POST /api/order", "/pkg.Svc/Method", or the name of a named rule
	template string   // the key template, or "func" for a key computed in Go
	store    string   // the store the rule locks in: "redis", "etcd" or "zookeeper"
	labels   []string // name, template and store: ruleLabels' values
	attrs    []attribute.KeyValue
}

func newRuleStats(name, template, store string, r rules.Rule) *ruleStats {
	labels := []string{name, template, store}
	return &ruleStats{name: name, template: template, store: store, labels: labels, attrs: []attribute.KeyValue{
		attribute.String("flightlock.rule", name),
		attribute.String("flightlock.key_template", template),
		attribute.String("flightlock.store", store),
		attribute.String("flightlock.mode", r.LockMode()),
		attribute.Bool("flightlock.fair", r.Fair),
		attribute.Int("flightlock.permits", max(r.Permits, 1)),
	}}
}

func (s *ruleStats) with(extra ...string) []string {
	return append(slices.Clip(s.labels), extra...)
}

// count increments c for the rule, with extra labels, when metrics are on.
func (s *ruleStats) count(c metric.CounterVec, extra ...string) {
	if metricsOn() {
		c.Inc(s.with(extra...)...)
	}
}

// observer is a rule's Locker observer: renewals and losses counted, retries as span events.
func (s *ruleStats) observer(logs *logSummary) flightlock.Observer {
	return flightlock.Observer{
		Retry: func(ctx context.Context, _ string, attempt int, holderTTL time.Duration) {
			if span, ok := ctx.Value(acquireSpanKey{}).(oteltrace.Span); ok {
				span.AddEvent("flightlock.retry", oteltrace.WithAttributes(
					attribute.Int("flightlock.attempt", attempt),
					attribute.Float64("flightlock.holder_ttl_ms", ms(holderTTL))))
			}
		},
		Renewed: func(_ string, err error) {
			if err == nil {
				s.count(renewalTotal, "ok")
				return
			}
			s.count(renewalTotal, "failed")
			logs.error(context.Background(), s, "renewal failed", err)
		},
		Lost: func(string) { s.count(lostTotal) },
		Drift: func(ctx context.Context, key, here, holder string) {
			s.count(driftTotal)
			logs.error(ctx, s, "drift: another instance locks this rule's key in another way; give every instance the same Permits and Fair",
				fmt.Errorf("here %s, holder %s (key %s)", here, holder, key))
		},
		Abandoned: func(key, at string) {
			s.count(abandonedTotal)
			logx.Errorw("flightlock: a lease was never released; its lock ran out and the grant was given up",
				logx.Field("rule", s.name), logx.Field("lock", key), logx.Field("taken_at", at))
		},
	}
}

// acquireSpanKey carries the acquisition's span to the Retry observer, not as the current span:
// the handler's spans, under the lease's context derived from this one, belong to the request's.
type acquireSpanKey struct{}

// traceAcquire starts an acquisition's span; an untraced request gets ctx and a nil span.
func (m *Middleware) traceAcquire(ctx context.Context, rl *rule, keys []string) (context.Context, oteltrace.Span) {
	if !oteltrace.SpanFromContext(ctx).IsRecording() {
		return ctx, nil
	}
	_, span := ztrace.TracerFromContext(ctx).Start(ctx, "flightlock.lock",
		oteltrace.WithSpanKind(oteltrace.SpanKindInternal), oteltrace.WithAttributes(rl.stats.attrs...))
	if m.conf.TraceKeys {
		span.SetAttributes(attribute.StringSlice("flightlock.keys", keys))
	}
	return context.WithValue(ctx, acquireSpanKey{}, span), span
}

func endAcquireSpan(span oteltrace.Span, st *ruleStats, outcome string, g *flightlock.Group, waited time.Duration, err error) {
	if span == nil {
		return
	}
	attrs := []attribute.KeyValue{
		attribute.String("flightlock.outcome", outcome),
		attribute.Float64("flightlock.wait_ms", ms(waited)),
	}
	if g != nil {
		leases := g.Leases()
		fences := make([]int64, len(leases))
		for i, l := range leases {
			fences[i] = l.Fence()
			if l.Grant() == flightlock.GrantHandoff {
				span.AddEvent("flightlock.handoff", oteltrace.WithAttributes(attribute.Int64("flightlock.fence", l.Fence())))
			}
		}
		attrs = append(attrs, attribute.String("flightlock.grant", grantOf(st, g)),
			attribute.Int64("flightlock.fence", fences[0]))
		if len(fences) > 1 {
			attrs = append(attrs, attribute.Int64Slice("flightlock.fences", fences))
		}
	}
	span.SetAttributes(attrs...)
	if err != nil && outcome != outcomeBusy {
		span.RecordError(err)
		span.SetStatus(codes.Error, outcome)
	}
	span.End()
}

// outcomeOf names the outcome of a LockAll for the request of ctx.
func outcomeOf(ctx context.Context, g *flightlock.Group, err error) string {
	switch {
	case err == nil && slices.ContainsFunc(g.Leases(), (*flightlock.Lease).Degraded): // OnStoreError: open
		return outcomeDegraded
	case err == nil:
		return outcomeAcquired
	case errors.Is(err, flightlock.ErrBusy):
		return outcomeBusy
	case errors.Is(err, flightlock.ErrInvalidKey):
		return outcomeInvalidKey
	case errors.Is(err, flightlock.ErrClosed):
		return outcomeDraining
	case ctx.Err() != nil:
		return outcomeCanceled
	default:
		return outcomeStoreError
	}
}

// grantOf is an acquisition's grant label: its first lease's (a store's by name), or "none".
func grantOf(st *ruleStats, g *flightlock.Group) string {
	if g == nil {
		return "none"
	}
	grant := g.Leases()[0].Grant()
	if grant == flightlock.GrantStore && st.store != "" {
		return st.store
	}
	return grant.String()
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// logSummary logs the first error of each rule and kind in an interval at once, and sums up
// the others in one line at its end, so that an outage makes a handful of lines.
type logSummary struct {
	interval time.Duration
	mu       sync.Mutex
	open     map[summaryKey]*summaryWindow // guarded by mu: the kinds logged in this interval
	// errorw writes a line: logc.Errorw, or a test's recorder.
	errorw func(ctx context.Context, msg string, fields ...logx.LogField)
}

type summaryKey struct{ rule, what string }

type summaryWindow struct {
	more int    // events after the first one of the interval
	last string // the last one's error
}

func newLogSummary() *logSummary {
	return &logSummary{interval: 10 * time.Second, open: make(map[summaryKey]*summaryWindow), errorw: logc.Errorw}
}

// error logs (or counts) an error of a rule: what failed, and its cause.
func (s *logSummary) error(ctx context.Context, rs *ruleStats, what string, err error, fields ...logx.LogField) {
	k := summaryKey{rule: rs.name, what: what}
	s.mu.Lock()
	if w := s.open[k]; w != nil {
		w.more++
		w.last = err.Error()
		s.mu.Unlock()
		return
	}
	s.open[k] = &summaryWindow{}
	s.mu.Unlock()
	s.errorw(ctx, fmt.Sprintf("flightlock: %s: %s: %v", rs.name, what, err),
		append(fields, logx.Field("rule", rs.name), logx.Field("key", rs.template), logx.Field("outcome", what))...)
	time.AfterFunc(s.interval, func() { s.flush(k, rs) })
}

// flush ends the interval of one kind: a line for the events after the first, if any.
func (s *logSummary) flush(k summaryKey, rs *ruleStats) {
	s.mu.Lock()
	w := s.open[k]
	delete(s.open, k)
	s.mu.Unlock()
	if w == nil || w.more == 0 {
		return
	}
	s.errorw(context.Background(),
		fmt.Sprintf("flightlock: %s: %s: %d more in the last %v (last: %s)", rs.name, k.what, w.more, s.interval, w.last),
		logx.Field("rule", rs.name), logx.Field("key", rs.template), logx.Field("outcome", k.what),
		logx.Field("count", w.more))
}

// metricsOn reports whether go-zero exports metrics; if not, requests build no label lists.
func metricsOn() bool { return prometheus.Enabled() }
