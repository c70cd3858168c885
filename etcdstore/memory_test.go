package etcdstore

import (
	"runtime"
	"strconv"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// liveHeap returns the bytes of live heap objects after a full collection.
func liveHeap() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// The store's table of held locks gives its memory back once they are released: releasing
// everything returns to the baseline, as it does for the Locker. Go maps never shrink, and a
// map that keeps its peak leaves 78 B per released lock live after 10,000 are held (etcdbench's
// scenario 6). The table is driven directly here (no etcd needed: the client is never dialled).
func TestReleasedEntriesReturnTheirMemory(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	s := quiet(newStore(t, cli))
	const n = 20000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "lock:mem:" + strconv.Itoa(i)
	}
	base := liveHeap()
	for _, k := range keys {
		s.update(k, ownerA, func(e *heldKey) { e.own, e.simple = true, true })
	}
	held := liveHeap()
	for i, k := range keys {
		if i%2 == 0 {
			s.released(k, ownerA, "")
		} else {
			s.forget(k, ownerA)
		}
	}
	after := liveHeap()
	runtime.KeepAlive(keys)
	perHeld := float64(int64(held)-int64(base)) / n
	perLeft := float64(int64(after)-int64(base)) / n
	t.Logf("%d entries: %.0f B per held lock, %.1f B per lock after release", n, perHeld, perLeft)
	if perLeft > 16 {
		t.Errorf("after releasing %d locks, %.1f B per lock stays live in the store (bound 16)", n, perLeft)
	}
	s.mu.Lock()
	left := len(s.held)
	s.mu.Unlock()
	if left != 0 {
		t.Errorf("%d entries left", left)
	}
}
