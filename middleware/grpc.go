package middleware

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

// UnaryServerInterceptor locks the calls of every method that a rule names by RPC, for zrpc's
// server.AddUnaryInterceptors, answering as GRPCStatus says. The handler gets the lease's
// context; the lock is released when it returns or panics. With TrustOwner, propagated owners
// are honoured on every method, so that locks the handler takes itself re-enter them too.
func (m *Middleware) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	m.unaryIntercepting.Store(true)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx = m.owners.withIncomingOwners(ctx)
		rl := m.rpc[info.FullMethod]
		if rl == nil {
			if m.answersProbe(info.FullMethod, probeUnary) {
				return new(emptypb.Empty), nil
			}
			return handler(ctx, req)
		}
		keys, err := rl.RPCKeys(ctx, req)
		if err == nil && rl.share != nil {
			return rl.share.HandleRPC(ctx, req, info, handler, keys)
		}
		h, err := m.lock(ctx, rl, keys, err)
		if err != nil {
			return nil, rpcError(err)
		}
		defer m.release(ctx, rl, h)
		return handler(h.Ctx, req)
	}
}

// StreamServerInterceptor is UnaryServerInterceptor for streaming methods. A key that only
// reads metadata ({header.x}) is locked before the handler runs. A key that reads the request
// message is locked when the handler receives the first message: that RecvMsg returns the
// lock's error as a status, and the stream's Context carries the lease from then on.
func (m *Middleware) StreamServerInterceptor() grpc.StreamServerInterceptor {
	m.streamIntercepting.Store(true)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := m.owners.withIncomingOwners(ss.Context())
		rl := m.rpc[info.FullMethod]
		if rl == nil && m.answersProbe(info.FullMethod, probeStream) {
			return nil
		}
		if rl == nil && ctx == ss.Context() {
			return handler(srv, ss)
		}
		ls := &lockedStream{ServerStream: ss, ctx: ctx, m: m, rl: rl}
		defer ls.release()
		if rl != nil && !rl.FromMessage {
			if err := ls.lock(nil); err != nil {
				return err
			}
		}
		err := handler(srv, ls)
		if lerr := ls.lockError(); lerr != nil {
			return lerr // even if the handler went on regardless
		}
		return err
	}
}

// lockedStream is a server stream whose Context carries the call's lease and handed-over
// owners. With a rule, it locks on the first message received; if that fails, every later
// RecvMsg and SendMsg fails the same way: the handler cannot go on without the lock.
type lockedStream struct {
	grpc.ServerStream
	m  *Middleware
	rl *rule

	once sync.Once // the lock is attempted once
	mu   sync.Mutex
	ctx  context.Context // guarded by mu
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
	if err := s.ServerStream.RecvMsg(msg); err != nil || s.rl == nil {
		return err // a nil rl: the call carries handed-over owners, and no rule locks it
	}
	return s.lock(msg)
}

// lock locks the call once, on msg's keys (msg nil: metadata only), returning its status error.
func (s *lockedStream) lock(msg any) error {
	s.once.Do(func() {
		ctx := s.Context()
		keys, err := s.rl.RPCKeys(ctx, msg)
		h, err := s.m.lock(ctx, s.rl, keys, err)
		s.mu.Lock()
		defer s.mu.Unlock()
		if err != nil {
			s.err = rpcError(err)
			return
		}
		s.held, s.ctx = h, h.Ctx
	})
	return s.lockError()
}

// release releases the call's lock, if any, after the handler returned.
func (s *lockedStream) release() {
	s.mu.Lock()
	h := s.held
	s.mu.Unlock()
	s.m.release(s.ServerStream.Context(), s.rl, h)
}

// UnaryClientInterceptor propagates the locks of the calling request's context, as store key,
// owner and fence (signed with OwnerSecret when set), in the metadata of calls to the methods
// LockConf.PropagateTo names, for zrpc.WithUnaryClientInterceptor: a downstream service with
// TrustOwner re-enters them as the caller's own. Other calls are unchanged.
func (m *Middleware) UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(m.owners.withOwners(ctx, method), method, req, reply, cc, opts...)
	}
}

// StreamClientInterceptor is UnaryClientInterceptor for streaming calls.
func (m *Middleware) StreamClientInterceptor() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
		streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		return streamer(m.owners.withOwners(ctx, method), desc, cc, method, opts...)
	}
}
