package logic

import (
	"context"

	"github.com/zeromicro/go-zero/core/logx"

	"github.com/flightlock/flightlock/example/internal/rpcstatus"
	"github.com/flightlock/flightlock/example/internal/state"
	"github.com/flightlock/flightlock/example/inventory/internal/svc"
	pb "github.com/flightlock/flightlock/example/pb/inventory"
)

// StockLogic reads the stock of a SKU.
type StockLogic struct {
	logx.Logger
	ctx    context.Context
	svcCtx *svc.ServiceContext
}

// NewStockLogic returns the logic of one call.
func NewStockLogic(ctx context.Context, svcCtx *svc.ServiceContext) *StockLogic {
	return &StockLogic{Logger: logx.WithContext(ctx), ctx: ctx, svcCtx: svcCtx}
}

// Stock returns the stock of in.Sku. It takes no lock: a read of one Redis field is atomic.
func (l *StockLogic) Stock(in *pb.StockRequest) (*pb.StockReply, error) {
	if err := state.CheckID("sku", in.GetSku()); err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	stock, err := l.svcCtx.State.Stock(l.ctx, in.GetSku())
	if err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	return &pb.StockReply{Sku: in.GetSku(), Stock: stock}, nil
}
