package order

import (
	"context"

	"github.com/zeromicro/go-zero/core/logx"

	"github.com/flightlock/flightlock/example/internal/rpcstatus"
	"github.com/flightlock/flightlock/example/internal/state"
	"github.com/flightlock/flightlock/example/pb/balance"
	"github.com/flightlock/flightlock/example/pb/inventory"
)

// QueryLogic serves the read endpoints. Reads take no lock.
type QueryLogic struct {
	logx.Logger
	ctx    context.Context
	svcCtx *ServiceContext
}

// NewQueryLogic returns the logic of one request.
func NewQueryLogic(ctx context.Context, svcCtx *ServiceContext) *QueryLogic {
	return &QueryLogic{Logger: logx.WithContext(ctx), ctx: ctx, svcCtx: svcCtx}
}

// Orders lists a user's orders.
func (l *QueryLogic) Orders(req *OrdersReq) (*OrdersReply, error) {
	if err := state.CheckID("uid", req.UID); err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	orders, err := l.svcCtx.State.Orders(l.ctx, req.UID)
	if err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	return &OrdersReply{Orders: orders}, nil
}

// Balance reads an account's balance from the balance service.
func (l *QueryLogic) Balance(req *AccountReq) (*BalanceReply, error) {
	reply, err := l.svcCtx.Balance.Balance(l.ctx, &balance.BalanceRequest{Account: req.Account})
	if err != nil {
		return nil, err
	}
	return &BalanceReply{Account: reply.GetAccount(), Balance: reply.GetBalance()}, nil
}

// Stock reads a SKU's stock from the inventory service.
func (l *QueryLogic) Stock(req *StockReq) (*StockReply, error) {
	reply, err := l.svcCtx.Inventory.Stock(l.ctx, &inventory.StockRequest{Sku: req.SKU})
	if err != nil {
		return nil, err
	}
	return &StockReply{SKU: reply.GetSku(), Stock: reply.GetStock()}, nil
}
