package share

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/etcdstore"
	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	"github.com/flightlock/flightlock/middleware/internal/sharehook"
)

// An etcd save never overwrites what is not a stored response (a lock whose key renders as the
// replay key keeps its value, revision and lease), replaces a stored response, and puts it on
// a lease; a load of a missing key finds nothing.
func TestEtcdReplaySaveNeverOverwritesALock(t *testing.T) {
	ec := etcdtest.Start(t)
	cli := ec.Client(t)
	ctx := context.Background()
	store, err := etcdstore.New(cli)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	locker, err := flightlock.New(store, flightlock.WithPrefix("flightlock/lock:"), flightlock.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	lock, err := locker.TryLock(ctx, "replay:a:u1")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Release(ctx) }()
	const k = "flightlock/lock:replay:a:u1"
	before := etcdGet(t, cli, k)
	if len(before.Kvs) != 1 || strings.HasPrefix(string(before.Kvs[0].Value), "{") {
		t.Fatalf("the lock at %s: %v, want a lock value", k, before.Kvs)
	}
	replays := &rule{locks: sharehook.Locks{Responses: store.Describe("flightlock/").Responses}}
	rec := &record{Status: http.StatusOK, Body: []byte("new"), Print: "p"}
	if err := replays.save(ctx, "lock:replay:a:u1", rec, time.Second); err == nil {
		t.Error("save over a lock succeeded")
	}
	after := etcdGet(t, cli, k)
	if len(after.Kvs) != 1 || string(after.Kvs[0].Value) != string(before.Kvs[0].Value) ||
		after.Kvs[0].ModRevision != before.Kvs[0].ModRevision || after.Kvs[0].Lease != before.Kvs[0].Lease {
		t.Fatalf("the lock changed: %v -> %v", before.Kvs, after.Kvs)
	}
	const stale = "flightlock/lock:replay:stale"
	if _, err := cli.Put(ctx, stale, `{"s":200,"b":"b2xk","f":1,"p":"old"}`); err != nil {
		t.Fatal(err)
	}
	if err := replays.save(ctx, "lock:replay:stale", rec, time.Second); err != nil {
		t.Fatalf("save over a stored response: %v", err)
	}
	got, err := replays.load(ctx, "lock:replay:stale")
	if err != nil || got == nil || string(got.Body) != "new" || !got.replayed {
		t.Fatalf("load after replacing a stored response: %+v, %v; want the new record", got, err)
	}
	if kv := etcdGet(t, cli, stale).Kvs; len(kv) != 1 || kv[0].Lease == 0 {
		t.Fatalf("the replaced response %v: want it on a lease", kv)
	}
	if got, err := replays.load(ctx, "lock:replay:none"); got != nil || err != nil {
		t.Fatalf("load of a missing key: %v, %v; want nothing", got, err)
	}
}

// The etcd save compares the grants that produced the records, as the Redis save compares
// fences: a holder A that lost its lock and saves late, after its successor B was granted,
// neither beats B's record nor keeps B from replacing A's. Both orders of the two saves end
// with B's record; a save without a fence (a degraded run) replaces any record, and a record
// that does not carry its grant (an older encoding) is replaced by any save.
func TestEtcdReplaySaveKeepsTheLaterGrantsRecord(t *testing.T) {
	ec := etcdtest.Start(t)
	cli := ec.Client(t)
	ctx := context.Background()
	store, err := etcdstore.New(cli)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	rp := &rule{locks: sharehook.Locks{Responses: store.Describe("flk/").Responses}}
	save := func(key string, fence int64, body string) {
		t.Helper()
		if err := rp.save(ctx, key, &record{Status: 200, Body: []byte(body), Fence: fence, Print: "abc"}, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	stored := func(key string) string {
		t.Helper()
		rec, err := rp.load(ctx, key)
		if err != nil || rec == nil {
			t.Fatalf("load %s: %v, %v", key, rec, err)
		}
		return string(rec.Body)
	}
	now, err := cli.Get(ctx, "flk/none")
	if err != nil {
		t.Fatal(err)
	}
	// A granted at one revision, B at the next (the key was deleted between them in a real run;
	// the fences are what the etcd store mints: the grant's revision << 20). Every save below is
	// written after both grants.
	rev := now.Header.Revision
	fenceA, fenceB := rev<<20, (rev+1)<<20

	// A saves first, late (its lock was lost after its ErrLost check), then B: B's record wins.
	save("lock:replay:ab", fenceA, "A")
	save("lock:replay:ab", fenceB, "B")
	if got := stored("lock:replay:ab"); got != "B" {
		t.Errorf("A's late save, then B's: stored %q, want B's record", got)
	}
	// B saves first, then A's late save: refused, B's record stays.
	save("lock:replay:ba", fenceB, "B")
	save("lock:replay:ba", fenceA, "A")
	if got := stored("lock:replay:ba"); got != "B" {
		t.Errorf("B's save, then A's late save: stored %q, want B's record", got)
	}
	// A handoff under B's grant (a larger fence of the same grant) replaces B's record.
	save("lock:replay:ba", fenceB+1, "B+1")
	if got := stored("lock:replay:ba"); got != "B+1" {
		t.Errorf("a handoff's save after its grant's: stored %q, want the handoff's record", got)
	}
	// A save without a fence compares nothing.
	save("lock:replay:ba", 0, "unfenced")
	if got := stored("lock:replay:ba"); got != "unfenced" {
		t.Errorf("a save without a fence: stored %q, want it stored", got)
	}
	// Records without their grant in front, whatever their first field: replaced.
	for i, old := range []string{`{"s":200,"b":"b2xk","f":99999999999,"p":"old"}`, `{"b":"b2xk","f":99999999999,"p":"old"}`} {
		k := fmt.Sprintf("lock:replay:old%d", i)
		if _, err := cli.Put(ctx, "flk/"+k, old); err != nil {
			t.Fatal(err)
		}
		save(k, fenceA, "new")
		if got := stored(k); got != "new" {
			t.Errorf("a save over the record %s: stored %q, want the new record", old, got)
		}
	}
}

// etcdGet returns the etcd key k (nil when there is none).
func etcdGet(t *testing.T, cli *clientv3.Client, k string) *clientv3.GetResponse {
	t.Helper()
	resp, err := cli.Get(context.Background(), k)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}
