package middleware

// What the requests of a shared run (OnBusy share) are answered: a duplicate's wait for a run
// of this process ends within the rule's Wait, a leading request that leaves fails no
// duplicate, the body read for the fingerprint is bounded, and error replies say why and keep
// their details.

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock/middleware/rules"
	"github.com/zeromicro/go-zero/rest"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// shareRuleWaiting is the share tests' pay rule with the given Wait.
func shareRuleWaiting(wait time.Duration) Rule {
	return Rule{Method: http.MethodPost, Path: "/pay", Key: "pay:{header.X-Uid}:{header.Idempotency-Key}",
		OnBusy: "share", Wait: wait, Replay: 10 * time.Second}
}

// A duplicate that joins a run of this process waits within the rule's Wait, as one in another
// process waits for the lock, and answers 409 with Retry-After, not go-zero's timeout 503 (a
// 5xx that go-zero's breakers count) after waiting on its own context only.
func TestShareDuplicateAnswersBusyWithinWait(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{shareRuleWaiting(100 * time.Millisecond)}})
	ran := make(chan struct{})
	slow := func(w http.ResponseWriter, r *http.Request) {
		defer close(ran)
		time.Sleep(1500 * time.Millisecond)
		w.WriteHeader(http.StatusOK)
	}
	// go-zero's server timeout 700ms; the leader's handler takes 1.5s (its own 503 is its own).
	s := serverless(t, restConf(t, 700*time.Millisecond), m, []rest.Route{{Method: http.MethodPost, Path: "/pay", Handler: slow}})
	leader := make(chan int, 1)
	go func() { leader <- serve(s, payRequest("u1", "k1", `{}`)).Code }()
	time.Sleep(100 * time.Millisecond) // the leader's run has started

	start := time.Now()
	w := serve(s, payRequest("u1", "k1", `{}`))
	took := time.Since(start)
	<-leader
	<-ran // the leader's handler goes on past go-zero's timeout; let it end before the store closes
	time.Sleep(50 * time.Millisecond)
	if w.Code >= 500 {
		t.Errorf("duplicate of a request in flight (rule Wait 100ms, server timeout 700ms): %d after %v; "+
			"contention must answer below 500 (409 with Retry-After within Wait)", w.Code, took.Round(time.Millisecond))
	}
	if w.Code != http.StatusConflict || w.Header().Get("Retry-After") == "" {
		t.Errorf("duplicate past the rule's Wait: %d (Retry-After %q), want 409 with Retry-After",
			w.Code, w.Header().Get("Retry-After"))
	}
	if took > 500*time.Millisecond {
		t.Errorf("the duplicate waited %v, past the rule's Wait of 100ms", took.Round(time.Millisecond))
	}
}

// The zrpc twin: a duplicate call that joined a run answers Aborted within the rule's Wait,
// not DeadlineExceeded at its own deadline.
func TestShareDuplicateCallAbortsWithinWait(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{{RPC: fullMethod("Host"), Key: "h:{host}", OnBusy: "share",
		Wait: 100 * time.Millisecond}}})
	conn := startGRPC(t, m, func(ctx context.Context, req *rpb.ServerReflectionRequest) (*wrapperspb.StringValue, error) {
		time.Sleep(time.Second)
		return wrapperspb.String("done"), nil
	})
	leader := make(chan error, 1)
	go func() {
		_, err := call(context.Background(), conn, "Host", &rpb.ServerReflectionRequest{Host: "a"})
		leader <- err
	}()
	time.Sleep(100 * time.Millisecond) // the leader's run has started
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	_, err := call(ctx, conn, "Host", &rpb.ServerReflectionRequest{Host: "a"})
	if code := status.Code(err); code != codes.Aborted {
		t.Errorf("duplicate call past the rule's Wait of 100ms (deadline 700ms): %v, want Aborted", err)
	}
	if err := <-leader; err != nil {
		t.Errorf("the leading call: %v", err)
	}
}

