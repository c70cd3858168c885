package middleware_test

import (
	"context"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/etcdstore"
	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	flmw "github.com/flightlock/flightlock/middleware"
	"github.com/zeromicro/go-zero/core/conf"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// The service below is an inventory.rpc as `goctl rpc protoc` lays it out, wired as the
// README's goctl rpc recipe says, with the Lock section of docs/stores.md ("A goctl rpc service
// on etcd"). zrpc itself is left out: its Kubernetes resolver would enter the library's go.mod.
// What zrpc.MustNewServer does with the recipe's calls is done on a grpc.Server: the
// interceptors of AddUnaryInterceptors, and Register's function run when the server starts.

// etcdRecipeHosts is the Hosts line of the recipe, pointed at the test's etcd.
const etcdRecipeHosts = "Hosts: [etcd-0:2379, etcd-1:2379, etcd-2:2379]"

// etcdRecipeYAML returns the YAML of the recipe, read from docs/stores.md, so that the test
// runs what the page shows.
func etcdRecipeYAML(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile("../docs/stores.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "### A goctl rpc service on etcd")
	if !ok {
		t.Fatal(`docs/stores.md has no "A goctl rpc service on etcd" section`)
	}
	_, block, ok := strings.Cut(section, "```yaml\n")
	if !ok {
		t.Fatal("the etcd goctl rpc recipe has no YAML block")
	}
	block, _, _ = strings.Cut(block, "```")
	if !strings.Contains(block, etcdRecipeHosts) {
		t.Fatalf("the recipe's YAML has no line %q to point at the test's etcd:\n%s", etcdRecipeHosts, block)
	}
	return block
}

// inventoryProto is inventory.proto, built at run time (the tests carry no generated code) and
// registered as generated code registers its descriptors, so that the rule's {sku} is checked
// against ReserveReq at start-up:
//
//	package inventory;
//	message ReserveReq { string sku = 1; int64 amount = 2; }
//	message ReserveResp { string locked = 1; int64 fence = 2; }
//	service Inventory { rpc Reserve(ReserveReq) returns (ReserveResp); }
var inventoryProto = sync.OnceValues(func() (protoreflect.FileDescriptor, error) {
	field := func(name string, n int32, typ descriptorpb.FieldDescriptorProto_Type) *descriptorpb.FieldDescriptorProto {
		return &descriptorpb.FieldDescriptorProto{Name: proto.String(name), JsonName: proto.String(name), Number: proto.Int32(n),
			Type: typ.Enum(), Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()}
	}
	fd, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
		Name:    proto.String("flightlock/test/inventory.proto"),
		Package: proto.String("inventory"),
		Syntax:  proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{
			{Name: proto.String("ReserveReq"), Field: []*descriptorpb.FieldDescriptorProto{
				field("sku", 1, descriptorpb.FieldDescriptorProto_TYPE_STRING),
				field("amount", 2, descriptorpb.FieldDescriptorProto_TYPE_INT64)}},
			{Name: proto.String("ReserveResp"), Field: []*descriptorpb.FieldDescriptorProto{
				field("locked", 1, descriptorpb.FieldDescriptorProto_TYPE_STRING),
				field("fence", 2, descriptorpb.FieldDescriptorProto_TYPE_INT64)}},
		},
		Service: []*descriptorpb.ServiceDescriptorProto{{Name: proto.String("Inventory"), Method: []*descriptorpb.MethodDescriptorProto{
			{Name: proto.String("Reserve"), InputType: proto.String(".inventory.ReserveReq"), OutputType: proto.String(".inventory.ReserveResp")}}}},
	}, protoregistry.GlobalFiles)
	if err != nil {
		return nil, err
	}
	return fd, protoregistry.GlobalFiles.RegisterFile(fd)
})

