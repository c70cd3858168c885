// Package logic is the balance service's business logic, one file per method as
// `goctl rpc protoc` generates it. Debit and Credit run under the lock "acct:{account}",
// Transfer under "acct:{from}" and "acct:{to}"; each write carries the fence of its own
// account's lease.
package logic

import (
	"context"

	"github.com/flightlock/flightlock/example/balance/internal/svc"
	"github.com/flightlock/flightlock/example/internal/rpcstatus"
	"github.com/flightlock/flightlock/example/internal/state"
	pb "github.com/flightlock/flightlock/example/pb/balance"
)

// maxAmount bounds one debit, credit or transfer, in cents.
const maxAmount = 1_000_000_000

// adjustBalance adds delta (amount or -amount) to the balance of account, fenced by the
// request's lease on "acct:{account}": the part DebitLogic and CreditLogic share.
func adjustBalance(ctx context.Context, svcCtx *svc.ServiceContext, account string, amount, delta int64) (*pb.BalanceReply, error) {
	if err := state.CheckID("account", account); err != nil {
		return nil, rpcstatus.FromError(ctx, err)
	}
	if err := checkAmount(amount); err != nil {
		return nil, err
	}
	fence, err := state.LeaseFence(ctx, svcCtx.AccountLock(account))
	if err != nil {
		return nil, rpcstatus.FromError(ctx, err)
	}
	balance, err := svcCtx.State.AdjustBalance(ctx, account, delta, fence)
	if err != nil {
		return nil, rpcstatus.FromError(ctx, err)
	}
	return &pb.BalanceReply{Account: account, Balance: balance}, nil
}

func checkAmount(amount int64) error {
	if amount <= 0 || amount > maxAmount {
		return rpcstatus.InvalidArgument("amount must be between 1 and 1000000000 cents")
	}
	return nil
}
