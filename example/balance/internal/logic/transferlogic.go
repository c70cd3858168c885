package logic

import (
	"context"

	"github.com/zeromicro/go-zero/core/logx"

	"github.com/flightlock/flightlock/example/balance/internal/svc"
	"github.com/flightlock/flightlock/example/internal/rpcstatus"
	"github.com/flightlock/flightlock/example/internal/state"
	pb "github.com/flightlock/flightlock/example/pb/balance"
)

// TransferLogic moves money between two accounts, under the locks "acct:{from}" and "acct:{to}".
type TransferLogic struct {
	logx.Logger
	ctx    context.Context
	svcCtx *svc.ServiceContext
}

// NewTransferLogic returns the logic of one call.
func NewTransferLogic(ctx context.Context, svcCtx *svc.ServiceContext) *TransferLogic {
	return &TransferLogic{Logger: logx.WithContext(ctx), ctx: ctx, svcCtx: svcCtx}
}

// Transfer moves in.Amount from in.From to in.To, all or nothing.
func (l *TransferLogic) Transfer(in *pb.TransferRequest) (*pb.TransferReply, error) {
	from, to := in.GetFrom(), in.GetTo()
	if err := state.CheckID("from", from); err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	if err := state.CheckID("to", to); err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	if from == to {
		return nil, rpcstatus.InvalidArgument("from and to must be different accounts")
	}
	if err := checkAmount(in.GetAmount()); err != nil {
		return nil, err
	}
	fromFence, err := state.LeaseFence(l.ctx, l.svcCtx.AccountLock(from))
	if err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	toFence, err := state.LeaseFence(l.ctx, l.svcCtx.AccountLock(to))
	if err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	fromBalance, toBalance, err := l.svcCtx.State.Transfer(l.ctx, from, to, in.GetAmount(), fromFence, toFence)
	if err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	return &pb.TransferReply{FromBalance: fromBalance, ToBalance: toBalance}, nil
}
