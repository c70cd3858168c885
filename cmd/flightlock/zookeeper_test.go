package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/testenv/zktest"
	"github.com/flightlock/flightlock/zkstore"
)

// zkLocker is a Locker of its own process (its own session) on the ZooKeeper server at addr,
// with the go-zero layer's key layout: nodes under /flightlock named Prefix "lock:" + key.
func zkLocker(t *testing.T, addr string, opts ...flightlock.Option) (*flightlock.Locker, *zkstore.Store) {
	t.Helper()
	store, err := zkstore.Dial(zkstore.Config{Hosts: []string{addr}, SessionTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	opts = append([]flightlock.Option{flightlock.WithPrefix("lock:"), flightlock.WithTTL(3 * time.Second),
		flightlock.WithMetadata(func(context.Context) string { return "host=h1 pid=42" })}, opts...)
	l, err := flightlock.New(store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l, store
}

// TestZookeeperCommands takes locks with zkstore and flightlock, then runs ls, show and unlock
// on them from the service's YAML (a Lock section that names ZooKeeper only): the locks with
// their nodes, fences, holders and waiter marks, no owner and no TTL (a hold lives with its
// session); unlock removes the node and its holds, and the waiter of another process gets the
// lock while the holder still runs.
func TestZookeeperCommands(t *testing.T) {
	srv := zktest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	file := writeFile(t, "svc.yaml", "Name: svc\nLock:\n  Zookeeper: {Hosts: ['"+srv.Addr+"'], SessionTimeout: 10s}\n  TTL: 3s\n  Rules: []\n")

	holder, store := zkLocker(t, srv.Addr)
	lease, err := holder.Lock(ctx, "order:alice")
	if err != nil {
		t.Fatal(err)
	}
	other, err := holder.Lock(ctx, "acct:1")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Release(ctx) }()
	const node = "/flightlock/lock:order:alice"

	// A waiter in another process: refused, it marks the key and watches it.
	waiter, _ := zkLocker(t, srv.Addr, flightlock.WithWait(time.Minute))
	waiterGot := make(chan *flightlock.Lease, 1)
	go func() {
		l, err := waiter.Lock(ctx, "order:alice")
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
		waiterGot <- l
	}()
	in := zkstore.NewInspector(store, "lock:")
	waitFor(t, "the waiter's mark", func() bool {
		l, err := in.Lookup(ctx, "order:alice")
		return err == nil && l.Contended
	})

	// ls -o json: both locks, with node, fence, holder, waiter mark, and no owner or TTL.
	code, out, errs := cli(t, nil, "-f", file, "ls", "-o", "json")
	if code != exitOK {
		t.Fatalf("ls: exit %d: %s", code, errs)
	}
	if strings.Contains(out, `"owner"`) || strings.Contains(out, `"redis_key"`) {
		t.Errorf("ls -o json has owner or redis_key fields:\n%s", out)
	}
	var locks []lockInfo
	if err := json.Unmarshal([]byte(out), &locks); err != nil {
		t.Fatalf("ls -o json: %v\n%s", err, out)
	}
	if len(locks) != 2 || locks[0].Key != "acct:1" || locks[1].Key != "order:alice" {
		t.Fatalf("ls: %+v, want acct:1 and order:alice", locks)
	}
	l := locks[1]
	switch {
	case l.Store != storeZookeeper || l.ZNode != node || l.Owner != "":
		t.Errorf("store %q node %q owner %q, want zookeeper, %s, no owner", l.Store, l.ZNode, l.Owner, node)
	case l.Fence != lease.Fence() || !l.Own || len(l.Reentries) != 0:
		t.Errorf("fence %d own %v reentries %v, want the lease's fence %d and the own hold only", l.Fence, l.Own, l.Reentries, lease.Fence())
	case l.TTLMillis != -1:
		t.Errorf("ttl %dms, want -1: a hold lives as long as its session", l.TTLMillis)
	case l.Host != "h1" || l.Pid != "42":
		t.Errorf("holder host=%q pid=%q, want h1 42", l.Host, l.Pid)
	case !l.Contended || locks[0].Contended:
		t.Errorf("contended %v and %v, want order:alice's mark only", l.Contended, locks[0].Contended)
	}

	// Tables, with the glob on the rendered key.
	code, out, _ = cli(t, nil, "-f", file, "ls", "order:*")
	if code != exitOK || !strings.Contains(out, "order:alice") || strings.Contains(out, "acct:1") || !strings.Contains(out, "session") ||
		!strings.Contains(out, "refused") || !strings.Contains(out, "pid=42") || !strings.Contains(out, strconv.FormatInt(l.Fence, 10)) {
		t.Errorf("ls order:* table: exit %d:\n%s", code, out)
	}
	code, out, _ = cli(t, nil, "-f", file, "ls", "stock:*")
	if code != exitOK || !strings.Contains(out, "no lock held matches lock:stock:* on zookeeper "+srv.Addr+" under /flightlock") {
		t.Errorf("ls of a pattern with no lock: exit %d: %s", code, out)
	}

	code, out, _ = cli(t, nil, "-f", file, "show", "order:alice")
	if code != exitOK || !regexp.MustCompile(`(?m)^znode +`+node+`$`).MatchString(out) || !strings.Contains(out, "waiter mark set") ||
		!strings.Contains(out, "not shown") || !strings.Contains(out, "ZooKeeper session") {
		t.Errorf("show table: exit %d:\n%s", code, out)
	}
	if code, _, errs = cli(t, nil, "-f", file, "show", "order:bob"); code != exitError || !strings.Contains(errs, "not held") {
		t.Errorf("show of a free key: exit %d: %s", code, errs)
	}

	// unlock, not confirmed: nothing removed.
	code, _, errs = cli(t, strings.NewReader("n\n"), "-f", file, "unlock", "order:alice")
	if code != exitError || !strings.Contains(errs, "not confirmed") || !strings.Contains(errs, "Force-release "+node+"?") {
		t.Fatalf("unlock answered n: exit %d: %s", code, errs)
	}
	if _, err := in.Lookup(ctx, "order:alice"); err != nil {
		t.Fatalf("unlock answered n removed the lock: %v", err)
	}
	// -yes: the node and its holds go, and the waiter gets the lock while the holder still
	// holds its lease (it learns of the loss at its next refresh).
	code, out, errs = cli(t, nil, "-f", file, "-yes", "unlock", "order:alice")
	if code != exitOK || !strings.Contains(out, "removed "+node+": fence "+strconv.FormatInt(lease.Fence(), 10)) ||
		!strings.Contains(out, "deleted its waiter mark") {
		t.Fatalf("unlock -yes: exit %d:\n%s%s", code, out, errs)
	}
	select {
	case got := <-waiterGot:
		if got == nil {
			t.Fatal("the waiter got no lease")
		}
		if got.Fence() <= lease.Fence() {
			t.Errorf("the waiter's fence %d is not above the removed holder's %d", got.Fence(), lease.Fence())
		}
		if err := got.Release(ctx); err != nil {
			t.Errorf("waiter release: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not woken by the unlock")
	}
	if err := lease.Release(ctx); err == nil {
		t.Error("the removed holder's release succeeded")
	}
	if code, _, errs = cli(t, nil, "-f", file, "-yes", "unlock", "order:alice"); code != exitError || !strings.Contains(errs, "not held") {
		t.Errorf("unlock of a free key: exit %d: %s", code, errs)
	}
}

// TestCheckZookeeperSection: flightlock check reads a Zookeeper section and Store: zookeeper
// as middleware.New does, without a server: a section on ZooKeeper alone is not the embedded
// store, and a TTL no session of its timeout keeps, a share rule and a ZooKeeper rule without
// hosts are each reported at their line.
func TestCheckZookeeperSection(t *testing.T) {
	good := writeConfig(t, `Mode: pro
Lock:
  Zookeeper: {Hosts: ["zk1:2181", "zk2:2181"], SessionTimeout: 12s}
  TTL: 5s
  Rules:
    - {Method: POST, Path: /a, Key: "a:{uid}", OnBusy: reject, Mode: write}
    - {Method: GET, Path: /a, Key: "a:{uid}", Mode: read}
    - {Method: POST, Path: /b, Key: "b:{sku}", Fair: true}
`)
	if code, out, _ := cli(t, nil, "check", "-q", "-f", good); code != exitOK || out != "" {
		t.Fatalf("a section on ZooKeeper: exit %d, output:\n%s\nwant no finding", code, out)
	}
	bad := writeConfig(t, `Mode: pro
Lock:
  Redis: {Host: "redis:6379"}
  Zookeeper: {Hosts: ["zk1:2181"], SessionTimeout: 6s}
  Rules:
    - {Method: POST, Path: /a, Key: "a:{uid}", Store: zookeeper, TTL: 4s}
    - {Method: POST, Path: /b, Key: "b:{sku}", Store: ZooKeeper, OnBusy: share}
    - {Method: POST, Path: /c, Key: "c:{order}"}
`)
	code, out, _ := cli(t, nil, "check", "-q", "-f", bad)
	want := []string{
		bad + ":6: Lock.Rules[0].TTL: 4s is too long for the 6s session timeout",
		bad + ":7: Lock.Rules[1].OnBusy: is share, but the rule locks in ZooKeeper",
		bad + ":8: Lock.Rules[2].Store: is empty, but Lock names several stores",
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != exitError || len(lines) != len(want) {
		t.Fatalf("exit %d, output:\n%s\nwant %d findings", code, out, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("finding %d: %s\nwant %s...", i, lines[i], w)
		}
	}
}
