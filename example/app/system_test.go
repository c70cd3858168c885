package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/example/internal/state"
	balancepb "github.com/flightlock/flightlock/example/pb/balance"
	inventorypb "github.com/flightlock/flightlock/example/pb/inventory"
	"github.com/flightlock/flightlock/internal/testenv/redistest"
	flmw "github.com/flightlock/flightlock/middleware"
)

// testConfigYAML is etc/flightlock-example.yaml with the ports and the Redis of one test, and
// wait budgets and timeouts that fit hundreds of queued requests on a slow -race build.
const testConfigYAML = `
StatePrefix: "example:"
Seed: true
Redis:
  Host: "%[1]s"
Order:
  Name: order-api
  Host: 127.0.0.1
  Port: %[2]d
  Mode: dev
  CpuThreshold: 0
  Timeout: 30000
  Log: {Mode: console, Level: severe}
  Price: 250
  MaxOrderDelay: 10s
  Inventory: {Endpoints: ["127.0.0.1:%[3]d"], Timeout: 30000}
  Balance: {Endpoints: ["127.0.0.1:%[4]d"], Timeout: 30000}
  Lock:
    Rules:
      - {Method: POST, Path: /api/order/create, Key: "order:{body.uid}", OnBusy: reject}
      - {Method: POST, Path: /api/order/place, Key: "order:{body.uid}+idem:{body.uid}:{header.Idempotency-Key}", OnBusy: share, Replay: 10m}
      - {Method: POST, Path: "/api/account/:account/withdraw", Key: "acct:{path.account}", OnBusy: reject, Mode: write}
      - {Method: GET, Path: "/api/account/:account/balance", Key: "acct:{path.account}", Mode: read}
    PropagateTo: ["/balance.Balance/"]
    OwnerSecret: test-secret
Inventory:
  Name: inventory.rpc
  ListenOn: 127.0.0.1:%[3]d
  Mode: dev
  CpuThreshold: 0
  Timeout: 30000
  Log: {Mode: console, Level: severe}
  Lock:
    Wait: 20s
    Rules:
      - {RPC: /inventory.Inventory/Deduct, Key: "sku:{sku}", OnBusy: wait}
      - {RPC: /inventory.Inventory/Restock, Key: "sku:{sku}", OnBusy: wait}
Balance:
  Name: balance.rpc
  ListenOn: 127.0.0.1:%[4]d
  Mode: dev
  CpuThreshold: 0
  Timeout: 30000
  Log: {Mode: console, Level: severe}
  Lock:
    Wait: 20s
    TrustOwner: true
    OwnerSecret: test-secret
    Rules:
      - {RPC: /balance.Balance/Debit, Key: "acct:{account}", OnBusy: wait}
      - {RPC: /balance.Balance/Credit, Key: "acct:{account}", OnBusy: wait}
      - {RPC: /balance.Balance/Transfer, Key: "acct:{from}+acct:{to}", OnBusy: wait}
`

// The order API's bodies as its clients see them: its own types are internal to it
// (example/order/internal/types), where goctl puts them. The JSON names are the API's.
type (
	createOrderReq struct {
		UID     string `json:"uid"`
		SKU     string `json:"sku"`
		Qty     int64  `json:"qty"`
		DelayMs int64  `json:"delay_ms"`
	}
	createOrderReply struct {
		Order   state.Order `json:"order"`
		Stock   int64       `json:"stock"`
		Balance int64       `json:"balance"`
	}
	balanceReply struct {
		Account string `json:"account"`
		Balance int64  `json:"balance"`
	}
	stockReply struct {
		SKU   string `json:"sku"`
		Stock int64  `json:"stock"`
	}
	ordersReply struct {
		Orders []state.Order `json:"orders"`
	}
)

// harness is a running example system and clients for it.
type harness struct {
	sys       *System
	base      string // http://127.0.0.1:port
	http      *http.Client
	inventory inventorypb.InventoryClient
	balance   balancepb.BalanceClient
}

