package middleware

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/zeromicro/go-zero/rest"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The test service has no generated code: its methods take a registered message with string,
// int and nested fields (grpc.reflection.v1.ServerReflectionRequest) and answer the keys
// of the leases in their context.
const testService = "flightlock.test.Locked"

var unaryMethods = []string{"Host", "Nested", "Ext", "Header", "Two", "Panic", "Call"}

func fullMethod(name string) string { return "/" + testService + "/" + name }

// leaseKeys lists the keys of the leases ctx holds, sorted, comma separated.
func leaseKeys(ctx context.Context) string {
	var keys []string
	for _, l := range flightlock.AllFromContext(ctx) {
		keys = append(keys, l.Key())
	}
	slices.Sort(keys)
	return strings.Join(keys, ",")
}

type handlerFunc func(ctx context.Context, req *rpb.ServerReflectionRequest) (*wrapperspb.StringValue, error)

func testServiceDesc(unary handlerFunc) *grpc.ServiceDesc {
	desc := &grpc.ServiceDesc{ServiceName: testService, HandlerType: (*any)(nil)}
	for _, name := range unaryMethods {
		desc.Methods = append(desc.Methods, grpc.MethodDesc{
			MethodName: name,
			Handler: func(srv any, ctx context.Context, dec func(any) error, icp grpc.UnaryServerInterceptor) (any, error) {
				in := new(rpb.ServerReflectionRequest)
				if err := dec(in); err != nil {
					return nil, err
				}
				h := func(ctx context.Context, req any) (any, error) {
					return unary(ctx, req.(*rpb.ServerReflectionRequest))
				}
				if icp == nil {
					return h(ctx, in)
				}
				return icp(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: fullMethod(name)}, h)
			},
		})
	}
	for _, name := range []string{"Stream", "StreamHeader"} {
		desc.Streams = append(desc.Streams, grpc.StreamDesc{
			StreamName: name, ServerStreams: true, ClientStreams: true,
			Handler: func(_ any, stream grpc.ServerStream) error {
				first := new(rpb.ServerReflectionRequest)
				if err := stream.RecvMsg(first); err != nil {
					return err
				}
				if err := stream.SendMsg(wrapperspb.String(leaseKeys(stream.Context()))); err != nil {
					return err
				}
				for {
					if err := stream.RecvMsg(new(rpb.ServerReflectionRequest)); err == io.EOF {
						return nil
					} else if err != nil {
						return err
					}
				}
			},
		})
	}
	return desc
}

// recoverInterceptor turns a panic into codes.Internal, as zrpc's recover interceptor does.
func recoverInterceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = status.Errorf(codes.Internal, "panic: %v", p)
		}
	}()
	return h(ctx, req)
}

// startGRPC serves the test service with m's interceptors on a free loopback port and
// returns a client connection with the given client interceptors.
func startGRPC(t *testing.T, m *Middleware, unary handlerFunc, client ...grpc.UnaryClientInterceptor) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(recoverInterceptor, m.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(m.StreamServerInterceptor()),
	)
	srv.RegisterService(testServiceDesc(unary), nil)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(client...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func echoLeases(ctx context.Context, _ *rpb.ServerReflectionRequest) (*wrapperspb.StringValue, error) {
	return wrapperspb.String(leaseKeys(ctx)), nil
}

var grpcRules = []Rule{
	{RPC: fullMethod("Host"), Key: "h:{host}"},
	{RPC: fullMethod("Nested"), Key: "n:{file_containing_extension.containing_type}"},
	{RPC: fullMethod("Ext"), Key: "e:{file_containing_extension.extension_number}"},
	{RPC: fullMethod("Header"), Key: "t:{header.x-tenant}"},
	{RPC: fullMethod("Two"), Key: "p:{host}+p:{file_by_filename}"},
	{RPC: fullMethod("Panic"), Key: "panic:{host}"},
	{RPC: fullMethod("Stream"), Key: "s:{host}"},
	{RPC: fullMethod("StreamHeader"), Key: "sh:{header.x-tenant}"},
}

func call(ctx context.Context, conn *grpc.ClientConn, method string, req *rpb.ServerReflectionRequest) (string, error) {
	reply := new(wrapperspb.StringValue)
	err := conn.Invoke(ctx, fullMethod(method), req, reply)
	return reply.GetValue(), err
}

func extReq(typ string, n int32) *rpb.ServerReflectionRequest {
	return &rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_FileContainingExtension{
		FileContainingExtension: &rpb.ExtensionRequest{ContainingType: typ, ExtensionNumber: n},
	}}
}

