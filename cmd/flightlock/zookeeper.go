package main

import (
	"cmp"
	"fmt"
	"strings"

	"github.com/flightlock/flightlock/zkstore"
)

// zookeeperTarget applies the ZooKeeper flags over the file's Zookeeper section: -zookeeper
// (hosts) and -zookeeper-root. The session timeout is the file's (default 40s): the servers
// refuse one outside their bounds, as they would the service's.
func zookeeperTarget(t target, o options, path string) (target, error) {
	switch {
	case o.etcdKey != "":
		return target{}, otherStoreFlag(o, storeZookeeper)
	case o.addr != "" || o.typ != "" || o.tls || o.user != "" || o.pass != "" && !o.passFromEnv:
		return target{}, flagError{fmt.Errorf("-addr, -type, -tls, -user and -pass are Redis's or etcd's; the locks are read in ZooKeeper here (-zookeeper host:port)")}
	case o.zk != "":
		t.zk.Hosts = strings.Split(o.zk, ",")
		if o.file != "" {
			t.from = "-zookeeper, with " + t.from
		}
	case len(t.zk.Hosts) == 0: // -store zookeeper: a section that names ZooKeeper has hosts
		return target{}, flagError{fmt.Errorf("%s: %s.Zookeeper.Hosts is empty: pass -zookeeper host:port", o.file, path)}
	}
	// A file without a Zookeeper section, and no file, leave the section's defaults unfilled.
	t.zk.Root = cmp.Or(o.zkRoot, t.zk.Root, zkstore.DefaultRoot)
	t.zk.SessionTimeout = cmp.Or(t.zk.SessionTimeout, zkstore.DefaultSessionTimeout)
	return t, nil
}
