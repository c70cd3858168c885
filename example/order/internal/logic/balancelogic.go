package logic

import (
	"context"

	"github.com/zeromicro/go-zero/core/logx"

	"github.com/flightlock/flightlock/example/order/internal/svc"
	"github.com/flightlock/flightlock/example/order/internal/types"
	"github.com/flightlock/flightlock/example/pb/balance"
)

// BalanceLogic reads an account's balance from the balance service. Reads take no lock.
type BalanceLogic struct {
	logx.Logger
	ctx    context.Context
	svcCtx *svc.ServiceContext
}

// NewBalanceLogic returns the logic of one request.
func NewBalanceLogic(ctx context.Context, svcCtx *svc.ServiceContext) *BalanceLogic {
	return &BalanceLogic{Logger: logx.WithContext(ctx), ctx: ctx, svcCtx: svcCtx}
}

// Balance reads an account's balance from the balance service.
func (l *BalanceLogic) Balance(req *types.AccountReq) (*types.BalanceReply, error) {
	reply, err := l.svcCtx.Balance.Balance(l.ctx, &balance.BalanceRequest{Account: req.Account})
	if err != nil {
		return nil, err
	}
	return &types.BalanceReply{Account: reply.GetAccount(), Balance: reply.GetBalance()}, nil
}