func TestGRPCKeySources(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: grpcRules})
	conn := startGRPC(t, m, echoLeases)
	tenant := metadata.Pairs("x-tenant", "acme")
	tests := []struct {
		name   string
		method string
		req    *rpb.ServerReflectionRequest
		md     metadata.MD
		want   string
		code   codes.Code
	}{
		{"string field", "Host", &rpb.ServerReflectionRequest{Host: "a:b"}, nil, "lock:h:a%3Ab", codes.OK},
		{"nested field", "Nested", extReq("pkg.Msg", 0), nil, "lock:n:pkg.Msg", codes.OK},
		{"nested int", "Ext", extReq("", 7), nil, "lock:e:7", codes.OK},
		{"metadata", "Header", &rpb.ServerReflectionRequest{}, tenant, "lock:t:acme", codes.OK},
		{"two keys", "Two", &rpb.ServerReflectionRequest{Host: "x", MessageRequest: &rpb.ServerReflectionRequest_FileByFilename{FileByFilename: "f"}}, nil, "lock:p:f,lock:p:x", codes.OK},
		{"two equal keys", "Two", &rpb.ServerReflectionRequest{Host: "x", MessageRequest: &rpb.ServerReflectionRequest_FileByFilename{FileByFilename: "x"}}, nil, "lock:p:x", codes.OK},
		{"missing field", "Host", &rpb.ServerReflectionRequest{}, nil, "", codes.InvalidArgument},
		{"missing nested message", "Nested", &rpb.ServerReflectionRequest{Host: "x"}, nil, "", codes.InvalidArgument},
		{"zero int", "Ext", extReq("t", 0), nil, "", codes.InvalidArgument},
		{"missing metadata", "Header", &rpb.ServerReflectionRequest{}, nil, "", codes.InvalidArgument},
		{"missing second key", "Two", &rpb.ServerReflectionRequest{Host: "x"}, nil, "", codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			if tt.md != nil {
				ctx = metadata.NewOutgoingContext(ctx, tt.md)
			}
			before := tr.mr.CommandCount()
			got, err := call(ctx, conn, tt.method, tt.req)
			if status.Code(err) != tt.code {
				t.Fatalf("code %v (%v), want %v", status.Code(err), err, tt.code)
			}
			if tt.code != codes.OK {
				if n := againIfCostly(tr, tr.mr.CommandCount()-before, func() { _, _ = call(ctx, conn, tt.method, tt.req) }); n != 0 {
					t.Errorf("a bad request sent %d commands to Redis, twice in a row", n)
				}
				return
			}
			if got != tt.want {
				t.Errorf("keys %q, want %q", got, tt.want)
			}
		})
	}
	// A method without a rule runs without a lock.
	if got, err := call(context.Background(), conn, "Call", &rpb.ServerReflectionRequest{Host: "x"}); err != nil || got != "" {
		t.Errorf("unlocked method: %q, %v", got, err)
	}
}

