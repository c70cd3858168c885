// Package server implements the Inventory gRPC service, as `goctl rpc protoc` generates it:
// each method hands the call to its logic.
package server

import (
	"context"

	"github.com/flightlock/flightlock/example/inventory/internal/logic"
	"github.com/flightlock/flightlock/example/inventory/internal/svc"
	pb "github.com/flightlock/flightlock/example/pb/inventory"
)

// InventoryServer implements the Inventory gRPC service.
type InventoryServer struct {
	svcCtx *svc.ServiceContext
	pb.UnimplementedInventoryServer
}

// NewInventoryServer returns the Inventory server.
func NewInventoryServer(svcCtx *svc.ServiceContext) *InventoryServer {
	return &InventoryServer{svcCtx: svcCtx}
}

// Deduct takes stock off a SKU.
func (s *InventoryServer) Deduct(ctx context.Context, in *pb.DeductRequest) (*pb.StockReply, error) {
	l := logic.NewDeductLogic(ctx, s.svcCtx)
	return l.Deduct(in)
}

// Restock puts stock back on a SKU.
func (s *InventoryServer) Restock(ctx context.Context, in *pb.RestockRequest) (*pb.StockReply, error) {
	l := logic.NewRestockLogic(ctx, s.svcCtx)
	return l.Restock(in)
}

// Stock reads the stock of a SKU.
func (s *InventoryServer) Stock(ctx context.Context, in *pb.StockRequest) (*pb.StockReply, error) {
	l := logic.NewStockLogic(ctx, s.svcCtx)
	return l.Stock(in)
}
