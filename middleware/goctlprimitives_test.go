package middleware_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/conf"
	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/rest"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/redisstore"
	flmw "github.com/flightlock/flightlock/middleware"
)

// primitivesRecipe returns the YAML and the .api file of docs/configuration.md's goctl recipe
// of reads, writes, permits and a line, so that the test runs what the docs show.
func primitivesRecipe(t *testing.T) (yamlText, api string) {
	t.Helper()
	b, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	const marker = "<!-- the goctl primitives recipe's YAML: TestGoctlPrimitivesRecipe loads this block -->\n```yaml\n"
	i := strings.Index(doc, marker)
	if i < 0 {
		t.Fatal("docs/configuration.md lost the recipe's YAML block")
	}
	yamlText, _, _ = strings.Cut(doc[i+len(marker):], "```")
	apiStart := strings.LastIndex(doc[:i], "```\n@server")
	if apiStart < 0 {
		t.Fatal("docs/configuration.md lost the recipe's .api block")
	}
	api, _, _ = strings.Cut(doc[apiStart+4:], "```")
	return yamlText, api
}

// shopTable counts the handlers of each kind inside at once and fails the test on a read and a
// write of one price at once.
type shopTable struct {
	readers, writers  atomic.Int32
	maxReaders        atomic.Int32
	exports, maxExp   atomic.Int32
	mu                sync.Mutex
	tickets           []string // guarded by mu: the order tickets were served in
	gate              chan struct{}
	gateExports       chan struct{}
	gateFirstTicket   chan struct{}
	firstTicketInside chan struct{}
}

func raise(max *atomic.Int32, v int32) {
	for m := max.Load(); v > m && !max.CompareAndSwap(m, v); m = max.Load() {
	}
}

