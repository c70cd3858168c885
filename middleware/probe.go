package middleware

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

// interceptorProbe finds out which of a Middleware's server interceptors a grpc.Server really
// runs, for Register: building an interceptor does not install it. Register adds a service of
// its own and calls its two methods in process (grpc.Server.ServeHTTP: nothing listens). The
// interceptor answers a probe call itself; a call that reaches the probe's handler went
// through a chain without it.
type interceptorProbe struct {
	service string // unique per Middleware: two Middlewares may probe one server
	// Written by the probe calls, read by Register after them.
	unarySeen, unaryReached   atomic.Bool
	streamSeen, streamReached atomic.Bool
}

// probeServices numbers the probe services of the process.
var probeServices atomic.Int64

// probeVerdict is what a probe found out about one interceptor.
type probeVerdict int

const (
	probeUnknown   probeVerdict = iota // another interceptor answered first (zrpc's Auth): trust what was built
	probeInstalled                     // the interceptor answered the probe
	probeMissing                       // the probe's handler ran: the server's chain lacks the interceptor
)

func (p *interceptorProbe) unaryMethod() string  { return "/" + p.service + "/Unary" }
func (p *interceptorProbe) streamMethod() string { return "/" + p.service + "/Stream" }

// answersProbe reports whether full is a probe call of m's that the interceptor answers
// itself, and notes that it saw it. Only methods without a rule are asked.
func (m *Middleware) answersProbe(full string, unary bool) bool {
	p := m.probe.Load()
	if p == nil {
		return false
	}
	switch {
	case unary && full == p.unaryMethod():
		p.unarySeen.Store(true)
		return true
	case !unary && full == p.streamMethod():
		p.streamSeen.Store(true)
		return true
	}
	return false
}

// register adds the probe's service to gs (before the server serves: gRPC refuses services
// added later).
func (p *interceptorProbe) register(gs *grpc.Server) {
	gs.RegisterService(&grpc.ServiceDesc{
		ServiceName: p.service,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Unary",
			Handler: func(srv any, ctx context.Context, dec func(any) error, icp grpc.UnaryServerInterceptor) (any, error) {
				in := new(emptypb.Empty)
				if err := dec(in); err != nil {
					return nil, err
				}
				reached := func(context.Context, any) (any, error) {
					p.unaryReached.Store(true)
					return new(emptypb.Empty), nil
				}
				if icp == nil {
					return reached(ctx, in)
				}
				return icp(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: p.unaryMethod()}, reached)
			}}},
		Streams: []grpc.StreamDesc{{StreamName: "Stream", ServerStreams: true,
			Handler: func(any, grpc.ServerStream) error {
				p.streamReached.Store(true)
				return nil
			}}},
	}, struct{}{})
}

// run calls both probe methods through gs and returns the verdicts.
func (p *interceptorProbe) run(gs *grpc.Server) (unary, stream probeVerdict) {
	p.call(gs, p.unaryMethod())
	p.call(gs, p.streamMethod())
	return verdict(p.unarySeen.Load(), p.unaryReached.Load()), verdict(p.streamSeen.Load(), p.streamReached.Load())
}

func verdict(seen, reached bool) probeVerdict {
	switch {
	case seen:
		return probeInstalled
	case reached:
		return probeMissing
	}
	return probeUnknown
}

// probeTimeout bounds a probe call; it runs in process and takes microseconds.
const probeTimeout = 5 * time.Second

// call sends one call with an empty message to method through gs's HTTP/2 handler.
func (p *interceptorProbe) call(gs *grpc.Server, method string) {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	// One gRPC message frame: not compressed, length 0 (an empty emptypb.Empty).
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://flightlock.probe"+method, bytes.NewReader(make([]byte, 5)))
	if err != nil {
		return
	}
	r.ProtoMajor, r.ProtoMinor, r.Proto = 2, 0, "HTTP/2.0"
	r.Header.Set("Content-Type", "application/grpc")
	r.Header.Set("Te", "trailers")
	gs.ServeHTTP(&probeWriter{header: http.Header{}}, r)
}

// probeWriter takes a probe call's reply; nothing of it is read (the probe's flags tell).
type probeWriter struct{ header http.Header }

func (w *probeWriter) Header() http.Header         { return w.header }
func (w *probeWriter) Write(b []byte) (int, error) { return io.Discard.Write(b) }
func (w *probeWriter) WriteHeader(int)             {}
func (w *probeWriter) Flush()                      {}

// newInterceptorProbe makes the probe of one Middleware.
func newInterceptorProbe() *interceptorProbe {
	return &interceptorProbe{service: fmt.Sprintf("flightlock.InterceptorProbe%d", probeServices.Add(1))}
}
