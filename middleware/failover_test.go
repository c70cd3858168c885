package middleware

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/conf"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/redisstore"
)

// failoverRig is a primary, a replica that replicates through a proxy (so the test can stall
// the replication link), and three Sentinels, all on loopback.
type failoverRig struct {
	nodes     [2]*redistest.Server // [0] the first primary, [1] its replica
	proxy     *redistest.Proxy     // between the replica and the first primary
	sentinels []*redistest.Server
}

const failoverMaster = "flightlock-test"

func startFailoverRig(t *testing.T) *failoverRig {
	t.Helper()
	r := &failoverRig{}
	r.nodes[0] = redistest.Start(t)
	r.proxy = redistest.StartProxy(t, r.nodes[0].Addr)
	r.nodes[1] = redistest.StartReplica(t, r.proxy.Addr)
	for range 3 {
		r.sentinels = append(r.sentinels, redistest.StartSentinel(t, failoverMaster, r.nodes[0].Addr, 500*time.Millisecond))
	}
	// Each Sentinel must know the replica and the two others before a failover can happen.
	for _, s := range r.sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr, DisableIdentity: true})
		waitFor(t, 20*time.Second, "sentinel "+s.Addr+" to see the replica and the other sentinels", func() bool {
			replicas, err1 := sc.Replicas(context.Background(), failoverMaster).Result()
			others, err2 := sc.Sentinels(context.Background(), failoverMaster).Result()
			return err1 == nil && err2 == nil && len(replicas) >= 1 && len(others) >= 2
		})
		_ = sc.Close()
	}
	return r
}

// conf is the Lock section that reaches the rig through its Sentinels, loaded from YAML as a
// service loads it.
func (r *failoverRig) conf(t *testing.T, replicas int) LockConf {
	t.Helper()
	var addrs []string
	for _, s := range r.sentinels {
		addrs = append(addrs, `"`+s.Addr+`"`)
	}
	yaml := fmt.Sprintf("Lock:\n  TTL: 30s\n  Redis:\n    Sentinel:\n      MasterName: %s\n      Addrs: [%s]\n"+
		"    Replicas: %d\n    ReplicaTimeout: 200ms\n", failoverMaster, strings.Join(addrs, ", "), replicas)
	var c struct{ Lock LockConf }
	if err := conf.LoadFromYamlBytes([]byte(yaml), &c); err != nil {
		t.Fatalf("load %q: %v", yaml, err)
	}
	return c.Lock.Normalized()
}

