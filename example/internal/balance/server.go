package balance

import (
	"context"

	pb "github.com/flightlock/flightlock/example/pb/balance"
)

// Server implements the Balance gRPC service.
type Server struct {
	pb.UnimplementedBalanceServer
	svcCtx *ServiceContext
}

// NewServer returns the Balance server.
func NewServer(svcCtx *ServiceContext) *Server { return &Server{svcCtx: svcCtx} }

// Debit takes money off an account.
func (s *Server) Debit(ctx context.Context, in *pb.DebitRequest) (*pb.BalanceReply, error) {
	return NewAccountLogic(ctx, s.svcCtx).Debit(in)
}

// Credit adds money to an account.
func (s *Server) Credit(ctx context.Context, in *pb.CreditRequest) (*pb.BalanceReply, error) {
	return NewAccountLogic(ctx, s.svcCtx).Credit(in)
}

// Transfer moves money between two accounts.
func (s *Server) Transfer(ctx context.Context, in *pb.TransferRequest) (*pb.TransferReply, error) {
	return NewAccountLogic(ctx, s.svcCtx).Transfer(in)
}

// Balance reads an account's balance.
func (s *Server) Balance(ctx context.Context, in *pb.BalanceRequest) (*pb.BalanceReply, error) {
	return NewAccountLogic(ctx, s.svcCtx).Balance(in)
}
