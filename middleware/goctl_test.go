package middleware_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	flmw "github.com/flightlock/flightlock/middleware"
	"github.com/zeromicro/go-zero/core/conf"
	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/rest"
	"github.com/zeromicro/go-zero/rest/httpx"
)

// The service below is laid out as `goctl api go` lays out one for this .api file, each piece
// wired as the README's goctl recipe says:
//
//	@server(prefix: /api/stock, middleware: StockLock)
//	service stock-api {
//		@handler GetStock
//		get /:sku (StockReq) returns (StockResp)
//		@handler Deduct
//		post /:sku/deduct (DeductReq) returns (StockResp)
//	}

// goctlYAML is etc/stock-api.yaml. Mode dev: without a Redis host the locks live in the
// embedded in-memory Redis, which is for development only.
const goctlYAML = `
Name: stock-api
Host: 127.0.0.1
Port: 8888
Mode: dev
Lock:
  Rules:
    - Name: StockLock                 # @server(middleware: StockLock)
      Method: POST
      Path: /api/stock/:sku/deduct    # the full path, group prefix included
      Key: "stock:{path.sku}"
      OnBusy: wait
`

// goctlConfig is internal/config/config.go.
type goctlConfig struct {
	rest.RestConf
	Lock flmw.LockConf
}

// serviceContext is internal/svc/servicecontext.go, with a stock table for the logic.
type serviceContext struct {
	Config    goctlConfig
	Lock      *flmw.Middleware
	StockLock rest.Middleware // @server(middleware: StockLock)

	stock *stockTable
}

// stockLockMiddleware is internal/middleware/stocklockmiddleware.go, the stub goctl writes
// once for @server(middleware: StockLock) and never overwrites, made to delegate to the
// YAML rule of that name (the stub is kept, not left unused).
type stockLockMiddleware struct {
	lock rest.Middleware
}

func newStockLockMiddleware(lock *flmw.Middleware) *stockLockMiddleware {
	return &stockLockMiddleware{lock: lock.MustNamed("StockLock")}
}

func (m *stockLockMiddleware) Handle(next http.HandlerFunc) http.HandlerFunc {
	return m.lock(next)
}

// newServiceContext is NewServiceContext: it returns no error, hence MustNew and MustNamed,
// and it cannot defer Close, which would close the store before the first request: New
// registered the drain with go-zero's shutdown listeners.
func newServiceContext(c goctlConfig) *serviceContext {
	lock := flmw.MustNew(c.Lock, flmw.WithServiceMode(c.Mode), flmw.WithServerTimeout(c.Timeout))
	return &serviceContext{
		Config:    c,
		Lock:      lock,
		StockLock: newStockLockMiddleware(lock).Handle, // goctl wrote middleware.NewStockLockMiddleware().Handle
		stock:     newStockTable(),
	}
}

// registerHandlers is internal/handler/routes.go as goctl generates it.
func registerHandlers(server *rest.Server, serverCtx *serviceContext) {
	server.AddRoutes(
		rest.WithMiddlewares(
			[]rest.Middleware{serverCtx.StockLock},
			[]rest.Route{
				{
					Method:  http.MethodGet,
					Path:    "/:sku",
					Handler: getStockHandler(serverCtx),
				},
				{
					Method:  http.MethodPost,
					Path:    "/:sku/deduct",
					Handler: deductHandler(serverCtx),
				},
			}...,
		),
		rest.WithPrefix("/api/stock"),
	)
}

// internal/types/types.go.
type (
	stockReq struct {
		Sku string `path:"sku"`
	}
	deductReq struct {
		Sku    string `path:"sku"`
		Amount int    `json:"amount"`
	}
	stockResp struct {
		Sku    string `json:"sku"`
		Left   int    `json:"left"`
		Locked string `json:"locked"` // the key of the lease the handler runs under, if any
	}
)

// getStockHandler is internal/handler/getstockhandler.go with its logic inlined.
func getStockHandler(svcCtx *serviceContext) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req stockReq
		if err := httpx.Parse(r, &req); err != nil {
			httpx.ErrorCtx(r.Context(), w, err)
			return
		}
		httpx.OkJsonCtx(r.Context(), w, &stockResp{Sku: req.Sku, Left: svcCtx.stock.get(req.Sku), Locked: leaseKey(r)})
	}
}

