package logic

import (
	"context"

	"github.com/zeromicro/go-zero/core/logx"

	"github.com/flightlock/flightlock/example/balance/internal/svc"
	pb "github.com/flightlock/flightlock/example/pb/balance"
)

// CreditLogic adds money to an account, under the lock "acct:{account}".
type CreditLogic struct {
	logx.Logger
	ctx    context.Context
	svcCtx *svc.ServiceContext
}

// NewCreditLogic returns the logic of one call.
func NewCreditLogic(ctx context.Context, svcCtx *svc.ServiceContext) *CreditLogic {
	return &CreditLogic{Logger: logx.WithContext(ctx), ctx: ctx, svcCtx: svcCtx}
}

// Credit adds in.Amount to the balance of in.Account.
func (l *CreditLogic) Credit(in *pb.CreditRequest) (*pb.BalanceReply, error) {
	return adjustBalance(l.ctx, l.svcCtx, in.GetAccount(), in.GetAmount(), in.GetAmount())
}
