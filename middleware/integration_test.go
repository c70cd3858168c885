package middleware

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/zeromicro/go-zero/rest"
)

// TestRealRedis runs the REST middleware, built from LockConf alone, on a real redis-server
// started on a free loopback port: two Middlewares on one Redis stand for two processes.
func TestRealRedis(t *testing.T) {
	srv := redistest.Start(t)
	c := LockConf{
		Redis: RedisConf{Host: srv.Addr, Protocol: 2},
		TTL:   5 * time.Second,
		Rules: []Rule{{Method: http.MethodPost, Path: "/order/:uid", Key: "order:{uid}"}},
	}
	a, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b := MustNew(c)
	defer b.Close()

	s := serverless(t, restConf(t, 3*time.Second), a, []rest.Route{{Method: http.MethodPost, Path: "/order/:uid", Handler: echoKeys}})
	post := func() *httptest.ResponseRecorder {
		return serve(s, httptest.NewRequest(http.MethodPost, "/order/1", http.NoBody))
	}

	lease, err := b.Locker().TryLock(context.Background(), "order:1")
	if err != nil {
		t.Fatal(err)
	}
	if w := post(); w.Code != http.StatusConflict || w.Header().Get("Retry-After") == "" {
		t.Fatalf("held by the other process: %d (Retry-After %q), want 409 with Retry-After", w.Code, w.Header().Get("Retry-After"))
	}
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if w := post(); w.Code != http.StatusOK || w.Body.String() != "lock:order:1" {
		t.Fatalf("after release: %d %q", w.Code, w.Body)
	}

	srv.Stop()
	if w := post(); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("Redis stopped: %d, want 503", w.Code)
	}
}