// locker is a Locker of its own (its own client, as another process would have) on the rig,
// built as New builds the Middleware's.
func (r *failoverRig) locker(t *testing.T, replicas int) *flightlock.Locker {
	t.Helper()
	c := r.conf(t, replicas)
	b, err := openSection(c.Sections()[0], c, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	l, err := baseOn(b, c)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// master is the address the Sentinels give for the primary now.
func (r *failoverRig) master(t *testing.T) string {
	t.Helper()
	sc := redis.NewSentinelClient(&redis.Options{Addr: r.sentinels[0].Addr, DisableIdentity: true})
	defer sc.Close()
	addr, err := sc.GetMasterAddrByName(context.Background(), failoverMaster).Result()
	if err != nil {
		t.Fatal(err)
	}
	return addr[0] + ":" + addr[1]
}

// failOver kills the primary with SIGKILL and waits until the Sentinels promote the other node.
// It returns the index of the new primary.
func (r *failoverRig) failOver(t *testing.T, primary int) int {
	t.Helper()
	r.nodes[primary].Stop() // SIGKILL: no shutdown, no last writes
	next := 1 - primary
	waitFor(t, 30*time.Second, "the Sentinels to promote "+r.nodes[next].Addr, func() bool {
		return r.master(t) == r.nodes[next].Addr
	})
	return next
}

// retryStoreErrors calls f until it returns nil or an error other than a store error (the
// clients reconnect to the new primary after a failover), for up to 15s.
func retryStoreErrors(t *testing.T, what string, f func() error) error {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := f()
		if err == nil || errors.Is(err, flightlock.ErrBusy) || errors.Is(err, lockstore.ErrNotHeld) || time.Now().After(deadline) {
			return err
		}
		t.Logf("%s: %v (retrying)", what, err)
		time.Sleep(100 * time.Millisecond)
	}
}

// Without replica acknowledgement, the hole every Redis lock has: a lock granted by a primary
// whose replica never received it is gone after the replica is promoted, and a second holder
// walks in while the first still holds its lease. This test asserts that the hole exists, so
// that the test with acknowledgement below can be trusted to see a second holder if there
// were one. Fences still increase across the failover (the fence clock runs on server time).
func TestFailoverWithoutReplicaAckGrantsASecondHolder(t *testing.T) {
	rig := startFailoverRig(t)
	first, second := rig.locker(t, 0), rig.locker(t, 0)
	ctx := context.Background()

	if n := rig.proxy.Stall(time.Minute); n == 0 {
		t.Fatal("no replication link through the proxy to stall")
	}
	lease1, err := first.Lock(ctx, "acct:1")
	if err != nil {
		t.Fatal(err)
	}
	rig.failOver(t, 0)

	var lease2 *flightlock.Lease
	err = retryStoreErrors(t, "second TryLock", func() (err error) {
		lease2, err = second.TryLock(ctx, "acct:1")
		return err
	})
	if err != nil {
		t.Fatalf("after the failover the second locker got %v; the replica was expected to have lost the first grant", err)
	}
	if lease1.Context().Err() != nil {
		t.Fatalf("the first holder already knew it lost its lock (%v): not a double grant", context.Cause(lease1.Context()))
	}
	t.Logf("double grant: first holder fence %d still valid, second holder fence %d", lease1.Fence(), lease2.Fence())
	if lease2.Fence() <= lease1.Fence() {
		t.Errorf("the second grant's fence %d is not above the first's %d: a fenced write could not refuse the stale holder",
			lease2.Fence(), lease1.Fence())
	}
	_ = lease2.Release(ctx)
	_ = lease1.Release(ctx)
}

// With Replicas: 1, a lock the replica did not acknowledge is not handed out (a store error,
// and nothing left in Redis), and a lock that was handed out survives each of three failovers:
// the other locker finds it held, never a second grant, and fences keep increasing.
func TestFailoverWithReplicaAckKeepsOneHolder(t *testing.T) {
	rig := startFailoverRig(t)
	first, second := rig.locker(t, 1), rig.locker(t, 1)
	ctx := context.Background()
	primary := 0

	// The replica gets nothing: the acquisition is refused and given up again.
	rig.proxy.Stall(time.Second)
	_, err := first.Lock(ctx, "acct:0")
	if !errors.Is(err, redisstore.ErrNotReplicated) {
		t.Fatalf("Lock while the replica receives nothing: %v, want ErrNotReplicated", err)
	}
	if !strings.Contains(err.Error(), "0 of 1") {
		t.Errorf("error %q does not say how many replicas acknowledged", err)
	}
	direct := redis.NewClient(rig.nodes[primary].Options())
	if n := direct.Exists(ctx, "lock:acct:0").Val(); n != 0 {
		t.Errorf("the unacknowledged lock was left in Redis")
	}
	_ = direct.Close()
	rig.nodes[1].WaitLinkUp(30 * time.Second) // a precondition: a loaded machine may take long to reconnect

	var last int64
	for round := range 3 {
		var lease1 *flightlock.Lease
		if err := retryStoreErrors(t, "first Lock", func() (err error) {
			lease1, err = first.Lock(ctx, "acct:1")
			return err
		}); err != nil {
			t.Fatalf("round %d: first Lock: %v", round, err)
		}
		if lease1.Fence() <= last {
			t.Errorf("round %d: fence %d is not above the last grant's %d", round, lease1.Fence(), last)
		}
		killed := primary
		primary = rig.failOver(t, primary)

		if err := retryStoreErrors(t, "second TryLock", func() error {
			lease2, err := second.TryLock(ctx, "acct:1")
			if err == nil {
				_ = lease2.Release(ctx)
				t.Fatalf("round %d: a second holder (fence %d) while the first (fence %d) holds the lock", round, lease2.Fence(), lease1.Fence())
			}
			return err
		}); !errors.Is(err, flightlock.ErrBusy) {
			t.Fatalf("round %d: second TryLock after the failover: %v, want busy", round, err)
		}
		if lease1.Context().Err() != nil {
			t.Fatalf("round %d: the first holder lost its lock in the failover: %v", round, context.Cause(lease1.Context()))
		}
		if err := retryStoreErrors(t, "release", func() error { return lease1.Release(ctx) }); err != nil {
			t.Fatalf("round %d: release on the new primary: %v", round, err)
		}

		// The killed node comes back empty, as a replica of the new primary.
		rig.nodes[killed].RestartAsReplicaOf(rig.nodes[primary].Addr)
		var lease2 *flightlock.Lease
		if err := retryStoreErrors(t, "second Lock", func() (err error) {
			lease2, err = second.Lock(ctx, "acct:1")
			return err
		}); err != nil {
			t.Fatalf("round %d: second Lock after the release: %v", round, err)
		}
		if lease2.Fence() <= lease1.Fence() {
			t.Errorf("round %d: fence %d after the failover is not above %d before it", round, lease2.Fence(), lease1.Fence())
		}
		last = lease2.Fence()
		if err := lease2.Release(ctx); err != nil {
			t.Fatalf("round %d: release: %v", round, err)
		}
	}
}

// A waiter queued on a key rides out a Sentinel failover: the store errors it meets while the
// primary is down and the replica is promoted are retried within its wait, and it gets the key
// once the holder, whose acknowledged lock the new primary has, releases it.
func TestWaiterRidesOutASentinelFailover(t *testing.T) {
	rig := startFailoverRig(t)
	holder := rig.locker(t, 1)
	// The waiter asks no acknowledgement: the promoted primary has no replica left to give one.
	waiter, err := rig.locker(t, 0).With(flightlock.WithWait(40 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lease, err := holder.Lock(ctx, "acct:w")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 40*time.Second)
		defer cancel()
		l, err := waiter.Lock(wctx, "acct:w")
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(300 * time.Millisecond) // the waiter saw the key held and waits
	rig.failOver(t, 0)
	select {
	case err := <-got:
		t.Fatalf("the waiter ended its wait during the failover: %v", err)
	default:
	}
	if err := retryStoreErrors(t, "the holder's release", func() error { return lease.Release(ctx) }); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("a waiter through a Sentinel failover: %v, want the lock", err)
	}
}
