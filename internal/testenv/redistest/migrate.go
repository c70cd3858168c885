package redistest

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SlotMigration moves one hash slot from one master of a Redis Cluster to another in the
// steps redis-cli --cluster reshard takes, so that a test can act between them:
//
//   - Start: the target imports the slot, the source migrates it (keys still on the source;
//     a command on a key the source no longer has is answered ASK);
//   - Move: keys go from the source to the target with MIGRATE (a key that moved is served by
//     the target to a client that says ASKING; a script whose keys are split between the two
//     is answered TRYAGAIN);
//   - Finish: the target, then the source, then every other master takes the target as the
//     slot's owner (the source answers MOVED from then on).
//
// Addresses are the nodes' own (Server.Addr), which MIGRATE dials; a client reaches them as the
// cluster announces them.
type SlotMigration struct {
	Slot int

	tb       testing.TB
	from, to *redis.Client
	toAddr   string
	fromID   string
	toID     string
	masters  []string // every master's own address, for Finish
}

// StartSlotMigration marks slot as importing on the master at to and migrating on the master
// at from; masters lists every master (from and to included). The clients end with tb.
func StartSlotMigration(tb testing.TB, slot int, from, to string, masters []string) *SlotMigration {
	tb.Helper()
	m := &SlotMigration{Slot: slot, tb: tb, toAddr: to, masters: masters,
		from: adminClient(tb, from), to: adminClient(tb, to)}
	ctx := context.Background()
	m.fromID = m.from.ClusterMyID(ctx).Val()
	m.toID = m.to.ClusterMyID(ctx).Val()
	if m.fromID == "" || m.toID == "" {
		tb.Fatalf("CLUSTER MYID of %s or %s is empty", from, to)
	}
	m.setSlot(m.to, "IMPORTING", m.fromID)
	m.setSlot(m.from, "MIGRATING", m.toID)
	return m
}

// Keys returns the keys of the slot that are still on the source.
func (m *SlotMigration) Keys() []string {
	m.tb.Helper()
	keys, err := m.from.ClusterGetKeysInSlot(context.Background(), m.Slot, 1000).Result()
	if err != nil {
		m.tb.Fatalf("CLUSTER GETKEYSINSLOT %d: %v", m.Slot, err)
	}
	return keys
}

// Move migrates keys (all the slot's keys still on the source when none are named) to the
// target, TTLs included.
func (m *SlotMigration) Move(keys ...string) {
	m.tb.Helper()
	if len(keys) == 0 {
		keys = m.Keys()
	}
	if len(keys) == 0 {
		return
	}
	host, port, _ := net.SplitHostPort(m.toAddr)
	args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
	for _, k := range keys {
		args = append(args, k)
	}
	if err := m.from.Do(context.Background(), args...).Err(); err != nil {
		m.tb.Fatalf("MIGRATE %v to %s: %v", keys, m.toAddr, err)
	}
}

// Finish moves the keys still on the source and makes the target the slot's owner: on the
// target first, then the source, then every other master, as redis-cli does. It returns once
// every master names the target as the slot's owner.
func (m *SlotMigration) Finish() {
	m.tb.Helper()
	m.Move()
	m.setSlot(m.to, "NODE", m.toID)
	m.setSlot(m.from, "NODE", m.toID)
	for _, addr := range m.masters {
		c := adminClient(m.tb, addr)
		m.setSlot(c, "NODE", m.toID)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, addr := range m.masters {
		c := adminClient(m.tb, addr)
		for !ownsSlot(c, m.Slot, m.toID) {
			if time.Now().After(deadline) {
				m.tb.Fatalf("%s does not name %s as the owner of slot %d after 10s", addr, m.toID, m.Slot)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func (m *SlotMigration) setSlot(c *redis.Client, state, id string) {
	m.tb.Helper()
	if err := c.Do(context.Background(), "CLUSTER", "SETSLOT", m.Slot, state, id).Err(); err != nil {
		m.tb.Fatalf("CLUSTER SETSLOT %d %s %s on %s: %v", m.Slot, state, id, c.Options().Addr, err)
	}
}

// ownsSlot reports whether the node c talks to names id as the master of slot.
func ownsSlot(c *redis.Client, slot int, id string) bool {
	ranges, err := c.ClusterShards(context.Background()).Result()
	if err != nil {
		return false
	}
	for _, shard := range ranges {
		for _, r := range shard.Slots {
			if r.Start <= int64(slot) && int64(slot) <= r.End {
				for _, n := range shard.Nodes {
					if n.Role == "master" && n.ID == id {
						return true
					}
				}
				return false
			}
		}
	}
	return false
}

// MasterAddrOf returns which of masters (their own addresses) serves slot.
func MasterAddrOf(tb testing.TB, slot int, masters []string) string {
	tb.Helper()
	for _, addr := range masters {
		c := adminClient(tb, addr)
		id := c.ClusterMyID(context.Background()).Val()
		if ownsSlot(c, slot, id) {
			return addr
		}
	}
	tb.Fatalf("no master of %v serves slot %d", masters, slot)
	return ""
}

// adminClient is a plain client on one node's own address, closed when tb ends.
func adminClient(tb testing.TB, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true, MaxRetries: -1})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Slot returns Redis Cluster's hash slot of key, as CLUSTER KEYSLOT computes it.
func Slot(tb testing.TB, addr, key string) int {
	tb.Helper()
	n, err := adminClient(tb, addr).ClusterKeySlot(context.Background(), key).Result()
	if err != nil {
		tb.Fatalf("CLUSTER KEYSLOT %q: %v", key, err)
	}
	return int(n)
}
