// Package observe measures what flightlock's metrics, spans and shadow rules cost one request
// through the go-zero middleware, next to scenario 6 of bench/run.sh, which measures
// the same on the whole example under wrk but within the noise of a 2-core machine.
//
//	cd bench && go test -run '^$' -bench . -benchmem -count 1 ./observe
//
// Run it with -count 1: go-zero's Prometheus switch (core/prometheus.Enable) cannot be turned
// off again, so the sub-benchmarks run in the order off, trace, metrics, metrics+trace, and a
// second count would measure "off" with metrics on.
package observe

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/core/prometheus"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
	flmw "github.com/flightlock/flightlock/middleware"
)

// discard is a span processor that drops ended spans: the cost measured is building and
// ending the spans, not exporting them.
type discard struct{}

func (discard) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (discard) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (discard) Shutdown(context.Context) error                  { return nil }
func (discard) ForceFlush(context.Context) error                { return nil }

// BenchmarkHandle is locked requests through Middleware.Handle, 32 at once (on a redis-server of its
// own, a key per request, a handler that does nothing) under a parent request span, as go-zero's tracing
// handler starts one: enforced with observability off, with spans, with metrics, with both;
// and the same rule in shadow mode with both on.
func BenchmarkHandle(b *testing.B) {
	logx.Disable()
	addr := redistest.Start(b).Addr
	tracing := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(discard{}))
	defer tracing.Shutdown(context.Background())

	for _, c := range []struct {
		name    string
		metrics bool
		trace   bool
		shadow  bool
	}{
		{name: "off"},
		{name: "trace", trace: true},
		{name: "metrics", metrics: true},
		{name: "metrics+trace", metrics: true, trace: true},
		{name: "shadow,metrics+trace", metrics: true, trace: true, shadow: true},
	} {
		b.Run(c.name, func(b *testing.B) {
			if c.metrics {
				prometheus.Enable()
			} else if prometheus.Enabled() {
				b.Fatal("Prometheus is already on: run with -count 1 and all sub-benchmarks in order")
			}
			if c.trace {
				otel.SetTracerProvider(tracing)
			} else {
				otel.SetTracerProvider(noop.NewTracerProvider())
			}
			mw, err := flmw.New(flmw.LockConf{Redis: flmw.RedisConf{Host: addr}, Rules: []flmw.Rule{
				{Method: http.MethodPost, Path: "/order", Key: "order:{header.X-Uid}", Shadow: c.shadow},
			}})
			if err != nil {
				b.Fatal(err)
			}
			defer mw.Close()
			handler := mw.Handle(func(w http.ResponseWriter, r *http.Request) {})
			tracer := otel.Tracer("bench")
			b.ReportAllocs()
			b.SetParallelism(16) // 32 requests at once on 2 cores: CPU-bound, so ns/op is CPU per request
			var next atomic.Int64
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					ctx, span := tracer.Start(context.Background(), "request")
					r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/order", nil)
					r.Header.Set("X-Uid", strconv.FormatInt(next.Add(1), 10))
					w := httptest.NewRecorder()
					handler(w, r)
					span.End()
					if w.Code != http.StatusOK {
						b.Errorf("status %d: %s", w.Code, w.Body)
						return
					}
				}
			})
		})
	}
}
