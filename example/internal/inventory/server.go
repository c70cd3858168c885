package inventory

import (
	"context"

	pb "github.com/flightlock/flightlock/example/pb/inventory"
)

// Server implements the Inventory gRPC service.
type Server struct {
	pb.UnimplementedInventoryServer
	svcCtx *ServiceContext
}

// NewServer returns the Inventory server.
func NewServer(svcCtx *ServiceContext) *Server { return &Server{svcCtx: svcCtx} }

// Deduct takes stock off a SKU.
func (s *Server) Deduct(ctx context.Context, in *pb.DeductRequest) (*pb.StockReply, error) {
	return NewStockLogic(ctx, s.svcCtx).Deduct(in)
}

// Restock puts stock back on a SKU.
func (s *Server) Restock(ctx context.Context, in *pb.RestockRequest) (*pb.StockReply, error) {
	return NewStockLogic(ctx, s.svcCtx).Restock(in)
}

// Stock reads the stock of a SKU.
func (s *Server) Stock(ctx context.Context, in *pb.StockRequest) (*pb.StockReply, error) {
	return NewStockLogic(ctx, s.svcCtx).Stock(in)
}
