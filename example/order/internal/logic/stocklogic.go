package logic

import (
	"context"

	"github.com/zeromicro/go-zero/core/logx"

	"github.com/flightlock/flightlock/example/order/internal/svc"
	"github.com/flightlock/flightlock/example/order/internal/types"
	"github.com/flightlock/flightlock/example/pb/inventory"
)

// StockLogic reads a SKU's stock from the inventory service. Reads take no lock.
type StockLogic struct {
	logx.Logger
	ctx    context.Context
	svcCtx *svc.ServiceContext
}

// NewStockLogic returns the logic of one request.
func NewStockLogic(ctx context.Context, svcCtx *svc.ServiceContext) *StockLogic {
	return &StockLogic{Logger: logx.WithContext(ctx), ctx: ctx, svcCtx: svcCtx}
}

// Stock reads a SKU's stock from the inventory service.
func (l *StockLogic) Stock(req *types.StockReq) (*types.StockReply, error) {
	reply, err := l.svcCtx.Inventory.Stock(l.ctx, &inventory.StockRequest{Sku: req.SKU})
	if err != nil {
		return nil, err
	}
	return &types.StockReply{SKU: reply.GetSku(), Stock: reply.GetStock()}, nil
}
