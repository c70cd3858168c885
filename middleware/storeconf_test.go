package middleware

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
)

// configCase is one bad LockConf and the fields of its problems, the first one Validate and
// New report.
type configCase struct {
	name string
	c    LockConf
	want []string
}

// TestConfigErrorsNameTheirFieldOnEveryStore: the store checks of LockConf need no server.
// For the section of each store (etcd, ZooKeeper), each bad setting is one problem naming its
// field, Validate returns the first, and New refuses the config before it dials anything; the
// good configs of each store have no problem.
func TestConfigErrorsNameTheirFieldOnEveryStore(t *testing.T) {
	etcd := EtcdConf{Hosts: []string{"127.0.0.1:1"}}         // never dialled: every case fails first
	zkHosts := ZookeeperConf{Hosts: []string{"127.0.0.1:1"}} // never dialled either
	redis := RedisConf{Host: "127.0.0.1:1"}
	order := func(r Rule) Rule {
		r.Method, r.Path, r.Key = "POST", "/api/order", "order:{body.uid}"
		return r
	}
	stores := []struct {
		name  string
		cases []configCase
		good  []LockConf
	}{
		{name: "etcd", cases: []configCase{
			{"both stores, rule says none", LockConf{Redis: redis, Etcd: etcd, Rules: []Rule{order(Rule{})}},
				[]string{"Lock.Rules[0].Store"}},
			{"both stores through Sentinel", LockConf{Redis: RedisConf{Sentinel: SentinelConf{MasterName: "m", Addrs: []string{"127.0.0.1:1"}}},
				Etcd: etcd, Rules: []Rule{order(Rule{})}}, []string{"Lock.Rules[0].Store"}},
			{"etcd store with no hosts", LockConf{Rules: []Rule{order(Rule{Store: "etcd"})}}, []string{"Lock.Rules[0].Store"}},
			{"bad store word", LockConf{Rules: []Rule{order(Rule{Store: "consul"})}}, []string{"Lock.Rules[0].Store"}},
			{"section TTL not whole seconds", LockConf{Etcd: etcd, TTL: 1500 * time.Millisecond, Rules: []Rule{order(Rule{})}},
				[]string{"Lock.TTL"}},
			{"section TTL below a second", LockConf{Etcd: etcd, TTL: 500 * time.Millisecond}, []string{"Lock.TTL"}},
			{"rule TTL not whole seconds", LockConf{Redis: redis, Etcd: etcd, Rules: []Rule{order(Rule{Store: "ETCD", TTL: 2500 * time.Millisecond})}},
				[]string{"Lock.Rules[0].TTL"}},
			{"inherited TTL of an etcd rule", LockConf{Redis: redis, Etcd: etcd, TTL: 1500 * time.Millisecond,
				Rules: []Rule{order(Rule{Store: "redis"}), {RPC: "/pkg.Svc/Do", Key: "x:{id}", Store: "etcd"}}}, []string{"Lock.TTL"}},
			{"a discovery key as prefix", LockConf{Etcd: EtcdConf{Hosts: etcd.Hosts, Key: "order.rpc/"}}, []string{"Lock.Etcd.Key"}},
			{"user without pass", LockConf{Etcd: EtcdConf{Hosts: etcd.Hosts, User: "root"}}, []string{"Lock.Etcd.Pass"}},
			{"cert without key and CA", LockConf{Etcd: EtcdConf{Hosts: etcd.Hosts, CertFile: "c.pem"}}, []string{"Lock.Etcd.CertFile"}},
			{"settings without hosts", LockConf{Etcd: EtcdConf{User: "root", Pass: "x"}}, []string{"Lock.Etcd.Hosts"}},
			{"empty host", LockConf{Etcd: EtcdConf{Hosts: []string{" "}}}, []string{"Lock.Etcd.Hosts[0]"}},
			{"lease margin", LockConf{Etcd: EtcdConf{Hosts: etcd.Hosts, LeaseMargin: 1500 * time.Millisecond}}, []string{"Lock.Etcd.LeaseMargin"}},
			{"all at once", LockConf{Etcd: EtcdConf{Hosts: etcd.Hosts, Key: "pay.rpc/", User: "u"}, TTL: 1500 * time.Millisecond,
				Rules: []Rule{order(Rule{Store: "bogus"}), {RPC: "/pkg.Svc/Do", Key: "x:{id}", TTL: 100 * time.Millisecond}}},
				[]string{"Lock.Etcd.Key", "Lock.Etcd.Pass", "Lock.TTL", "Lock.Rules[0].Store", "Lock.Rules[1].TTL"}},
		}, good: []LockConf{
			{Redis: redis, Etcd: etcd, Rules: []Rule{order(Rule{Store: "redis", OnBusy: "share"}), {RPC: "/pkg.Svc/Do", Key: "x:{id}", Store: "Etcd", TTL: 3 * time.Second}}},
			{Etcd: etcd, TTL: 2 * time.Second, Rules: []Rule{order(Rule{})}},
			{Etcd: etcd, TTL: 1500 * time.Millisecond, Rules: []Rule{order(Rule{Store: "redis"})}, Redis: redis}, // the Locker of Redis only
			{Etcd: EtcdConf{Hosts: etcd.Hosts, Key: "locks/order.rpc/"}},                                         // under locks/, not order.rpc/
			// share rules on etcd keep their responses there (middleware/share), with any Replay
			{Etcd: etcd, Rules: []Rule{order(Rule{OnBusy: "share"})}},
			{Redis: redis, Etcd: etcd, Rules: []Rule{order(Rule{OnBusy: "share", Store: "etcd", Replay: 1500 * time.Millisecond})}},
		}},
		{name: "zookeeper", cases: []configCase{
			{"zookeeper store with no hosts", LockConf{Rules: []Rule{order(Rule{Store: "zookeeper"})}}, []string{"Lock.Rules[0].Store"}},
			{"several stores, rule says none", LockConf{Etcd: EtcdConf{Hosts: []string{"127.0.0.1:1"}}, Zookeeper: zkHosts,
				Rules: []Rule{order(Rule{})}}, []string{"Lock.Rules[0].Store"}},
			{"share rule on zookeeper", LockConf{Zookeeper: zkHosts, Rules: []Rule{order(Rule{OnBusy: "share"})}},
				[]string{"Lock.Rules[0].OnBusy"}},
			{"rule TTL of the whole session", LockConf{Redis: redis, Zookeeper: zkHosts,
				Rules: []Rule{order(Rule{Store: "zookeeper", TTL: 30 * time.Second})}}, []string{"Lock.Rules[0].TTL"}},
			{"inherited TTL of a zookeeper rule", LockConf{Redis: redis, Zookeeper: ZookeeperConf{Hosts: zkHosts.Hosts, SessionTimeout: 9 * time.Second},
				Rules: []Rule{order(Rule{Store: "zookeeper"})}}, []string{"Lock.TTL"}},
			{"section TTL", LockConf{Zookeeper: ZookeeperConf{Hosts: zkHosts.Hosts, SessionTimeout: 12 * time.Second}, TTL: 8 * time.Second},
				[]string{"Lock.TTL"}},
			{"relative root", LockConf{Zookeeper: ZookeeperConf{Hosts: zkHosts.Hosts, Root: "locks"}}, []string{"Lock.Zookeeper.Root"}},
			{"empty host", LockConf{Zookeeper: ZookeeperConf{Hosts: []string{"127.0.0.1:1", " "}}}, []string{"Lock.Zookeeper.Hosts[1]"}},
			{"negative session", LockConf{Zookeeper: ZookeeperConf{Hosts: zkHosts.Hosts, SessionTimeout: -time.Second}},
				[]string{"Lock.Zookeeper.SessionTimeout"}},
			{"settings without hosts", LockConf{Zookeeper: ZookeeperConf{TickTime: time.Second}}, []string{"Lock.Zookeeper.Hosts"}},
		}, good: []LockConf{
			{Zookeeper: zkHosts, Rules: []Rule{order(Rule{Mode: "read", ReadOnly: true}), {RPC: "/pkg.Svc/Fair", Key: "f:{id}", Fair: true},
				{RPC: "/pkg.Svc/Do", Key: "x:{id}", Permits: 3}}},
			{Redis: redis, Zookeeper: zkHosts, Rules: []Rule{order(Rule{Store: "redis", OnBusy: "share"}), {RPC: "/pkg.Svc/Do", Key: "x:{id}", Store: "Zookeeper"}}},
			{Zookeeper: ZookeeperConf{Hosts: zkHosts.Hosts, SessionTimeout: 60 * time.Second}, TTL: 30 * time.Second},
		}},
	}
	for _, store := range stores {
		t.Run(store.name, func(t *testing.T) {
			for _, tc := range store.cases {
				t.Run(tc.name, func(t *testing.T) {
					if got := fields(t, tc.c.Problems()); !slices.Equal(got, tc.want) {
						t.Fatalf("Problems fields = %q, want %q (%v)", got, tc.want, tc.c.Problems())
					}
					var ce *ConfigError
					if err := tc.c.Validate(); !errors.As(err, &ce) || ce.Field != tc.want[0] {
						t.Fatalf("Validate = %v, want the ConfigError of %s", err, tc.want[0])
					}
					m, err := New(tc.c)
					if err == nil {
						_ = m.Close()
					}
					if !errors.As(err, &ce) || ce.Field != tc.want[0] || !errors.Is(err, flightlock.ErrConfig) {
						t.Fatalf("New = %v, want the ConfigError of %s", err, tc.want[0])
					}
				})
			}
			for i, c := range store.good {
				if ps := c.Problems(); len(ps) != 0 {
					t.Errorf("good config %d: Problems = %v", i, ps)
				}
				if err := c.Validate(); err != nil {
					t.Errorf("good config %d: Validate = %v", i, err)
				}
			}
		})
	}
}
