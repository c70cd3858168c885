// Package logic is the order API's business logic, one file per route as `goctl api go`
// generates it. A logic that writes finds the fence of its lock's lease in ctx and passes it
// to every write of the entity the lock protects.
package logic

import (
	"context"
	"time"

	"github.com/zeromicro/go-zero/core/logx"

	"github.com/flightlock/flightlock/example/internal/rpcstatus"
	"github.com/flightlock/flightlock/example/internal/state"
	"github.com/flightlock/flightlock/example/order/internal/svc"
	"github.com/flightlock/flightlock/example/order/internal/types"
	"github.com/flightlock/flightlock/example/pb/balance"
	"github.com/flightlock/flightlock/example/pb/inventory"
)

// maxOrderQty bounds the units of one order.
const maxOrderQty = 1000

// undoTimeout bounds each compensating call of a failed order.
const undoTimeout = 5 * time.Second

// CreateOrderLogic places one order. It runs under the lock "order:{uid}": a second order of
// the same user while this one is in flight was answered 409 by the middleware and never got
// here.
type CreateOrderLogic struct {
	logx.Logger
	ctx    context.Context
	svcCtx *svc.ServiceContext
}

// NewCreateOrderLogic returns the logic of one request.
func NewCreateOrderLogic(ctx context.Context, svcCtx *svc.ServiceContext) *CreateOrderLogic {
	return &CreateOrderLogic{Logger: logx.WithContext(ctx), ctx: ctx, svcCtx: svcCtx}
}

// CreateOrder deducts the stock, debits the user's account (qty times Price) and records the
// order, fenced by the order lock. A step that fails undoes the steps before it.
func (l *CreateOrderLogic) CreateOrder(req *types.CreateOrderReq) (*types.CreateOrderReply, error) {
	if err := state.CheckID("uid", req.UID); err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	if err := state.CheckID("sku", req.SKU); err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	if req.Qty <= 0 || req.Qty > maxOrderQty {
		return nil, rpcstatus.InvalidArgument("qty must be between 1 and 1000")
	}
	if req.DelayMs < 0 {
		return nil, rpcstatus.InvalidArgument("delay_ms must not be negative")
	}
	fence, err := l.svcCtx.OrderFence(l.ctx, req.UID)
	if err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	if err := l.delay(req.DelayMs); err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}

	amount := req.Qty * l.svcCtx.Config.Price
	stock, err := l.svcCtx.Inventory.Deduct(l.ctx, &inventory.DeductRequest{Sku: req.SKU, Qty: req.Qty})
	if err != nil {
		return nil, err
	}
	debited, err := l.svcCtx.Balance.Debit(l.ctx, &balance.DebitRequest{Account: req.UID, Amount: amount})
	if err != nil {
		l.restock(req.SKU, req.Qty)
		return nil, err
	}
	order, err := l.svcCtx.State.AddOrder(l.ctx, state.Order{
		UID: req.UID, SKU: req.SKU, Qty: req.Qty, Amount: amount, Fence: fence,
	})
	if err != nil {
		l.refund(req.UID, amount)
		l.restock(req.SKU, req.Qty)
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	return &types.CreateOrderReply{Order: order, Stock: stock.GetStock(), Balance: debited.GetBalance()}, nil
}

// delay holds the lock for the configured OrderDelay plus the request's delay_ms, capped by
// MaxOrderDelay, or until the request ends.
func (l *CreateOrderLogic) delay(ms int64) error {
	c := l.svcCtx.Config
	d := c.OrderDelay
	if ms > 0 {
		d += time.Duration(min(ms, c.MaxOrderDelay.Milliseconds())) * time.Millisecond
	}
	d = min(d, c.MaxOrderDelay)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-l.ctx.Done():
		return context.Cause(l.ctx)
	}
}

// undoContext keeps the request's values (trace, lock owners) but not its cancellation: the
// undo must run even when the request ended.
func (l *CreateOrderLogic) undoContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(l.ctx), undoTimeout)
}

func (l *CreateOrderLogic) restock(sku string, qty int64) {
	ctx, cancel := l.undoContext()
	defer cancel()
	if _, err := l.svcCtx.Inventory.Restock(ctx, &inventory.RestockRequest{Sku: sku, Qty: qty}); err != nil {
		l.Errorf("undo order: restock %d of %s: %v", qty, sku, err)
	}
}

func (l *CreateOrderLogic) refund(account string, amount int64) {
	ctx, cancel := l.undoContext()
	defer cancel()
	if _, err := l.svcCtx.Balance.Credit(ctx, &balance.CreditRequest{Account: account, Amount: amount}); err != nil {
		l.Errorf("undo order: refund %d to %s: %v", amount, account, err)
	}
}
