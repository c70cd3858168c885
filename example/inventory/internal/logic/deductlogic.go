package logic

import (
	"context"

	"github.com/zeromicro/go-zero/core/logx"

	"github.com/flightlock/flightlock/example/inventory/internal/svc"
	pb "github.com/flightlock/flightlock/example/pb/inventory"
)

// DeductLogic takes stock off a SKU, under the lock "sku:{sku}".
type DeductLogic struct {
	logx.Logger
	ctx    context.Context
	svcCtx *svc.ServiceContext
}

// NewDeductLogic returns the logic of one call.
func NewDeductLogic(ctx context.Context, svcCtx *svc.ServiceContext) *DeductLogic {
	return &DeductLogic{Logger: logx.WithContext(ctx), ctx: ctx, svcCtx: svcCtx}
}

// Deduct takes in.Qty off the stock of in.Sku, never below zero.
func (l *DeductLogic) Deduct(in *pb.DeductRequest) (*pb.StockReply, error) {
	return adjustStock(l.ctx, l.svcCtx, in.GetSku(), in.GetQty(), -in.GetQty())
}
