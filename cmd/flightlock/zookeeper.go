package main

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/flightlock/flightlock/zkstore"
)

// zookeeperTarget applies the ZooKeeper flags over the file's Zookeeper section: -zookeeper
// (hosts) and -zookeeper-root. The session timeout is the file's (default 40s): the servers
// refuse one outside their bounds, as they would the service's.
func zookeeperTarget(t target, o options, path string) (target, error) {
	switch {
	case o.addr != "" || o.typ != "" || o.tls || o.user != "" || o.pass != "" && !o.passFromEnv:
		return target{}, fmt.Errorf("-addr, -type, -tls, -user and -pass are Redis's or etcd's; the locks are read in ZooKeeper here (-zookeeper host:port)")
	case o.zk != "":
		t.zk.Hosts = strings.Split(o.zk, ",")
	case len(t.zk.Hosts) == 0:
		return target{}, fmt.Errorf("%s: %s.Zookeeper.Hosts is empty: pass -zookeeper host:port", o.file, path)
	}
	// A file without a Zookeeper section, and no file, leave the section's defaults unfilled.
	t.zk.Root = cmp.Or(o.zkRoot, t.zk.Root, zkstore.DefaultRoot)
	t.zk.SessionTimeout = cmp.Or(t.zk.SessionTimeout, zkstore.DefaultSessionTimeout)
	return t, nil
}

// connectZookeeper opens a session as the service's own store does (ZookeeperConf.Store:
// hosts, session timeout checked against the servers', Root), so that a wrong address fails
// here, within -timeout, with the address in the message. The locks are read through
// zkstore's inspector, which never hands out an owner token (the nodes hold a hash of it).
// The CLI's session is its own: closing it touches no service's hold.
func connectZookeeper(ctx context.Context, t target, timeout time.Duration) (*backend, error) {
	type dialed struct {
		store *zkstore.Store
		err   error
	}
	done := make(chan dialed, 1)
	go func() { // Dial waits up to a session timeout for a session, and takes no context
		s, _, err := t.zk.Store()
		done <- dialed{s, err}
	}()
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	select {
	case d := <-done:
		if d.err != nil {
			return nil, fmt.Errorf("cannot reach %s (from %s): %w", t.where(), t.from, d.err)
		}
		return &backend{Inspector: zkstore.NewInspector(d.store, t.prefix), target: t, close: func() { _ = d.store.Close() }}, nil
	case <-tctx.Done():
		go func() { // a session that comes after all is ended at once
			if d := <-done; d.err == nil {
				_ = d.store.Close()
			}
		}()
		return nil, fmt.Errorf("cannot reach %s (from %s): no session within %v", t.where(), t.from, timeout)
	}
}
