package zrpcchain

import (
	"context"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
	flmw "github.com/flightlock/flightlock/middleware"
)

// A wait for a busy key ends before zrpc's server timeout cuts the call, so that the caller
// gets the busy answer (Aborted with a RetryInfo detail), not DeadlineExceeded, with the rule's
// Wait below, at and above the server's timeout.
func TestBusyAnswerArrivesBeforeTheZrpcTimeout(t *testing.T) {
	srv := redistest.Start(t)
	const timeout = 500 * time.Millisecond
	for _, wait := range []time.Duration{300 * time.Millisecond, timeout, 2 * time.Second} {
		t.Run(wait.String(), func(t *testing.T) {
			m := newMiddleware(t, flmw.LockConf{Redis: flmw.RedisConf{Host: srv.Addr}, Rules: []flmw.Rule{
				{RPC: fullMethod("Host"), Key: "h:{host}", OnBusy: "wait", Wait: wait},
			}})
			release := holdKey(t, srv.Addr, "h:a")
			defer release()
			conn := startZrpc(t, m, func(ctx context.Context, req *rpb.ServerReflectionRequest) (*wrapperspb.StringValue, error) {
				return wrapperspb.String("ran"), nil
			}, timeout)
			// The client's own deadline is the server's timeout plus a little, as go-zero's
			// clients and servers are configured alike.
			ctx, cancel := context.WithTimeout(context.Background(), timeout+200*time.Millisecond)
			defer cancel()
			_, err := call(ctx, conn, &rpb.ServerReflectionRequest{Host: "a"})
			st := status.Convert(err)
			if st.Code() != codes.Aborted {
				t.Fatalf("Wait %v, server timeout %v: %v, want Aborted before the deadline", wait, timeout, err)
			}
			hasRetry := false
			for _, d := range st.Details() {
				if _, ok := d.(*errdetails.RetryInfo); ok {
					hasRetry = true
				}
			}
			if !hasRetry {
				t.Errorf("busy answer without a RetryInfo detail: %v", st.Details())
			}
		})
	}
}
