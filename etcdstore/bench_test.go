package etcdstore

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	"github.com/flightlock/flightlock/lockstore"
)

// BenchmarkUncontended compares one uncontended Acquire + Release of the store with the raw
// floor (a transaction that puts the key with a lease, then a delete) on the same
// member (fsync on) and client. The two alternate within each iteration, so that both see the
// same machine (benchmarks elsewhere share it), and the ratio is reported: store/floor.
//
//	go test -run '^$' -bench Uncontended -benchtime 5s -count 3 ./etcdstore/
func BenchmarkUncontended(b *testing.B) {
	c := etcdtest.Start(b)
	cli := c.Client(b)
	ctx := context.Background()
	s := newStore(b, cli)
	// The floor's lease is the store's own (kept alive by it): the same lease, the same key size.
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "bench:warm", Owner: ownerA, TTL: 10 * time.Second}); err != nil {
		b.Fatal(err)
	}
	kv, err := cli.Get(ctx, "bench:warm")
	if err != nil {
		b.Fatal(err)
	}
	lease := clientv3.LeaseID(kv.Kvs[0].Lease)
	floorValue := newValue(ownerA, 11, "")
	var floor, store time.Duration
	for b.Loop() {
		t0 := time.Now()
		_, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision("bench:floor"), "=", 0)).
			Then(clientv3.OpPut("bench:floor", floorValue, clientv3.WithLease(lease))).Commit()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := cli.Delete(ctx, "bench:floor"); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		got, err := s.Acquire(ctx, lockstore.Request{Key: "bench:store", Owner: ownerA, TTL: 10 * time.Second})
		if err != nil || !got.Acquired {
			b.Fatal(got, err)
		}
		if _, err := s.Release(ctx, "bench:store", ownerA, "", 0); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		floor += t1.Sub(t0)
		store += t2.Sub(t1)
	}
	n := float64(b.N)
	b.ReportMetric(float64(floor.Nanoseconds())/n, "floor-ns/op")
	b.ReportMetric(float64(store.Nanoseconds())/n, "store-ns/op")
	b.ReportMetric(float64(store)/float64(floor), "store/floor")
}