// startSystem runs the whole example on redisHost (empty: embedded) on free loopback ports, built
// with opts, and stops it when t ends.
func startSystem(t *testing.T, redisHost string, opts ...Option) *harness {
	t.Helper()
	ports := freePorts(t, 3)
	path := filepath.Join(t.TempDir(), "example.yaml")
	yaml := fmt.Sprintf(testConfigYAML, redisHost, ports[0], ports[1], ports[2])
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(path)
	if err != nil {
		t.Fatalf("load config: %v", err)
	}
	return runSystem(t, c, ports, opts...)
}

// runSystem builds the example from c (whose order API, inventory and balance services listen
// on ports, in that order) with opts, starts it, waits until every port listens, and stops and
// closes it when t ends.
func runSystem(t *testing.T, c Config, ports []int, opts ...Option) *harness {
	t.Helper()
	sys, err := New(c, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sys.Start()
	}()
	t.Cleanup(func() {
		sys.Stop()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("the servers did not stop within 10s")
		}
		if err := sys.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	for _, p := range ports {
		waitListening(t, p)
	}

	h := &harness{
		sys:  sys,
		base: fmt.Sprintf("http://127.0.0.1:%d", ports[0]),
		http: &http.Client{
			Timeout:   30 * time.Second,
			Transport: &http.Transport{MaxIdleConnsPerHost: 512},
		},
		inventory: inventorypb.NewInventoryClient(dial(t, ports[1])),
		balance:   balancepb.NewBalanceClient(dial(t, ports[2])),
	}
	t.Cleanup(h.http.CloseIdleConnections)
	return h
}

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("find a free port: %v", err)
		}
		defer l.Close() // held until all are chosen, so the n ports differ
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

func waitListening(t *testing.T, port int) {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for range 400 { // 400 x 25ms: 10s
		conn, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			_ = conn.Close()
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("nothing listens on %s", addr)
}

func dial(t *testing.T, port int) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", port), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// post sends a JSON body and decodes a 200 answer into out (when not nil).
func (h *harness) post(t *testing.T, path string, body any, out any) int {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := h.http.Post(h.base+path, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Errorf("POST %s: %v", path, err)
		return 0
	}
	return decode(t, resp, out)
}

func (h *harness) get(t *testing.T, path string, out any) int {
	t.Helper()
	resp, err := h.http.Get(h.base + path)
	if err != nil {
		t.Errorf("GET %s: %v", path, err)
		return 0
	}
	return decode(t, resp, out)
}

func decode(t *testing.T, resp *http.Response, out any) int {
	t.Helper()
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Errorf("read body: %v", err)
	}
	if resp.StatusCode == http.StatusOK && out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			t.Errorf("decode %s: %v", body, err)
		}
	}
	return resp.StatusCode
}

func (h *harness) stock(t *testing.T, sku string) int64 {
	t.Helper()
	var r stockReply
	if code := h.get(t, "/api/stock/"+sku, &r); code != http.StatusOK {
		t.Fatalf("GET stock of %s: %d", sku, code)
	}
	return r.Stock
}

func (h *harness) accountBalance(t *testing.T, account string) int64 {
	t.Helper()
	var r balanceReply
	if code := h.get(t, "/api/account/"+account+"/balance", &r); code != http.StatusOK {
		t.Fatalf("GET balance of %s: %d", account, code)
	}
	return r.Balance
}

func (h *harness) seed(t *testing.T, stock, balances map[string]int64) {
	t.Helper()
	if err := h.sys.state.Seed(context.Background(), stock, balances); err != nil {
		t.Fatal(err)
	}
}

// TestExampleOnRedis runs the whole example on a real redis-server.
func TestExampleOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	h := startSystem(t, srv.Addr)

	t.Run("duplicate orders are rejected", func(t *testing.T) { testDuplicateOrders(t, h) })
	t.Run("an order is placed once per idempotency key", func(t *testing.T) { testPlaceOnce(t, h) })
	t.Run("stock is never oversold", func(t *testing.T) { testDeductions(t, h) })
	t.Run("transfers keep the total", func(t *testing.T) { testTransfers(t, h) })
	t.Run("withdraw re-enters downstream", func(t *testing.T) { testWithdrawReentry(t, h) })
	t.Run("stale fence is refused", func(t *testing.T) { testStaleFence(t, h) })
}

