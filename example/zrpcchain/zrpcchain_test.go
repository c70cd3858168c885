// Package zrpcchain tests the middleware's interceptors inside go-zero's own zrpc server and
// client chains (timeout, tracing, recover, breaker). They live in the example's module, which
// links zrpc anyway, so that zrpc's resolver and its Kubernetes modules stay out of the
// library's go.mod and out of the go.sum of every service that imports the middleware.
package zrpcchain

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/zeromicro/go-zero/core/conf"
	"github.com/zeromicro/go-zero/zrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/types/known/wrapperspb"

	flmw "github.com/flightlock/flightlock/middleware"
)

const service = "flightlock.test.Locked"

func fullMethod(name string) string { return "/" + service + "/" + name }

type handlerFunc func(ctx context.Context, req *rpb.ServerReflectionRequest) (*wrapperspb.StringValue, error)

// serviceDesc is a one-method service ("Host") whose handler is unary; the request type is
// one gRPC ships, so no generated code is needed.
func serviceDesc(unary handlerFunc) *grpc.ServiceDesc {
	return &grpc.ServiceDesc{ServiceName: service, HandlerType: (*any)(nil), Methods: []grpc.MethodDesc{{
		MethodName: "Host",
		Handler: func(srv any, ctx context.Context, dec func(any) error, icp grpc.UnaryServerInterceptor) (any, error) {
			in := new(rpb.ServerReflectionRequest)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) { return unary(ctx, req.(*rpb.ServerReflectionRequest)) }
			if icp == nil {
				return h(ctx, in)
			}
			return icp(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: fullMethod("Host")}, h)
		},
	}}}
}

func call(ctx context.Context, conn *grpc.ClientConn, req *rpb.ServerReflectionRequest, opts ...grpc.CallOption) (string, error) {
	reply := new(wrapperspb.StringValue)
	err := conn.Invoke(ctx, fullMethod("Host"), req, reply, opts...)
	return reply.GetValue(), err
}

// startZrpc serves the service through a zrpc server loaded from YAML, as a service loads it
// (go-zero's defaults on: tracing, recover, breaker, the server timeout), with m's unary
// interceptor added, and returns a plain connection to it.
func startZrpc(t *testing.T, m *flmw.Middleware, unary handlerFunc, timeout time.Duration) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close() // zrpc listens itself; the port stays free for the moment in between
	var c zrpc.RpcServerConf
	yaml := fmt.Sprintf("Name: zrpcchain-test\nMode: test\nListenOn: %s\nTimeout: %d\nLog: {Mode: console, Level: severe}\n",
		addr, timeout.Milliseconds())
	if err := conf.LoadFromYamlBytes([]byte(yaml), &c); err != nil {
		t.Fatal(err)
	}
	s := zrpc.MustNewServer(c, func(g *grpc.Server) { g.RegisterService(serviceDesc(unary), nil) })
	s.AddUnaryInterceptors(m.UnaryServerInterceptor())
	go s.Start()
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			_ = c.Close()
			return conn
		}
		if time.Now().After(deadline) {
			t.Fatalf("the zrpc server on %s did not start: %v", addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// holdKey takes key with a Middleware of its own (another process on the same store) and
// returns its release.
func holdKey(t *testing.T, redisAddr, key string) func() {
	t.Helper()
	m, err := flmw.New(flmw.LockConf{Redis: flmw.RedisConf{Host: redisAddr}})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := m.Locker().TryLock(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return func() { _ = lease.Release(context.Background()); _ = m.Close() }
}

func newMiddleware(t *testing.T, c flmw.LockConf) *flmw.Middleware {
	t.Helper()
	m, err := flmw.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}
