package logic

import (
	"context"

	"github.com/zeromicro/go-zero/core/logx"

	"github.com/flightlock/flightlock/example/inventory/internal/svc"
	pb "github.com/flightlock/flightlock/example/pb/inventory"
)

// RestockLogic puts stock back on a SKU, under the lock "sku:{sku}".
type RestockLogic struct {
	logx.Logger
	ctx    context.Context
	svcCtx *svc.ServiceContext
}

// NewRestockLogic returns the logic of one call.
func NewRestockLogic(ctx context.Context, svcCtx *svc.ServiceContext) *RestockLogic {
	return &RestockLogic{Logger: logx.WithContext(ctx), ctx: ctx, svcCtx: svcCtx}
}

// Restock puts in.Qty back on the stock of in.Sku.
func (l *RestockLogic) Restock(in *pb.RestockRequest) (*pb.StockReply, error) {
	return adjustStock(l.ctx, l.svcCtx, in.GetSku(), in.GetQty(), in.GetQty())
}
