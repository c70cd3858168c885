package logic

import (
	"context"

	"github.com/zeromicro/go-zero/core/logx"

	"github.com/flightlock/flightlock/example/balance/internal/svc"
	"github.com/flightlock/flightlock/example/internal/rpcstatus"
	"github.com/flightlock/flightlock/example/internal/state"
	pb "github.com/flightlock/flightlock/example/pb/balance"
)

// BalanceLogic reads an account's balance.
type BalanceLogic struct {
	logx.Logger
	ctx    context.Context
	svcCtx *svc.ServiceContext
}

// NewBalanceLogic returns the logic of one call.
func NewBalanceLogic(ctx context.Context, svcCtx *svc.ServiceContext) *BalanceLogic {
	return &BalanceLogic{Logger: logx.WithContext(ctx), ctx: ctx, svcCtx: svcCtx}
}

// Balance returns the balance of in.Account. It takes no lock: a read of one Redis field is
// atomic.
func (l *BalanceLogic) Balance(in *pb.BalanceRequest) (*pb.BalanceReply, error) {
	if err := state.CheckID("account", in.GetAccount()); err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	balance, err := l.svcCtx.State.Balance(l.ctx, in.GetAccount())
	if err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	return &pb.BalanceReply{Account: in.GetAccount(), Balance: balance}, nil
}