// The leading request's client leaving while it waits for the lock fails no duplicate (a run on
// the leader's context would answer every duplicate 409 at once): a duplicate still there leads
// the next run, which runs the handler once, for that duplicate.
func TestShareLeaderLeavingFailsNoDuplicate(t *testing.T) {
	var runs atomic.Int32
	s, tr := payServer(t, func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("paid"))
	})
	// Another process holds the key for 400ms: the leader waits for it, the follower joins.
	holder := holdKey(t, tr, "pay:u1:k1")
	go func() {
		time.Sleep(400 * time.Millisecond)
		_ = holder.Release(context.Background())
	}()
	if w := duplicateOfALeaderThatLeft(s); w.Code != http.StatusOK {
		t.Errorf("the duplicate whose own client is still there: %d %q after the leader's client left; "+
			"want 200 (the key came free 400ms in, well within its own Wait of 5s; runs %d)",
			w.Code, strings.TrimSpace(w.Body.String()), runs.Load())
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want once (for the duplicate; never for the request that left)", n)
	}
}

// zeroBody is a body of n zero bytes that counts what was read.
type zeroBody struct {
	n, read int64
}

func (z *zeroBody) Read(p []byte) (int, error) {
	if z.read >= z.n {
		return 0, io.EOF
	}
	k := min(int64(len(p)), z.n-z.read)
	clear(p[:k])
	z.read += k
	return int(k), nil
}

// A share rule reads at most rules.MaxBodyBytes of a body for its fingerprint, as the other rules
// read one for their keys, and refuses a longer one, chunked bodies included (go-zero's MaxBytes
// checks Content-Length only).
func TestShareBoundsChunkedBody(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{shareRuleWaiting(time.Second)}})
	var handlerRan atomic.Bool
	handler := func(w http.ResponseWriter, r *http.Request) {
		handlerRan.Store(true)
		w.WriteHeader(http.StatusOK)
	}
	s := serverless(t, restConf(t, 10*time.Second), m, []rest.Route{{Method: http.MethodPost, Path: "/pay", Handler: handler}})

	const size = 64 << 20 // 64 MiB, chunked: go-zero's MaxBytes (1 MiB) checks Content-Length only
	body := &zeroBody{n: size}
	r := httptest.NewRequest(http.MethodPost, "/pay", io.NopCloser(body))
	r.ContentLength = -1
	r.Header.Set("X-Uid", "u1")
	r.Header.Set("Idempotency-Key", "big")
	w := serve(s, r)
	if body.read > rules.MaxBodyBytes+1 {
		t.Errorf("the share middleware read %d MiB of a chunked body into memory (status %d, handler ran %v); "+
			"want at most rules.MaxBodyBytes (1 MiB) and a 4xx past it", body.read>>20, w.Code, handlerRan.Load())
	}
	if w.Code != http.StatusBadRequest || handlerRan.Load() {
		t.Errorf("a body over rules.MaxBodyBytes: %d, handler ran %v; want 400, not run", w.Code, handlerRan.Load())
	}
}

// A 422 says why: the key was used with another payload, not "lock store unavailable".
func TestSharePayloadMismatchMessage(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{shareRuleWaiting(time.Second)}})
	s := serverless(t, restConf(t, 5*time.Second), m, []rest.Route{{Method: http.MethodPost, Path: "/pay",
		Handler: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) }}})
	if w := serve(s, payRequest("u1", "k1", `{"amount":5}`)); w.Code != http.StatusOK {
		t.Fatalf("first: %d", w.Code)
	}
	w := serve(s, payRequest("u1", "k1", `{"amount":500}`))
	if w.Code != http.StatusUnprocessableEntity {
		t.Fatalf("same key, other payload: %d, want 422", w.Code)
	}
	if body := strings.TrimSpace(w.Body.String()); strings.Contains(body, "unavailable") || !strings.Contains(body, "payload") {
		t.Errorf("422 body %q: it must say the key was used with another payload, not that the store is unavailable", body)
	}
}

