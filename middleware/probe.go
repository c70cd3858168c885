package middleware

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

// interceptorProbe finds out which of a Middleware's server interceptors a grpc.Server really
// runs, for Register: building one does not install it. Register adds the probe's service
// (flightlock.InterceptorProbeN) and calls its two methods in process (ServeHTTP: nothing
// listens); the interceptor answers them itself, else the probe's handler runs.
type interceptorProbe struct {
	service string // unique per Middleware: two Middlewares may probe one server
	// Per kind of call, written by the probe calls and read by Register after them: the
	// interceptor answered the call (seen), the probe's handler ran (reached).
	seen, reached [2]atomic.Bool
}

// The kinds of probe call, as indexes of its flags.
const (
	probeUnary = iota
	probeStream
)

// probeServices numbers the probe services of the process.
var probeServices atomic.Int64

func (p *interceptorProbe) method(kind int) string {
	return "/" + p.service + [...]string{"/Unary", "/Stream"}[kind]
}

// answersProbe reports whether full is m's probe call of that kind, which the interceptor
// answers itself, and notes it. Only methods without a rule are asked.
func (m *Middleware) answersProbe(full string, kind int) bool {
	p := m.probe.Load()
	if p == nil || full != p.method(kind) {
		return false
	}
	p.seen[kind].Store(true)
	return true
}

// register adds the probe's service to gs (before it serves: gRPC refuses services added later).
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
					p.reached[probeUnary].Store(true)
					return new(emptypb.Empty), nil
				}
				if icp == nil {
					return reached(ctx, in)
				}
				return icp(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: p.method(probeUnary)}, reached)
			}}},
		Streams: []grpc.StreamDesc{{StreamName: "Stream", ServerStreams: true,
			Handler: func(any, grpc.ServerStream) error {
				p.reached[probeStream].Store(true)
				return nil
			}}},
	}, struct{}{})
}

// installed calls the probe method of kind through gs and reports whether the chain runs the
// interceptor of that kind: it answered the call, or, when another interceptor answered first
// (zrpc's Auth), built says whether the interceptor was built.
func (p *interceptorProbe) installed(gs *grpc.Server, kind int, built bool) bool {
	p.call(gs, p.method(kind))
	switch {
	case p.seen[kind].Load():
		return true
	case p.reached[kind].Load():
		return false // the probe's handler ran: the chain lacks the interceptor
	}
	return built
}

// probeTimeout bounds a probe call, which runs in process and takes microseconds.
const probeTimeout = 5 * time.Second

// call sends a call with an empty message to method through gs's HTTP/2 handler.
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

// probeWriter takes a probe call's reply, unread (the probe's flags tell).
type probeWriter struct{ header http.Header }

func (w *probeWriter) Header() http.Header         { return w.header }
func (w *probeWriter) Write(b []byte) (int, error) { return io.Discard.Write(b) }
func (w *probeWriter) WriteHeader(int)             {}
func (w *probeWriter) Flush()                      {}
