package middleware

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	oteltrace "go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// fanOutConn serves the test service under a TrustOwner middleware on its own Locker (another
// process) and returns a client connection whose interceptors hand the caller's owners over,
// with the holder's Locker.
func fanOutConn(t *testing.T, tr *testRedis, unary handlerFunc) (*grpc.ClientConn, *flightlock.Locker) {
	t.Helper()
	holder := tr.locker(t)
	mClient, err := New(LockConf{PropagateTo: []string{"/" + testService + "/"}, OwnerSecret: "s"}, WithLocker(holder))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mClient.Close() })
	mServer := newMiddleware(t, tr, LockConf{TrustOwner: true, OwnerSecret: "s", Rules: grpcRules})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(mServer.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(mServer.StreamServerInterceptor()))
	srv.RegisterService(testServiceDesc(unary), nil)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(mClient.UnaryClientInterceptor()),
		grpc.WithChainStreamInterceptor(mClient.StreamClientInterceptor()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn, holder
}

// openStream opens the Stream method (locked on s:{host}) with host 1 and reads its first
// reply, which the server sends from inside its re-entry of s:1.
func openStream(ctx context.Context, conn *grpc.ClientConn) (grpc.ClientStream, string, error) {
	cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, fullMethod("Stream"))
	if err != nil {
		return nil, "", err
	}
	if err := cs.SendMsg(&rpb.ServerReflectionRequest{Host: "1"}); err != nil {
		return nil, "", err
	}
	reply := new(wrapperspb.StringValue)
	if err := cs.RecvMsg(reply); err != nil {
		return nil, "", err
	}
	return cs, reply.GetValue(), nil
}

// Calls that carry a held lease's context are its owner: the downstream handlers that re-enter
// the lock through the handed-over owner are inside at once, from two goroutines of the holder
// as from one, and beside the holder's own re-entry in its process. Each downstream handler
// waits inside until all three are, so the test passes only if they were inside together.
// Once the holder releases, the key is free: no call leaves a hold behind.
func TestHandedOwnerCallsEnterAtOnce(t *testing.T) {
	tr := newTestRedis(t)
	const together = 3 // two calls and the holder's own re-entry
	var inside sync.WaitGroup
	inside.Add(together)
	all := make(chan struct{})
	go func() { inside.Wait(); close(all) }()
	wait := func() error {
		inside.Done()
		select {
		case <-all:
			return nil
		case <-time.After(5 * time.Second):
			return status.Error(codes.DeadlineExceeded, "the other owners never got inside")
		}
	}
	conn, holder := fanOutConn(t, tr, func(ctx context.Context, req *rpb.ServerReflectionRequest) (*wrapperspb.StringValue, error) {
		if err := wait(); err != nil {
			return nil, err
		}
		return wrapperspb.String(leaseKeys(ctx)), nil
	})
	lease, err := holder.Lock(context.Background(), "h:1")
	if err != nil {
		t.Fatal(err)
	}
	ctx := lease.Context()
	var wg sync.WaitGroup
	errs := make([]error, together)
	keys := make([]string, 2)
	for i := range 2 {
		wg.Add(1)
		go func() { // mr.MapReduce with the holder's context
			defer wg.Done()
			keys[i], errs[i] = call(ctx, conn, "Host", &rpb.ServerReflectionRequest{Host: "1"})
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		inner, err := holder.Lock(ctx, "h:1")
		if err != nil {
			errs[2] = err
			inside.Done()
			return
		}
		defer inner.Release(context.Background())
		errs[2] = wait()
	}()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("owner %d: %v", i, err)
		}
	}
	for i, k := range keys {
		if errs[i] == nil && k != "lock:h:1" {
			t.Errorf("call %d ran under %q, want lock:h:1", i, k)
		}
	}
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	free, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	next, err := tr.locker(t).Lock(free, "h:1")
	if err != nil {
		t.Fatalf("h:1 after its holder released, with every propagated call over: %v", err)
	}
	_ = next.Release(context.Background())
}

// Streams are calls like any other: one goroutine's two streams under a held lock both enter
// it downstream while both are open, and a unary call beside them too.
func TestHandedOwnerStreamsEnterAtOnce(t *testing.T) {
	tr := newTestRedis(t)
	conn, holder := fanOutConn(t, tr, echoLeases)
	lease, err := holder.Lock(context.Background(), "s:1")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	ctx, cancel := context.WithTimeout(lease.Context(), 5*time.Second)
	defer cancel()
	for i := range 2 {
		cs, keys, err := openStream(ctx, conn)
		if err != nil || keys != "lock:s:1" {
			t.Fatalf("stream %d while the earlier ones are open: %q, %v", i, keys, err)
		}
		defer cs.CloseSend()
	}
	if keys, err := call(ctx, conn, "Host", &rpb.ServerReflectionRequest{Host: "1"}); err != nil || keys != "lock:h:1" {
		t.Fatalf("a unary call while two streams are open: %q, %v", keys, err)
	}
}

