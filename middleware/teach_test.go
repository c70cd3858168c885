package middleware

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/rest"
	"google.golang.org/grpc"
)

// A key field spelled the Go way or the JSON way fails at start-up with the field the
// template needs and the fields the request has, as one line, without a stack trace.
func TestKeyFieldErrorsTeach(t *testing.T) {
	const method = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo" // request: ServerReflectionRequest
	for _, c := range []struct{ key, want string }{
		{"f:{FileByFilename}", "did you mean {file_by_filename}?"},
		{"f:{fileByFilename}", "did you mean {file_by_filename}?"},
		{"f:{nothing_like_it}", "key templates name fields by their proto names: host, file_by_filename"},
	} {
		_, err := New(LockConf{Rules: []Rule{{RPC: method, Key: c.key}}})
		if err == nil || !strings.Contains(err.Error(), "Lock.Rules[0].Key:") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("key %s: %v, want an error naming Lock.Rules[0].Key and %q", c.key, err, c.want)
		}
	}
}

// MustNew on a bad config: one line on stderr naming the field, exit status 1, no stack trace.
func TestMustNewExitsWithOneLine(t *testing.T) {
	code := -1
	exit = func(c int) { code = c }
	defer func() { exit = os.Exit }()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = w
	MustNew(LockConf{Rules: []Rule{{Method: "POST", Path: "/x", Key: "x:{path.id}", OnBusy: "queue"}}})
	os.Stderr = stderr
	_ = w.Close()
	var out bytes.Buffer
	_, _ = io.Copy(&out, r)
	msg := out.String()
	if code != 1 {
		t.Errorf("exit status %d, want 1", code)
	}
	if strings.Count(strings.TrimSpace(msg), "\n") != 0 || !strings.Contains(msg, "Lock.Rules[0].OnBusy") || strings.Contains(msg, "goroutine") {
		t.Errorf("stderr %q, want one line naming Lock.Rules[0].OnBusy and no stack trace", msg)
	}
}

