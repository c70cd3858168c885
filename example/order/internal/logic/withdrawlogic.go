package logic

import (
	"context"

	"github.com/zeromicro/go-zero/core/logx"

	"github.com/flightlock/flightlock/example/internal/rpcstatus"
	"github.com/flightlock/flightlock/example/internal/state"
	"github.com/flightlock/flightlock/example/order/internal/svc"
	"github.com/flightlock/flightlock/example/order/internal/types"
	"github.com/flightlock/flightlock/example/pb/balance"
)

// WithdrawLogic withdraws money from an account. It runs under the lock "acct:{account}" and
// calls the balance service's Debit, which locks the same key: the zrpc client interceptor
// sends this request's lock owner along, and the balance service (TrustOwner: true) re-enters
// the lock instead of waiting for it until its wait budget runs out.
type WithdrawLogic struct {
	logx.Logger
	ctx    context.Context
	svcCtx *svc.ServiceContext
}

// NewWithdrawLogic returns the logic of one request.
func NewWithdrawLogic(ctx context.Context, svcCtx *svc.ServiceContext) *WithdrawLogic {
	return &WithdrawLogic{Logger: logx.WithContext(ctx), ctx: ctx, svcCtx: svcCtx}
}

// Withdraw debits req.Amount from req.Account.
func (l *WithdrawLogic) Withdraw(req *types.WithdrawReq) (*types.BalanceReply, error) {
	if err := state.CheckID("account", req.Account); err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	if req.Amount <= 0 {
		return nil, rpcstatus.InvalidArgument("amount must be positive")
	}
	reply, err := l.svcCtx.Balance.Debit(l.ctx, &balance.DebitRequest{Account: req.Account, Amount: req.Amount})
	if err != nil {
		return nil, err
	}
	return &types.BalanceReply{Account: reply.GetAccount(), Balance: reply.GetBalance()}, nil
}