// inventoryServer is internal/server/inventoryserver.go with its logic inlined: Reserve answers
// the key and fence of the lease it runs under, and counts the reservations in flight at once.
// hold, when set, makes the next Reserve signal held and wait for hold to be closed.
type inventoryServer struct {
	req, resp protoreflect.MessageDescriptor

	mu        sync.Mutex
	hold      chan struct{} // guarded by mu
	held      chan struct{} // guarded by mu
	active    atomic.Int32
	maxActive atomic.Int32
}

func (s *inventoryServer) holdNext() (hold, held chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hold, s.held = make(chan struct{}), make(chan struct{})
	return s.hold, s.held
}

func (s *inventoryServer) reserve(ctx context.Context, _ *dynamicpb.Message) (*dynamicpb.Message, error) {
	for a := s.active.Add(1); ; {
		if m := s.maxActive.Load(); a <= m || s.maxActive.CompareAndSwap(m, a) {
			break
		}
	}
	defer s.active.Add(-1)
	s.mu.Lock()
	hold, held := s.hold, s.held
	s.hold, s.held = nil, nil
	s.mu.Unlock()
	if hold != nil {
		close(held)
		<-hold
	}
	resp := dynamicpb.NewMessage(s.resp)
	if l := flightlock.FromContext(ctx); l != nil {
		resp.Set(s.resp.Fields().ByName("locked"), protoreflect.ValueOfString(l.Key()))
		resp.Set(s.resp.Fields().ByName("fence"), protoreflect.ValueOfInt64(l.Fence()))
	}
	return resp, nil
}

// serviceDesc is what protoc-gen-go-grpc writes as Inventory_ServiceDesc.
func (s *inventoryServer) serviceDesc() *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: "inventory.Inventory",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Reserve",
			Handler: func(srv any, ctx context.Context, dec func(any) error, icp grpc.UnaryServerInterceptor) (any, error) {
				in := dynamicpb.NewMessage(s.req)
				if err := dec(in); err != nil {
					return nil, err
				}
				h := func(ctx context.Context, req any) (any, error) { return s.reserve(ctx, req.(*dynamicpb.Message)) }
				if icp == nil {
					return h(ctx, in)
				}
				return icp(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/inventory.Inventory/Reserve"}, h)
			},
		}},
	}
}

