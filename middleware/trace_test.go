package middleware

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/middleware/rules"
	"github.com/zeromicro/go-zero/core/logx"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	oteltrace "go.opentelemetry.io/otel/trace"
)

// tracedRequest is a POST of body to path whose context carries a sampled request span of tp.
func tracedRequest(tp oteltrace.TracerProvider, path, body string) (*http.Request, oteltrace.Span) {
	ctx, span := tp.Tracer("test").Start(context.Background(), "request "+path)
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)).WithContext(ctx)
	r.Header.Set("Content-Type", "application/json")
	return r, span
}

func attrs(s tracetest.SpanStub) map[attribute.Key]attribute.Value {
	m := make(map[attribute.Key]attribute.Value)
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value
	}
	return m
}

func spansNamed(spans tracetest.SpanStubs, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func hasEvent(s tracetest.SpanStub, name string) bool {
	for _, e := range s.Events {
		if e.Name == name {
			return true
		}
	}
	return false
}

// Each acquisition is a span under the request's span, with the rule, the key template, the
// outcome, the grant, the fence and the wait as attributes, and events for retries, handoffs and
// a loss; the rendered key appears only with TraceKeys.
func TestTraceSpans(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	tr := newTestRedis(t)

	for _, traceKeys := range []bool{false, true} {
		t.Run(fmt.Sprintf("TraceKeys=%v", traceKeys), func(t *testing.T) {
			exp.Reset()
			m, err := New(LockConf{TraceKeys: traceKeys, Rules: []Rule{
				{Method: "POST", Path: "/t/pay", Key: "pay:{body.uid}", OnBusy: "wait", Wait: 2 * time.Second, TTL: 300 * time.Millisecond},
			}}, WithLocker(tr.locker(t, flightlock.WithHandoff(64, time.Minute),
				flightlock.WithRetry(flightlock.LinearRetry(5*time.Millisecond)))))
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			release := make(chan struct{})
			started := make(chan struct{}, 2)
			var lostOnce sync.Once
			h := m.Handle(func(w http.ResponseWriter, r *http.Request) {
				started <- struct{}{}
				if r.Header.Get("X-Lose") != "" {
					lostOnce.Do(func() { tr.mr.Del("lock:pay:u2") })
					<-r.Context().Done()
					return
				}
				<-release
			})

			// A key held by another process: the request retries, then gets it.
			other := holdKey(t, tr, "pay:u1")
			r1, span1 := tracedRequest(tp, "/t/pay", `{"uid":"u1"}`)
			done := make(chan struct{})
			go func() {
				defer close(done)
				h(httptest.NewRecorder(), r1)
				span1.End()
			}()
			waitFor(t, 2*time.Second, "a refused attempt", func() bool {
				return strings.HasSuffix(mustMiniGet(tr, "lock:pay:u1"), " ~") // acquire.lua marks a refusal
			})
			_ = other.Release(context.Background())
			<-started
			// A second request queues behind it in this process and gets it by handoff.
			r2, span2 := tracedRequest(tp, "/t/pay", `{"uid":"u1"}`)
			done2 := make(chan struct{})
			go func() {
				defer close(done2)
				h(httptest.NewRecorder(), r2)
				span2.End()
			}()
			waitFor(t, 2*time.Second, "the second request to queue", func() bool {
				return metricValue(t, "flightlock_waiting", "POST /t/pay") == 1
			})
			time.Sleep(50 * time.Millisecond) // from the gauge into the gate's queue
			release <- struct{}{}
			<-started
			release <- struct{}{}
			<-done
			<-done2

			// A lock lost under its handler.
			r3, span3 := tracedRequest(tp, "/t/pay", `{"uid":"u2"}`)
			r3.Header.Set("X-Lose", "1")
			h(httptest.NewRecorder(), r3)
			span3.End()

			spans := exp.GetSpans()
			locks := spansNamed(spans, "flightlock.lock")
			if len(locks) != 3 {
				t.Fatalf("%d lock spans, want 3", len(locks))
			}
			for i, s := range locks {
				a := attrs(s)
				if a["flightlock.rule"].AsString() != "POST /t/pay" || a["flightlock.key_template"].AsString() != "pay:{body.uid}" ||
					a["flightlock.outcome"].AsString() != "acquired" || a["flightlock.fence"].AsInt64() <= 0 {
					t.Errorf("span %d: attributes %v", i, s.Attributes)
				}
				if _, ok := a["flightlock.wait_ms"]; !ok {
					t.Errorf("span %d: no wait_ms", i)
				}
				_, hasKeys := a["flightlock.keys"]
				if hasKeys != traceKeys {
					t.Errorf("span %d: flightlock.keys present %v with TraceKeys %v", i, hasKeys, traceKeys)
				}
				if traceKeys && strings.Join(a["flightlock.keys"].AsStringSlice(), ",") != "pay:u"+string("112"[i]) {
					t.Errorf("span %d: keys %v", i, a["flightlock.keys"].AsStringSlice())
				}
			}
			parents := map[oteltrace.SpanID]string{}
			for _, s := range spans {
				parents[s.SpanContext.SpanID()] = s.Name
			}
			for i, s := range locks {
				if parent := parents[s.Parent.SpanID()]; !strings.HasPrefix(parent, "request ") {
					t.Errorf("lock span %d has parent %q, want the request's span", i, parent)
				}
			}
			if a := attrs(locks[0]); a["flightlock.grant"].AsString() != "redis" || !hasEvent(locks[0], "flightlock.retry") {
				t.Errorf("first span: grant %v, events %v; want redis with retry events", a["flightlock.grant"], locks[0].Events)
			}
			if a := attrs(locks[1]); a["flightlock.grant"].AsString() != "handoff" || !hasEvent(locks[1], "flightlock.handoff") {
				t.Errorf("second span: grant %v, events %v; want a handoff", a["flightlock.grant"], locks[1].Events)
			}
			if req := spansNamed(spans, "request /t/pay"); len(req) != 3 || !hasEvent(req[2], "flightlock.lost") {
				t.Errorf("the request whose lock was lost has no flightlock.lost event")
			}
		})
	}
}

func mustMiniGet(tr *testRedis, key string) string {
	v, _ := tr.mr.Get(key)
	return v
}

// During an outage, the error log gets one line per rule and kind at once and one line with
// the count of the rest when the interval ends, not one line per request.
func TestLogSummary(t *testing.T) {
	var (
		mu    sync.Mutex
		lines []string
	)
	s := newLogSummary()
	s.interval = 50 * time.Millisecond
	s.errorw = func(_ context.Context, msg string, fields ...logx.LogField) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, msg)
	}
	a, b := newRuleStats("POST /a", "a:{x}", rules.StoreRedis, Rule{}), newRuleStats("POST /b", "b:{x}", rules.StoreRedis, Rule{})
	for i := range 100 {
		s.error(context.Background(), a, "lock store unreachable", fmt.Errorf("dial %d", i))
	}
	s.error(context.Background(), b, "lock store unreachable", errors.New("dial b"))
	s.error(context.Background(), a, "release failed", errors.New("timeout"))
	mu.Lock()
	if len(lines) != 3 {
		t.Fatalf("%d lines before the interval ended, want 3 (one per rule and kind): %q", len(lines), lines)
	}
	mu.Unlock()
	waitFor(t, 2*time.Second, "the summary line", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(lines) == 4
	})
	time.Sleep(100 * time.Millisecond) // no line for kinds that had no more events
	mu.Lock()
	if len(lines) != 4 || !strings.Contains(lines[3], "POST /a: lock store unreachable: 99 more") || !strings.Contains(lines[3], "dial 99") {
		t.Fatalf("lines %q, want a summary of the 99 more with the last error", lines)
	}
	mu.Unlock()
	// The next event after the interval is logged in full again.
	s.error(context.Background(), a, "lock store unreachable", errors.New("dial again"))
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(lines[len(lines)-1], "dial again") {
		t.Fatalf("the first event of a new interval was not logged: %q", lines)
	}
}
