package middleware

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/zeromicro/go-zero/rest"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
)

// A wait for a busy key ends before go-zero's server timeout, so that the caller gets the busy
// answer (409 with Retry-After), not 503, with the rule's Wait below, at and above the server's
// timeout. The zrpc half runs inside zrpc's own chain, in example/zrpcchain.
func TestBusyAnswerArrivesBeforeTheServerTimeout(t *testing.T) {
	srv := redistest.Start(t)
	// A timeout whose reserve (a tenth, at most 100ms) outlasts a loaded machine's pauses.
	const timeout = time.Second
	for _, wait := range []time.Duration{600 * time.Millisecond, timeout, 3 * time.Second} {
		t.Run(wait.String(), func(t *testing.T) {
			m, err := New(LockConf{Redis: RedisConf{Host: srv.Addr}, Rules: []Rule{
				{Method: "POST", Path: "/pay", Key: "pay:{header.X-Uid}", OnBusy: "wait", Wait: wait},
			}})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			releasePay := holdKeyOn(t, srv, "pay:u1")
			defer releasePay()

			rc := restConf(t, timeout)
			s := serverless(t, rc, m, []rest.Route{{Method: http.MethodPost, Path: "/pay", Handler: func(w http.ResponseWriter, r *http.Request) {}}})
			r := httptest.NewRequest(http.MethodPost, "/pay", nil)
			r.Header.Set("X-Uid", "u1")
			w := serve(s, r)
			if w.Code != http.StatusConflict || w.Header().Get("Retry-After") == "" {
				t.Errorf("REST, Wait %v, server timeout %v: %d (Retry-After %q), want 409 with Retry-After", wait, timeout, w.Code, w.Header().Get("Retry-After"))
			}
		})
	}
}
