package middleware

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeromicro/go-zero/rest"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A busy answer says how long the key typically stays held, from the rule's own hold times,
// not the holder's TTL (the renewal period of a lock that is renewed): a rule whose handlers
// hold for milliseconds answers Retry-After 1 on REST and a RetryInfo under a second on gRPC,
// while the locks' TTL is 5 s.
func TestBusyAnswersSayHowLongTheRulesLocksAreTypicallyHeld(t *testing.T) {
	t.Run("REST", func(t *testing.T) {
		tr := newTestRedis(t)
		m := newMiddleware(t, tr, LockConf{Rules: []Rule{{Method: http.MethodPost, Path: "/pay/:uid", Key: "pay:{uid}", OnBusy: "reject"}}})
		block := make(chan struct{})
		var blocking atomic.Bool
		s := serverless(t, restConf(t, 30*time.Second), m, []rest.Route{{Method: http.MethodPost, Path: "/pay/:uid",
			Handler: func(w http.ResponseWriter, r *http.Request) {
				if blocking.Load() {
					<-block
				}
			}}})
		for range 3 { // short holds
			if w := serve(s, httptest.NewRequest(http.MethodPost, "/pay/1", http.NoBody)); w.Code != http.StatusOK {
				t.Fatalf("short hold: %d", w.Code)
			}
		}
		blocking.Store(true)
		go serve(s, httptest.NewRequest(http.MethodPost, "/pay/1", http.NoBody))
		defer close(block)
		waitFor(t, 5*time.Second, "the long hold", func() bool { return !tr.isFree("pay:1") })
		w := serve(s, httptest.NewRequest(http.MethodPost, "/pay/1", http.NoBody))
		secs, err := strconv.Atoi(w.Header().Get("Retry-After"))
		if w.Code != http.StatusConflict || err != nil || secs != 1 {
			t.Fatalf("busy: %d, Retry-After %q; want 409 with 1 (holds of milliseconds), not the 5s TTL", w.Code, w.Header().Get("Retry-After"))
		}
	})
	t.Run("gRPC", func(t *testing.T) {
		tr := newTestRedis(t)
		block := make(chan struct{})
		var blocking atomic.Bool
		rules := []Rule{{RPC: fullMethod("Host"), Key: "h:{host}", OnBusy: "reject"}}
		conn := startGRPC(t, newMiddleware(t, tr, LockConf{Rules: rules}), func(ctx context.Context, req *rpb.ServerReflectionRequest) (*wrapperspb.StringValue, error) {
			if blocking.Load() {
				<-block
			}
			return echoLeases(ctx, req)
		})
		for range 3 {
			if _, err := call(context.Background(), conn, "Host", &rpb.ServerReflectionRequest{Host: "x"}); err != nil {
				t.Fatalf("short hold: %v", err)
			}
		}
		blocking.Store(true)
		go func() { _, _ = call(context.Background(), conn, "Host", &rpb.ServerReflectionRequest{Host: "x"}) }()
		defer close(block)
		waitFor(t, 5*time.Second, "the long hold", func() bool { return !tr.isFree("h:x") })
		_, err := call(context.Background(), conn, "Host", &rpb.ServerReflectionRequest{Host: "x"})
		st := status.Convert(err)
		var delay time.Duration
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				delay = ri.GetRetryDelay().AsDuration()
			}
		}
		if st.Code() != codes.Aborted || delay <= 0 || delay >= time.Second {
			t.Fatalf("busy: %v, RetryInfo %v; want Aborted with a delay under a second (holds of milliseconds), not the 5s TTL", err, delay)
		}
	})
}
