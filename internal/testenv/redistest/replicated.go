package redistest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flightlock/flightlock/internal/testenv/freeport"
	"github.com/redis/go-redis/v9"
)

// ReplicatedCluster is a Redis Cluster of masters with one replica each, on loopback, whose
// masters announce a Proxy in front of themselves: clients and the replication links reach a
// master through its proxy (the cluster bus does not), so a test can stall a master's
// replication link, which cluster nodes give no command for (they refuse REPLICAOF).
type ReplicatedCluster struct {
	Masters  []*Server // Masters[i] is behind Proxies[i]
	Replicas []*Server // Replicas[i] replicates Masters[i]
	Proxies  []*Proxy
	// NodeTimeout is the cluster-node-timeout: a master is failed over about twice this long
	// after it stops answering.
	NodeTimeout time.Duration
	tb          testing.TB
}

// StartReplicatedCluster starts n masters (behind proxies) and n replicas, joins them with
// redis-cli --cluster create --cluster-replicas 1, and waits until the cluster is ok and every
// replica's link is up.
func StartReplicatedCluster(tb testing.TB, n int) *ReplicatedCluster {
	tb.Helper()
	bin, cli := Binary(tb), redisCLI(tb)
	c := &ReplicatedCluster{tb: tb, NodeTimeout: time.Second}
	node := func(addr, announce string) *Server {
		_, port, _ := net.SplitHostPort(addr)
		p, _ := strconv.Atoi(port)
		_, aport, _ := net.SplitHostPort(announce)
		dir := tb.TempDir()
		s := &Server{tb: tb, bin: bin, Addr: addr, dir: dir}
		s.extra = []string{"--cluster-enabled", "yes", "--cluster-config-file", dir + "/nodes.conf",
			"--cluster-node-timeout", strconv.Itoa(int(c.NodeTimeout.Milliseconds())),
			"--cluster-announce-ip", "127.0.0.1", "--cluster-announce-port", aport,
			"--cluster-announce-bus-port", strconv.Itoa(p + 10000)}
		s.start()
		tb.Cleanup(s.Stop)
		return s
	}
	var addrs []string
	for range n {
		addr := freeBusAddr(tb)
		proxy := StartProxy(tb, addr)
		c.Proxies = append(c.Proxies, proxy)
		c.Masters = append(c.Masters, node(addr, proxy.Addr))
		addrs = append(addrs, proxy.Addr)
	}
	for range n {
		addr := freeBusAddr(tb)
		c.Replicas = append(c.Replicas, node(addr, addr))
	}
	// Masters first, by the addresses they announce; redis-cli makes the first n the masters.
	args := append([]string{"--cluster", "create"}, addrs...)
	for _, r := range c.Replicas {
		args = append(args, r.Addr)
	}
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		tb.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	// Each replica must replicate the master of the same index: redis-cli pairs them as it
	// likes, so repair the pairing where it differs.
	ctx := context.Background()
	for i, r := range c.Replicas {
		mc := redis.NewClient(&redis.Options{Addr: c.Masters[i].Addr, DisableIdentity: true})
		id := mc.ClusterMyID(ctx).Val()
		_ = mc.Close()
		rc := redis.NewClient(&redis.Options{Addr: r.Addr, DisableIdentity: true})
		deadline := time.Now().Add(20 * time.Second)
		for {
			if err := rc.ClusterReplicate(ctx, id).Err(); err == nil {
				break
			} else if time.Now().After(deadline) {
				tb.Fatalf("CLUSTER REPLICATE on %s: %v", r.Addr, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		_ = rc.Close()
	}
	c.WaitHealthy(30 * time.Second)
	return c
}

// freeBusAddr is a free loopback address whose port + 10000 is free too (the cluster bus),
// both below the ephemeral range (internal/freeport).
func freeBusAddr(tb testing.TB) string {
	tb.Helper()
	return freeport.WithPeer(tb, 10000)
}

// WaitHealthy waits until every running node reports cluster_state:ok and every running
// replica its master link up.
func (c *ReplicatedCluster) WaitHealthy(within time.Duration) {
	c.tb.Helper()
	deadline := time.Now().Add(within)
	for _, s := range append(append([]*Server{}, c.Masters...), c.Replicas...) {
		if s.Pid() == 0 {
			continue
		}
		rc := redis.NewClient(&redis.Options{Addr: s.Addr, DisableIdentity: true})
		for {
			info, _ := rc.ClusterInfo(context.Background()).Result()
			repl, _ := rc.Info(context.Background(), "replication").Result()
			if strings.Contains(info, "cluster_state:ok") &&
				(strings.Contains(repl, "role:master") || strings.Contains(repl, "master_link_status:up")) {
				break
			}
			if time.Now().After(deadline) {
				_ = rc.Close()
				c.tb.Fatalf("node %s not healthy after %v:\n%s\n%s", s.Addr, within, info, repl)
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = rc.Close()
	}
}

// Seeds are the addresses a Cluster client starts from: the masters' proxies.
func (c *ReplicatedCluster) Seeds() []string {
	var seeds []string
	for _, p := range c.Proxies {
		seeds = append(seeds, p.Addr)
	}
	return seeds
}

// MasterOf returns the index of the master (of Masters) that serves key's slot.
func (c *ReplicatedCluster) MasterOf(key string) int {
	c.tb.Helper()
	addr := c.NodeOf(key)
	for i, p := range c.Proxies {
		if addr == p.Addr {
			return i
		}
	}
	c.tb.Fatalf("%q is served by %s, not by one of the first masters", key, addr)
	return -1
}

// NodeOf returns the address that the master serving key's slot announces.
func (c *ReplicatedCluster) NodeOf(key string) string {
	c.tb.Helper()
	ctx := context.Background()
	var node *Server
	for _, s := range append(append([]*Server{}, c.Masters...), c.Replicas...) {
		if s.Pid() != 0 {
			node = s
			break
		}
	}
	rc := redis.NewClient(&redis.Options{Addr: node.Addr, DisableIdentity: true})
	defer rc.Close()
	slot := rc.ClusterKeySlot(ctx, key).Val()
	slots, err := rc.ClusterSlots(ctx).Result()
	if err != nil {
		c.tb.Fatal(err)
	}
	for _, r := range slots {
		if int64(r.Start) <= slot && slot <= int64(r.End) {
			return r.Nodes[0].Addr
		}
	}
	c.tb.Fatalf("no master serves %q", key)
	return ""
}

// WaitPromoted waits until Replicas[i] is a master that the cluster agrees on (cluster_state
// ok on it) and returns when that was seen.
func (c *ReplicatedCluster) WaitPromoted(i int, within time.Duration) time.Time {
	c.tb.Helper()
	rc := redis.NewClient(&redis.Options{Addr: c.Replicas[i].Addr, DisableIdentity: true})
	defer rc.Close()
	deadline := time.Now().Add(within)
	for {
		repl, _ := rc.Info(context.Background(), "replication").Result()
		info, _ := rc.ClusterInfo(context.Background()).Result()
		if strings.Contains(repl, "role:master") && strings.Contains(info, "cluster_state:ok") {
			return time.Now()
		}
		if time.Now().After(deadline) {
			c.tb.Fatalf("replica %s not promoted after %v:\n%s", c.Replicas[i].Addr, within, repl)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// String lists the nodes, for failure messages.
func (c *ReplicatedCluster) String() string {
	var b strings.Builder
	for i := range c.Masters {
		fmt.Fprintf(&b, "master %s (proxy %s) replica %s; ", c.Masters[i].Addr, c.Proxies[i].Addr, c.Replicas[i].Addr)
	}
	return b.String()
}