// testPlaceOnce: duplicates of a placed order (same Idempotency-Key and body) all get the
// response of the one that ran, and one order is written; the same key with another body gets
// 422; another key places another order.
func testPlaceOnce(t *testing.T, h *harness) {
	place := func(key string, body createOrderReq) (int, string, string) {
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest(http.MethodPost, h.base+"/api/order/place", bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := h.http.Do(req)
		if err != nil {
			t.Error(err)
			return 0, "", ""
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out), resp.Header.Get("Idempotent-Replayed")
	}
	order := createOrderReq{UID: "carol", SKU: "plum", Qty: 1, DelayMs: 200}
	const n = 16
	var wg sync.WaitGroup
	codes, bodies, replays := make([]int, n), make([]string, n), make([]string, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i], bodies[i], replays[i] = place("carol-1", order)
		}()
	}
	wg.Wait()
	replayed := 0
	for i := range n {
		if codes[i] != http.StatusOK || bodies[i] != bodies[0] {
			t.Fatalf("duplicate %d: %d %s, want 200 and the body of the others %s", i, codes[i], bodies[i], bodies[0])
		}
		if replays[i] == "true" {
			replayed++
		}
	}
	if replayed != n-1 {
		t.Errorf("%d responses marked Idempotent-Replayed, want %d", replayed, n-1)
	}
	var book ordersReply
	if code := h.get(t, "/api/orders/carol", &book); code != http.StatusOK || len(book.Orders) != 1 {
		t.Fatalf("orders of carol after %d duplicates: status %d, %d orders, want 1", n, code, len(book.Orders))
	}
	// A later retry with the same key and body: the same response, no new order.
	if code, body, replay := place("carol-1", order); code != http.StatusOK || body != bodies[0] || replay != "true" {
		t.Errorf("later retry: %d %s replayed=%q", code, body, replay)
	}
	// The same key with another body: refused.
	other := order
	other.Qty = 2
	if code, _, _ := place("carol-1", other); code != http.StatusUnprocessableEntity {
		t.Errorf("same key, another body: %d, want 422", code)
	}
	// Another key: another order.
	if code, _, replay := place("carol-2", order); code != http.StatusOK || replay != "" {
		t.Errorf("another key: %d replayed=%q, want a new order", code, replay)
	}
	if code := h.get(t, "/api/orders/carol", &book); code != http.StatusOK || len(book.Orders) != 2 {
		t.Errorf("orders of carol: %d, want 2", len(book.Orders))
	}
}

// testDuplicateOrders: 200 concurrent orders of one user give one order and 199 409s.
func testDuplicateOrders(t *testing.T, h *harness) {
	const n = 200
	h.seed(t, map[string]int64{"widget": 50}, map[string]int64{"dave": 10_000})

	// Open the connections first, so that the burst reaches the server well within the
	// winner's hold.
	var warm sync.WaitGroup
	for range n {
		warm.Go(func() { h.get(t, "/api/stock/widget", nil) })
	}
	warm.Wait()

	var (
		start         = make(chan struct{})
		wg            sync.WaitGroup
		ok, busy, bad atomic.Int64
	)
	for range n {
		wg.Go(func() {
			<-start
			req := createOrderReq{UID: "dave", SKU: "widget", Qty: 2, DelayMs: 800}
			switch code := h.post(t, "/api/order/create", req, nil); code {
			case http.StatusOK:
				ok.Add(1)
			case http.StatusConflict:
				busy.Add(1)
			default:
				bad.Add(1)
				t.Errorf("create order: status %d", code)
			}
		})
	}
	close(start)
	wg.Wait()

	if ok.Load() != 1 || busy.Load() != n-1 || bad.Load() != 0 {
		t.Fatalf("got %d OK, %d conflicts, %d others; want 1, %d, 0", ok.Load(), busy.Load(), bad.Load(), n-1)
	}
	var orders ordersReply
	if code := h.get(t, "/api/orders/dave", &orders); code != http.StatusOK || len(orders.Orders) != 1 {
		t.Fatalf("orders of dave: status %d, %+v; want one order", code, orders)
	}
	if got := h.stock(t, "widget"); got != 48 {
		t.Errorf("stock of widget = %d, want 48", got)
	}
	if got := h.accountBalance(t, "dave"); got != 10_000-2*250 {
		t.Errorf("balance of dave = %d, want %d", got, 10_000-2*250)
	}
}

