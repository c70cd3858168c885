// Package logic is the inventory service's business logic, one file per method as
// `goctl rpc protoc` generates it. Deduct and Restock run under the lock "sku:{sku}" that the
// interceptor took; their writes carry that lease's fence.
package logic

import (
	"context"

	"github.com/flightlock/flightlock/example/internal/rpcstatus"
	"github.com/flightlock/flightlock/example/internal/state"
	"github.com/flightlock/flightlock/example/inventory/internal/svc"
	pb "github.com/flightlock/flightlock/example/pb/inventory"
)

// maxQty bounds one deduction or restock.
const maxQty = 1_000_000

// adjustStock adds delta (qty or -qty) to the stock of sku, fenced by the request's lease on
// "sku:{sku}": the part DeductLogic and RestockLogic share.
func adjustStock(ctx context.Context, svcCtx *svc.ServiceContext, sku string, qty, delta int64) (*pb.StockReply, error) {
	if err := state.CheckID("sku", sku); err != nil {
		return nil, rpcstatus.FromError(ctx, err)
	}
	if qty <= 0 || qty > maxQty {
		return nil, rpcstatus.InvalidArgument("qty must be between 1 and 1000000")
	}
	fence, err := state.LeaseFence(ctx, svcCtx.SkuLock(sku))
	if err != nil {
		return nil, rpcstatus.FromError(ctx, err)
	}
	stock, err := svcCtx.State.AdjustStock(ctx, sku, delta, fence)
	if err != nil {
		return nil, rpcstatus.FromError(ctx, err)
	}
	return &pb.StockReply{Sku: sku, Stock: stock}, nil
}