// A zrpc rule built in Go locks the key its function computes, and a bad one is refused
// naming the option.
func TestGRPCWithRPCRule(t *testing.T) {
	tr := newTestRedis(t)
	m, err := New(LockConf{}, WithLocker(tr.locker(t)), WithRPCRule(Rule{RPC: fullMethod("Host")},
		func(_ context.Context, req any) (string, error) {
			return "host:" + req.(*rpb.ServerReflectionRequest).GetHost(), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := m.UnaryServerInterceptor()(context.Background(), &rpb.ServerReflectionRequest{Host: "z"},
		&grpc.UnaryServerInfo{FullMethod: fullMethod("Host")},
		func(ctx context.Context, _ any) (any, error) { return leaseKeys(ctx), nil })
	if err != nil || resp != "lock:host:z" {
		t.Errorf("call of a WithRPCRule method: %v %v, want lock:host:z", resp, err)
	}
	if _, err := New(LockConf{}, WithRPCRule(Rule{RPC: fullMethod("Host"), OnBusy: "later"}, nil)); err == nil ||
		!strings.HasPrefix(err.Error(), "WithRPCRule") {
		t.Errorf("bad Go rule: %v", err)
	}
}

func TestGRPCErrors(t *testing.T) {
	t.Run("busy", func(t *testing.T) {
		tr := newTestRedis(t)
		var ran atomic.Bool
		conn := startGRPC(t, newMiddleware(t, tr, LockConf{Rules: grpcRules}), func(ctx context.Context, req *rpb.ServerReflectionRequest) (*wrapperspb.StringValue, error) {
			ran.Store(true)
			return echoLeases(ctx, req)
		})
		holdKey(t, tr, "h:x")
		_, err := call(context.Background(), conn, "Host", &rpb.ServerReflectionRequest{Host: "x"})
		st := status.Convert(err)
		if st.Code() != codes.Aborted || ran.Load() {
			t.Fatalf("code %v, handler ran %v; want Aborted without the handler", st.Code(), ran.Load())
		}
		var delay time.Duration
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				delay = ri.GetRetryDelay().AsDuration()
			}
		}
		if delay <= 0 || delay > 5*time.Second {
			t.Errorf("RetryInfo delay %v, want within the holder's 5s TTL", delay)
		}
	})
	t.Run("panic releases", func(t *testing.T) {
		tr := newTestRedis(t)
		conn := startGRPC(t, newMiddleware(t, tr, LockConf{Rules: grpcRules}), func(context.Context, *rpb.ServerReflectionRequest) (*wrapperspb.StringValue, error) {
			panic("boom")
		})
		if _, err := call(context.Background(), conn, "Panic", &rpb.ServerReflectionRequest{Host: "p"}); status.Code(err) != codes.Internal {
			t.Fatalf("code %v, want Internal from the recover interceptor", status.Code(err))
		}
		if !tr.isFree("panic:p") {
			t.Fatal("lock left held after a panic")
		}
	})
	for _, mode := range []string{"closed", "open"} {
		t.Run("store down "+mode, func(t *testing.T) {
			tr := newTestRedis(t)
			m := newMiddleware(t, tr, LockConf{Rules: grpcRules, OnStoreError: mode})
			var ran atomic.Bool
			conn := startGRPC(t, m, func(ctx context.Context, req *rpb.ServerReflectionRequest) (*wrapperspb.StringValue, error) {
				ran.Store(true)
				return echoLeases(ctx, req)
			})
			before := failOpenCount(t, fullMethod("Host")) // the rule's name in logs and metrics
			tr.mr.Close()
			got, err := call(context.Background(), conn, "Host", &rpb.ServerReflectionRequest{Host: "x"})
			switch mode {
			case "closed":
				if status.Code(err) != codes.Unavailable || ran.Load() {
					t.Fatalf("code %v, ran %v; want Unavailable without the handler", status.Code(err), ran.Load())
				}
			case "open":
				if counted := failOpenCount(t, fullMethod("Host")) - before; err != nil || !ran.Load() || got != "lock:h:x" || counted != 1 {
					t.Fatalf("err %v, ran %v, keys %q, counted %v; want the handler run under a degraded (local) lease, counted",
						err, ran.Load(), got, counted)
				}
			}
		})
	}
}

func TestGRPCStream(t *testing.T) {
	tr := newTestRedis(t)
	conn := startGRPC(t, newMiddleware(t, tr, LockConf{Rules: grpcRules}), echoLeases)
	desc := &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}
	open := func(ctx context.Context, method string, first *rpb.ServerReflectionRequest) (string, error) {
		cs, err := conn.NewStream(ctx, desc, fullMethod(method))
		if err != nil {
			return "", err
		}
		if err := cs.SendMsg(first); err != nil && err != io.EOF {
			return "", err
		}
		if err := cs.CloseSend(); err != nil {
			return "", err
		}
		reply := new(wrapperspb.StringValue)
		if err := cs.RecvMsg(reply); err != nil {
			return "", err
		}
		if err := cs.RecvMsg(reply); err != io.EOF {
			return "", fmt.Errorf("stream end: %w", err)
		}
		return reply.GetValue(), nil
	}
	tenant := metadata.NewOutgoingContext(context.Background(), metadata.Pairs("x-tenant", "acme"))
	tests := []struct {
		name   string
		ctx    context.Context
		method string
		req    *rpb.ServerReflectionRequest
		want   string
		code   codes.Code
	}{
		{"first message", context.Background(), "Stream", &rpb.ServerReflectionRequest{Host: "s1"}, "lock:s:s1", codes.OK},
		{"metadata", tenant, "StreamHeader", &rpb.ServerReflectionRequest{}, "lock:sh:acme", codes.OK},
		{"missing field", context.Background(), "Stream", &rpb.ServerReflectionRequest{}, "", codes.InvalidArgument},
		{"missing metadata", context.Background(), "StreamHeader", &rpb.ServerReflectionRequest{}, "", codes.InvalidArgument},
		{"busy", context.Background(), "Stream", &rpb.ServerReflectionRequest{Host: "held"}, "", codes.Aborted},
	}
	holdKey(t, tr, "s:held")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := open(tt.ctx, tt.method, tt.req)
			if status.Code(err) != tt.code || got != tt.want {
				t.Fatalf("%q, %v; want %q, %v", got, err, tt.want, tt.code)
			}
		})
	}
	waitFree(t, tr, "s:s1")
	waitFree(t, tr, "sh:acme")
}

