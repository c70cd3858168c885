package middleware

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/zeromicro/go-zero/rest"
)

// Two instances of one service whose configs differ (one exports with Permits: 3, the other
// without Permits, as a config not rolled out yet) lock one key in two ways. Neither config is
// wrong on its own, so neither refuses to start; the instance that finds the key held by the
// other kind counts it in flightlock_drift_total under its rule, and logs it.
func TestDriftBetweenInstancesIsCounted(t *testing.T) {
	tr := newTestRedis(t)
	rule := Rule{Method: http.MethodPost, Path: "/export/:tenant", Key: "export:{path.tenant}", OnBusy: "reject"}
	newInstance := func(permits int) (*rest.Serverless, chan struct{}) {
		r := rule
		r.Permits = permits
		m, err := New(LockConf{Rules: []Rule{r}}, WithStore(tr.store))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		block := make(chan struct{})
		return serverless(t, restConf(t, 10*time.Second), m, []rest.Route{{Method: http.MethodPost, Path: "/export/:tenant",
			Handler: func(w http.ResponseWriter, r *http.Request) { <-block }}}), block
	}
	old, oldBlock := newInstance(0) // a lock: permit 1 of the key
	updated, updatedBlock := newInstance(3)
	close(updatedBlock)
	const name = "POST /export/:tenant"
	before := metricValue(t, "flightlock_drift_total", name)

	done := make(chan int)
	go func() {
		w := httptest.NewRecorder()
		old.Serve(w, httptest.NewRequest(http.MethodPost, "/export/acme", http.NoBody))
		done <- w.Code
	}()
	waitFor(t, 5*time.Second, "the old instance's export to hold the key", func() bool { return !tr.isFree("export:acme") })
	// The updated instance's look finds the old instance's lock on permit 1, busy, while it
	// takes another permit, and counts drift.
	for range 3 {
		w := httptest.NewRecorder()
		updated.Serve(w, httptest.NewRequest(http.MethodPost, "/export/acme", http.NoBody))
	}
	close(oldBlock)
	<-done
	if got := metricValue(t, "flightlock_drift_total", name) - before; got < 1 {
		t.Fatalf("flightlock_drift_total{rule=%q} grew by %v, want at least 1", name, got)
	}
}
