package etcdstore

import (
	"context"
	"testing"
	"time"

	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	"github.com/flightlock/flightlock/internal/testenv/poll"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

// Every test must leave no goroutine behind: keep-alive senders, watches, the keep-alive loop.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	ownerA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	ownerB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// newStore returns a store on cli, closed when t ends (before cli, which was registered first).
func newStore(t testing.TB, cli *clientv3.Client, opts ...Option) *Store {
	t.Helper()
	s, err := New(cli, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// quiet stops s's background keep-alives before its first lease is granted: its leases then
// live only as long as explicit acquisitions and refreshes keep them.
func quiet(s *Store) *Store {
	s.mu.Lock()
	s.ticking = true
	s.mu.Unlock()
	return s
}

// Held returns how many locks the store keeps an entry for (taken or re-entered, not yet seen
// released or lost).
func (s *Store) Held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held)
}

// single starts one etcd member and returns a client on it.
func single(t *testing.T) (*etcdtest.Cluster, *clientv3.Client) {
	t.Helper()
	c := etcdtest.Start(t)
	return c, c.Client(t)
}

func bg(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// get reads key, failing the test on error; nil when it does not exist.
func get(t *testing.T, cli *clientv3.Client, key string) *mvccpb.KeyValue {
	t.Helper()
	resp, err := cli.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	return resp.Kvs[0]
}

// leaseTTL is the remaining TTL of the lease key is on, in whole seconds.
func leaseTTL(t *testing.T, cli *clientv3.Client, key string) int64 {
	t.Helper()
	kv := get(t, cli, key)
	if kv == nil {
		t.Fatalf("%q does not exist", key)
	}
	if kv.Lease == 0 {
		t.Fatalf("%q has no lease: a lock must never be immortal", key)
	}
	resp, err := cli.TimeToLive(context.Background(), clientv3.LeaseID(kv.Lease))
	if err != nil {
		t.Fatal(err)
	}
	return resp.TTL
}

// waitFor polls cond every 10ms until it holds or within passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, within, 10*time.Millisecond, what, cond)
}