// TestOwnerPropagation: a REST handler holding order:{uid} calls a zrpc method locked on the
// same key. With TrustOwner the downstream lock re-enters; without it the call is refused.
// The downstream release never frees the caller's lock.
func TestOwnerPropagation(t *testing.T) {
	tests := []struct {
		name      string
		trust     bool
		shared    bool // the zrpc service runs on the REST service's Locker (one process)
		intercept bool // the REST service's zrpc client propagates owners
		code      codes.Code
	}{
		{"trusted, other process", true, false, true, codes.OK},
		{"trusted, same process", true, true, true, codes.OK},
		{"not trusted", false, false, true, codes.Aborted},
		{"not trusted, same process", false, true, true, codes.Aborted},
		{"trusted, no propagation", true, false, false, codes.Aborted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := newTestRedis(t)
			restLocker := tr.locker(t)
			mREST, err := New(LockConf{PropagateTo: []string{"/" + testService + "/"},
				Rules: []Rule{{Method: http.MethodPost, Path: "/order/:uid", Key: "order:{uid}"}}}, WithLocker(restLocker))
			if err != nil {
				t.Fatal(err)
			}
			rpcLocker := tr.locker(t)
			if tt.shared {
				rpcLocker = restLocker
			}
			mRPC, err := New(LockConf{TrustOwner: tt.trust, Rules: []Rule{{RPC: fullMethod("Host"), Key: "order:{host}"}}}, WithLocker(rpcLocker))
			if err != nil {
				t.Fatal(err)
			}
			var inner atomic.Value
			var client []grpc.UnaryClientInterceptor
			if tt.intercept {
				client = append(client, mREST.UnaryClientInterceptor())
			}
			conn := startGRPC(t, mRPC, func(ctx context.Context, req *rpb.ServerReflectionRequest) (*wrapperspb.StringValue, error) {
				inner.Store(flightlock.FromContext(ctx).Owner())
				return echoLeases(ctx, req)
			}, client...)

			var (
				code       atomic.Value
				heldAfter  atomic.Bool
				outerOwner atomic.Value
			)
			s := serverless(t, restConf(t, 3*time.Second), mREST, []rest.Route{{Method: http.MethodPost, Path: "/order/:uid",
				Handler: func(w http.ResponseWriter, r *http.Request) {
					outerOwner.Store(flightlock.FromContext(r.Context()).Owner())
					_, err := call(r.Context(), conn, "Host", &rpb.ServerReflectionRequest{Host: "1"})
					code.Store(status.Code(err))
					heldAfter.Store(tr.mr.Exists("lock:order:1"))
				}}})
			if w := serve(s, httptest.NewRequest(http.MethodPost, "/order/1", http.NoBody)); w.Code != http.StatusOK {
				t.Fatalf("REST status %d", w.Code)
			}
			if got := code.Load().(codes.Code); got != tt.code {
				t.Fatalf("zrpc code %v, want %v", got, tt.code)
			}
			if !heldAfter.Load() {
				t.Error("the downstream release freed the caller's lock")
			}
			if tt.code == codes.OK && inner.Load() != outerOwner.Load() {
				t.Errorf("downstream owner %v, want the caller's %v", inner.Load(), outerOwner.Load())
			}
			if !tr.isFree("order:1") {
				t.Error("lock left held after the REST request")
			}
		})
	}
}