// Register: a server whose chain lacks the interceptor a rule's method needs, or with a rule for
// a method it does not serve, stops at start-up with one line naming the rule (and the nearest
// method); a server wired right starts. What counts is the server's chain, not which
// interceptors were built: zrpc runs only those added to it.
func TestRegisterChecksTheServer(t *testing.T) {
	code, msg := -1, ""
	exit = func(c int) { code = c }
	defer func() { exit = os.Exit }()
	register := func(gs *grpc.Server) { gs.RegisterService(testServiceDesc(echoLeases), nil) }
	start := func(m *Middleware, opts ...grpc.ServerOption) {
		code = -1
		r, w, _ := os.Pipe()
		stderr := os.Stderr
		os.Stderr = w
		m.Register(register)(grpc.NewServer(opts...))
		os.Stderr = stderr
		_ = w.Close()
		b, _ := io.ReadAll(r)
		msg = string(b)
	}
	newMW := func(rpc string) *Middleware {
		m, err := New(LockConf{Rules: []Rule{{RPC: rpc, Key: "h:{host}"}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		return m
	}
	unary := func(m *Middleware) grpc.ServerOption { return grpc.ChainUnaryInterceptor(m.UnaryServerInterceptor()) }
	stream := func(m *Middleware) grpc.ServerOption { return grpc.ChainStreamInterceptor(m.StreamServerInterceptor()) }

	m := newMW(fullMethod("Host"))
	start(m) // no interceptor built
	if code != 1 || !strings.Contains(msg, "Lock.Rules[0]") || !strings.Contains(msg, "AddUnaryInterceptors") {
		t.Errorf("rules without the interceptor: exit %d, %q", code, msg)
	}
	_ = m.UnaryServerInterceptor()
	start(m) // built, and not added to the server
	if code != 1 || !strings.Contains(msg, "AddUnaryInterceptors") {
		t.Errorf("a unary interceptor built and not installed: exit %d, %q", code, msg)
	}
	start(m, unary(m))
	if code != -1 {
		t.Errorf("a server wired right stopped: %q", msg)
	}
	// Each kind of call runs through its own chain: the stream interceptor alone leaves a
	// unary method unlocked (both built), and the unary one alone a streaming method.
	m = newMW(fullMethod("Host"))
	_ = m.UnaryServerInterceptor()
	start(m, stream(m))
	if code != 1 || !strings.Contains(msg, "Lock.Rules[0]") || !strings.Contains(msg, "AddUnaryInterceptors") {
		t.Errorf("a unary rule with only the stream interceptor installed: exit %d, %q", code, msg)
	}
	m = newMW(fullMethod("Stream"))
	_ = m.StreamServerInterceptor()
	start(m, unary(m))
	if code != 1 || !strings.Contains(msg, "Lock.Rules[0]") || !strings.Contains(msg, "AddStreamInterceptors") {
		t.Errorf("a streaming rule with only the unary interceptor installed: exit %d, %q", code, msg)
	}
	start(m, stream(m))
	if code != -1 {
		t.Errorf("a streaming rule with the stream interceptor stopped: %q", msg)
	}
	// Another interceptor that refuses every call before this one (zrpc's Auth): the probe
	// cannot tell, and the interceptors built count.
	m = newMW(fullMethod("Host"))
	start(m, grpc.ChainUnaryInterceptor(func(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
		return nil, errors.New("unauthenticated")
	}), unary(m))
	if code != -1 {
		t.Errorf("a server whose first interceptor refuses the probe, with this one installed after it, stopped: %q", msg)
	}
	// A REST rule in a zrpc service's Lock section (and no RPC rule) would lock no call.
	rest, err := New(LockConf{Rules: []Rule{{Method: "POST", Path: "/api/debit", Key: "acct:{body.account}"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rest.Close() })
	start(rest, unary(rest))
	if code != 1 || !strings.Contains(msg, "Lock.Rules[0]") || !strings.Contains(msg, "RPC: /package.Service/Method") {
		t.Errorf("a REST rule on a zrpc server: exit %d, %q", code, msg)
	}
	m = newMW("/" + testService + "/host")
	start(m, unary(m))
	if code != 1 || !strings.Contains(msg, "did you mean /"+testService+"/Host?") || !strings.Contains(msg, "case-sensitively") {
		t.Errorf("a rule for a method in the wrong case: exit %d, %q", code, msg)
	}
}

// A request whose key cannot be built is refused with 400, and the service's log
// says why (once per rule and interval, then counted), not only the access line.
func TestBadKeyIsLogged(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Rules: []Rule{{Method: "POST", Path: "/k", Key: "k:{body.userId}"}}})
	var mu sync.Mutex
	var lines []string
	m.logs.errorw = func(_ context.Context, msg string, _ ...logx.LogField) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, msg)
	}
	h := m.Handle(func(w http.ResponseWriter, r *http.Request) {})
	for range 3 {
		r := httptest.NewRequest(http.MethodPost, "/k", strings.NewReader(`{"uid":"u1"}`))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h(w, r)
		if w.Code != http.StatusBadRequest {
			t.Fatalf("status %d, want 400", w.Code)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lines) != 1 || !strings.Contains(lines[0], "lock key cannot be built") || !strings.Contains(lines[0], "userId") {
		t.Errorf("log lines %q, want one naming the rule's missing value", lines)
	}
}

// MustCheckRoutes: a rule that matches no route stops the service with one line on stderr
// naming the rule and the route it probably meant, exit status 1, no stack trace (logx.Must
// would print one); a rule that matches starts.
func TestMustCheckRoutesExitsWithOneLine(t *testing.T) {
	code := -1
	exit = func(c int) { code = c }
	defer func() { exit = os.Exit }()
	check := func(path string) string {
		m, err := New(LockConf{Rules: []Rule{{Method: "POST", Path: path, Key: "w:{body.uid}"}}})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		stderr := os.Stderr
		os.Stderr = w
		m.MustCheckRoutes([]rest.Route{{Method: "POST", Path: "/api/wallet/withdraw"}})
		os.Stderr = stderr
		_ = w.Close()
		out, _ := io.ReadAll(r)
		return string(out)
	}
	if msg := check("/api/wallet/withdraw"); code != -1 || msg != "" {
		t.Errorf("a rule that matches its route: exit %d, %q", code, msg)
	}
	msg := check("/wallet/withdraw")
	if code != 1 || strings.Count(strings.TrimSpace(msg), "\n") != 0 || strings.Contains(msg, "goroutine") ||
		!strings.Contains(msg, "Lock.Rules[0]") || !strings.Contains(msg, "did you mean POST /api/wallet/withdraw?") {
		t.Errorf("a rule without the group prefix: exit %d, stderr %q, want one line naming the rule and the route", code, msg)
	}
}

// An RPC rule in the Lock section of a REST server (and no REST rule) would lock no request:
// CheckRoutes refuses it, naming the rule and the fields a REST rule has.
func TestCheckRoutesRefusesRPCRulesOnARESTServer(t *testing.T) {
	m, err := New(LockConf{Rules: []Rule{{RPC: "/balance.Balance/Debit", Key: "acct:{account}"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	err = m.CheckRoutes([]rest.Route{{Method: "POST", Path: "/api/debit"}})
	if err == nil || !strings.Contains(err.Error(), "Lock.Rules[0]") || !strings.Contains(err.Error(), "Method and Path") {
		t.Fatalf("CheckRoutes with only an RPC rule: %v, want Lock.Rules[0] refused, naming Method and Path", err)
	}
	// Beside a REST rule, an RPC rule is the zrpc server's business (one Lock section for both).
	both, err := New(LockConf{Rules: []Rule{{RPC: "/balance.Balance/Debit", Key: "acct:{account}"},
		{Method: "POST", Path: "/api/debit", Key: "acct:{body.account}"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = both.Close() })
	if err := both.CheckRoutes([]rest.Route{{Method: "POST", Path: "/api/debit"}}); err != nil {
		t.Fatalf("CheckRoutes with a REST and an RPC rule: %v", err)
	}
}
