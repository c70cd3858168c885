package flightlock

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/redisstore"
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
	s := redisstore.New(client, redisstore.WithOnClose(client.Close))
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

// clusterLocker is a Locker of its own (its own Cluster client, as another process would
// have) on c, with replica acknowledgement when replicas > 0.
func clusterLocker(t *testing.T, c *redistest.ReplicatedCluster, replicas int) *Locker {
	t.Helper()
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Seeds(), DisableIdentity: true, ContextTimeoutEnabled: true})
	var opts []redisstore.Option
	if replicas > 0 {
		opts = append(opts, redisstore.WithReplicas(replicas, 200*time.Millisecond))
	}
	s := redisstore.New(client, append(opts, redisstore.WithOnClose(client.Close))...)
	t.Cleanup(func() { _ = s.Close() })
	return mustLocker(t, s, WithTTL(30*time.Second))
}

// retryStoreErrors calls f until it returns nil, ErrBusy or ErrNotHeld (store errors are
// expected while clients find the promoted replica), for up to 20s.
func retryStoreErrors(t *testing.T, f func() error) error {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := f()
		if err == nil || errors.Is(err, ErrBusy) || errors.Is(err, ErrNotHeld) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Issue 19, the hole: on a real Cluster (3 masters, 3 replicas), a lock taken while its
// master's replica receives nothing is lost when the master is killed and the replica
// promoted, and a second holder is granted while the first still holds its lease. Asserting
// the hole keeps the test below honest. The fence still increases (server-time clock).
func TestClusterFailoverWithoutReplicaAckGrantsASecondHolder(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a six-node Redis Cluster")
	}
	c := redistest.StartReplicatedCluster(t, 3)
	ctx := context.Background()
	i := c.MasterOf("lock:acct:1")
	if n := c.Proxies[i].Stall(time.Minute); n == 0 {
		t.Fatalf("no replication link to stall through the proxy of master %d", i)
	}
	first := clusterLocker(t, c, 0) // its connections are new: not stalled
	lease1, err := first.Lock(ctx, "acct:1")
	if err != nil {
		t.Fatal(err)
	}
	c.Masters[i].Stop() // SIGKILL
	c.WaitPromoted(i, 30*time.Second)

	second := clusterLocker(t, c, 0)
	var lease2 *Lease
	if err := retryStoreErrors(t, func() (err error) { lease2, err = second.TryLock(ctx, "acct:1"); return err }); err != nil {
		t.Fatalf("after the promotion the second locker got %v; the promoted replica was expected to have lost the grant", err)
	}
	if lease1.Context().Err() != nil {
		t.Fatalf("the first holder already knew it lost its lock (%v): not a double grant", context.Cause(lease1.Context()))
	}
	t.Logf("double grant: first holder fence %d still valid, second holder fence %d", lease1.Fence(), lease2.Fence())
	if lease2.Fence() <= lease1.Fence() {
		t.Errorf("the second grant's fence %d is not above the first's %d", lease2.Fence(), lease1.Fence())
	}
	_ = lease2.Release(ctx)
	_ = lease1.Release(ctx)
}

