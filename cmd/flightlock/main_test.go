package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/redisstore"
)

// exampleYAML is etc/flightlock-example.yaml on one test's Redis and ports, with the Redis
// also under each Lock section, where the CLI reads it (the example itself uses the top-level
// one).
const exampleYAML = `
Redis: {Host: "%[1]s"}
StatePrefix: "example:"
Seed: true
Order:
  Name: order-api
  Host: 127.0.0.1
  Port: %[2]d
  Mode: dev
  Timeout: 30000
  Log: {Mode: console, Level: severe}
  MaxOrderDelay: 20s
  Inventory: {Endpoints: ["127.0.0.1:%[3]d"], Timeout: 30000}
  Balance: {Endpoints: ["127.0.0.1:%[4]d"], Timeout: 30000}
  Lock:
    Redis: {Host: "%[1]s"}
    Rules:
      - {Method: POST, Path: /api/order/create, Key: "order:{body.uid}", OnBusy: reject}
Inventory:
  Name: inventory.rpc
  ListenOn: 127.0.0.1:%[3]d
  Mode: dev
  Timeout: 30000
  Log: {Mode: console, Level: severe}
  Lock:
    Redis: {Host: "%[1]s"}
    Rules:
      - {RPC: /inventory.Inventory/Deduct, Key: "sku:{sku}", OnBusy: wait}
Balance:
  Name: balance.rpc
  ListenOn: 127.0.0.1:%[4]d
  Mode: dev
  Timeout: 30000
  Log: {Mode: console, Level: severe}
  Lock:
    Redis: {Host: "%[1]s"}
    Rules:
      - {RPC: /balance.Balance/Debit, Key: "acct:{account}", OnBusy: wait}
`

// cli runs the command in-process and returns its exit code, stdout and stderr.
func cli(t *testing.T, stdin io.Reader, args ...string) (int, string, string) {
	t.Helper()
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	var out, errb bytes.Buffer
	code := run(context.Background(), args, stdin, &out, &errb)
	return code, out.String(), errb.String()
}

