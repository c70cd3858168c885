package logic

import (
	"context"

	"github.com/zeromicro/go-zero/core/logx"

	"github.com/flightlock/flightlock/example/internal/rpcstatus"
	"github.com/flightlock/flightlock/example/internal/state"
	"github.com/flightlock/flightlock/example/order/internal/svc"
	"github.com/flightlock/flightlock/example/order/internal/types"
)

// OrdersLogic lists a user's orders. Reads take no lock.
type OrdersLogic struct {
	logx.Logger
	ctx    context.Context
	svcCtx *svc.ServiceContext
}

// NewOrdersLogic returns the logic of one request.
func NewOrdersLogic(ctx context.Context, svcCtx *svc.ServiceContext) *OrdersLogic {
	return &OrdersLogic{Logger: logx.WithContext(ctx), ctx: ctx, svcCtx: svcCtx}
}

// Orders lists a user's orders.
func (l *OrdersLogic) Orders(req *types.OrdersReq) (*types.OrdersReply, error) {
	if err := state.CheckID("uid", req.UID); err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	orders, err := l.svcCtx.State.Orders(l.ctx, req.UID)
	if err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	return &types.OrdersReply{Orders: orders}, nil
}
