package middleware

// A run of a share rule whose lock was lost while its handler ran (the lease context is
// cancelled with ErrLost) stores nothing: the record of the newer holder, which ran the handler
// after the key came free, stays, and later duplicates replay the answer its client got.
//
// Here: process A's handler finds its lock gone (deleted, as if it expired during a stall); a
// duplicate sent to process B takes the key, runs the handler ("run 2") and stores its
// response; A's watchdog reports ErrLost; A's handler then answers "run 1", which must not
// replace B's record.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeromicro/go-zero/rest"

	"github.com/flightlock/flightlock"
)

func TestShareLostRunKeepsTheNewerHoldersRecord(t *testing.T) {
	tr := newTestRedis(t)
	rule := shareRuleWaiting(2 * time.Second)
	rule.TTL = 1500 * time.Millisecond // watchdog at 500ms
	mA := newMiddleware(t, tr, LockConf{Rules: []Rule{rule}})
	mB := newMiddleware(t, tr, LockConf{Rules: []Rule{rule}}) // another process: its own Locker and gate

	var (
		runs  atomic.Int32
		sB    *rest.Serverless
		dup   = make(chan *httptest.ResponseRecorder, 1)
		cause = make(chan error, 1)
	)
	handler := func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		if n == 1 {
			if !tr.mr.Exists("lock:pay:u1:k1") {
				t.Errorf("the lock key is not lock:pay:u1:k1: %v", tr.mr.Keys())
			}
			tr.mr.Del("lock:pay:u1:k1") // A's lock is gone, as if it expired while A stalled
			dup <- serve(sB, payRequest("u1", "k1", `{}`))
			select {
			case <-r.Context().Done():
			case <-time.After(3 * time.Second):
			}
			cause <- context.Cause(r.Context())
		}
		w.WriteHeader(http.StatusOK)
		_, _ = fmt.Fprintf(w, "run %d", n)
	}
	routes := []rest.Route{{Method: http.MethodPost, Path: "/pay", Handler: handler}}
	sA := serverless(t, restConf(t, 10*time.Second), mA, routes)
	sB = serverless(t, restConf(t, 10*time.Second), mB, routes)

	wA := serve(sA, payRequest("u1", "k1", `{}`))
	wB := <-dup
	lost := <-cause
	t.Logf("A: %d %q; B: %d %q; A's handler context ended with: %v", wA.Code, wA.Body.String(), wB.Code, wB.Body.String(), lost)
	if lost != flightlock.ErrLost {
		t.Logf("note: A's handler context was not cancelled with ErrLost (%v)", lost)
	}
	if wB.Body.String() != "run 2" {
		t.Fatalf("B did not run the handler after A's lock went: %d %q", wB.Code, wB.Body.String())
	}

	v, err := tr.mr.Get("lock:replay:pay:u1:k1")
	if err != nil {
		t.Fatalf("stored response: %v (keys %v)", err, tr.mr.Keys())
	}
	var rec struct {
		Body  []byte `json:"b"`
		Fence int64  `json:"f"`
	}
	if err := json.Unmarshal([]byte(v), &rec); err != nil {
		t.Fatal(err)
	}
	if string(rec.Body) != "run 2" {
		t.Errorf("the stored response is %q (fence %d), written by the run that had lost its lock (ErrLost) "+
			"over the record of the newer holder (\"run 2\"): a request that is not the holder stored its response",
			rec.Body, rec.Fence)
	}
	w3 := serve(sA, payRequest("u1", "k1", `{}`))
	if w3.Body.String() != wB.Body.String() {
		t.Errorf("a later duplicate replays %q, while the client of the newer holder got %q", w3.Body.String(), wB.Body.String())
	}
}
