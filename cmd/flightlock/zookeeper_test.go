package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
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