// A goroutine that locks as a new owner hands nothing over: its call waits downstream behind the
// holder like any other request's, and is answered busy when its wait is spent.
func TestNewOwnerCallHandsNothingOver(t *testing.T) {
	tr := newTestRedis(t)
	conn, holder := fanOutConn(t, tr, echoLeases)
	lease, err := holder.Lock(context.Background(), "h:2")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	ctx, cancel := context.WithTimeout(flightlock.NewOwner(lease.Context()), 5*time.Second)
	defer cancel()
	if _, err := call(ctx, conn, "Host", &rpb.ServerReflectionRequest{Host: "2"}); status.Code(err) != codes.Aborted {
		t.Fatalf("a new owner's call under the holder's lock: %v, want Aborted", err)
	}
}

// StreamClientInterceptor leaves a stream's retries to gRPC: in grpc-go, reading a client
// stream's Context commits its attempt and turns its retries off, so the interceptor never
// reads it. A server-streaming call whose first attempt fails with UNAVAILABLE before any reply
// is retried by the service config's retryPolicy, with the interceptor as without it.
func TestStreamClientInterceptorKeepsRetries(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: grpcRules}) // no PropagateTo at all
	var attempts atomic.Int32
	desc := &grpc.ServiceDesc{ServiceName: "flightlocktest.Retry", HandlerType: (*any)(nil),
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
	const sc = `{"methodConfig":[{"name":[{"service":"flightlocktest.Retry"}],"retryPolicy":{
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
		cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, "/flightlocktest.Retry/Watch")
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

// A nested call whose caller handed its owner over, but which this service does not honour,
// is refused with the reason the owner was turned down: a caller signing with another
// OwnerSecret, or a service without TrustOwner, otherwise reads as an owner never sent, and the
// refusal's advice (install the client interceptor, PropagateTo) sends its reader to wiring
// that is already there. With the same secret, the call re-enters.
func TestNestedCallNamesWhyItsHandedOwnerWasNotHonoured(t *testing.T) {
	tr := newTestRedis(t)
	holder, err := New(LockConf{PropagateTo: []string{"/" + testService + "/"}, OwnerSecret: "a"}, WithStore(tr.store))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Close() })
	traced := oteltrace.ContextWithSpanContext(context.Background(), oteltrace.NewSpanContext(oteltrace.SpanContextConfig{
		TraceID: oteltrace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, SpanID: oteltrace.SpanID{1},
		TraceFlags: oteltrace.FlagsSampled}))
	lease, err := holder.Locker().Lock(traced, "h:1")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	// The metadata the holder's client interceptor sends with a call made under its lease.
	var sent metadata.MD
	err = holder.UnaryClientInterceptor()(lease.Context(), fullMethod("Host"), nil, nil, nil,
		func(ctx context.Context, _ string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
			sent, _ = metadata.FromOutgoingContext(ctx)
			return nil
		})
	if err != nil || len(sent.Get(ownerMetadataKey)) != 1 {
		t.Fatalf("the holder's client interceptor sent %v, %v; want one owner", sent, err)
	}
	for _, tc := range []struct {
		name string
		c    LockConf
		want string // in the refusal; "" for a call that re-enters
	}{
		{"another secret", LockConf{TrustOwner: true, OwnerSecret: "b"}, "Lock.OwnerSecret"},
		{"no TrustOwner", LockConf{OwnerSecret: "a"}, "Lock.TrustOwner"},
		{"the same secret", LockConf{TrustOwner: true, OwnerSecret: "a"}, ""},
	} {
		tc.c.Rules = []Rule{{RPC: fullMethod("Host"), Key: "h:{host}", Wait: 5 * time.Second}}
		m, err := New(tc.c, WithStore(tr.store))
		if err != nil {
			t.Fatalf("%s: New: %v", tc.name, err)
		}
		ctx, cancel := context.WithTimeout(metadata.NewIncomingContext(traced, sent), 5*time.Second)
		start := time.Now()
		reply, err := m.UnaryServerInterceptor()(ctx, &rpb.ServerReflectionRequest{Host: "1"},
			&grpc.UnaryServerInfo{FullMethod: fullMethod("Host")},
			func(ctx context.Context, _ any) (any, error) { return leaseKeys(ctx), nil })
		cancel()
		_ = m.Close()
		st := status.Convert(err)
		switch {
		case tc.want == "" && (err != nil || reply != "lock:h:1"):
			t.Errorf("%s: %v, %v; want the handler to run inside lock:h:1", tc.name, reply, err)
		case tc.want != "" && (st.Code() != codes.Aborted || !strings.Contains(st.Message(), tc.want)):
			t.Errorf("%s: %v (%v) after %v; want Aborted at once, naming %s", tc.name, st.Code(), st.Message(),
				time.Since(start), tc.want)
		}
	}
}