// testDeductions: 500 concurrent deductions of a SKU with stock 100 succeed exactly 100 times.
func testDeductions(t *testing.T, h *harness) {
	const n, stock = 500, 100
	h.seed(t, map[string]int64{"gadget": stock}, nil)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var (
		start               = make(chan struct{})
		wg                  sync.WaitGroup
		ok, outOfStock, bad atomic.Int64
	)
	for range n {
		wg.Go(func() {
			<-start
			_, err := h.inventory.Deduct(ctx, &inventorypb.DeductRequest{Sku: "gadget", Qty: 1})
			switch status.Code(err) {
			case codes.OK:
				ok.Add(1)
			case codes.FailedPrecondition:
				outOfStock.Add(1)
			default:
				bad.Add(1)
				t.Errorf("deduct: %v", err)
			}
		})
	}
	close(start)
	wg.Wait()

	if ok.Load() != stock || outOfStock.Load() != n-stock || bad.Load() != 0 {
		t.Fatalf("got %d OK, %d out of stock, %d others; want %d, %d, 0",
			ok.Load(), outOfStock.Load(), bad.Load(), stock, n-stock)
	}
	if got := h.stock(t, "gadget"); got != 0 {
		t.Fatalf("stock of gadget = %d, want 0", got)
	}
}

// testTransfers: concurrent transfers in both directions between a few accounts keep the total
// and all finish before a deadline (no deadlock).
func testTransfers(t *testing.T, h *harness) {
	const accounts, each, n = 5, 1_000, 300
	names := make([]string, accounts)
	balances := make(map[string]int64, accounts)
	for i := range names {
		names[i] = fmt.Sprintf("t%d", i)
		balances[names[i]] = each
	}
	h.seed(t, nil, balances)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var (
		start         = make(chan struct{})
		wg            sync.WaitGroup
		ok, poor, bad atomic.Int64
	)
	for i := range n {
		from := i % accounts
		to := (from + 1 + rand.IntN(accounts-1)) % accounts
		amount := 1 + rand.Int64N(400)
		wg.Go(func() {
			<-start
			_, err := h.balance.Transfer(ctx, &balancepb.TransferRequest{From: names[from], To: names[to], Amount: amount})
			switch status.Code(err) {
			case codes.OK:
				ok.Add(1)
			case codes.FailedPrecondition:
				poor.Add(1)
			default:
				bad.Add(1)
				t.Errorf("transfer %s -> %s: %v", names[from], names[to], err)
			}
		})
	}
	close(start)
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("transfers did not finish before the deadline: %v", ctx.Err())
	}

	var total int64
	for _, name := range names {
		total += h.accountBalance(t, name)
	}
	if total != accounts*each {
		t.Fatalf("total balance = %d, want %d", total, accounts*each)
	}
	if ok.Load() == 0 || bad.Load() != 0 {
		t.Fatalf("%d transfers OK, %d insufficient, %d others", ok.Load(), poor.Load(), bad.Load())
	}
	t.Logf("%d transfers OK, %d refused for insufficient funds", ok.Load(), poor.Load())
}

// testWithdrawReentry: the order API locks acct:{account} and calls Debit, which locks the same
// key; Debit re-enters the lock through the propagated owner and debits once.
func testWithdrawReentry(t *testing.T, h *harness) {
	h.seed(t, nil, map[string]int64{"erin": 5_000})

	began := time.Now()
	var r balanceReply
	if code := h.post(t, "/api/account/erin/withdraw", map[string]int64{"amount": 700}, &r); code != http.StatusOK {
		t.Fatalf("withdraw: status %d, want 200", code)
	}
	// Without re-entry Debit would wait out its 20s budget for a lock held by its own caller.
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("withdraw took %v: Debit waited instead of re-entering", took)
	}
	if r.Balance != 4_300 {
		t.Errorf("withdraw answered balance %d, want 4300", r.Balance)
	}
	if got := h.accountBalance(t, "erin"); got != 4_300 {
		t.Errorf("balance of erin = %d, want 4300 (debited once)", got)
	}
	// The REST lock was released: the account is free again.
	if code := h.post(t, "/api/account/erin/withdraw", map[string]int64{"amount": 300}, nil); code != http.StatusOK {
		t.Errorf("second withdraw: status %d, want 200", code)
	}
	if got := h.accountBalance(t, "erin"); got != 4_000 {
		t.Errorf("balance of erin = %d, want 4000", got)
	}
}

