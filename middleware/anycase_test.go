package middleware

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/zeromicro/go-zero/core/conf"
	"github.com/zeromicro/go-zero/rest"
	"github.com/zeromicro/go-zero/rest/pathvar"
)

// TestNewTakesWordsInAnyCase: the words of a config loaded by go-zero are honoured in any case,
// not only accepted: a rule with Method post (goctl's .api spelling) locks POST requests, and
// OnBusy Wait queues for a busy key instead of answering 409. So are those of a rule built in Go.
func TestNewTakesWordsInAnyCase(t *testing.T) {
	var c struct{ Lock LockConf }
	const yaml = "Lock:\n  Rules:\n    - Method: post\n      Path: /api/order/:uid\n      Key: \"order:{uid}\"\n      OnBusy: Wait\n"
	if err := conf.LoadFromYamlBytes([]byte(yaml), &c); err != nil {
		t.Fatalf("load: %v", err)
	}
	tr := newTestRedis(t)
	m, err := New(c.Lock, WithLocker(tr.locker(t)),
		WithHTTPRule(Rule{Method: "put", Path: "/api/order/:uid", OnBusy: "WAIT"}, func(r *http.Request) (string, error) {
			return "order:" + pathvar.Vars(r)["uid"], nil
		}))
	if err != nil {
		t.Fatalf("New must normalize the config before it checks and reads it (LockConf.normalized, Rule.normalized): %v", err)
	}
	t.Cleanup(func() { _ = m.Close() })

	handler := func(w http.ResponseWriter, r *http.Request) {
		if flightlock.FromContext(r.Context()) == nil {
			w.WriteHeader(http.StatusTeapot) // not locked
		}
	}
	s := serverless(t, restConf(t, 3*time.Second), m, []rest.Route{
		{Method: http.MethodPost, Path: "/api/order/:uid", Handler: handler},
		{Method: http.MethodPut, Path: "/api/order/:uid", Handler: handler},
	})
	for _, method := range []string{http.MethodPost, http.MethodPut} {
		// Another process holds the key for a moment: a waiting rule gets it after the release.
		holder := holdKey(t, tr, "order:9")
		go func() {
			time.Sleep(100 * time.Millisecond)
			_ = holder.Release(context.Background())
		}()
		if w := serve(s, httptest.NewRequest(method, "/api/order/9", http.NoBody)); w.Code != http.StatusOK {
			t.Errorf("%s with the key held for 100ms: %d, want 200 after a wait, under the lock", method, w.Code)
		}
	}
}
