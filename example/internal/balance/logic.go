package balance

import (
	"context"

	"github.com/zeromicro/go-zero/core/logx"

	"github.com/flightlock/flightlock/example/internal/rpcstatus"
	"github.com/flightlock/flightlock/example/internal/state"
	pb "github.com/flightlock/flightlock/example/pb/balance"
)

// maxAmount bounds one debit, credit or transfer, in cents.
const maxAmount = 1_000_000_000

// AccountLogic changes and reads balances. Debit and Credit run under the lock
// "acct:{account}", Transfer under "acct:{from}" and "acct:{to}"; each write carries the
// fence of its own account's lease.
type AccountLogic struct {
	logx.Logger
	ctx    context.Context
	svcCtx *ServiceContext
}

// NewAccountLogic returns the logic of one call.
func NewAccountLogic(ctx context.Context, svcCtx *ServiceContext) *AccountLogic {
	return &AccountLogic{Logger: logx.WithContext(ctx), ctx: ctx, svcCtx: svcCtx}
}

// Debit takes in.Amount off the balance of in.Account, never below zero.
func (l *AccountLogic) Debit(in *pb.DebitRequest) (*pb.BalanceReply, error) {
	return l.adjust(in.GetAccount(), in.GetAmount(), -in.GetAmount())
}

// Credit adds in.Amount to the balance of in.Account.
func (l *AccountLogic) Credit(in *pb.CreditRequest) (*pb.BalanceReply, error) {
	return l.adjust(in.GetAccount(), in.GetAmount(), in.GetAmount())
}

func (l *AccountLogic) adjust(account string, amount, delta int64) (*pb.BalanceReply, error) {
	if err := state.CheckID("account", account); err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	if err := checkAmount(amount); err != nil {
		return nil, err
	}
	fence, err := state.LeaseFence(l.ctx, l.svcCtx.accountLock(account))
	if err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	balance, err := l.svcCtx.State.AdjustBalance(l.ctx, account, delta, fence)
	if err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	return &pb.BalanceReply{Account: account, Balance: balance}, nil
}

// Transfer moves in.Amount from in.From to in.To, all or nothing.
func (l *AccountLogic) Transfer(in *pb.TransferRequest) (*pb.TransferReply, error) {
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
	fromFence, err := state.LeaseFence(l.ctx, l.svcCtx.accountLock(from))
	if err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	toFence, err := state.LeaseFence(l.ctx, l.svcCtx.accountLock(to))
	if err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	fromBalance, toBalance, err := l.svcCtx.State.Transfer(l.ctx, from, to, in.GetAmount(), fromFence, toFence)
	if err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	return &pb.TransferReply{FromBalance: fromBalance, ToBalance: toBalance}, nil
}

// Balance returns the balance of in.Account. It takes no lock: a read of one Redis field is
// atomic.
func (l *AccountLogic) Balance(in *pb.BalanceRequest) (*pb.BalanceReply, error) {
	if err := state.CheckID("account", in.GetAccount()); err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	balance, err := l.svcCtx.State.Balance(l.ctx, in.GetAccount())
	if err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	return &pb.BalanceReply{Account: in.GetAccount(), Balance: balance}, nil
}

func checkAmount(amount int64) error {
	if amount <= 0 || amount > maxAmount {
		return rpcstatus.InvalidArgument("amount must be between 1 and 1000000000 cents")
	}
	return nil
}