// deductHandler is internal/handler/deducthandler.go with its logic inlined: a read, a pause
// and a write, which loses updates unless the requests of one SKU run one at a time.
func deductHandler(svcCtx *serviceContext) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req deductReq
		if err := httpx.Parse(r, &req); err != nil {
			httpx.ErrorCtx(r.Context(), w, err)
			return
		}
		left := svcCtx.stock.deduct(req.Sku, req.Amount)
		httpx.OkJsonCtx(r.Context(), w, &stockResp{Sku: req.Sku, Left: left, Locked: leaseKey(r)})
	}
}

func leaseKey(r *http.Request) string {
	if l := flightlock.FromContext(r.Context()); l != nil {
		return l.Key()
	}
	return ""
}

// stockTable is the service's database: deduct reads, pauses and writes, and counts the
// deductions of one SKU in flight at once. hold, when set, makes the next deduct wait for it
// to be closed after signalling held.
type stockTable struct {
	mu        sync.Mutex
	left      map[string]int // guarded by mu
	hold      chan struct{}  // guarded by mu
	held      chan struct{}  // guarded by mu
	active    atomic.Int32
	maxActive atomic.Int32
}

func newStockTable() *stockTable {
	return &stockTable{left: map[string]int{"s1": 100, "s2": 100}}
}

func (t *stockTable) get(sku string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.left[sku]
}

func (t *stockTable) deduct(sku string, n int) int {
	for a := t.active.Add(1); ; {
		if m := t.maxActive.Load(); a <= m || t.maxActive.CompareAndSwap(m, a) {
			break
		}
	}
	defer t.active.Add(-1)
	left := t.get(sku)
	t.mu.Lock()
	hold, held := t.hold, t.held
	t.hold, t.held = nil, nil
	t.mu.Unlock()
	if hold != nil {
		close(held)
		<-hold
	}
	time.Sleep(200 * time.Microsecond) // a round trip to the database
	t.mu.Lock()
	defer t.mu.Unlock()
	t.left[sku] = left - n
	return t.left[sku]
}

// startGoctl loads yaml as the service's config and builds it as goctl's main.go does, with
// the recipe's CheckRoutes after the routes are registered; it returns go-zero's whole REST
// chain, the service context and CheckRoutes' answer.
func startGoctl(t *testing.T, yaml string) (*rest.Serverless, *serviceContext, error) {
	t.Helper()
	var c goctlConfig
	if err := conf.LoadFromYamlBytes([]byte(yaml), &c); err != nil {
		t.Fatal(err)
	}
	c.Middlewares.Shedding = false // the CPU shedder's 503s on a loaded machine are not the lock's
	server := rest.MustNewServer(c.RestConf)
	logx.Disable() // TestMain's, undone by the first logx.SetUp of the test binary (MustNewServer)
	ctx := newServiceContext(c)
	t.Cleanup(func() { _ = ctx.Lock.Close() }) // what the shutdown listener does in the service
	registerHandlers(server, ctx)
	checked := ctx.Lock.CheckRoutes(server.Routes())
	s, err := rest.NewServerless(server)
	if err != nil {
		t.Fatal(err)
	}
	return s, ctx, checked
}

func goctlRequest(s *rest.Serverless, method, target string, body string) (*httptest.ResponseRecorder, stockResp) {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	w := httptest.NewRecorder()
	s.Serve(w, r)
	var resp stockResp
	_ = json.Unmarshal(w.Body.Bytes(), &resp)
	return w, resp
}

