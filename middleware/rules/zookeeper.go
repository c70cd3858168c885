package rules

import (
	"fmt"
	"strings"
	"time"

	"github.com/flightlock/flightlock/zkstore"
)

// ZookeeperConf is a ZooKeeper ensemble for the locks (zkstore). The lock of a rendered key is
// one node under Root, named Lock.Prefix + the key, escaped so that a key never makes a path of
// several nodes.
//   - Hosts lists the servers (host:port). Empty (the default): no ZooKeeper.
//   - SessionTimeout is the session's timeout (default 40s). ZooKeeper keeps a hold as long as
//     the session that made it, so it bounds the lock TTL: a rule on ZooKeeper needs a TTL of at
//     most two thirds of it less syncLimit + 1 ticks (zkstore.Store.MaxTTL), and New refuses a longer one,
//     naming the rule. It must also exceed syncLimit x tickTime + tickTime and lie within the
//     servers' minSessionTimeout and maxSessionTimeout, or New refuses it (zkstore.Dial).
//   - Root is the node the locks live under (default /flightlock), created when missing.
//   - TickTime and SyncLimit are the ensemble's settings, used only when its servers do not
//     answer the "conf" four-letter word (4lw.commands.whitelist); zero means ZooKeeper's
//     sample values, 2s and 5.
type ZookeeperConf struct {
	Hosts          []string      `json:",optional"`
	SessionTimeout time.Duration `json:",default=40s"`
	Root           string        `json:",default=/flightlock"`
	TickTime       time.Duration `json:",optional"`
	SyncLimit      int           `json:",optional"`
}

// Named reports whether z names a ZooKeeper ensemble.
func (z ZookeeperConf) Named() bool { return len(z.Hosts) > 0 }

// Config is z as zkstore's Config, with the hosts trimmed.
func (z ZookeeperConf) Config() zkstore.Config {
	var hosts []string
	for _, h := range z.Hosts {
		if h = strings.TrimSpace(h); h != "" {
			hosts = append(hosts, h)
		}
	}
	return zkstore.Config{Hosts: hosts, SessionTimeout: z.SessionTimeout, Root: z.Root, TickTime: z.TickTime, SyncLimit: z.SyncLimit}
}

// Store connects to the ensemble z names and returns its store as New builds it, once the
// session is up and its timeout checked against the servers' settings (zkstore.Dial). For
// tools that read the locks (cmd/flightlock) and services that build a Locker of their own
// on it. close is the store's Close: it ends the session, and with it every hold it made.
func (z ZookeeperConf) Store() (store *zkstore.Store, close func() error, err error) {
	cfg := z.Config()
	if len(cfg.Hosts) == 0 {
		return nil, nil, FieldError("Lock.Zookeeper.Hosts", "is empty: list the ZooKeeper servers to connect to")
	}
	if store, err = zkstore.Dial(cfg); err != nil {
		return nil, nil, err
	}
	return store, store.Close, nil
}

// problems validates the settings of z.
func (z ZookeeperConf) problems() []error {
	var ps []error
	if !z.Named() {
		if z.TickTime != 0 || z.SyncLimit != 0 {
			ps = append(ps, FieldError("Lock.Zookeeper.Hosts", "is empty, but the Zookeeper section sets other fields: a ZooKeeper store with no hosts"))
		}
		return ps
	}
	for i, h := range z.Hosts {
		if strings.TrimSpace(h) == "" {
			ps = append(ps, FieldError(fmt.Sprintf("Lock.Zookeeper.Hosts[%d]", i), "is empty"))
		}
	}
	if z.SessionTimeout <= 0 {
		ps = append(ps, FieldError("Lock.Zookeeper.SessionTimeout", "must be positive, got %v", z.SessionTimeout))
	}
	if root := strings.TrimRight(z.Root, "/"); !strings.HasPrefix(root, "/") || strings.Contains(root, "//") {
		ps = append(ps, FieldError("Lock.Zookeeper.Root", "%q must be an absolute node path, such as /flightlock", z.Root))
	}
	if z.TickTime < 0 {
		ps = append(ps, FieldError("Lock.Zookeeper.TickTime", "must not be negative, got %v", z.TickTime))
	}
	if z.SyncLimit < 0 {
		ps = append(ps, FieldError("Lock.Zookeeper.SyncLimit", "must not be negative, got %d", z.SyncLimit))
	}
	return ps
}

// checkTTL refuses a lock TTL that no ZooKeeper session of z's timeout keeps, whatever
// the ensemble's tickTime: at least two thirds of the timeout. The exact bound (less two
// ticks, the tick read from the servers) is checked when the store is dialled.
func (z ZookeeperConf) checkTTL(field, rule string, ttl time.Duration) error {
	if z.SessionTimeout <= 0 || ttl < z.SessionTimeout*2/3 {
		return nil
	}
	on := "the locks run on ZooKeeper"
	if rule != "" {
		on = rule + " runs on ZooKeeper"
	}
	return FieldError(field, "%v is too long for the %v session timeout (Lock.Zookeeper.SessionTimeout): %s, which keeps a lock "+
		"at most two thirds of the session timeout less syncLimit + 1 ticks; shorten the TTL or lengthen the session", ttl, z.SessionTimeout, on)
}