// startInventoryReplica builds one replica of the service from c as the recipe's service
// context and main do, and returns a client connection to it.
func startInventoryReplica(t *testing.T, c flmw.LockConf, inv *inventoryServer) *grpc.ClientConn {
	t.Helper()
	// NewServiceContext: pro mode, so a Lock section that named no store would stop here.
	lock := flmw.MustNew(c, flmw.WithServiceMode("pro"))
	t.Cleanup(func() { _ = lock.Close() }) // what the shutdown listener does in the service
	// main: zrpc.MustNewServer(c.RpcServerConf, ctx.Lock.Register(...)) and the interceptors.
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(lock.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(lock.StreamServerInterceptor()))
	lock.Register(func(gs *grpc.Server) { gs.RegisterService(inv.serviceDesc(), nil) })(srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

type reserveReply struct {
	locked string
	fence  int64
	err    error
	took   time.Duration
}

func (s *inventoryServer) call(conn *grpc.ClientConn, sku string) reserveReply {
	req, resp := dynamicpb.NewMessage(s.req), dynamicpb.NewMessage(s.resp)
	req.Set(s.req.Fields().ByName("sku"), protoreflect.ValueOfString(sku))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	err := conn.Invoke(ctx, "/inventory.Inventory/Reserve", req, resp)
	return reserveReply{
		locked: resp.Get(s.resp.Fields().ByName("locked")).String(),
		fence:  resp.Get(s.resp.Fields().ByName("fence")).Int(),
		err:    err,
		took:   time.Since(start),
	}
}

// TestGoctlRPCRecipeOnEtcd runs the etcd goctl rpc recipe of docs/stores.md, its YAML as the
// page shows it, on a real etcd: two replicas of the service, each with a Middleware of its
// own (two processes, as far as the locks go), exclude each other through etcd. Two
// reservations of one SKU sent at once run one after the other, the second under a newer
// fence; one that finds the SKU held past its Wait (1s) is answered Aborted with a retry delay.
func TestGoctlRPCRecipeOnEtcd(t *testing.T) {
	ec := etcdtest.Start(t)
	fd, err := inventoryProto()
	if err != nil {
		t.Fatal(err)
	}
	yaml := strings.Replace(etcdRecipeYAML(t), etcdRecipeHosts, `Hosts: ["`+strings.Join(ec.Endpoints(), `", "`)+`"]`, 1)
	var c struct {
		Lock flmw.LockConf // internal/config/config.go, beside zrpc.RpcServerConf
	}
	if err := conf.LoadFromYamlBytes([]byte(yaml), &c); err != nil {
		t.Fatalf("the recipe's YAML: %v", err)
	}
	inv := &inventoryServer{
		req:  fd.Messages().ByName("ReserveReq"),
		resp: fd.Messages().ByName("ReserveResp"),
	}
	replicas := []*grpc.ClientConn{startInventoryReplica(t, c.Lock, inv), startInventoryReplica(t, c.Lock, inv)}
	cli := ec.Client(t)
	const lockKey = "flightlock/lock:sku:s1" // Etcd.Key + Prefix + the rendered key
	marked := func() bool {
		resp, err := cli.Get(context.Background(), etcdstore.WaiterKey(lockKey), clientv3.WithCountOnly())
		return err == nil && resp.Count > 0
	}

	// Two reservations of s1 at once, one through each replica: the first in holds the lock
	// until the other has been refused by etcd once (its waiter mark) and waits.
	hold, held := inv.holdNext()
	start := make(chan struct{})
	replies := make([]reserveReply, len(replicas))
	var wg sync.WaitGroup
	for i, conn := range replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			replies[i] = inv.call(conn, "s1")
		}()
	}
	close(start)
	<-held
	for deadline := time.Now().Add(5 * time.Second); !marked(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the second reservation did not wait in etcd (no waiter mark)")
		}
	}
	if n := inv.active.Load(); n != 1 {
		t.Fatalf("%d reservations of s1 run while one holds its lock, want 1", n)
	}
	close(hold)
	wg.Wait()
	for i, r := range replies {
		if r.err != nil || r.locked != lockKey {
			t.Fatalf("replica %d: %q, %v; want OK under %s (OnBusy: wait)", i, r.locked, r.err, lockKey)
		}
	}
	if got := inv.maxActive.Load(); got != 1 {
		t.Fatalf("%d reservations of s1 ran at once, want 1", got)
	}
	if replies[0].fence == replies[1].fence || replies[0].fence <= 0 || replies[1].fence <= 0 {
		t.Fatalf("fences %d and %d, want two different grants", replies[0].fence, replies[1].fence)
	}

	// Held past the rule's Wait: the other replica answers Aborted, with the holder's lease
	// (TTL 10s + LeaseMargin 1s) as its retry delay.
	hold, held = inv.holdNext()
	first := make(chan reserveReply, 1)
	go func() { first <- inv.call(replicas[0], "s1") }()
	<-held
	r := inv.call(replicas[1], "s1")
	close(hold)
	st := status.Convert(r.err)
	var delay time.Duration
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			delay = ri.GetRetryDelay().AsDuration()
		}
	}
	if st.Code() != codes.Aborted || delay <= 0 || delay > 11*time.Second {
		t.Fatalf("held past Wait: %v, retry delay %v; want Aborted within the holder's 11s lease", st.Code(), delay)
	}
	if r.took < 900*time.Millisecond {
		t.Fatalf("answered Aborted after %v; want it to wait the rule's Wait: 1s first", r.took)
	}
	if f := <-first; f.err != nil || f.fence <= max(replies[0].fence, replies[1].fence) {
		t.Fatalf("the holder: fence %d, %v; want OK under a fence above %d", f.fence, f.err, max(replies[0].fence, replies[1].fence))
	}
}