// testStaleFence: a write with the fence of an earlier lease is refused once a later lease
// wrote the entity.
func testStaleFence(t *testing.T, h *harness) {
	ctx := context.Background()
	h.seed(t, map[string]int64{"fenced": 10}, nil)
	locker := flightlock.MustNew(h.sys.store, flightlock.WithTTL(5*time.Second))

	first, err := locker.Lock(ctx, "sku:fenced")
	if err != nil {
		t.Fatal(err)
	}
	stale := first.Fence()
	if _, err := h.sys.state.AdjustStock(ctx, "fenced", -1, stale); err != nil {
		t.Fatalf("write under the first lease: %v", err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}

	second, err := locker.Lock(ctx, "sku:fenced")
	if err != nil {
		t.Fatal(err)
	}
	defer second.Release(ctx)
	if second.Fence() <= stale {
		t.Fatalf("second fence %d is not above the first %d", second.Fence(), stale)
	}
	if _, err := h.sys.state.AdjustStock(ctx, "fenced", -1, second.Fence()); err != nil {
		t.Fatalf("write under the second lease: %v", err)
	}
	if _, err := h.sys.state.AdjustStock(ctx, "fenced", -5, stale); !errors.Is(err, state.ErrStaleFence) {
		t.Fatalf("write with the stale fence: %v, want ErrStaleFence", err)
	}
	_, _, err = h.sys.state.Transfer(ctx, "fenced-a", "fenced-b", 1, stale, stale)
	if !errors.Is(err, state.ErrNotFound) {
		t.Errorf("transfer between unknown accounts: %v, want ErrNotFound", err)
	}
	if got := h.stock(t, "fenced"); got != 8 {
		t.Fatalf("stock of fenced = %d, want 8: the stale write changed it", got)
	}
	if got, err := h.sys.state.StockFence(ctx, "fenced"); err != nil || got != second.Fence() {
		t.Fatalf("stored fence = %d, %v; want %d", got, err, second.Fence())
	}
}

// TestExampleEmbedded is a smoke test of the default configuration's store, the embedded
// in-memory Redis: it needs no redis-server.
func TestExampleEmbedded(t *testing.T) {
	h := startSystem(t, "")

	// The demo data was seeded.
	if got := h.stock(t, "apple"); got != demoStock["apple"] {
		t.Fatalf("stock of apple = %d, want %d", got, demoStock["apple"])
	}

	// A duplicate order while the first is in flight is answered 409.
	first := make(chan int, 1)
	go func() {
		first <- h.post(t, "/api/order/create", createOrderReq{UID: "alice", SKU: "apple", Qty: 3, DelayMs: 800}, nil)
	}()
	// Wait until the first order holds its lock, then send the duplicate.
	held := false
	for range 500 { // 500 x 10ms at most
		if _, err := h.sys.store.TTL(context.Background(), "lock:order:alice"); err == nil {
			held = true
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !held {
		t.Fatalf("the first order never took its lock")
	}
	if code := h.post(t, "/api/order/create", createOrderReq{UID: "alice", SKU: "apple", Qty: 1}, nil); code != http.StatusConflict {
		t.Fatalf("duplicate order while the first is in flight: status %d, want 409", code)
	}
	if code := <-first; code != http.StatusOK {
		t.Fatalf("first order: status %d", code)
	}

	var orders ordersReply
	h.get(t, "/api/orders/alice", &orders)
	var qty int64
	for _, o := range orders.Orders {
		qty += o.Qty
		if o.Fence <= 0 {
			t.Errorf("order %s has no fence", o.ID)
		}
	}
	if got := h.stock(t, "apple"); got != demoStock["apple"]-qty {
		t.Errorf("stock of apple = %d, want %d", got, demoStock["apple"]-qty)
	}
	if got := h.accountBalance(t, "alice"); got != demoBalances["alice"]-qty*250 {
		t.Errorf("balance of alice = %d, want %d", got, demoBalances["alice"]-qty*250)
	}

	// Withdraw re-enters the balance service's lock of the same account.
	var r balanceReply
	if code := h.post(t, "/api/account/bob/withdraw", map[string]int64{"amount": 1_000}, &r); code != http.StatusOK || r.Balance != demoBalances["bob"]-1_000 {
		t.Fatalf("withdraw: status %d, %+v", code, r)
	}

	// Bad requests; carol can pay for 200 units at most.
	h.seed(t, map[string]int64{"bulk": 1_000}, nil)
	for _, tc := range []struct {
		name string
		body any
		want int
	}{
		{"missing uid", map[string]any{"sku": "apple", "qty": 1}, http.StatusBadRequest},
		{"bad uid", createOrderReq{UID: "a b", SKU: "apple", Qty: 1}, http.StatusBadRequest},
		{"zero qty", createOrderReq{UID: "carol", SKU: "apple", Qty: 0}, http.StatusBadRequest},
		{"unknown sku", createOrderReq{UID: "carol", SKU: "kiwi", Qty: 1}, http.StatusNotFound},
		{"out of stock", createOrderReq{UID: "carol", SKU: "plum", Qty: 21}, http.StatusBadRequest},
		{"insufficient funds", createOrderReq{UID: "carol", SKU: "bulk", Qty: 300}, http.StatusBadRequest},
	} {
		if code := h.post(t, "/api/order/create", tc.body, nil); code != tc.want {
			t.Errorf("%s: status %d, want %d", tc.name, code, tc.want)
		}
	}
	// The refused debit put the stock back and recorded no order.
	if got := h.stock(t, "bulk"); got != 1_000 {
		t.Errorf("stock of bulk after a refused order = %d, want 1000", got)
	}
	if got := h.accountBalance(t, "carol"); got != demoBalances["carol"] {
		t.Errorf("balance of carol after a refused order = %d, want %d", got, demoBalances["carol"])
	}
	h.get(t, "/api/orders/carol", &orders)
	if len(orders.Orders) != 0 {
		t.Errorf("orders of carol = %+v, want none", orders.Orders)
	}
}

// TestConfigFiles loads the shipped config files as main does.
func TestConfigFiles(t *testing.T) {
	for _, name := range []string{"flightlock-example.yaml", "flightlock-example-redis.yaml"} {
		t.Run(name, func(t *testing.T) {
			c, err := LoadConfig(filepath.Join("..", "..", "etc", name))
			if err != nil {
				t.Fatal(err)
			}
			for svc, lc := range map[string]flmw.LockConf{"Inventory": c.Inventory.Lock, "Balance": c.Balance.Lock} {
				if err := lc.Validate(); err != nil {
					t.Errorf("%s.%v", svc, err)
				}
			}
			if err := c.Order.Lock.Validate(); err != nil {
				t.Errorf("Order.%v", err)
			}
			if redis := strings.Contains(name, "redis"); redis != (c.Redis.Host != "") {
				t.Errorf("Redis.Host = %q", c.Redis.Host)
			}
			// Each Lock block of the Redis file carries the file's Redis, so that a block
			// pasted into another service's file locks on a real Redis, not on the embedded
			// store.
			for svc, lc := range map[string]flmw.LockConf{"Order": c.Order.Lock, "Inventory": c.Inventory.Lock, "Balance": c.Balance.Lock} {
				if lc.Redis.Host != c.Redis.Host {
					t.Errorf("%s.Lock.Redis.Host = %q, want the file's Redis.Host %q", svc, lc.Redis.Host, c.Redis.Host)
				}
			}
			if !c.Balance.Lock.TrustOwner || c.Order.Lock.Prefix != c.Balance.Lock.Prefix {
				t.Errorf("Balance must trust owners propagated by Order, with the same lock prefix")
			}
		})
	}
}

// A Lock.Redis that names another Redis than the top-level one is refused: the example would run
// that service on the top-level store anyway, and the file would say otherwise.
func TestLockRedisMustBeTheExamplesRedis(t *testing.T) {
	c, err := LoadConfig(filepath.Join("..", "..", "etc", "flightlock-example-redis.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("the shipped file: %v", err)
	}
	other := c
	other.Inventory.Lock.Redis.Host = "127.0.0.1:6380"
	if err := other.Validate(); err == nil || !strings.Contains(err.Error(), "Inventory.Lock.Redis.Host") {
		t.Errorf("another Redis under Inventory.Lock: %v, want an error naming Inventory.Lock.Redis.Host", err)
	}
	cluster := c
	cluster.Balance.Lock.Redis.Type = "cluster"
	if err := cluster.Validate(); err == nil || !strings.Contains(err.Error(), "Balance.Lock.Redis.Type") {
		t.Errorf("another Redis type under Balance.Lock: %v, want an error naming Balance.Lock.Redis.Type", err)
	}
	omitted := c
	omitted.Order.Lock.Redis = flmw.RedisConf{}
	if err := omitted.Validate(); err != nil {
		t.Errorf("a Lock without Redis (the top-level one by omission): %v", err)
	}
}

// TestWithoutOrderLock: the order API runs with no lock; orders are written unfenced, and
// Seed creates many accounts at once.
func TestWithoutOrderLock(t *testing.T) {
	h := startSystem(t, "", WithoutOrderLock())

	const users = 2_000
	names := make(map[string]int64, users)
	for i := range users {
		names[fmt.Sprintf("u%d", i)] = 1_000_000
	}
	if err := h.sys.Seed(context.Background(), names, names); err != nil {
		t.Fatal(err)
	}
	for _, uid := range []string{"u0", "u1999"} {
		if got := h.accountBalance(t, uid); got != 1_000_000 {
			t.Fatalf("balance of %s = %d, want 1000000", uid, got)
		}
	}

	// Two orders of one user in flight at once both go through: nothing rejects the second.
	var wg sync.WaitGroup
	codes := make(chan int, 2)
	for range 2 {
		wg.Go(func() {
			codes <- h.post(t, "/api/order/create", createOrderReq{UID: "u7", SKU: "u7", Qty: 1, DelayMs: 300}, nil)
		})
	}
	wg.Wait()
	close(codes)
	for code := range codes {
		if code != http.StatusOK {
			t.Fatalf("order without a lock: status %d, want 200", code)
		}
	}
	var orders ordersReply
	h.get(t, "/api/orders/u7", &orders)
	if len(orders.Orders) != 2 || orders.Orders[0].Fence != 0 {
		t.Fatalf("orders of u7 = %+v, want two unfenced orders", orders.Orders)
	}

	// An order book that a fenced write reached refuses unfenced writes.
	if _, err := h.sys.state.AddOrder(context.Background(), state.Order{UID: "u8", SKU: "u8", Qty: 1, Fence: 5}); err != nil {
		t.Fatal(err)
	}
	if code := h.post(t, "/api/order/create", createOrderReq{UID: "u8", SKU: "u8", Qty: 1}, nil); code != http.StatusConflict {
		t.Errorf("unfenced order on a fenced order book: status %d, want 409", code)
	}
}

// TestWithOrderLock: the order API's lock is replaced by another middleware, which sees
// every route.
func TestWithOrderLock(t *testing.T) {
	var calls atomic.Int64
	counting := func(next http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			next(w, r)
		}
	}
	h := startSystem(t, "", WithOrderLock(counting))

	var r createOrderReply
	if code := h.post(t, "/api/order/create", createOrderReq{UID: "alice", SKU: "apple", Qty: 1}, &r); code != http.StatusOK {
		t.Fatalf("create order: status %d, want 200", code)
	}
	if r.Order.Fence != 0 || r.Stock != demoStock["apple"]-1 {
		t.Errorf("order = %+v, want fence 0 and stock %d", r, demoStock["apple"]-1)
	}
	h.stock(t, "apple")
	if got := calls.Load(); got != 2 {
		t.Errorf("the middleware ran %d times, want 2 (create order, stock)", got)
	}
	// The downstream services keep their own locks: a withdrawal still debits.
	if code := h.post(t, "/api/account/bob/withdraw", map[string]int64{"amount": 100}, nil); code != http.StatusOK {
		t.Errorf("withdraw: status %d, want 200", code)
	}
}
