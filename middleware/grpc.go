package middleware

import (
	"context"
	"io"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// UnaryServerInterceptor locks the calls of every method that a rule names by RPC, for
// zrpc's server.AddUnaryInterceptors. A busy key answers codes.Aborted, a key that cannot be
// built InvalidArgument, and an unreachable store Unavailable (unless OnStoreError is
// "open"). The handler gets the lease's context; the lock is released when it returns or
// panics. With TrustOwner, lock owners propagated by UnaryClientInterceptor are honoured on
// every method, so that locks the handler takes itself re-enter them too.
func (m *Middleware) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	m.intercepting.Store(true)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx = m.owners.withIncomingOwners(ctx)
		rl := m.rpc[info.FullMethod]
		if rl == nil {
			return handler(ctx, req)
		}
		keys, err := rl.rpcKeys(ctx, req)
		if err != nil {
			if m.badKey(ctx, rl, err) {
				return handler(ctx, req)
			}
			return nil, grpcStatus(err).Err()
		}
		if rl.shared {
			return m.serveSharedRPC(ctx, rl, req, info, handler, keys)
		}
		h, err := m.lock(ctx, rl, keys)
		if err != nil {
			return nil, grpcStatus(err).Err()
		}
		defer m.release(ctx, rl, h)
		return handler(h.ctx, req)
	}
}

// StreamServerInterceptor is UnaryServerInterceptor for streaming methods. A key that only
// reads metadata ({header.x}) is locked before the handler runs. A key that reads the request
// message is locked when the handler receives the first message: that RecvMsg returns the
// lock's error as a status, and the stream's Context carries the lease from then on.
func (m *Middleware) StreamServerInterceptor() grpc.StreamServerInterceptor {
	m.intercepting.Store(true)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := m.owners.withIncomingOwners(ss.Context())
		rl := m.rpc[info.FullMethod]
		if rl == nil {
			if ctx != ss.Context() {
				ss = &lockedStream{ServerStream: ss, ctx: ctx, done: true}
			}
			return handler(srv, ss)
		}
		if rl.fromMessage {
			ls := &lockedStream{ServerStream: ss, ctx: ctx, m: m, rl: rl}
			defer ls.release()
			err := handler(srv, ls)
			if lerr := ls.lockError(); lerr != nil {
				return lerr // even if the handler went on regardless
			}
			return err
		}
		keys, err := rl.rpcKeys(ctx, nil)
		if err != nil {
			if m.badKey(ctx, rl, err) {
				return handler(srv, &lockedStream{ServerStream: ss, ctx: ctx, done: true})
			}
			return grpcStatus(err).Err()
		}
		h, err := m.lock(ctx, rl, keys)
		if err != nil {
			return grpcStatus(err).Err()
		}
		defer m.release(ctx, rl, h)
		return handler(srv, &lockedStream{ServerStream: ss, ctx: h.ctx, done: true})
	}
}

// lockedStream is a server stream whose Context carries the call's lease and handed-over
// owners. Unless done, it takes the lock on the first message received; if that fails, every
// later RecvMsg and SendMsg fails the same way, so the handler cannot go on without the lock.
type lockedStream struct {
	grpc.ServerStream
	m  *Middleware
	rl *rule

	mu   sync.Mutex
	ctx  context.Context // guarded by mu
	done bool            // guarded by mu: the lock was attempted (or is not needed)
	held held            // guarded by mu: the lock held, if any
	err  error           // guarded by mu: the status error of a failed lock
}

func (s *lockedStream) lockError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *lockedStream) SendMsg(msg any) error {
	if err := s.lockError(); err != nil {
		return err
	}
	return s.ServerStream.SendMsg(msg)
}

func (s *lockedStream) Context() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ctx
}

func (s *lockedStream) RecvMsg(msg any) error {
	if err := s.lockError(); err != nil {
		return err
	}
	if err := s.ServerStream.RecvMsg(msg); err != nil {
		return err
	}
	s.mu.Lock()
	if s.done {
		s.mu.Unlock()
		return nil
	}
	s.done = true
	ctx := s.ctx
	s.mu.Unlock()

	h, err := s.lockFirst(ctx, msg)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.err = grpcStatus(err).Err()
		return s.err
	}
	s.held, s.ctx = h, h.ctx
	return nil
}

