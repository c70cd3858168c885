package middleware

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// A shadow rule changes no response: the same requests, concurrent duplicates, a key that
// cannot be built and a dead Redis get the same status, headers and body as with no rule.
func TestShadowChangesNoResponse(t *testing.T) {
	tr := newTestRedis(t)
	handler := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Handler", "ran")
		time.Sleep(5 * time.Millisecond)
		fmt.Fprintf(w, "paid %s", r.URL.Query().Get("n"))
	}
	none := newMiddleware(t, tr, LockConf{})
	shadow := newMiddleware(t, tr, LockConf{Rules: []Rule{
		{Method: "POST", Path: "/s/pay", Key: "pay:{body.uid}", Shadow: true},
	}})
	dead, err := New(LockConf{Redis: RedisConf{Host: deadRedis(t), NonBlock: true, PingTimeout: time.Second},
		Rules: []Rule{{Method: "POST", Path: "/s/pay", Key: "pay:{body.uid}", Shadow: true}}})
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()

	type reply struct {
		code int
		hdr  string
		body string
	}
	run := func(m *Middleware, body, contentType string, n int) reply {
		r := httptest.NewRequest(http.MethodPost, fmt.Sprintf("/s/pay?n=%d", n), strings.NewReader(body))
		r.Header.Set("Content-Type", contentType)
		w := httptest.NewRecorder()
		m.Handle(handler)(w, r)
		return reply{w.Code, w.Header().Get("X-Handler") + "|" + w.Header().Get("Retry-After"), w.Body.String()}
	}
	cases := []struct {
		name, body, ct string
	}{
		{"plain", `{"uid":"a"}`, "application/json"},
		{"no key", `{"other":1}`, "application/json"},
		{"not json", `uid=a`, "text/plain"},
	}
	for _, c := range cases {
		want := run(none, c.body, c.ct, 1)
		for name, m := range map[string]*Middleware{"shadow": shadow, "shadow on a dead Redis": dead} {
			if got := run(m, c.body, c.ct, 1); got != want {
				t.Errorf("%s, %s: %+v, want %+v as without the rule", c.name, name, got, want)
			}
		}
	}
	// Concurrent duplicates: all of them run and answer as without the rule.
	const n = 16
	var wg sync.WaitGroup
	got := make([]reply, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = run(shadow, `{"uid":"dup"}`, "application/json", i)
		}()
	}
	wg.Wait()
	for i, g := range got {
		if want := run(none, `{"uid":"dup"}`, "application/json", i); g != want {
			t.Errorf("duplicate %d: %+v, want %+v", i, g, want)
		}
	}
	if !tr.isFree("shadow:pay:dup") || !tr.isFree("pay:dup") {
		t.Error("a shadow lock was left in Redis")
	}
}

// Conflicts are counted exactly under concurrency: n requests on one key whose handlers all
// run at once make n-1 conflicts ("would reject"), and a key that cannot be built one more.
func TestShadowCountsConflicts(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{
		{Method: "POST", Path: "/s/count", Key: "count:{body.uid}", Shadow: true, OnBusy: "reject"},
		{Method: "POST", Path: "/s/countwait", Key: "countwait:{body.uid}", Shadow: true, OnBusy: "wait"},
	}})
	for _, c := range []struct{ path, would string }{{"/s/count", "reject"}, {"/s/countwait", "wait"}} {
		const n = 12
		var (
			arrived sync.WaitGroup
			wg      sync.WaitGroup
		)
		arrived.Add(n)
		h := m.Handle(func(w http.ResponseWriter, r *http.Request) {
			arrived.Done()
			arrived.Wait() // every request's handler runs at once: the shadow rule holds none back
		})
		before := conflictCount(t, "POST "+c.path, c.would)
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := httptest.NewRequest(http.MethodPost, c.path, strings.NewReader(`{"uid":"k"}`))
				r.Header.Set("Content-Type", "application/json")
				w := httptest.NewRecorder()
				h(w, r)
				if w.Code != http.StatusOK {
					t.Errorf("status %d", w.Code)
				}
			}()
		}
		wg.Wait()
		if got := conflictCount(t, "POST "+c.path, c.would) - before; got != n-1 {
			t.Errorf("%s: %v conflicts counted, want %d", c.path, got, n-1)
		}
		beforeBad := conflictCount(t, "POST "+c.path, "invalid_key")
		r := httptest.NewRequest(http.MethodPost, c.path, strings.NewReader(`{}`))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		m.Handle(func(http.ResponseWriter, *http.Request) {})(w, r)
		if w.Code != http.StatusOK || conflictCount(t, "POST "+c.path, "invalid_key")-beforeBad != 1 {
			t.Errorf("%s without a key: status %d, want 200 and one invalid_key conflict", c.path, w.Code)
		}
	}
}

// countsOneConflict sends a request of a shadow rule that enforcing it would refuse, wants it
// answered 200 and counted as one conflict of kind would (what, in messages). A shadow try
// gives up after shadowBound: on a loaded machine the store may answer later, and the try is
// then counted as a store error; only then is the request sent again, 10 times at most. A
// failure is reported with Errorf, so that the caller lets its held requests go.
func countsOneConflict(t *testing.T, what, rule, would string, send func() int) {
	t.Helper()
	for try := 1; ; try++ {
		conflicts, storeErrs := conflictCount(t, rule, would), conflictCount(t, rule, outcomeStoreError)
		if code := send(); code != http.StatusOK {
			t.Errorf("%s: %d, want 200 (shadow rules hold nothing back)", what, code)
			return
		}
		got := conflictCount(t, rule, would) - conflicts
		if got == 1 {
			return
		}
		if timedOut := conflictCount(t, rule, outcomeStoreError) - storeErrs; got != 0 || timedOut != 1 || try == 10 {
			t.Errorf("%s counted %v conflicts (store errors %v, try %d), want 1", what, got, timedOut, try)
			return
		}
	}
}

func conflictCount(t *testing.T, rule, would string) float64 {
	t.Helper()
	var v float64
	withMetric(t, "flightlock_shadow_conflicts_total", func(labels map[string]string, value float64) {
		if labels["rule"] == rule && labels["would"] == would {
			v = value
		}
	})
	return v
}
