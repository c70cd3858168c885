package zkstore

import (
	"context"
	"errors"
	"testing"

	"github.com/go-zookeeper/zk"

	"github.com/flightlock/flightlock/internal/testenv/zktest"
	"github.com/flightlock/flightlock/lockstore"
)

// TestInspectorMarksANodeWithoutAHoldNotALock: a key node someone else made under the root
// (zkCli), with children none of which is a hold, is listed and looked up as not a lock
// (Unrecognized: its data, or EmptyValue), and ForceUnlock leaves it alone.
func TestInspectorMarksANodeWithoutAHoldNotALock(t *testing.T) {
	srv := zktest.Start(t)
	s := dial(t, srv.Addr)
	ctx := context.Background()
	if err := s.ensurePath(ctx, s.root); err != nil {
		t.Fatal(err)
	}
	for key, data := range map[string]string{"junk": "hello", "empty": ""} {
		p := s.keyPath("lock:" + key)
		if _, err := s.conn.Create(p, []byte(data), 0, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.conn.Create(p+"/child", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
	}
	in := NewInspector(s, "lock:")
	locks, _, err := in.List(ctx, "*", lockstore.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(locks) != 2 || locks[0].Key != "empty" || locks[0].Unrecognized != lockstore.EmptyValue || locks[0].Fence != 0 ||
		locks[1].Key != "junk" || locks[1].Unrecognized != "hello" || locks[1].Fence != 0 {
		t.Fatalf("listed %+v; want both marked not a lock", locks)
	}
	l, err := in.Lookup(ctx, "junk")
	if err != nil || l.Unrecognized != "hello" {
		t.Fatalf("Lookup: %+v, %v", l, err)
	}
	l.Unrecognized = "" // a caller that would remove it anyway
	if _, err := in.ForceUnlock(ctx, l); err == nil {
		t.Fatal("ForceUnlock removed a node that is not a lock")
	}
	if ok, _, err := s.conn.Exists(s.keyPath("lock:junk") + "/child"); err != nil || !ok {
		t.Fatalf("the node's child after ForceUnlock: exists %v, %v", ok, err)
	}
}

// TestInspectorListsPastANodeItCannotRead: a key node whose ACL refuses the inspector's
// session (a Store makes every node readable by all) is listed as unreadable, not a lock, and
// does not hide the locks beside it; Lookup of it fails with zk.ErrNoAuth.
func TestInspectorListsPastANodeItCannotRead(t *testing.T) {
	srv := zktest.Start(t)
	s := dial(t, srv.Addr)
	ctx := context.Background()
	x, err := mustLocker(t, s).Lock(ctx, "order:1")
	if err != nil {
		t.Fatal(err)
	}
	defer x.Release(ctx)
	admin, _ := zktest.Connect(t, testSession, srv.Addr)
	if err := admin.AddAuth("digest", []byte("admin:pw")); err != nil {
		t.Fatal(err)
	}
	p := s.keyPath("lock:secret")
	for _, n := range []string{p, p + "/child"} {
		if _, err := admin.Create(n, nil, 0, zk.DigestACL(zk.PermAll, "admin", "pw")); err != nil {
			t.Fatal(err)
		}
	}
	in := NewInspector(s, "lock:")
	locks, _, err := in.List(ctx, "*", lockstore.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(locks) != 2 || locks[0].Key != "order:1" || locks[0].Unrecognized != "" ||
		locks[1].Key != "secret" || locks[1].Unrecognized != "(unreadable: "+zk.ErrNoAuth.Error()+")" {
		t.Fatalf("listed %+v; want order:1, and secret unreadable", locks)
	}
	if _, err := in.Lookup(ctx, "secret"); !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("Lookup of the node: %v, want zk.ErrNoAuth", err)
	}
}
