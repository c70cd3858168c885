package zrpcchain

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
	flmw "github.com/flightlock/flightlock/middleware"
	"github.com/flightlock/flightlock/middleware/share"
)

// Duplicates on two zrpc servers, each with its own Middleware (two processes on one Redis),
// all get the reply of the one call that ran the handler, and all but that one are marked
// replayed: go-zero's chain (breaker, timeout, tracing) neither retries nor cuts the shared
// answer.
func TestShareRepliesThroughZrpcServers(t *testing.T) {
	flmw.ResponseSharing = share.New // as the main.go of a service with share rules sets it
	srv := redistest.Start(t)
	var runs atomic.Int64
	handler := func(ctx context.Context, req *rpb.ServerReflectionRequest) (*wrapperspb.StringValue, error) {
		n := runs.Add(1)
		time.Sleep(200 * time.Millisecond)
		return wrapperspb.String(fmt.Sprintf("run %d for %s", n, req.GetHost())), nil
	}
	rules := []flmw.Rule{{RPC: fullMethod("Host"), Key: "h:{host}", OnBusy: "share", Wait: 10 * time.Second}}
	var conns []*grpc.ClientConn
	for range 2 {
		m := newMiddleware(t, flmw.LockConf{Redis: flmw.RedisConf{Host: srv.Addr}, Rules: rules})
		conns = append(conns, startZrpc(t, m, handler, 10*time.Second))
	}
	const calls = 8
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var replies []string
	replayed := 0
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var md metadata.MD
			got, err := call(context.Background(), conns[i%2], &rpb.ServerReflectionRequest{Host: "a"}, grpc.Header(&md))
			mu.Lock()
			defer mu.Unlock()
			replies = append(replies, fmt.Sprintf("%v %s", err, got))
			if len(md.Get(flmw.ReplayedMetadata)) > 0 {
				replayed++
			}
		}()
	}
	close(start)
	wg.Wait()
	if got := runs.Load(); got != 1 {
		t.Fatalf("the handler ran %d times for %d duplicates on two servers, want 1", got, calls)
	}
	for _, r := range replies {
		if r != "<nil> run 1 for a" {
			t.Fatalf("replies: %q", replies)
		}
	}
	if replayed != calls-1 {
		t.Errorf("%d replies marked %s, want %d", replayed, flmw.ReplayedMetadata, calls-1)
	}
}