// Issue 19 with Replicas: 1 on a real Cluster: a lock its master's replica cannot receive is
// refused; one it acknowledged survives the master's death: the other locker finds it held,
// never granted; the holder's renewals reach the promoted replica (the store reloads the slot
// map on connection errors) within a measured time; fences increase across the promotion; and a
// lock over keys on all three masters is all or nothing.
func TestClusterFailoverWithReplicaAckKeepsOneHolder(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a six-node Redis Cluster")
	}
	c := redistest.StartReplicatedCluster(t, 3)
	ctx := context.Background()
	i := c.MasterOf("lock:acct:1")
	first, second := clusterLocker(t, c, 1), clusterLocker(t, c, 1)

	c.Proxies[i].Stall(2 * time.Second)
	if _, err := first.Lock(ctx, "acct:1"); !errors.Is(err, redisstore.ErrNotReplicated) {
		t.Fatalf("Lock while the replica receives nothing: %v, want ErrNotReplicated", err)
	}
	var lease1 *Lease
	if err := retryStoreErrors(t, func() (err error) { lease1, err = first.Lock(ctx, "acct:1"); return err }); err != nil {
		t.Fatalf("Lock once the replica receives again: %v", err)
	}

	killed := time.Now()
	c.Masters[i].Stop() // SIGKILL
	promoted := c.WaitPromoted(i, 30*time.Second)
	t.Logf("replica promoted %v after the master was killed", promoted.Sub(killed))
	// The holder renews explicitly until a renewal reaches the promoted replica. It runs there
	// but cannot be acknowledged (the new master has no replica yet), so it does not extend
	// the lease: ErrNotReplicated is the answer that shows it arrived.
	if err := retryStoreErrors(t, func() error {
		if err := lease1.Refresh(ctx); !errors.Is(err, redisstore.ErrNotReplicated) {
			return err
		}
		return nil
	}); err != nil {
		t.Fatalf("the holder's renewal after the promotion: %v", err)
	}
	recovered := time.Since(promoted)
	// The dead master comes back, empty, and the cluster makes it the new master's replica.
	c.Masters[i].Restart()
	c.WaitHealthy(30 * time.Second)
	if err := retryStoreErrors(t, func() error { return lease1.Refresh(ctx) }); err != nil {
		t.Fatalf("renewal once the new master has a replica again: %v", err)
	}
	t.Logf("renewal reached the promoted replica %v after the promotion (cluster-node-timeout %v)", recovered, c.NodeTimeout)
	if recovered > 10*c.NodeTimeout {
		t.Errorf("renewals took %v after the promotion to reach the new master: the slot map was not reloaded", recovered)
	}
	if err := retryStoreErrors(t, func() error {
		lease2, err := second.TryLock(ctx, "acct:1")
		if err == nil {
			_ = lease2.Release(ctx)
			t.Fatalf("a second holder (fence %d) while the first (fence %d) holds the lock", lease2.Fence(), lease1.Fence())
		}
		return err
	}); !errors.Is(err, ErrBusy) {
		t.Fatalf("second TryLock after the promotion: %v, want busy", err)
	}
	if lease1.Context().Err() != nil {
		t.Fatalf("the first holder lost its lock in the failover: %v", context.Cause(lease1.Context()))
	}
	if err := retryStoreErrors(t, func() error { return lease1.Release(ctx) }); err != nil {
		t.Fatalf("release on the promoted replica: %v", err)
	}
	var lease2 *Lease
	if err := retryStoreErrors(t, func() (err error) { lease2, err = second.Lock(ctx, "acct:1"); return err }); err != nil {
		t.Fatalf("second Lock after the release: %v", err)
	}
	if lease2.Fence() <= lease1.Fence() {
		t.Errorf("fence %d after the promotion is not above %d before it", lease2.Fence(), lease1.Fence())
	}
	_ = lease2.Release(ctx)

	// All or nothing across masters: keys on the three masters.
	var keys []string
	seen := map[string]bool{}
	for n := 0; len(keys) < 3 && n < 1000; n++ {
		k := "multi:" + strconv.Itoa(n)
		if m := c.NodeOf("lock:" + k); !seen[m] {
			seen[m] = true
			keys = append(keys, k)
		}
	}
	all, err := first.LockAll(ctx, keys[0], keys[1])
	if err != nil {
		t.Fatalf("LockAll over two masters: %v", err)
	}
	if _, err := second.LockAll(ctx, keys[1], keys[2]); !errors.Is(err, ErrBusy) {
		t.Fatalf("LockAll with one key held: %v, want busy", err)
	}
	probe, err := second.TryLock(ctx, keys[2])
	if err != nil {
		t.Fatalf("the free key of a refused LockAll was left taken: %v", err)
	}
	_ = probe.Release(ctx)
	_ = all.Release(ctx)
}
