package app

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	flmw "github.com/flightlock/flightlock/middleware"
)

// TestExampleOnEtcd runs etc/flightlock-example-etcd.yaml on a real etcd (internal/testenv/etcdtest)
// and the embedded Redis: the account locks (withdraw, Debit, Credit, Transfer) are in etcd,
// the order and stock locks in Redis, and everything the example shows still works across
// both: a withdrawal re-enters the account lock downstream through the propagated owner (on
// etcd), duplicate orders are refused (on Redis), an account held by another process in etcd
// answers 409.
func TestExampleOnEtcd(t *testing.T) {
	ec := etcdtest.Start(t)
	c, h := startEtcdExample(t, ec, nil)

	t.Run("withdraw re-enters downstream on etcd", func(t *testing.T) { testWithdrawReentry(t, h) })
	t.Run("duplicate orders are rejected", func(t *testing.T) { testDuplicateOrders(t, h) })
	t.Run("an account held in etcd is busy", func(t *testing.T) {
		other, err := flmw.New(c.Order.Lock) // another order API on the same etcd
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		cli := etcdtest.NewClient(t, ec.Endpoints()...)
		h.seed(t, nil, map[string]int64{"frank": 5_000})
		lease, err := other.Locker().TryLock(context.Background(), "acct:frank")
		if err != nil {
			t.Fatal(err)
		}
		if resp, err := cli.Get(context.Background(), "flightlock/lock:acct:frank"); err != nil || resp.Count != 1 {
			t.Fatalf("the lock of acct:frank is not the etcd key flightlock/lock:acct:frank: %v", err)
		}
		if code := h.post(t, "/api/account/frank/withdraw", map[string]int64{"amount": 100}, nil); code != http.StatusConflict {
			t.Fatalf("withdraw while another process holds the account in etcd: %d, want 409", code)
		}
		if err := lease.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		var r balanceReply
		if code := h.post(t, "/api/account/frank/withdraw", map[string]int64{"amount": 100}, &r); code != http.StatusOK || r.Balance != 4_900 {
			t.Fatalf("withdraw once released: %d, balance %d; want 200, 4900", code, r.Balance)
		}
	})
}

// startEtcdExample runs etc/flightlock-example-etcd.yaml, changed by mutate (when not nil), on
// ec and the embedded Redis, on free ports.
func startEtcdExample(t *testing.T, ec *etcdtest.Cluster, mutate func(*Config)) (Config, *harness) {
	t.Helper()
	c, err := LoadConfig(filepath.Join("..", "..", "etc", "flightlock-example-etcd.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for svc, lc := range map[string]flmw.LockConf{"Order": c.Order.Lock, "Inventory": c.Inventory.Lock, "Balance": c.Balance.Lock} {
		if ps := lc.Problems(); len(ps) != 0 {
			t.Errorf("%s.Lock: %v", svc, ps)
		}
	}
	if len(c.Order.Lock.Etcd.Hosts) == 0 || len(c.Balance.Lock.Etcd.Hosts) == 0 || len(c.Inventory.Lock.Etcd.Hosts) != 0 {
		t.Fatal("the etcd file must name etcd in Order and Balance only")
	}
	ports := freePorts(t, 3)
	c.Order.Port = ports[0]
	c.Inventory.ListenOn = fmt.Sprintf("127.0.0.1:%d", ports[1])
	c.Balance.ListenOn = fmt.Sprintf("127.0.0.1:%d", ports[2])
	c.Order.Inventory.Endpoints = []string{c.Inventory.ListenOn}
	c.Order.Lock.Etcd.Hosts, c.Balance.Lock.Etcd.Hosts = ec.Endpoints(), ec.Endpoints()
	c.Order.Balance.Endpoints = []string{c.Balance.ListenOn}
	c.Order.Log.Mode, c.Inventory.Log.Mode, c.Balance.Log.Mode = "console", "console", "console"
	c.Order.Log.Level, c.Inventory.Log.Level, c.Balance.Log.Level = "error", "error", "error"

	if mutate != nil {
		mutate(&c)
	}
	return c, runSystem(t, c, ports)
}

// The create-order rule moved to etcd (Store: etcd): the order logic finds its lease under the
// etcd key (Etcd.Key first) and writes its orders fenced; it answered 500 "no lease held" when
// it looked for the Redis key only.
func TestExampleOrderLockOnEtcd(t *testing.T) {
	ec := etcdtest.Start(t)
	_, h := startEtcdExample(t, ec, func(c *Config) {
		for i := range c.Order.Lock.Rules {
			if c.Order.Lock.Rules[i].Path == "/api/order/create" {
				c.Order.Lock.Rules[i].Store = "etcd"
			}
		}
	})
	testDuplicateOrders(t, h)
}
