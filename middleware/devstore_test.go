package middleware

import (
	"context"
	"strings"
	"testing"

	"github.com/flightlock/flightlock"
	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/core/logx/logtest"
)

// A config with no store that runs in a binary without the embedded store is refused at
// start-up, and the error names the line that sets it (EmbeddedStore); with it set, it runs.
func TestEmptyHostWithoutTheEmbeddedStoreNamesTheLineThatSetsIt(t *testing.T) {
	conf := LockConf{Rules: []Rule{{Method: "POST", Path: "/order", Key: "order:{header.x-uid}"}}}
	open := EmbeddedStore
	EmbeddedStore = nil
	_, err := New(conf)
	EmbeddedStore = open
	if err == nil || !strings.Contains(err.Error(), embeddedStoreLine) || !strings.Contains(err.Error(), "Lock.Redis.Host") {
		t.Fatalf("New without a Redis host or the embedded store: %v, want an error naming Lock.Redis.Host and %s", err, embeddedStoreLine)
	}
	m, err := New(conf)
	if err != nil {
		t.Fatalf("New without a Redis host, the embedded store linked: %v", err)
	}
	_ = m.Close()
}

// Each Middleware whose section names no store opens an embedded store of its own, so two
// services of one development binary (a zrpc caller and the service it calls) do not meet on a
// key: the callee takes its caller's key as a free one, and neither exclusion nor owner
// hand-over is exercised. The start-up log says so, and names WithStore, which shares one.
func TestEmbeddedStoreIsEachMiddlewaresOwn(t *testing.T) {
	logx.SetLevel(logx.InfoLevel) // TestMain disabled the logs
	t.Cleanup(logx.Disable)
	logs := logtest.NewCollector(t)
	conf := LockConf{Rules: []Rule{{RPC: "/bal.Balance/Debit", Key: "acct:{account}"}}}
	var lockers []*flightlock.Locker
	for range 2 {
		m, err := New(conf, WithServiceMode("dev"))
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		t.Cleanup(func() { _ = m.Close() })
		l, err := m.Locker().With(flightlock.WithMode(flightlock.Reject))
		if err != nil {
			t.Fatal(err)
		}
		lockers = append(lockers, l)
	}
	ctx := context.Background()
	first, err := lockers[0].Lock(ctx, "acct:7")
	if err != nil {
		t.Fatalf("first Middleware's lock: %v", err)
	}
	defer func() { _ = first.Release(ctx) }()
	second, err := lockers[1].Lock(ctx, "acct:7")
	if err != nil {
		t.Fatalf("second Middleware's lock of the key the first holds, each on its own embedded store: %v", err)
	}
	_ = second.Release(ctx)
	out := logs.String()
	for _, want := range []string{"any other Middleware", "WithStore"} {
		if !strings.Contains(out, want) {
			t.Errorf("the embedded store's start-up log %q does not say %q", out, want)
		}
	}
}
