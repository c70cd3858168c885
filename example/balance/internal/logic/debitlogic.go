package logic

import (
	"context"

	"github.com/zeromicro/go-zero/core/logx"

	"github.com/flightlock/flightlock/example/balance/internal/svc"
	pb "github.com/flightlock/flightlock/example/pb/balance"
)

// DebitLogic takes money off an account, under the lock "acct:{account}".
type DebitLogic struct {
	logx.Logger
	ctx    context.Context
	svcCtx *svc.ServiceContext
}

// NewDebitLogic returns the logic of one call.
func NewDebitLogic(ctx context.Context, svcCtx *svc.ServiceContext) *DebitLogic {
	return &DebitLogic{Logger: logx.WithContext(ctx), ctx: ctx, svcCtx: svcCtx}
}

// Debit takes in.Amount off the balance of in.Account, never below zero.
func (l *DebitLogic) Debit(in *pb.DebitRequest) (*pb.BalanceReply, error) {
	return adjustBalance(l.ctx, l.svcCtx, in.GetAccount(), in.GetAmount(), -in.GetAmount())
}
