package middleware

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/testenv/childproc"
	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/lockstore/redisstore"
	"github.com/zeromicro/go-zero/core/proc"
	"github.com/zeromicro/go-zero/rest"
)

// Shutdown refuses new locked requests with 503 and Retry-After, lets the handler in flight
// finish, releases its lock as it returns (waking a waiter elsewhere), and closes the store.
func TestShutdownDrains(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Drain: 5 * time.Second, Rules: []Rule{
		{Method: "POST", Path: "/d/pay", Key: "pay:{body.uid}"},
	}})
	entered, finish := make(chan struct{}), make(chan struct{})
	h := m.Handle(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("hold") == "" {
			return // a probe that got in before the drain began
		}
		close(entered)
		<-finish
	})
	req := func(uid string) *httptest.ResponseRecorder {
		path := "/d/pay"
		if uid == "a" {
			path += "?hold=1"
		}
		r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{"uid":"`+uid+`"}`))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h(w, r)
		return w
	}
	inFlight := make(chan int, 1)
	go func() { inFlight <- req("a").Code }()
	<-entered

	// Another process waits for the key.
	waiter := tr.locker(t, flightlock.WithWait(10*time.Second))
	got := make(chan error, 1)
	go func() {
		lease, err := waiter.Lock(context.Background(), "pay:a")
		if err == nil {
			_ = lease.Release(context.Background())
		}
		got <- err
	}()

	done := make(chan error, 1)
	go func() { done <- m.Shutdown(context.Background()) }()
	waitFor(t, 2*time.Second, "new requests to be refused", func() bool {
		return req("b").Code == http.StatusServiceUnavailable
	})
	if w := req("c"); w.Header().Get("Retry-After") != "1" {
		t.Errorf("a request during the drain: %d, Retry-After %q; want 503 with Retry-After 1", w.Code, w.Header().Get("Retry-After"))
	}
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned (%v) while a handler held its lock", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(finish)
	if code := <-inFlight; code != http.StatusOK {
		t.Fatalf("the request in flight: %d", code)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter elsewhere: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if !tr.isFree("pay:a") {
		t.Fatal("the lock is still in Redis after the drain")
	}
}

const drainHolderEnv = "FLIGHTLOCK_DRAIN_HOLDER_REDIS"

// drainHolder is the holder process of TestDrainOnSIGTERM: a go-zero REST service on the
// test's redis-server whose one route holds its lock until its context ends. It prints the
// address it serves on, and exits when go-zero's shutdown is done.
func drainHolder(redisAddr string) int {
	proc.Setup(proc.ShutdownConf{WrapUpTime: 50 * time.Millisecond, WaitTime: 5 * time.Second})
	m, err := New(LockConf{Redis: RedisConf{Host: redisAddr}, Drain: 500 * time.Millisecond, Rules: []Rule{
		{Method: "POST", Path: "/hold/:id", Key: "hold:{path.id}"},
	}})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	server := rest.MustNewServer(rest.RestConf{Host: "127.0.0.1", Port: 0, Timeout: 60000})
	server.Use(m.Handle)
	server.AddRoute(rest.Route{Method: http.MethodPost, Path: "/hold/:id", Handler: func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // cancelled with flightlock.ErrClosed when the grace period ends
	}})
	// A Locker used directly holds a second key, released by its owner when told to stop.
	lease, err := m.Locker().Lock(context.Background(), "job")
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	go func() {
		<-lease.Context().Done()
		_ = lease.Release(context.Background())
	}()
	fmt.Println("ready")
	server.Start() // returns when go-zero's shutdown listeners stop it
	_ = m.Shutdown(context.Background())
	return 0
}

// After SIGTERM, a waiter in another process gets a key that the holder's handler kept, within
// go-zero's wrap-up plus the grace period plus a round trip, far before the TTL; and no lock
// of the holder is left in Redis.
func TestDrainOnSIGTERM(t *testing.T) {
	srv := redistest.Start(t)
	cmd, exited := startChild(t, drainHolderEnv, srv.Addr)
	client := srv.Client()
	ctx := context.Background()
	// The REST server's port is chosen by the kernel (Port 0); the handler's lock is taken
	// through the Locker in the holder: the test reads the listening port from /proc.
	port := listeningPort(t, cmd.Process.Pid)
	go func() {
		resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/hold/1", port), "application/json", nil)
		if err == nil {
			resp.Body.Close()
		}
	}()
	waitFor(t, 5*time.Second, "the holder's handler to hold its lock", func() bool {
		return client.Exists(ctx, "lock:hold:1").Val() == 1 && client.Exists(ctx, "lock:job").Val() == 1
	})

	store := redisstore.New(client)
	waiter, err := flightlock.New(store, flightlock.WithWait(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan time.Time, 2)
	for _, key := range []string{"hold:1", "job"} {
		go func() {
			lease, err := waiter.Lock(ctx, key)
			if err != nil {
				t.Errorf("waiter for %s: %v", key, err)
				got <- time.Time{}
				return
			}
			got <- time.Now()
			_ = lease.Release(ctx)
		}()
	}
	time.Sleep(100 * time.Millisecond) // the waiters are queued in Redis
	sent := time.Now()
	if err := syscall.Kill(cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// go-zero's wrap-up (50ms) + Drain (500ms) + a round trip, with room for a loaded machine;
	// the TTL is 10s.
	const bound = 2500 * time.Millisecond
	for range 2 {
		at := <-got
		if at.IsZero() {
			t.FailNow()
		}
		if d := at.Sub(sent); d > bound {
			t.Errorf("a waiter got its key %v after SIGTERM, want under %v (TTL 10s)", d, bound)
		} else {
			t.Logf("a waiter got its key %v after SIGTERM", d.Round(time.Millisecond))
		}
	}
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("holder: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the holder did not exit")
	}
	if keys := client.Keys(ctx, "lock:*").Val(); len(keys) != 0 {
		t.Fatalf("keys left in Redis after the holder exited: %v", keys)
	}
}

// startChild re-executes the test binary as another process of the test, with env=value (its
// TestMain runs the child's part), and returns once the child printed "ready" (failing the test
// on a line starting with "error"). exited gets the child's exit; the child is killed, by pid,
// when the test ends if it is still running.
func startChild(t *testing.T, env, value string) (*exec.Cmd, <-chan error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env+"="+value)
	childproc.Tie(cmd)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill() // our own child, by pid
			<-exited
		}
	})
	lines := bufio.NewScanner(out)
	for lines.Scan() {
		line := lines.Text()
		if strings.HasPrefix(line, "error") {
			t.Fatal(line)
		}
		if line == "ready" {
			break
		}
	}
	return cmd, exited
}

// listeningPort finds the TCP port a process of ours listens on, from /proc/net/tcp and the
// sockets in /proc/<pid>/fd.
func listeningPort(t *testing.T, pid int) int {
	t.Helper()
	var port int
	waitFor(t, 5*time.Second, "the holder to listen", func() bool {
		port = findListen(pid)
		return port != 0
	})
	return port
}

func findListen(pid int) int {
	inodes := map[string]bool{}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" || !inodes[f[9]] { // 0A: LISTEN
				continue
			}
			var p int
			if _, err := fmt.Sscanf(f[1][strings.LastIndexByte(f[1], ':')+1:], "%X", &p); err == nil {
				return p
			}
		}
	}
	return 0
}

// A request queued here for a key when the drain begins is answered 503 at once, and a transfer
// (two keys locked together) lets go of the key it already took: another instance takes it
// while this one still drains its running handlers.
func TestDrainAnswersARequestQueuedHereAtOnce(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Drain: 5 * time.Second, Wait: 4 * time.Second, Rules: []Rule{
		{Method: http.MethodPost, Path: "/withdraw", Key: "acct:{body.account}"},
		{Method: http.MethodPost, Path: "/transfer", Key: "acct:{body.from}+acct:{body.to}"},
	}})
	entered, finish := make(chan struct{}), make(chan struct{})
	h := m.Handle(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/withdraw" {
			close(entered)
			<-finish
		}
	})
	post := func(path, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h(w, r)
		return w
	}
	withdraw, shutdown := make(chan int, 1), make(chan error, 1)
	go func() { withdraw <- post("/withdraw", `{"account":"b"}`).Code }()
	<-entered
	defer func() { close(finish); <-withdraw; <-shutdown }()
	transfer := make(chan *httptest.ResponseRecorder, 1)
	go func() { transfer <- post("/transfer", `{"from":"a","to":"b"}`) }()
	waitFor(t, 2*time.Second, "the transfer to hold acct:a", func() bool { return !tr.isFree("acct:a") })
	time.Sleep(100 * time.Millisecond) // queued here for acct:b behind the withdrawal

	go func() { shutdown <- m.Shutdown(context.Background()) }()
	select {
	case w := <-transfer:
		if w.Code != http.StatusServiceUnavailable {
			t.Errorf("the queued transfer was answered %d %q, want 503", w.Code, strings.TrimSpace(w.Body.String()))
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the queued transfer still waits 2s into the drain")
	}
	if l, err := tr.locker(t).TryLock(context.Background(), "acct:a"); err != nil {
		t.Errorf("acct:a, taken by the transfer that was answered, is still held: %v", err)
	} else {
		_ = l.Release(context.Background())
	}
}

// A Shutdown called while another drains (go-zero's listener runs the first) returns by its own
// deadline; the first one returns within a second of its ctx's end, the stragglers' time.
func TestShutdownReturnsByItsDeadline(t *testing.T) {
	tr := newTestRedis(t)
	m := newMiddleware(t, tr, LockConf{Drain: 3 * time.Second, Rules: []Rule{
		{Method: http.MethodPost, Path: "/withdraw", Key: "acct:{body.account}"},
	}})
	entered, finish := make(chan struct{}), make(chan struct{})
	h := m.Handle(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-finish
	})
	first := make(chan error, 1)
	defer func() { close(finish); <-first }()
	go func() {
		r := httptest.NewRequest(http.MethodPost, "/withdraw", strings.NewReader(`{"account":"b"}`))
		r.Header.Set("Content-Type", "application/json")
		h(httptest.NewRecorder(), r)
	}()
	<-entered
	go func() { first <- m.Shutdown(context.Background()) }() // go-zero's listener
	time.Sleep(50 * time.Millisecond)                         // the first drain runs
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := m.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a second Shutdown while the first drains: %v, want its own deadline's error", err)
	}
	if err := ctx.Err(); err == nil {
		t.Error("the second Shutdown returned before its deadline without the drain's end")
	}
	select {
	case err := <-first:
		t.Error("the first Shutdown returned while a handler still held its lock within the grace")
		first <- err // for the deferred wait
	default:
	}
}

// A closed Middleware can be collected: go-zero keeps its shutdown listeners for the life of the
// process, and a service that builds Middlewares again (a config reload, per tenant, a test
// suite) must not keep every one it closed.
func TestClosedMiddlewareCanBeCollected(t *testing.T) {
	tr := newTestRedis(t)
	var collected atomic.Int32
	const n = 20
	for range n {
		m, err := New(LockConf{Rules: []Rule{{Method: http.MethodPost, Path: "/x", Key: "k:{body.id}"}}}, WithLocker(tr.locker(t)))
		if err != nil {
			t.Fatal(err)
		}
		_ = m.Close()
		runtime.AddCleanup(m, func(c *atomic.Int32) { c.Add(1) }, &collected)
	}
	waitFor(t, 5*time.Second, "closed Middlewares collected", func() bool {
		runtime.GC()
		return collected.Load() >= n/2
	})
}