func (s *lockedStream) lockFirst(ctx context.Context, msg any) (held, error) {
	keys, err := s.rl.rpcKeys(ctx, msg)
	if err != nil {
		if s.m.badKey(ctx, s.rl, err) {
			return held{ctx: ctx}, nil
		}
		return held{}, err
	}
	return s.m.lock(ctx, s.rl, keys)
}

// release releases the lock taken on the first message, after the handler returned.
func (s *lockedStream) release() {
	s.mu.Lock()
	h := s.held
	s.held = held{}
	s.mu.Unlock()
	if h.g != nil {
		s.m.release(s.ServerStream.Context(), s.rl, h)
	}
}

// UnaryClientInterceptor propagates the locks held by the calling request's context
// (flightlock.AllFromContext) in the metadata of calls to the methods that LockConf.PropagateTo
// names, as Redis key, owner and fence (signed with OwnerSecret when set), for
// zrpc.WithUnaryClientInterceptor. A downstream service whose LockConf sets TrustOwner then
// re-enters those locks instead of waiting for them. Such calls take turns per held lock: the
// calling goroutine re-enters the locks for the call (see withEnteredOwners). Calls to other
// methods, and calls made outside a lock, are unchanged: an owner token lets its bearer into
// the lock.
func (m *Middleware) UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		callCtx, release, withheld, err := m.owners.withEnteredOwners(ctx, method, false)
		if err != nil {
			return err
		}
		m.ownersWithheld(ctx, method, withheld)
		if release != nil {
			defer release()
		}
		return invoker(callCtx, method, req, reply, cc, opts...)
	}
}

// StreamClientInterceptor is UnaryClientInterceptor for streaming calls. A stream takes its
// turn under each held lock for as long as it lasts (turnStream): until a RecvMsg returns an
// error (io.EOF at its end) or, for a stream without server streaming, its one reply; a
// SendMsg error; or the caller's context ends. Streams made outside a lock, or to
// other methods, are returned as gRPC made them.
func (m *Middleware) StreamClientInterceptor() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
		streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		callCtx, release, withheld, err := m.owners.withEnteredOwners(ctx, method, true)
		if err != nil {
			return nil, err
		}
		m.ownersWithheld(ctx, method, withheld)
		cs, err := streamer(callCtx, desc, cc, method, opts...)
		if err != nil || release == nil {
			if release != nil {
				release()
			}
			return cs, err
		}
		ts := &turnStream{ClientStream: cs, serverStreams: desc.ServerStreams, release: release}
		ts.stop = context.AfterFunc(ctx, release)
		return ts, nil
	}
}

// turnStream gives a stream's turns back (release) when the stream is over, as gRPC counts it.
// It does not use the stream's own Context: reading it commits the stream's attempt in
// grpc-go, which turns off its retries (review of 67db52c:
// TestReviewStreamInterceptorDisablesRetries).
type turnStream struct {
	grpc.ClientStream
	serverStreams bool
	release       func() // idempotent
	stop          func() bool
}

func (s *turnStream) end() {
	s.stop()
	s.release()
}

func (s *turnStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil || !s.serverStreams { // without server streaming, the one reply ends it
		s.end()
	}
	return err
}

func (s *turnStream) SendMsg(m any) error {
	err := s.ClientStream.SendMsg(m)
	if err != nil && err != io.EOF { // io.EOF: the stream ended; RecvMsg has its status
		s.end()
	}
	return err
}

// Header ends the turn on an error. grpc-go v1.80 reports a failed header read as nil, nil
// and leaves the error to RecvMsg; this guards other versions and wrappers that return it.
func (s *turnStream) Header() (metadata.MD, error) {
	md, err := s.ClientStream.Header()
	if err != nil {
		s.end()
	}
	return md, err
}
