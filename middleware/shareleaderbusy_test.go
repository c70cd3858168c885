package middleware

// When the request that leads the first run of a key has its Locker wait run out (409 for it),
// the duplicates that joined the run are not answered with that 409: the run is handed to one
// of them (errLeaderLeft), and each waits within its own Wait.
//
// Here: Wait 1s; another process holds the key until 1.3s; the leader comes at 0, a duplicate
// at 0.7s (its Wait ends at 1.7s). The key is free at 1.3s, within the duplicate's Wait, so the
// duplicate must get 200, not the leader's 409 at about 1.0s.

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeromicro/go-zero/rest"
)

func TestShareFirstLeaderBusyFailsNoDuplicate(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{shareRuleWaiting(time.Second)}})
	var runs atomic.Int32
	handler := func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("paid"))
	}
	s := serverless(t, restConf(t, 10*time.Second), m, []rest.Route{{Method: http.MethodPost, Path: "/pay", Handler: handler}})

	holder := holdKey(t, tr, "pay:u1:k1") // another process
	start := time.Now()
	go func() {
		time.Sleep(1300 * time.Millisecond)
		_ = holder.Release(context.Background())
	}()
	leader := make(chan int, 1)
	go func() { leader <- serve(s, payRequest("u1", "k1", `{}`)).Code }()
	time.Sleep(700 * time.Millisecond)
	dupStart := time.Now()
	w := serve(s, payRequest("u1", "k1", `{}`))
	took := time.Since(dupStart)
	if code := <-leader; code != http.StatusConflict {
		t.Logf("leader: %d (expected 409: its own Wait of 1s ran out at 1.0s)", code)
	}
	if w.Code != http.StatusOK {
		t.Errorf("duplicate that came at 0.7s (its Wait ends at 1.7s; key free at 1.3s): %d %q after %v "+
			"(%v since start), handler runs %d; want 200: the leader's wait running out must not answer "+
			"the duplicates that joined its run",
			w.Code, w.Body.String(), took.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), runs.Load())
	}
}
