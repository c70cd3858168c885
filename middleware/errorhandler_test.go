package middleware_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/lockstore/redisstore"
	flmw "github.com/flightlock/flightlock/middleware"
	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/conf"
	"github.com/zeromicro/go-zero/rest"
	"github.com/zeromicro/go-zero/rest/httpx"
)

// errorBody is a service's uniform error reply, as in the README.
type errorBody struct {
	Code int    `json:"code"`
	Msg  string `json:"msg"`
}

// uniformErrors is the README's error handler (section Errors), word for word.
func uniformErrors(ctx context.Context, err error) (int, any) {
	if status := flmw.HTTPStatus(err); status != 0 {
		// A lock error keeps its status: 409 busy, 400 bad key, 503 lock store down.
		// The middleware has set Retry-After on a busy reply already.
		return status, errorBody{Code: status, Msg: http.StatusText(status)}
	}
	return http.StatusBadRequest, errorBody{Code: 1, Msg: err.Error()} // the service's own errors
}

// TestUniformErrorHandler runs the README's httpx.SetErrorHandlerCtx handler through go-zero's
// whole REST chain: a service that shapes every error as {code, msg} keeps the status of a
// lock error, and Retry-After on a busy one.
func TestUniformErrorHandler(t *testing.T) {
	httpx.SetErrorHandlerCtx(uniformErrors)
	t.Cleanup(func() { httpx.SetErrorHandlerCtx(nil) })

	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{
		Addr: mr.Addr(), Protocol: 2, DisableIdentity: true, ContextTimeoutEnabled: true,
		MaxRetries: -1, // a stopped server fails at once
	})
	store := redisstore.New(client)
	t.Cleanup(func() { _ = store.Close(); _ = client.Close() })
	lock, err := flmw.New(flmw.LockConf{
		Rules: []flmw.Rule{
			{Method: http.MethodPost, Path: "/api/order/:uid", Key: "order:{uid}"},
			{Method: http.MethodPost, Path: "/api/cart", Key: "cart:{query.uid}"},
		},
	}, flmw.WithLocker(flightlock.MustNew(store, flightlock.WithTTL(5*time.Second))))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = lock.Close() })

	var rc rest.RestConf
	if err := conf.LoadFromYamlBytes([]byte("Name: errors-test\nHost: 127.0.0.1\nPort: 0\n"), &rc); err != nil {
		t.Fatal(err)
	}
	rc.Timeout = 3000
	rc.Middlewares.Prometheus, rc.Middlewares.Metrics, rc.Middlewares.Trace = false, false, false
	rc.Middlewares.Shedding = false // the CPU shedder's 503s on a loaded machine are not the lock's
	server, err := rest.NewServer(rc)
	if err != nil {
		t.Fatal(err)
	}
	server.Use(lock.Handle)
	ok := func(w http.ResponseWriter, r *http.Request) { httpx.OkJsonCtx(r.Context(), w, errorBody{}) }
	server.AddRoutes([]rest.Route{
		{Method: http.MethodPost, Path: "/api/order/:uid", Handler: ok},
		{Method: http.MethodPost, Path: "/api/cart", Handler: ok},
		{Method: http.MethodPost, Path: "/api/stock", Handler: func(w http.ResponseWriter, r *http.Request) {
			httpx.ErrorCtx(r.Context(), w, errors.New("out of stock"))
		}},
	})
	s, err := rest.NewServerless(server)
	if err != nil {
		t.Fatal(err)
	}
	serve := func(target string) (*httptest.ResponseRecorder, errorBody) {
		w := httptest.NewRecorder()
		s.Serve(w, httptest.NewRequest(http.MethodPost, target, http.NoBody))
		var body errorBody
		if w.Code != http.StatusOK {
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
				t.Errorf("%s: body %q is not the uniform reply: %v", target, w.Body, err)
			}
		}
		return w, body
	}

	// Another process (a Locker with a gate of its own) holds order:7.
	holder, err := flightlock.MustNew(store, flightlock.WithTTL(5*time.Second)).TryLock(context.Background(), "order:7")
	if err != nil {
		t.Fatalf("hold order:7: %v", err)
	}
	w, body := serve("/api/order/7")
	secs, aerr := strconv.Atoi(w.Header().Get("Retry-After"))
	if w.Code != http.StatusConflict || body.Code != http.StatusConflict || aerr != nil || secs < 1 || secs > 5 {
		t.Errorf("busy key: %d %+v, Retry-After %q; want 409, code 409, Retry-After 1..5 (TTL 5s)",
			w.Code, body, w.Header().Get("Retry-After"))
	}
	_ = holder.Release(context.Background())
	if w, _ := serve("/api/order/7"); w.Code != http.StatusOK {
		t.Errorf("free key: %d, want 200", w.Code)
	}

	// A key that cannot be built: no uid in the query.
	if w, body := serve("/api/cart"); w.Code != http.StatusBadRequest || body.Code != http.StatusBadRequest {
		t.Errorf("bad key: %d %+v, want 400 with code 400", w.Code, body)
	}
	if w, _ := serve("/api/cart?uid=1"); w.Code != http.StatusOK {
		t.Errorf("good key: %d, want 200", w.Code)
	}

	// The service's own errors keep the service's answer.
	if w, body := serve("/api/stock"); w.Code != http.StatusBadRequest || body.Code != 1 || body.Msg != "out of stock" {
		t.Errorf("the service's own error: %d %+v, want 400 with code 1", w.Code, body)
	}

	mr.Close() // the lock store goes down
	if w, body := serve("/api/order/8"); w.Code != http.StatusServiceUnavailable || body.Code != http.StatusServiceUnavailable {
		t.Errorf("store down: %d %+v, want 503 with code 503", w.Code, body)
	}
}