// A zrpc share rule answers the handler's error status whole, details included, to the call
// that ran it and to a duplicate that replays it, not one rebuilt from code and message.
func TestSharedRPCErrorKeepsDetails(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{{RPC: fullMethod("Host"), Key: "h:{host}", OnBusy: "share",
		Replay: 10 * time.Second, ReplayStatus: "2xx,4xx"}}})
	var runs atomic.Int32
	conn := startGRPC(t, m, func(ctx context.Context, req *rpb.ServerReflectionRequest) (*wrapperspb.StringValue, error) {
		runs.Add(1)
		st, err := status.New(codes.InvalidArgument, "bad amount").WithDetails(&errdetails.BadRequest{
			FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "amount", Description: "must be positive"}}})
		if err != nil {
			return nil, err
		}
		return nil, st.Err()
	})
	for i, who := range []string{"the call that ran the handler", "a duplicate replaying it"} {
		_, err := call(context.Background(), conn, "Host", &rpb.ServerReflectionRequest{Host: "a"})
		st := status.Convert(err)
		if st.Code() != codes.InvalidArgument {
			t.Fatalf("%s: code %v, want InvalidArgument", who, st.Code())
		}
		if len(st.Details()) == 0 {
			t.Errorf("%s: the handler's error lost its details under a share rule: %v", who, st.Proto())
		} else if br, ok := st.Details()[0].(*errdetails.BadRequest); !ok || br.GetFieldViolations()[0].GetField() != "amount" {
			t.Errorf("%s: details %v, want the handler's BadRequest", who, st.Details())
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("after call %d the handler ran %d times, want once (4xx replayed)", i+1, n)
		}
	}
}

// A run whose request's client left while the handler ran, and which failed, is that request's
// answer alone: a duplicate that joined it (a client that timed out and retried with the same
// key) runs the handler again rather than get the error the cancellation caused.
func TestDuplicateRunsAgainWhenTheRunItJoinedFailedAfterItsRequestLeft(t *testing.T) {
	s, _ := payServer(t, func(w http.ResponseWriter, r *http.Request) {
		select { // a handler that honours its context, as DB and RPC calls do
		case <-time.After(400 * time.Millisecond):
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("paid"))
		case <-r.Context().Done():
			http.Error(w, "cancelled: "+context.Cause(r.Context()).Error(), http.StatusServiceUnavailable)
		}
	})
	if w := duplicateOfALeaderThatLeft(s); w.Code != http.StatusOK {
		t.Errorf("the retry, whose client is still there, got %d %q: the run was cancelled by the first "+
			"request's client leaving", w.Code, strings.TrimSpace(w.Body.String()))
	}
}

// A handler that sends an informational status (103 Early Hints) before its real one answers
// with the real one under a share rule.
func TestInformationalStatusIsNotTheAnswer(t *testing.T) {
	s, _ := payServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte("payment failed"))
	})
	srv := httptest.NewServer(http.HandlerFunc(s.Serve))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Uid", "u1")
	req.Header.Set("Idempotency-Key", "k1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusInternalServerError {
		t.Errorf("handler answered 103 then 500 %q; the client got %d %q", "payment failed", resp.StatusCode, b)
	}
}