// exampleConfig writes exampleYAML for srv (the services' ports are not used: the CLI reads
// the Lock sections only) and returns its path.
func exampleConfig(t *testing.T, srv *redistest.Server) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "example.yaml")
	if err := os.WriteFile(path, fmt.Appendf(nil, exampleYAML, srv.Addr, 18080, 18081, 18082), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitForText waits until out holds want, and fails with what it holds if it does not.
func waitForText(t *testing.T, what string, out *syncBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(out.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s (%q); the output:\n%s", what, want, out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// processLocker is a Locker of the service's kind on srv: the prefix of exampleYAML, the
// default metadata (this host and pid), a store of its own (a process of its own).
func processLocker(t *testing.T, srv *redistest.Server, opts ...flightlock.Option) *flightlock.Locker {
	t.Helper()
	store := redisstore.New(redis.NewClient(srv.Options()))
	t.Cleanup(func() { _ = store.Close() })
	l, err := flightlock.New(store, append([]flightlock.Option{flightlock.WithPrefix("lock:")}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestCommandsAgainstTheLocksOfARunningService drives ls, show and unlock against the locks
// that processes of a service hold in a real redis-server, with the service's own YAML.
func TestCommandsAgainstTheLocksOfARunningService(t *testing.T) {
	srv := redistest.Start(t)
	file := exampleConfig(t, srv)
	rdb := srv.Client()
	ctx := context.Background()

	// An order in flight holds lock:order:alice in this process, as the example's order API
	// does while its handler runs.
	service := processLocker(t, srv, flightlock.WithMode(flightlock.Reject))
	order, err := service.Lock(ctx, "order:alice")
	if err != nil {
		t.Fatal(err)
	}
	defer order.Release(ctx)
	// A duplicate from another instance is refused, which marks the lock contended.
	if _, err := processLocker(t, srv, flightlock.WithMode(flightlock.Reject)).Lock(ctx, "order:alice"); !errors.Is(err, flightlock.ErrBusy) {
		t.Fatalf("duplicate order: %v, want ErrBusy", err)
	}
	// A waiter in "another process" (its own Locker and store on the same Redis).
	waiter := processLocker(t, srv, flightlock.WithWait(time.Minute))
	waiterGot := make(chan *flightlock.Lease, 1)
	go func() {
		lease, err := waiter.Lock(ctx, "order:alice")
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
		waiterGot <- lease
	}()
	waitFor(t, "the waiter's subscription", func() bool {
		n := rdb.PubSubNumSub(ctx, redisstore.DefaultChannelPrefix+"lock:order:alice").Val()
		return n[redisstore.DefaultChannelPrefix+"lock:order:alice"] == 1
	})

	// ls -o json: the lock with its owner, fence, TTL, holder and waiters.
	code, out, errs := cli(t, nil, "-f", file, "ls", "-o", "json")
	if code != exitOK {
		t.Fatalf("ls: exit %d: %s", code, errs)
	}
	var locks []lockInfo
	if err := json.Unmarshal([]byte(out), &locks); err != nil {
		t.Fatalf("ls -o json: %v\n%s", err, out)
	}
	if len(locks) != 1 {
		t.Fatalf("ls: %d locks, want 1: %s", len(locks), out)
	}
	l := locks[0]
	host, _ := os.Hostname()
	switch {
	case l.Key != "order:alice" || l.RedisKey != "lock:order:alice":
		t.Errorf("key %q (%q), want order:alice (lock:order:alice)", l.Key, l.RedisKey)
	case len(l.Owner) != 22 || l.Fence <= 0 || !l.Own || len(l.Reentries) != 0:
		t.Errorf("owner %q fence %d own %v reentries %v: want a 22-character token, a fence, the own hold only", l.Owner, l.Fence, l.Own, l.Reentries)
	case l.TTLMillis <= 0 || l.TTLMillis > 10_000:
		t.Errorf("ttl %dms, want within the 10s TTL", l.TTLMillis)
	case l.Host != host || l.Pid != strconv.Itoa(os.Getpid()):
		t.Errorf("holder host=%q pid=%q, want %q %d (the example runs in this process)", l.Host, l.Pid, host, os.Getpid())
	case !l.Contended || l.Waiters != 1:
		t.Errorf("contended %v waiters %d, want true and 1", l.Contended, l.Waiters)
	}
	// The same as a table.
	code, out, _ = cli(t, nil, "-f", file, "ls", "order:*")
	if code != exitOK || !strings.Contains(out, "order:alice") || !strings.Contains(out, l.Owner[:8]) ||
		!strings.Contains(out, "1 proc") || !strings.Contains(out, "pid="+strconv.Itoa(os.Getpid())) {
		t.Errorf("ls table: exit %d:\n%s", code, out)
	}
	if code, out, _ = cli(t, nil, "-f", file, "ls", "acct:*"); code != exitOK || !strings.Contains(out, "no lock held") {
		t.Errorf("ls of a pattern with no lock: exit %d: %s", code, out)
	}

	// show: one lock in full, with the fence counter of its slot.
	code, out, errs = cli(t, nil, "-f", file, "show", "order:alice", "-o", "json")
	var shown lockInfo
	if code != exitOK || json.Unmarshal([]byte(out), &shown) != nil {
		t.Fatalf("show: exit %d: %s %s", code, out, errs)
	}
	if shown.Owner != l.Owner || shown.FenceCounter == nil || *shown.FenceCounter < l.Fence || shown.FenceCounterKey != lockstore.FenceKey("lock:order:alice") {
		t.Errorf("show: %+v; want the owner of ls and a fence counter at or above fence %d", shown, l.Fence)
	}
	code, out, _ = cli(t, nil, "-f", file, "show", "order:alice")
	if code != exitOK || !strings.Contains(out, l.Owner) || !strings.Contains(out, "1 process(es) wait") {
		t.Errorf("show table: exit %d:\n%s", code, out)
	}
	if code, _, errs = cli(t, nil, "-f", file, "show", "order:bob"); code != exitError || !strings.Contains(errs, "not held") {
		t.Errorf("show of a free key: exit %d: %s", code, errs)
	}

	// unlock, not confirmed: nothing removed.
	if code, _, errs = cli(t, strings.NewReader("n\n"), "-f", file, "unlock", "order:alice"); code != exitError ||
		!strings.Contains(errs, "not confirmed") || rdb.Exists(ctx, "lock:order:alice").Val() != 1 {
		t.Fatalf("unlock answered n: exit %d, key exists %d: %s", code, rdb.Exists(ctx, "lock:order:alice").Val(), errs)
	}
	// Confirmed: removed, with a release notification that reached the waiter's process (1
	// subscriber), and the waiter gets the key while the order still runs.
	code, out, errs = cli(t, strings.NewReader("y\n"), "-f", file, "unlock", "order:alice")
	if code != exitOK || !strings.Contains(out, "removed lock:order:alice: owner "+l.Owner) || !strings.Contains(out, "reached 1 subscriber(s)") {
		t.Fatalf("unlock: exit %d:\n%s%s", code, out, errs)
	}
	if !strings.Contains(errs, "Force-release lock:order:alice?") {
		t.Errorf("unlock asked nothing: %s", errs)
	}
	select {
	case lease := <-waiterGot:
		if lease == nil {
			t.Fatal("the waiter got no lease")
		}
		if lease.Fence() <= l.Fence {
			t.Errorf("the waiter's fence %d is not above the removed holder's %d", lease.Fence(), l.Fence)
		}
		if err := lease.Release(ctx); err != nil {
			t.Errorf("waiter release: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the waiter did not get the unlocked key")
	}
	// The order's lease is told it lost the lock (its next renewal finds another owner's).
	select {
	case <-order.Context().Done():
		if !errors.Is(context.Cause(order.Context()), flightlock.ErrLost) {
			t.Errorf("the unlocked order's context ended with %v, want ErrLost", context.Cause(order.Context()))
		}
	case <-time.After(15 * time.Second):
		t.Error("the unlocked order was not told it lost its lock")
	}
}

type readerFunc func(p []byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// syncBuffer is a bytes.Buffer that watch writes to while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestWatch follows a lock through acquisition, contention and release, and a second one that
// expires, with keyspace notifications and by polling.
func TestWatch(t *testing.T) {
	for _, mode := range []string{"keyspace", "polling"} {
		t.Run(mode, func(t *testing.T) {
			srv := redistest.Start(t)
			rdb := srv.Client()
			ctx := context.Background()
			if mode == "keyspace" {
				if err := rdb.ConfigSet(ctx, "notify-keyspace-events", "K$gx").Err(); err != nil {
					t.Fatal(err)
				}
			}
			var out syncBuffer
			done := make(chan int, 1)
			go func() {
				done <- run(ctx, []string{"-addr", srv.Addr, "-o", "json", "-interval", "100ms", "-for", "4s", "watch", "order:*"},
					strings.NewReader(""), &out, io.Discard)
			}()
			waitFor(t, "watch's subscription", func() bool { return rdb.PubSubNumPat(ctx).Val() == 1 })
			time.Sleep(150 * time.Millisecond) // its first poll, which reports nothing

			store := redisstore.New(redis.NewClient(srv.Options()))
			defer store.Close()
			holder, _ := flightlock.New(store, flightlock.WithPrefix("lock:"))
			other, _ := flightlock.New(store, flightlock.WithPrefix("lock:"))
			lease, err := holder.Lock(ctx, "order:1")
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond) // a poll sees it held
			if _, err := other.TryLock(ctx, "order:1"); err == nil {
				t.Fatal("a second owner got a held lock")
			}
			time.Sleep(300 * time.Millisecond) // a poll sees it contended
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			// A lock whose holder died: it expires.
			if err := rdb.Set(ctx, "lock:order:2", "deadbeef 5 1 host=gone pid=1", 300*time.Millisecond).Err(); err != nil {
				t.Fatal(err)
			}
			// Not matched by the pattern: never reported.
			_ = rdb.Set(ctx, "lock:acct:1", "cafe 6 1", time.Second).Err()

			want := map[string][]string{
				"keyspace": {"acquired order:1", "contended order:1", "released order:1", "acquired order:2", "expired order:2"},
				"polling":  {"acquired order:1", "contended order:1", "released order:1", "acquired order:2", "gone order:2"},
			}[mode]
			waitFor(t, "the events", func() bool { return len(events(t, out.String())) >= len(want) })
			if code := <-done; code != exitOK {
				t.Fatalf("watch: exit %d", code)
			}
			got := events(t, out.String())
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

// events reads watch's JSON lines as "kind key".
func events(t *testing.T, out string) []string {
	var evs []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var e event
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("watch line %q: %v", line, err)
		}
		evs = append(evs, e.Kind+" "+e.Lock.Key)
	}
	return evs
}

// regrabOnPrompt is the operator's answer to unlock's prompt: while the prompt waits, first is
// released and the key taken again into *second (once); then the operator says yes.
func regrabOnPrompt(t *testing.T, l *flightlock.Locker, first *flightlock.Lease, key string, second **flightlock.Lease) io.Reader {
	ctx := context.Background()
	return readerFunc(func(p []byte) (int, error) {
		if *second == nil {
			if err := first.Release(ctx); err != nil {
				t.Errorf("release: %v", err)
			}
			var err error
			if *second, err = l.Lock(ctx, key); err != nil {
				t.Errorf("second lock: %v", err)
			}
		}
		return copy(p, "y\n"), io.EOF
	})
}

// TestUnlockDoesNotCountAWatchAsAWaiter: a flightlock watch hears every release notification
// (a pattern subscription), so the count that unlock reports includes it; with no process
// waiting for the key, unlock must not say that it woke one.
func TestUnlockDoesNotCountAWatchAsAWaiter(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	holder := processLocker(t, srv)
	lease, err := holder.Lock(ctx, "order:1")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	wctx, stop := context.WithCancel(ctx)
	var watched syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(wctx, []string{"-addr", srv.Addr, "watch"}, strings.NewReader(""), &watched, io.Discard)
	}()
	defer func() {
		stop()
		<-done
	}()
	// The header is printed once the watch's subscription is confirmed.
	waitFor(t, "the watch to start", func() bool { return strings.Contains(watched.String(), "1 held") })

	code, out, errs := cli(t, nil, "-addr", srv.Addr, "unlock", "-yes", "order:1")
	if code != exitOK || !strings.Contains(out, "removed lock:order:1: ") {
		t.Fatalf("unlock: exit %d:\n%s%s", code, out, errs)
	}
	if strings.Contains(out, "woke 1 waiting") || !strings.Contains(out, "reached 1 subscriber(s)") {
		t.Errorf("unlock of a key no process waits for, with a watch running:\n%s\nwant the subscriber it reached, not a woken waiter", out)
	}
}

// TestUsageSaysWhatEachStoreDoes: -h says how ls matches its pattern on ZooKeeper too, that
// watch polls at -interval on ZooKeeper as on Redis, and that check reads no store at all.
func TestUsageSaysWhatEachStoreDoes(t *testing.T) {
	code, _, errs := cli(t, nil, "-h")
	if code != exitOK {
		t.Fatalf("-h: exit %d", code)
	}
	for _, want := range []string{
		"check the Lock sections of a config without a store:",
		"and ZooKeeper the same glob, matched on a read of the prefix",
		"watch on Redis and ZooKeeper: refresh period",
	} {
		if !strings.Contains(errs, want) {
			t.Errorf("-h says:\n%s\nwant %q in it", errs, want)
		}
	}
}
