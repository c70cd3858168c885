package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

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

// TestZookeeperNodesTheCLICannotReadSaySo: flightlock creates its nodes readable by all, so a
// node whose ACL refuses the CLI's session was set by someone else. ls lists the locks beside
// such a key node and marks it unreadable; show and unlock of it, and ls under a root the CLI
// may not list, fail (exit 1) saying that the ACL refuses the session and how to read it.
func TestZookeeperNodesTheCLICannotReadSaySo(t *testing.T) {
	srv := zktest.Start(t)
	ctx := context.Background()
	l, _ := zkLocker(t, srv.Addr)
	lease, err := l.Lock(ctx, "order:1")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	admin, _ := zktest.Connect(t, 10*time.Second, srv.Addr)
	if err := admin.AddAuth("digest", []byte("admin:pw")); err != nil {
		t.Fatal(err)
	}
	secret := zk.DigestACL(zk.PermAll, "admin", "pw")
	for _, p := range []string{"/flightlock/lock:secret", "/flightlock/lock:secret/child", "/locked", "/locked/lock:x"} {
		if _, err := admin.Create(p, []byte("v"), 0, secret); err != nil {
			t.Fatalf("create %s: %v", p, err)
		}
	}
	code, out, errs := cli(t, nil, "-zookeeper", srv.Addr, "ls")
	if code != exitOK || !strings.Contains(out, "order:1 ") ||
		!regexp.MustCompile(`(?m)^secret .*not a flightlock lock: "?\(unreadable: zk: not authenticated`).MatchString(out) {
		t.Errorf("ls beside a node it cannot read: exit %d\n%s%s\nwant order:1 listed and secret marked unreadable", code, out, errs)
	}
	acl := "ACL refuses the CLI's session, which authenticates as no one: flightlock creates its nodes readable by all, so someone else set it (getAcl "
	for _, args := range [][]string{
		{"-zookeeper", srv.Addr, "show", "secret"},
		{"-zookeeper", srv.Addr, "unlock", "-yes", "secret"},
		{"-zookeeper", srv.Addr, "-zookeeper-root", "/locked", "ls"},
	} {
		code, out, errs := cli(t, nil, args...)
		if code != exitError || !strings.Contains(errs, acl) {
			t.Errorf("flightlock %q: exit %d\n%s%s\nwant exit 1 and %q", args, code, out, errs, acl)
		}
	}
}