// TestGoctlRecipe wires a goctl-shaped service as the README's recipe says: the key in the
// YAML rule StockLock, the group's middleware from MustNamed, CheckRoutes after the routes.
// The group's read-only GET passes unlocked, even while the SKU is locked; its POST deducts
// run one at a time per SKU.
func TestGoctlRecipe(t *testing.T) {
	s, ctx, err := startGoctl(t, goctlYAML)
	if err != nil {
		t.Fatalf("CheckRoutes: %v", err)
	}

	// One deduction holds s1; the GET of s1 and a deduction of s2 do not wait for it.
	hold, held := make(chan struct{}), make(chan struct{})
	ctx.stock.mu.Lock()
	ctx.stock.hold, ctx.stock.held = hold, held
	ctx.stock.mu.Unlock()
	done := make(chan stockResp)
	go func() {
		w, resp := goctlRequest(s, http.MethodPost, "/api/stock/s1/deduct", `{"amount": 1}`)
		if w.Code != http.StatusOK {
			t.Errorf("held deduction: %d %s", w.Code, w.Body)
		}
		done <- resp
	}()
	<-held
	if w, resp := goctlRequest(s, http.MethodGet, "/api/stock/s1", ""); w.Code != http.StatusOK || resp.Locked != "" || resp.Left != 100 {
		t.Errorf("GET /api/stock/s1 while s1 is locked: %d %s, want 200, unlocked, 100 left", w.Code, w.Body)
	}
	if w, resp := goctlRequest(s, http.MethodPost, "/api/stock/s2/deduct", `{"amount": 1}`); w.Code != http.StatusOK || resp.Locked != "lock:stock:s2" || resp.Left != 99 {
		t.Errorf("POST /api/stock/s2/deduct while s1 is locked: %d %s, want 200 under lock:stock:s2", w.Code, w.Body)
	}
	close(hold)
	if resp := <-done; resp.Locked != "lock:stock:s1" || resp.Left != 99 {
		t.Errorf("held deduction: %+v, want 99 left under lock:stock:s1", resp)
	}

	// Concurrent deductions of s1 queue (OnBusy: wait) and none is lost.
	const n = 16
	ctx.stock.maxActive.Store(0)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if w, _ := goctlRequest(s, http.MethodPost, "/api/stock/s1/deduct", `{"amount": 1}`); w.Code != http.StatusOK {
				t.Errorf("concurrent deduction: %d %s, want 200 (OnBusy: wait)", w.Code, w.Body)
			}
		}()
	}
	close(start)
	wg.Wait()
	if got := ctx.stock.maxActive.Load(); got != 1 {
		t.Errorf("%d deductions of s1 ran at once, want 1", got)
	}
	if w, resp := goctlRequest(s, http.MethodGet, "/api/stock/s1", ""); resp.Left != 99-n {
		t.Errorf("GET /api/stock/s1: %s, want %d left", w.Body, 99-n)
	}
}

// TestGoctlRecipeChecked shows CheckRoutes stopping the goctl service of TestGoctlRecipe when
// its StockLock rule would lock nothing.
func TestGoctlRecipeChecked(t *testing.T) {
	tests := []struct {
		name  string
		edits []string // old, new pairs applied to goctlYAML
		want  string
	}{
		{"Path without the group prefix", []string{"Path: /api/stock/:sku/deduct", "Path: /:sku/deduct"},
			"Lock.Rules[0] (StockLock): POST /:sku/deduct matches no route of the server (did you mean POST /api/stock/:sku/deduct?)"},
		{"Method of no route", []string{"Method: POST", "Method: PUT"},
			"Lock.Rules[0] (StockLock): PUT /api/stock/:sku/deduct matches no route of the server (did you mean POST /api/stock/:sku/deduct?)"},
		{"Path of another variable", []string{"Path: /api/stock/:sku/deduct", "Path: /api/stock/:id/deduct", "{path.sku}", "{path.id}"},
			"Lock.Rules[0] (StockLock): POST /api/stock/:id/deduct matches no route of the server (did you mean POST /api/stock/:sku/deduct?)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := startGoctl(t, strings.NewReplacer(tt.edits...).Replace(goctlYAML))
			if err == nil || err.Error() != tt.want {
				t.Fatalf("CheckRoutes: %v, want %q", err, tt.want)
			}
		})
	}

	// A group prefix in the Path and Method are optional: without them the rule locks every
	// request of the group, and CheckRoutes has nothing to check.
	var group []string
	for _, line := range strings.Split(goctlYAML, "\n") {
		if !strings.Contains(line, "Method:") && !strings.Contains(line, "Path:") {
			group = append(group, line)
		}
	}
	s, _, err := startGoctl(t, strings.Join(group, "\n"))
	if err != nil {
		t.Fatalf("CheckRoutes of a rule for the whole group: %v", err)
	}
	if w, resp := goctlRequest(s, http.MethodGet, "/api/stock/s1", ""); w.Code != http.StatusOK || resp.Locked != "lock:stock:s1" {
		t.Errorf("GET under a rule for the whole group: %d %s, want it locked", w.Code, w.Body)
	}
}
