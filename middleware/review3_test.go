package middleware

// Review 3 of 67db52c / e7dd22d.

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Review of 67db52c: the opener's own in-process nested Lock of the key it holds queued
// behind the slot its own open stream took under a negative id, and since the stream only
// ends when this goroutine closes it, the Lock waited out its whole budget. The stream's
// handler elsewhere is inside the lock, so letting the opener in too would put two re-entries
// of one hold inside at once; it is now refused at once (the slot records its stream's
// opener), with ErrBusy, instead of after the budget.
func TestReviewOpenerNestedLockWaitsForItsOwnStream(t *testing.T) {
	tr := newTestRedis(t)
	conn, holder := fanOutConn(t, tr, echoLeases)
	lease, err := holder.Lock(context.Background(), "s:1")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	ctx, cancel := context.WithCancel(lease.Context())
	defer cancel()
	cs, keys, err := openStream(ctx, conn) // bidi: still open, the server waits for more
	if err != nil || keys != "lock:s:1" {
		t.Fatalf("stream: %q, %v", keys, err)
	}

	short, cancel2 := context.WithTimeout(lease.Context(), 2*time.Second)
	defer cancel2()
	start := time.Now()
	inner, err := holder.Lock(short, "s:1") // the same goroutine, while its stream is inside
	took := time.Since(start)
	if err == nil {
		_ = inner.Release(context.Background())
		t.Fatal("the stream's opener re-entered its lock in process while the stream's handler is inside it")
	}
	if !errors.Is(err, flightlock.ErrBusy) || took > time.Second {
		t.Fatalf("the opener's re-entry: %v after %v, want ErrBusy at once (its own stream holds the turn)", err, took)
	}
	// Once the stream is over, the opener re-enters.
	if err := cs.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for {
		if err := cs.RecvMsg(new(wrapperspb.StringValue)); err != nil {
			break
		}
	}
	again, err := holder.Lock(short, "s:1")
	if err != nil {
		t.Fatalf("the opener's re-entry after its stream ended: %v", err)
	}
	_ = again.Release(context.Background())
}

// StreamClientInterceptor calls cs.Context() on every stream it sees (even for methods that
// are not in PropagateTo and with no lock held). In grpc-go, clientStream.Context() commits
// the attempt (stream.go: cs.commitAttempt()), which turns off retries for that stream. A
// server-streaming call whose first attempt fails with UNAVAILABLE before any reply is
// retried by the service config's retryPolicy without the interceptor, and not with it.
func TestReviewStreamInterceptorDisablesRetries(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: grpcRules}) // no PropagateTo at all
	var attempts atomic.Int32
	desc := &grpc.ServiceDesc{ServiceName: "review3.Retry", HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{StreamName: "Watch", ServerStreams: true,
			Handler: func(_ any, ss grpc.ServerStream) error {
				if attempts.Add(1)%2 == 1 {
					return status.Error(codes.Unavailable, "first attempt refused")
				}
				if err := ss.RecvMsg(new(rpb.ServerReflectionRequest)); err != nil {
					return err
				}
				return ss.SendMsg(wrapperspb.String("ok"))
			}}}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	srv.RegisterService(desc, nil)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	const sc = `{"methodConfig":[{"name":[{"service":"review3.Retry"}],"retryPolicy":{
		"MaxAttempts":3,"InitialBackoff":"0.01s","MaxBackoff":"0.01s","BackoffMultiplier":1,
		"RetryableStatusCodes":["UNAVAILABLE"]}}]}`
	run := func(opts ...grpc.DialOption) error {
		conn, err := grpc.NewClient(lis.Addr().String(), append([]grpc.DialOption{
			grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultServiceConfig(sc)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, "/review3.Retry/Watch")
		if err != nil {
			return err
		}
		if err := cs.SendMsg(&rpb.ServerReflectionRequest{Host: "1"}); err != nil {
			return err
		}
		if err := cs.CloseSend(); err != nil {
			return err
		}
		return cs.RecvMsg(new(wrapperspb.StringValue))
	}
	attempts.Store(0)
	if err := run(); err != nil {
		t.Fatalf("control, without the interceptor: %v (retry policy not applied?)", err)
	}
	attempts.Store(0)
	if err := run(grpc.WithChainStreamInterceptor(m.StreamClientInterceptor())); err != nil {
		t.Fatalf("with StreamClientInterceptor (method not propagated, no lock held): %v; "+
			"cs.Context() committed the attempt and turned the retry policy off", err)
	}
}
