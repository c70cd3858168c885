package inventory

import (
	"context"

	"github.com/zeromicro/go-zero/core/logx"

	"github.com/flightlock/flightlock/example/internal/rpcstatus"
	"github.com/flightlock/flightlock/example/internal/state"
	pb "github.com/flightlock/flightlock/example/pb/inventory"
)

// maxQty bounds one deduction or restock.
const maxQty = 1_000_000

// StockLogic changes and reads the stock of one SKU. Deduct and Restock run under the lock
// "sku:{sku}" that the interceptor took; their writes carry that lease's fence.
type StockLogic struct {
	logx.Logger
	ctx    context.Context
	svcCtx *ServiceContext
}

// NewStockLogic returns the logic of one call.
func NewStockLogic(ctx context.Context, svcCtx *ServiceContext) *StockLogic {
	return &StockLogic{Logger: logx.WithContext(ctx), ctx: ctx, svcCtx: svcCtx}
}

// Deduct takes in.Qty off the stock of in.Sku, never below zero.
func (l *StockLogic) Deduct(in *pb.DeductRequest) (*pb.StockReply, error) {
	return l.adjust(in.GetSku(), in.GetQty(), -in.GetQty())
}

// Restock puts in.Qty back on the stock of in.Sku.
func (l *StockLogic) Restock(in *pb.RestockRequest) (*pb.StockReply, error) {
	return l.adjust(in.GetSku(), in.GetQty(), in.GetQty())
}

func (l *StockLogic) adjust(sku string, qty, delta int64) (*pb.StockReply, error) {
	if err := state.CheckID("sku", sku); err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	if qty <= 0 || qty > maxQty {
		return nil, rpcstatus.InvalidArgument("qty must be between 1 and 1000000")
	}
	fence, err := state.LeaseFence(l.ctx, l.svcCtx.skuLock(sku))
	if err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	stock, err := l.svcCtx.State.AdjustStock(l.ctx, sku, delta, fence)
	if err != nil {
		return nil, rpcstatus.FromError(l.ctx, err)
	}
	return &pb.StockReply{Sku: sku, Stock: stock}, nil
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