// TestGoctlPrimitivesRecipe builds the goctl service of docs/configuration.md's recipe from the
// docs' own .api routes and YAML: one @server group whose GET reads and PUT writes a price under
// one name, a Permits group and a Fair group. Reads of a price share, a write excludes them,
// exports of a tenant stay at 3, and tickets are served in arrival order.
func TestGoctlPrimitivesRecipe(t *testing.T) {
	yamlText, api := primitivesRecipe(t)
	for _, route := range []string{"get /price/:sku", "put /price/:sku", "post /export/:tenant", "post /ticket/:desk",
		"middleware: PriceLock", "middleware: ExportLock", "middleware: TicketLock"} {
		if !strings.Contains(api, route) {
			t.Fatalf("the recipe's .api has no %q: the test's routes below follow it", route)
		}
	}
	var c goctlConfig
	if err := conf.LoadFromYamlBytes([]byte("Name: shop-api\nHost: 127.0.0.1\nPort: 8888\nMode: dev\n"+yamlText), &c); err != nil {
		t.Fatal(err)
	}
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), Protocol: 2, DisableIdentity: true, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	store := redisstore.New(rdb)
	t.Cleanup(func() { _ = store.Close() })

	c.Middlewares.Shedding = false // the CPU shedder's 503s on a loaded machine are not the lock's
	server := rest.MustNewServer(c.RestConf)
	logx.Disable()
	lock := flmw.MustNew(c.Lock, flmw.WithStore(store), flmw.WithServiceMode(c.Mode))
	t.Cleanup(func() { _ = lock.Close() })
	tab := &shopTable{}
	keyOf := func(r *http.Request) string {
		if l := flightlock.FromContext(r.Context()); l != nil {
			return l.Key()
		}
		return ""
	}
	// internal/handler/routes.go as goctl generates it for the three @server blocks, each
	// group's middleware from its stub (MustNamed).
	server.AddRoutes(rest.WithMiddlewares([]rest.Middleware{lock.MustNamed("PriceLock")},
		rest.Route{Method: http.MethodGet, Path: "/price/:sku", Handler: func(w http.ResponseWriter, r *http.Request) {
			raise(&tab.maxReaders, tab.readers.Add(1))
			defer tab.readers.Add(-1)
			if tab.writers.Load() != 0 || keyOf(r) != "lock:price:s1" {
				t.Errorf("a read of s1 beside a write, or under %q", keyOf(r))
			}
			if g := tab.gate; g != nil {
				<-g
			}
		}},
		rest.Route{Method: http.MethodPut, Path: "/price/:sku", Handler: func(w http.ResponseWriter, r *http.Request) {
			if tab.writers.Add(1) != 1 || tab.readers.Load() != 0 || keyOf(r) != "lock:price:s1" {
				t.Errorf("a write of s1 beside another write or a read, or under %q", keyOf(r))
			}
			time.Sleep(time.Millisecond)
			tab.writers.Add(-1)
		}},
	), rest.WithPrefix("/api"))
	server.AddRoutes(rest.WithMiddlewares([]rest.Middleware{lock.MustNamed("ExportLock")},
		rest.Route{Method: http.MethodPost, Path: "/export/:tenant", Handler: func(w http.ResponseWriter, r *http.Request) {
			raise(&tab.maxExp, tab.exports.Add(1))
			defer tab.exports.Add(-1)
			<-tab.gateExports
		}},
	), rest.WithPrefix("/api"))
	server.AddRoutes(rest.WithMiddlewares([]rest.Middleware{lock.MustNamed("TicketLock")},
		rest.Route{Method: http.MethodPost, Path: "/ticket/:desk", Handler: func(w http.ResponseWriter, r *http.Request) {
			who := r.URL.Query().Get("who")
			if who == "first" {
				close(tab.firstTicketInside)
				<-tab.gateFirstTicket
			}
			tab.mu.Lock()
			tab.tickets = append(tab.tickets, who)
			tab.mu.Unlock()
		}},
	), rest.WithPrefix("/api"))
	if err := lock.CheckRoutes(server.Routes()); err != nil {
		t.Fatalf("CheckRoutes: %v", err)
	}
	s, err := rest.NewServerless(server)
	if err != nil {
		t.Fatal(err)
	}
	do := func(method, target string) int {
		w := httptest.NewRecorder()
		s.Serve(w, httptest.NewRequest(method, target, http.NoBody))
		return w.Code
	}

	// Reads share: two GETs are inside at once. A PUT waits for them, then runs alone.
	tab.gate = make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if code := do(http.MethodGet, "/api/price/s1"); code != http.StatusOK {
				t.Errorf("GET: %d", code)
			}
		})
	}
	waitUntil(t, "two reads of s1 inside at once", func() bool { return tab.readers.Load() == 2 })
	wg.Go(func() {
		if code := do(http.MethodPut, "/api/price/s1"); code != http.StatusOK {
			t.Errorf("PUT: %d", code)
		}
	})
	close(tab.gate)
	wg.Wait()
	tab.gate = nil
	// Then a burst of both: the handlers check that no read runs beside a write.
	for i := range 24 {
		method := http.MethodGet
		if i%4 == 0 {
			method = http.MethodPut
		}
		wg.Go(func() {
			if code := do(method, "/api/price/s1"); code != http.StatusOK {
				t.Errorf("%s in a burst: %d", method, code)
			}
		})
	}
	wg.Wait()

	// Exports of one tenant: 3 at once, the others wait (OnBusy: wait, the default).
	tab.gateExports = make(chan struct{})
	for range 5 {
		wg.Go(func() {
			if code := do(http.MethodPost, "/api/export/acme"); code != http.StatusOK {
				t.Errorf("export: %d", code)
			}
		})
	}
	waitUntil(t, "3 exports of acme inside", func() bool { return tab.exports.Load() == 3 })
	close(tab.gateExports)
	wg.Wait()
	if got := tab.maxExp.Load(); got != 3 {
		t.Errorf("%d exports of one tenant at once, want 3", got)
	}

	// Tickets of one desk in arrival order: each waiter joins the line after the one before.
	tab.gateFirstTicket, tab.firstTicketInside = make(chan struct{}), make(chan struct{})
	wg.Go(func() { do(http.MethodPost, "/api/ticket/d1?who=first") })
	<-tab.firstTicketInside
	line := lockstore.SideKey("line", "lock:desk:d1")
	base := rdb.ZCard(context.Background(), line).Val() // the first's own place, if kept
	want := []string{"first"}
	for i, who := range []string{"a", "b", "c", "d"} {
		wg.Go(func() { do(http.MethodPost, "/api/ticket/d1?who="+who) })
		waitUntil(t, who+" in the desk's line", func() bool { return rdb.ZCard(context.Background(), line).Val() >= base+int64(i+1) })
		want = append(want, who)
	}
	close(tab.gateFirstTicket)
	wg.Wait()
	if got := strings.Join(tab.tickets, ","); got != strings.Join(want, ",") {
		t.Errorf("tickets served %s, want arrival order %s", got, strings.Join(want, ","))
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
