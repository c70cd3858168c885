// Package zkconf is the Lock.Zookeeper section of a go-zero service and its lockstore.Driver,
// apart from zkstore so that a program using the store alone does not link it.
package zkconf

import (
	"strings"

	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/zkstore"
)

// Conf is a ZooKeeper ensemble for the locks, with zkstore.Config's fields and defaults. A
// rendered key's lock is one node under Root, named Lock.Prefix + the key, escaped. No Hosts
// (the default) means no ZooKeeper. A lock TTL may be at most the store's MaxTTL, two thirds of
// SessionTimeout less syncLimit + 1 ticks: New refuses a longer TTL, and a timeout the servers
// would not grant.
type Conf zkstore.Config

// Name implements lockstore.Driver.
func (z Conf) Name() string { return "zookeeper" }

// Configured reports whether z names a ZooKeeper ensemble.
func (z Conf) Configured() bool { return len(z.Hosts) > 0 }

// KeyPrefix is prefix: the locks are nodes under Root, named prefix + key.
func (z Conf) KeyPrefix(prefix string) string { return prefix }

// Config is z as zkstore's Config, with the hosts trimmed.
func (z Conf) Config() zkstore.Config {
	cfg := zkstore.Config(z)
	cfg.Hosts = lockstore.TrimHosts(z.Hosts)
	return cfg
}

// Store dials the ensemble z names (zkstore.Dial); close ends the session and every hold it made.
func (z Conf) Store() (store *zkstore.Store, close func() error, err error) {
	cfg := z.Config()
	if len(cfg.Hosts) == 0 {
		return nil, nil, lockstore.FieldError("Lock.Zookeeper.Hosts", "is empty: list the ZooKeeper servers to connect to")
	}
	if store, err = zkstore.Dial(cfg); err != nil {
		return nil, nil, err
	}
	return store, store.Close, nil
}

// Open implements lockstore.Driver: Store, described for keys under prefix.
func (z Conf) Open(prefix string) (*lockstore.Backend, error) {
	s, closeStore, err := z.Store()
	if err != nil {
		return nil, err
	}
	b := s.Describe(z.KeyPrefix(prefix))
	b.Close = closeStore
	return b, nil
}

// Validate implements lockstore.Driver.
func (z Conf) Validate(section, _ string) []error {
	if !z.Configured() {
		if z.TickTime != 0 || z.SyncLimit != 0 {
			return []error{lockstore.FieldError(section+".Hosts", "is empty, but the Zookeeper section sets other fields: a ZooKeeper store with no hosts")}
		}
		return nil
	}
	ps := lockstore.HostErrors(section+".Hosts", z.Hosts)
	if z.SessionTimeout <= 0 {
		ps = append(ps, lockstore.FieldError(section+".SessionTimeout", "must be positive, got %v", z.SessionTimeout))
	}
	if root := strings.TrimRight(z.Root, "/"); !strings.HasPrefix(root, "/") || strings.Contains(root, "//") {
		ps = append(ps, lockstore.FieldError(section+".Root", "%q must be an absolute node path, such as /flightlock", z.Root))
	}
	if z.TickTime < 0 {
		ps = append(ps, lockstore.FieldError(section+".TickTime", "must not be negative, got %v", z.TickTime))
	}
	if z.SyncLimit < 0 {
		ps = append(ps, lockstore.FieldError(section+".SyncLimit", "must not be negative, got %d", z.SyncLimit))
	}
	return ps
}

// Check implements lockstore.Driver: ZooKeeper keeps no responses, nor a lock TTL of two thirds
// of the session timeout or more (the exact bound needs the servers' tick: see Dial).
func (z Conf) Check(section string, u lockstore.Use) error {
	switch {
	case !z.Configured():
		return lockstore.FieldError(u.Field+".Store", "is zookeeper, but %s.Hosts is empty: a ZooKeeper store with no hosts", section)
	case u.Share:
		return lockstore.FieldError(u.Field+".OnBusy", "is share, but the rule locks in ZooKeeper, which keeps no stored responses: "+
			"lock it in Redis or etcd, or use wait")
	case u.TTLField == "" || z.SessionTimeout <= 0 || u.TTL < z.SessionTimeout*2/3:
		return nil
	}
	return lockstore.FieldError(u.TTLField, "%v is too long for the %v session timeout (%s.SessionTimeout): %s ZooKeeper, which keeps a lock "+
		"at most two thirds of the session timeout less syncLimit + 1 ticks; shorten the TTL or lengthen the session", u.TTL, z.SessionTimeout, section, u.On())
}