func TestOwnerMetadata(t *testing.T) {
	key, owner := "lock:\x00bin:key", "0123456789abcdef0123456789abcdef"
	plain := &ownerPolicy{trust: true}
	signed := &ownerPolicy{trust: true, secret: []byte("s3cret")}
	for _, p := range []*ownerPolicy{plain, signed} {
		if k, o, f, ok := p.decode(p.encode(key, owner, 42)); !ok || k != key || o != owner || f != 42 {
			t.Fatalf("round trip: %q %q %d %v", k, o, f, ok)
		}
		for _, bad := range []string{"", "\x05abc", p.encode("", owner, 1), p.encode(key, "", 1), p.encode(key, "a b", 1),
			p.encode(key, strings.Repeat("a", maxOwnerLen+1), 1), p.encode(strings.Repeat("k", flightlock.MaxKeyLen+1), owner, 1),
			p.encode(key, owner, 1) + "x"} {
			if _, _, _, ok := p.decode(bad); ok {
				t.Errorf("decode(%q) accepted", bad)
			}
		}
	}
	// With a secret, unsigned owners and owners signed with another secret are refused.
	other := &ownerPolicy{secret: []byte("other")}
	for _, v := range []string{plain.encode(key, owner, 1), other.encode(key, owner, 1)} {
		if _, _, _, ok := signed.decode(v); ok {
			t.Errorf("signed policy accepted %q", v)
		}
	}
	// A signature covers the fence: another fence under the same signature is refused.
	v := signed.encode(key, owner, 7)
	forged := plain.encode(key, owner, 8) + v[len(v)-ownerMACLen:]
	if _, _, _, ok := signed.decode(forged); ok {
		t.Error("a signature accepted for another fence")
	}
	// Without TrustOwner, inbound metadata changes nothing.
	md := metadata.Pairs(ownerMetadataKey, plain.encode(key, owner, 1))
	ctx := metadata.NewIncomingContext(context.Background(), md)
	if got := (&ownerPolicy{}).withIncomingOwners(ctx); got != ctx {
		t.Error("owners honoured without TrustOwner")
	}
	if got := plain.withIncomingOwners(ctx); got == ctx {
		t.Error("owners ignored with TrustOwner")
	}
	if got := signed.withIncomingOwners(ctx); got != ctx {
		t.Error("unsigned owners honoured with an OwnerSecret")
	}
}

// Owner tokens go only to the downstream methods the config names: the client interceptor
// sends no held token to any other method it is called for.
func TestOwnersGoOnlyToNamedMethods(t *testing.T) {
	tr := newTestRedis(t)
	l := tr.locker(t)
	ctx := context.Background()
	lease, err := l.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	sent := func(m *Middleware, method string) bool {
		var got []string
		err := m.UnaryClientInterceptor()(lease.Context(), method, nil, nil, nil,
			func(ctx context.Context, _ string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
				md, _ := metadata.FromOutgoingContext(ctx)
				got = md.Get(ownerMetadataKey)
				return nil
			})
		if err != nil {
			t.Fatal(err)
		}
		return len(got) > 0
	}
	none, err := New(LockConf{}, WithLocker(l))
	if err != nil {
		t.Fatal(err)
	}
	if sent(none, "/third.Party/Charge") {
		t.Fatal("owners sent to a method no config names")
	}
	named, err := New(LockConf{PropagateTo: []string{"/balance.Balance/", "/inventory.Inventory/Reserve"}}, WithLocker(l))
	if err != nil {
		t.Fatal(err)
	}
	for method, want := range map[string]bool{
		"/balance.Balance/Debit":       true,
		"/inventory.Inventory/Reserve": true,
		"/inventory.Inventory/Stock":   false,
		"/third.Party/Charge":          false,
		"/balance.BalanceAdmin/Reset":  false,
	} {
		if got := sent(named, method); got != want {
			t.Errorf("owners sent to %s: %v, want %v", method, got, want)
		}
	}
	if _, err := New(LockConf{PropagateTo: []string{"balance.Balance"}}); err == nil || !strings.Contains(err.Error(), "Lock.PropagateTo[0]") {
		t.Fatalf("a bad PropagateTo entry: %v", err)
	}
}
