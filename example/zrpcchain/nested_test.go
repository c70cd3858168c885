package zrpcchain

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/zeromicro/go-zero/core/conf"
	"github.com/zeromicro/go-zero/zrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc/codes"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
	flmw "github.com/flightlock/flightlock/middleware"
)

// Service A locks h:{host} and calls service B, which locks the same key, without
// passing its lock owner on. go-zero propagates the trace, so B sees that the holder is its own
// caller and answers Aborted at once with an error that names the fix, instead of waiting for
// itself until a deadline.
func TestNestedCallWithoutOwnerFailsFast(t *testing.T) {
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	tp := sdktrace.NewTracerProvider()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		otel.SetTracerProvider(prevTP)
		otel.SetTextMapPropagator(prevProp)
	})

	srv := redistest.Start(t)
	newMW := func(onBusy string) *flmw.Middleware {
		rule := flmw.Rule{RPC: fullMethod("Host"), Key: "h:{host}", OnBusy: onBusy}
		if onBusy == "wait" {
			rule.Wait = 20 * time.Second // a reject rule never waits, and has no Wait
		}
		m, err := flmw.New(flmw.LockConf{Redis: flmw.RedisConf{Host: srv.Addr}, Rules: []flmw.Rule{rule}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		return m
	}
	// B: waits for the key (20s), under a 30s server timeout.
	b := startZrpc(t, newMW("wait"), func(ctx context.Context, req *rpb.ServerReflectionRequest) (*wrapperspb.StringValue, error) {
		return wrapperspb.String("b ran"), nil
	}, 30*time.Second)
	bTarget := b.Target()
	// A: holds the key and calls B through a go-zero client (tracing on, no owner propagation).
	var cc zrpc.RpcClientConf
	if err := conf.LoadFromYamlBytes([]byte("Endpoints: ["+bTarget+"]\nNonBlock: true\nTimeout: 30000\n"), &cc); err != nil {
		t.Fatal(err)
	}
	client := zrpc.MustNewClient(cc)
	a := startZrpc(t, newMW("reject"), func(ctx context.Context, req *rpb.ServerReflectionRequest) (*wrapperspb.StringValue, error) {
		reply := new(wrapperspb.StringValue)
		err := client.Conn().Invoke(ctx, fullMethod("Host"), req, reply)
		return reply, err
	}, 30*time.Second)

	start := time.Now()
	_, err := call(context.Background(), a, &rpb.ServerReflectionRequest{Host: "n"})
	took := time.Since(start)
	st := status.Convert(err)
	if st.Code() != codes.Aborted || !strings.Contains(st.Message(), "same trace") || !strings.Contains(st.Message(), "TrustOwner") {
		t.Fatalf("nested call without owner propagation: %v after %v, want Aborted at once naming the fix", err, took)
	}
	t.Logf("nested call refused after %v: %s", took.Round(time.Millisecond), st.Message())
}