// A zrpc call whose client gave up, and whose handler answered Canceled, leaves no stored
// response, whatever ReplayStatus keeps (2xx,4xx here, for InvalidArgument and NotFound): the
// retry runs the handler.
func TestCanceledCallIsNotStored(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{{RPC: fullMethod("Host"), Key: "h:{host}", OnBusy: "share",
		Wait: time.Second, Replay: time.Minute, ReplayStatus: "2xx,4xx"}}})
	conn := startGRPC(t, m, func(ctx context.Context, req *rpb.ServerReflectionRequest) (*wrapperspb.StringValue, error) {
		select {
		case <-time.After(300 * time.Millisecond):
			return wrapperspb.String("done"), nil
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond) // the client gives up
	defer cancel()
	_, _ = call(ctx, conn, "Host", &rpb.ServerReflectionRequest{Host: "a"})
	time.Sleep(300 * time.Millisecond) // the run ended
	_, err := call(context.Background(), conn, "Host", &rpb.ServerReflectionRequest{Host: "a"})
	if err != nil {
		t.Errorf("the retry, 300ms later with its own time, got %v (code %v): the first call's cancellation was stored and replayed",
			err, status.Code(err))
	}
}

// A run that answers other than a failure (here a POST that creates and answers 303 See Other)
// stands when its request's client left while it ran: a duplicate that joined it gets the
// 303; the handler does not run again.
func TestRunThatDidItsWorkIsSharedWhenItsRequestLeft(t *testing.T) {
	var runs atomic.Int32
	s, _ := payServer(t, func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		time.Sleep(400 * time.Millisecond) // creates the order, context or not
		w.Header().Set("Location", "/orders/"+string(rune('0'+n)))
		w.WriteHeader(http.StatusSeeOther)
	})
	code := duplicateOfALeaderThatLeft(s).Code
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times (retry got %d): a completed 303 whose client left is run again", n, code)
	}
}

// A handler that, as Go handlers commonly do, returns without writing when its context ends was
// cut short: its empty answer is neither shared with a duplicate nor stored; the duplicate
// runs the handler and its answer is what a later retry gets.
func TestHandlerThatWroteNothingAfterItsRequestLeftIsRunAgain(t *testing.T) {
	var runs atomic.Int32
	s, _ := payServer(t, func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		select {
		case <-time.After(400 * time.Millisecond):
			_, _ = w.Write([]byte("paid"))
		case <-r.Context().Done():
			return // nothing written
		}
	})
	dup := duplicateOfALeaderThatLeft(s)
	if got := strings.TrimSpace(dup.Body.String()) + "|" + http.StatusText(dup.Code); got != "paid|OK" {
		t.Errorf("the duplicate whose client stayed got %q (runs %d)", got, runs.Load())
	}
	w := serve(s, payRequest("u1", "k1", `{}`))
	if b := w.Body.String(); b != "paid" {
		t.Errorf("a later retry got %d %q replayed=%q (runs %d)", w.Code, b, w.Header().Get("X-Flightlock-Replayed"), runs.Load())
	}
}

// payServer serves POST /pay with handler under a share rule whose duplicates wait up to 5s.
func payServer(t *testing.T, handler http.HandlerFunc) (*rest.Serverless, *testRedis) {
	t.Helper()
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{shareRuleWaiting(5 * time.Second)}})
	return serverless(t, restConf(t, 10*time.Second), m, []rest.Route{{Method: http.MethodPost, Path: "/pay", Handler: handler}}), tr
}

// duplicateOfALeaderThatLeft sends s a request whose client leaves 200ms in, and its duplicate,
// which joins the first one's run 100ms in and stays; it returns the duplicate's answer, once
// the first request returned.
func duplicateOfALeaderThatLeft(s *rest.Serverless) *httptest.ResponseRecorder {
	lctx, cancelLeader := context.WithCancel(context.Background())
	leader := make(chan struct{})
	go func() {
		defer close(leader)
		serve(s, payRequest("u1", "k1", `{}`).WithContext(lctx))
	}()
	time.Sleep(100 * time.Millisecond) // the first request runs the handler, or waits for the lock
	dup := make(chan *httptest.ResponseRecorder, 1)
	go func() { dup <- serve(s, payRequest("u1", "k1", `{}`)) }()
	time.Sleep(100 * time.Millisecond) // the duplicate joined its run
	cancelLeader()                     // the first request's client goes away
	<-leader
	return <-dup
}
