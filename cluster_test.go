package flightlock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/internal/redistest"
	"github.com/flightlock/flightlock/lockstore"
)

// Issue 19: an acquisition whose reply comes back late (0.57 x TTL after the send, a cold
// Cluster client) is renewed in time, counted from the send, never declared lost while its key
// is valid, on a real redis-server. The first renewal is due TTL/3 after the send, so here it
// goes out as soon as the reply arrives.
func TestSlowAcquireReplyIsRenewedInTime(t *testing.T) {
	s, _, c := realStore(t)
	ctx := context.Background()
	const ttl = time.Second
	l := mustLocker(t, &slowAcquireStore{Store: s, delay: 570 * time.Millisecond}, WithTTL(ttl))
	lease, err := l.Lock(ctx, "slow")
	if err != nil {
		t.Fatalf("a reply 0.57 x TTL late must still give a lease (0.33 x TTL is left to renew): %v", err)
	}
	defer lease.Release(ctx)
	// Three TTLs later the lease and its key are still there: the renewals kept up.
	end := time.Now().Add(3 * ttl)
	for time.Now().Before(end) {
		if err := lease.Context().Err(); err != nil {
			t.Fatalf("lease cancelled (%v) while its key was valid: %d ms left in Redis", context.Cause(lease.Context()),
				c.PTTL(ctx, "lock:slow").Val().Milliseconds())
		}
		if owner := strings.Fields(c.Get(ctx, "lock:slow").Val()); len(owner) == 0 || owner[0] != lease.Owner() {
			t.Fatalf("the key is no longer this lease's: %v", owner)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// migration moves one slot from its master to another in steps, as redis-cli --cluster
// reshard does, so a test can act between the steps.
type migration struct {
	t        *testing.T
	slot     int64
	from, to *redis.Client
	toAddr   string
	fromID   string
	toID     string
	all      []*redis.Client
}

func startMigration(t *testing.T, cluster *redistest.Cluster, key string) *migration {
	t.Helper()
	ctx := context.Background()
	m := &migration{t: t}
	for _, addr := range cluster.Addrs {
		c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
		t.Cleanup(func() { _ = c.Close() })
		m.all = append(m.all, c)
	}
	m.slot = m.all[0].ClusterKeySlot(ctx, key).Val()
	for i, c := range m.all {
		id := c.ClusterMyID(ctx).Val()
		owner := nodeOfSlot(t, c, m.slot)
		if owner == id {
			m.from, m.fromID = c, id
		} else if m.to == nil {
			m.to, m.toID, m.toAddr = c, id, cluster.Addrs[i]
		}
	}
	if m.from == nil || m.to == nil {
		t.Fatalf("slot %d: no source or target node", m.slot)
	}
	must(t, m.to.Do(ctx, "CLUSTER", "SETSLOT", m.slot, "IMPORTING", m.fromID).Err())
	must(t, m.from.Do(ctx, "CLUSTER", "SETSLOT", m.slot, "MIGRATING", m.toID).Err())
	return m
}

// nodeOfSlot is the id of the master that c believes serves slot.
func nodeOfSlot(t *testing.T, c *redis.Client, slot int64) string {
	t.Helper()
	ranges, err := c.ClusterSlots(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range ranges {
		if int64(r.Start) <= slot && slot <= int64(r.End) {
			return r.Nodes[0].ID
		}
	}
	t.Fatalf("no node serves slot %d", slot)
	return ""
}

// move migrates keys (they must be in the slot) to the target.
func (m *migration) move(keys ...string) {
	m.t.Helper()
	host, port, _ := strings.Cut(m.toAddr, ":")
	args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
	for _, k := range keys {
		args = append(args, k)
	}
	must(m.t, m.from.Do(context.Background(), args...).Err())
}

// finish moves the slot's remaining keys and gives the slot to the target on every node.
func (m *migration) finish() {
	m.t.Helper()
	ctx := context.Background()
	for {
		keys := m.from.ClusterGetKeysInSlot(ctx, int(m.slot), 100).Val()
		if len(keys) == 0 {
			break
		}
		m.move(keys...)
	}
	for _, c := range m.all {
		must(m.t, c.Do(ctx, "CLUSTER", "SETSLOT", m.slot, "NODE", m.toID).Err())
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// Issue 19: while a slot migrates, its lock and fence counter can be on two nodes and a script
// that touches both gets TRYAGAIN. No TRYAGAIN reaches a caller: a rejecting Lock is answered
// busy, a waiting Lock waits and gets the lock once the migration is done, and a release during
// the migration is sent again until it goes through.
func TestSlotMigrationIsInvisible(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node Redis Cluster")
	}
	cluster := redistest.StartCluster(t, 3)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs, DisableIdentity: true, ContextTimeoutEnabled: true})
	s := lockstore.New(client, lockstore.WithOnClose(client.Close))
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	reject := mustLocker(t, s, WithMode(Reject))
	wait := mustLocker(t, s, WithWait(20*time.Second))

	// Two keys of one slot ({mig}); the first grant creates the slot's fence counter.
	held, err := wait.Lock(ctx, "{mig}held")
	if err != nil {
		t.Fatal(err)
	}
	fence0 := held.Fence()
	m := startMigration(t, cluster, "lock:{mig}free")
	// The counter goes first; the held lock stays on the source: the two are split.
	m.move(lockstore.FenceKey("lock:{mig}free"))

	if _, err := reject.Lock(ctx, "{mig}free"); !errors.Is(err, ErrBusy) {
		t.Fatalf("a rejecting Lock during the migration: %v, want ErrBusy", err)
	}
	type result struct {
		lease *Lease
		err   error
	}
	waited := make(chan result, 1)
	go func() {
		lease, err := wait.Lock(ctx, "{mig}free")
		waited <- result{lease, err}
	}()
	released := make(chan error, 1)
	go func() { released <- held.Release(ctx) }()

	time.Sleep(300 * time.Millisecond) // both retry against the split slot meanwhile
	select {
	case r := <-waited:
		t.Fatalf("the waiting Lock returned during the migration: %v %v", r.lease, r.err)
	case err := <-released:
		t.Fatalf("the release returned during the migration: %v", err)
	default:
	}
	m.finish()

	if err := <-released; err != nil {
		t.Errorf("release across the migration: %v", err)
	}
	r := <-waited
	if r.err != nil {
		t.Fatalf("the waiting Lock across the migration: %v", r.err)
	}
	if r.lease.Fence() <= fence0 {
		t.Errorf("fence %d after the migration is not above %d before it", r.lease.Fence(), fence0)
	}
	if err := r.lease.Release(ctx); err != nil {
		t.Errorf("release after the migration: %v", err)
	}
	// The slot now lives on the target, which answers for both keys.
	if n := nodeOfSlot(t, m.to, m.slot); n != m.toID {
		t.Errorf("slot %d is on %s after the migration, want %s", m.slot, n, m.toID)
	}
}
