// Package server implements the Balance gRPC service, as `goctl rpc protoc` generates it:
// each method hands the call to its logic.
package server

import (
	"context"

	"github.com/flightlock/flightlock/example/balance/internal/logic"
	"github.com/flightlock/flightlock/example/balance/internal/svc"
	pb "github.com/flightlock/flightlock/example/pb/balance"
)

// BalanceServer implements the Balance gRPC service.
type BalanceServer struct {
	svcCtx *svc.ServiceContext
	pb.UnimplementedBalanceServer
}

// NewBalanceServer returns the Balance server.
func NewBalanceServer(svcCtx *svc.ServiceContext) *BalanceServer {
	return &BalanceServer{svcCtx: svcCtx}
}

// Debit takes money off an account.
func (s *BalanceServer) Debit(ctx context.Context, in *pb.DebitRequest) (*pb.BalanceReply, error) {
	l := logic.NewDebitLogic(ctx, s.svcCtx)
	return l.Debit(in)
}

// Credit adds money to an account.
func (s *BalanceServer) Credit(ctx context.Context, in *pb.CreditRequest) (*pb.BalanceReply, error) {
	l := logic.NewCreditLogic(ctx, s.svcCtx)
	return l.Credit(in)
}

// Transfer moves money between two accounts.
func (s *BalanceServer) Transfer(ctx context.Context, in *pb.TransferRequest) (*pb.TransferReply, error) {
	l := logic.NewTransferLogic(ctx, s.svcCtx)
	return l.Transfer(in)
}

// Balance reads an account's balance.
func (s *BalanceServer) Balance(ctx context.Context, in *pb.BalanceRequest) (*pb.BalanceReply, error) {
	l := logic.NewBalanceLogic(ctx, s.svcCtx)
	return l.Balance(in)
}
