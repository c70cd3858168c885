// Package gateway_test runs the balance service behind go-zero's gateway, as a service that
// exposes its zrpc methods as REST routes does, and checks what a busy lock looks like to an
// HTTP client.
package gateway_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/conf"
	"github.com/zeromicro/go-zero/gateway"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/example/balance"
	"github.com/flightlock/flightlock/example/internal/state"
	pb "github.com/flightlock/flightlock/example/pb/balance"
	"github.com/flightlock/flightlock/internal/testenv/freeport"
	"github.com/flightlock/flightlock/lockstore/redisstore"
	flmw "github.com/flightlock/flightlock/middleware"
)

// balanceYAML is the balance service's section, on a port of the test's.
const balanceYAML = `
Name: balance.rpc
ListenOn: %s
Mode: dev
Timeout: 10000
Log:
  Mode: console
  Level: severe
Lock:
  TTL: 10s
  Rules:
    - RPC: /balance.Balance/Debit
      Key: "acct:{account}"
      OnBusy: reject
`

// gatewayYAML is the gateway's config: POST /debit is Balance.Debit.
const gatewayYAML = `
Name: gateway
Host: 127.0.0.1
Port: %s
Log:
  Mode: console
  Level: severe
Upstreams:
  - Grpc:
      Endpoints: [%s]
      NonBlock: true
    ProtoSets: [%s]
    Mappings:
      - Method: post
        Path: /debit
        RpcPath: balance.Balance/Debit
`

// A busy lock of a zrpc method served through go-zero's gateway reaches Go's net/http client as
// 409 with Retry-After, with flmw.Gateway on the gateway. Without it the gateway copies the
// binary status details into a header, and the client loses the whole response.
func TestBusyLockThroughTheGateway(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), Protocol: 2, DisableIdentity: true, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	store := redisstore.New(rdb)
	t.Cleanup(func() { _ = store.Close() })
	st := state.New(rdb, "state:")
	if err := st.Seed(context.Background(), nil, map[string]int64{"alice": 1000}); err != nil {
		t.Fatal(err)
	}

	rpcAddr := freeport.Addr(t)
	var bc balance.Config
	if err := conf.LoadFromYamlBytes([]byte(fmt.Sprintf(balanceYAML, rpcAddr)), &bc); err != nil {
		t.Fatal(err)
	}
	lock, err := flmw.New(bc.Lock, flmw.WithStore(store))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lock.Close() })
	srv, err := balance.NewServer(bc, st, lock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()

	protoset := writeProtoset(t)
	for _, tc := range []struct {
		name string
		opts []gateway.Option
	}{
		{"with flmw.Gateway", []gateway.Option{gateway.WithMiddleware(flmw.Gateway)}},
		{"without", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gwAddr := freeport.Addr(t)
			_, gwPort, _ := net.SplitHostPort(gwAddr)
			var gc gateway.GatewayConf
			if err := conf.LoadFromYamlBytes([]byte(fmt.Sprintf(gatewayYAML, gwPort, rpcAddr, protoset)), &gc); err != nil {
				t.Fatal(err)
			}
			gw := gateway.MustNewServer(gc, tc.opts...)
			go gw.Start()
			url := "http://" + gwAddr + "/debit"
			debit := func() (*http.Response, error) {
				return http.Post(url, "application/json", strings.NewReader(`{"account":"alice","amount":1}`))
			}
			// Up: a debit of a free key goes through.
			deadline := time.Now().Add(20 * time.Second)
			for {
				resp, err := debit()
				if err == nil {
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						break
					}
				}
				if time.Now().After(deadline) {
					t.Fatalf("the gateway did not serve a debit: %v", err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			// Another process holds the account.
			other, err := flightlock.New(store)
			if err != nil {
				t.Fatal(err)
			}
			held, err := other.TryLock(context.Background(), "acct:alice")
			if err != nil {
				t.Fatal(err)
			}
			defer held.Release(context.Background())

			resp, err := debit()
			if tc.opts == nil {
				// What flmw.Gateway is for: the binary header breaks the response.
				if err == nil {
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode == http.StatusConflict {
						t.Skipf("this go-zero gateway no longer copies binary trailers into headers: flmw.Gateway only adds Retry-After")
					}
					t.Fatalf("busy debit without flmw.Gateway: %d %q, want 409 or the client's error", resp.StatusCode, body)
				}
				if !strings.Contains(err.Error(), "malformed") {
					t.Fatalf("busy debit without flmw.Gateway: %v, want net/http's malformed header error", err)
				}
				t.Logf("without flmw.Gateway the client gets: %v", err)
				return
			}
			if err != nil {
				t.Fatalf("busy debit through the gateway: %v, want a 409 the client can read", err)
			}
			defer resp.Body.Close()
			secs, aerr := strconv.Atoi(resp.Header.Get("Retry-After"))
			if resp.StatusCode != http.StatusConflict || aerr != nil || secs < 1 || secs > 10 {
				body, _ := io.ReadAll(resp.Body)
				t.Fatalf("busy debit: %d %q, Retry-After %q; want 409 with 1..10 (the TTL is 10s)", resp.StatusCode, body, resp.Header.Get("Retry-After"))
			}
		})
	}
}

// writeProtoset writes the balance service's descriptors where the gateway reads them
// (ProtoSets), as protoc --descriptor_set_out --include_imports would.
func writeProtoset(t *testing.T) string {
	t.Helper()
	set := &descriptorpb.FileDescriptorSet{File: []*descriptorpb.FileDescriptorProto{protodesc.ToFileDescriptorProto(pb.File_balance_proto)}}
	b, err := proto.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "balance.pb")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// A rule on the gateway's own routes is checked before Start, when the gateway has added none
// of them yet, against the routes its config maps: a typo stops the service at start-up
// instead of locking nothing.
func TestGatewayRoutesAreCheckedBeforeStart(t *testing.T) {
	var gc gateway.GatewayConf
	if err := conf.LoadFromYamlBytes([]byte(fmt.Sprintf(gatewayYAML, "0", "127.0.0.1:1", "balance.pb")), &gc); err != nil {
		t.Fatal(err)
	}
	if routes := flmw.GatewayRoutes(&gc); len(routes) != 1 || routes[0].Method != http.MethodPost || routes[0].Path != "/debit" {
		t.Fatalf("GatewayRoutes: %+v, want POST /debit", routes)
	}
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), Protocol: 2, DisableIdentity: true})
	t.Cleanup(func() { _ = rdb.Close() })
	store := redisstore.New(rdb)
	t.Cleanup(func() { _ = store.Close() })
	check := func(path string) error {
		lock, err := flmw.New(flmw.LockConf{Rules: []flmw.Rule{{Method: http.MethodPost, Path: path, Key: "acct:{body.account}"}}},
			flmw.WithStore(store))
		if err != nil {
			t.Fatal(err)
		}
		defer lock.Close()
		return lock.CheckRoutes(flmw.GatewayRoutes(gc))
	}
	if err := check("/debit"); err != nil {
		t.Fatalf("a rule on the gateway's mapped route: %v", err)
	}
	if err := check("/debt"); err == nil || !strings.Contains(err.Error(), "matches no route") {
		t.Fatalf("a rule on a route the gateway does not map: %v, want it refused", err)
	}
}
