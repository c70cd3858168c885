package middleware

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/zeromicro/go-zero/rest"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
)

// Issue 18: a wait for a busy key ends before go-zero's server timeout, so that the caller gets
// the busy answer (Aborted with a retry hint; 409 with Retry-After), not DeadlineExceeded / 503,
// with the rule's Wait below, at and above the server's timeout.
func TestBusyAnswerArrivesBeforeTheServerTimeout(t *testing.T) {
	srv := redistest.Start(t)
	const timeout = 500 * time.Millisecond
	for _, wait := range []time.Duration{300 * time.Millisecond, timeout, 2 * time.Second} {
		t.Run(wait.String(), func(t *testing.T) {
			m, err := New(LockConf{Redis: RedisConf{Host: srv.Addr}, Rules: []Rule{
				{RPC: fullMethod("Host"), Key: "h:{host}", OnBusy: "wait", Wait: wait},
				{Method: "POST", Path: "/pay", Key: "pay:{header.X-Uid}", OnBusy: "wait", Wait: wait},
			}})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			release := holdKeyOn(t, srv, "h:a")
			defer release()
			releasePay := holdKeyOn(t, srv, "pay:u1")
			defer releasePay()

			conn := startZrpc(t, m, func(ctx context.Context, req *rpb.ServerReflectionRequest) (*wrapperspb.StringValue, error) {
				return wrapperspb.String("ran"), nil
			}, timeout)
			// The client's own deadline is the server's timeout plus a little, as go-zero's
			// clients and servers are configured alike.
			ctx, cancel := context.WithTimeout(context.Background(), timeout+200*time.Millisecond)
			defer cancel()
			_, err = call(ctx, conn, "Host", &rpb.ServerReflectionRequest{Host: "a"})
			st := status.Convert(err)
			if st.Code() != codes.Aborted {
				t.Fatalf("zrpc, Wait %v, server timeout %v: %v, want Aborted before the deadline", wait, timeout, err)
			}
			hasRetry := false
			for _, d := range st.Details() {
				if _, ok := d.(*errdetails.RetryInfo); ok {
					hasRetry = true
				}
			}
			if !hasRetry {
				t.Errorf("zrpc busy answer without a RetryInfo detail: %v", st.Details())
			}

			rc := restConf(t, timeout)
			s := serverless(t, rc, m, []rest.Route{{Method: http.MethodPost, Path: "/pay", Handler: func(w http.ResponseWriter, r *http.Request) {}}})
			r := httptest.NewRequest(http.MethodPost, "/pay", nil)
			r.Header.Set("X-Uid", "u1")
			w := serve(s, r)
			if w.Code != http.StatusConflict || w.Header().Get("Retry-After") == "" {
				t.Errorf("REST, Wait %v, server timeout %v: %d (Retry-After %q), want 409 with Retry-After", wait, timeout, w.Code, w.Header().Get("Retry-After"))
			}
		})
	}
}
