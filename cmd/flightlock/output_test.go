package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/redisstore"
)

// ls and show tell a key held for reading, with how many read it and no owner, and a fair
// lock's line, with how many wait in it, in the table, the detail and the JSON.
func TestListAndShowReadersAndTheFairLine(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	store := redisstore.New(redis.NewClient(srv.Options()))
	defer store.Close()
	newLocker := func(opts ...flightlock.Option) *flightlock.Locker {
		l, err := flightlock.New(store, append([]flightlock.Option{flightlock.WithPrefix("lock:")}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	for range 2 { // two processes' readers (one process's would share one hold)
		lease, err := newLocker(flightlock.WithRead()).Lock(ctx, "order:1")
		if err != nil {
			t.Fatal(err)
		}
		defer lease.Release(ctx)
	}
	fair := newLocker(flightlock.WithFair(), flightlock.WithWait(30*time.Second))
	held, err := fair.Lock(ctx, "acct:1")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	wctx, stop := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() {
		_, err := newLocker(flightlock.WithFair(), flightlock.WithWait(30*time.Second)).Lock(wctx, "acct:1")
		waited <- err
	}()
	defer func() {
		stop()
		if err := <-waited; !errors.Is(err, context.Canceled) {
			t.Errorf("the fair waiter: %v, want it cancelled while it waited", err)
		}
	}()
	list := func() []lockInfo {
		code, out, errOut := cli(t, nil, "-addr", srv.Addr, "-o", "json", "ls")
		if code != exitOK {
			t.Fatalf("ls: exit %d: %s", code, errOut)
		}
		var locks []lockInfo
		if err := json.Unmarshal([]byte(out), &locks); err != nil {
			t.Fatalf("ls JSON %q: %v", out, err)
		}
		return locks
	}
	waitFor(t, "the fair waiter to take its place in line", func() bool {
		for _, l := range list() {
			if l.Key == "acct:1" && l.Queued == 1 {
				return true
			}
		}
		return false
	})

	for _, l := range list() {
		switch l.Key {
		case "order:1":
			if l.Readers != 2 || l.Owner != "" {
				t.Errorf("order:1 lists %d readers and owner %q, want 2 and none", l.Readers, l.Owner)
			}
		case "acct:1":
			if l.Readers != 0 || l.Owner == "" {
				t.Errorf("acct:1 lists %d readers and owner %q, want its writer's owner", l.Readers, l.Owner)
			}
		}
	}
	code, out, _ := cli(t, nil, "-addr", srv.Addr, "ls")
	if code != exitOK {
		t.Fatalf("ls: exit %d", code)
	}
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, "order:1 ") && !strings.HasPrefix(strings.Join(strings.Fields(line), " "), "order:1 2 readers - "):
			t.Errorf("ls row of a key two read: %q, want 2 readers as its owner and no fence", line)
		case strings.HasPrefix(line, "acct:1 ") && !strings.Contains(line, "1 in line"):
			t.Errorf("ls row of a fair key with a waiter: %q, want 1 in line", line)
		}
	}
	if _, out, _ := cli(t, nil, "-addr", srv.Addr, "show", "order:1"); !strings.Contains(out, "readers") ||
		!strings.Contains(out, "2 (held for reading") || !strings.Contains(out, "none (each reader has its own)") ||
		strings.Contains(out, "holds ") {
		t.Errorf("show of a key two read:\n%s\nwant its 2 readers, and no owner or holds", out)
	}
	if _, out, _ := cli(t, nil, "-addr", srv.Addr, "show", "acct:1"); !strings.Contains(out, "fair line") ||
		!strings.Contains(out, "1 request(s) wait") {
		t.Errorf("show of a fair key with a waiter:\n%s\nwant its line of 1", out)
	}
}

// watch's line for a key held for reading names its readers, not an owner, and a fair key's
// line says how many wait in it.
func TestWatchLineNamesReadersAndTheFairLine(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	read := eventLine(event{Time: at, Kind: "acquired", Lock: lockInfo{Key: "order:1", Readers: 3, TTLMillis: 900}})
	if want := "03:04:05.000 acquired  order:1 readers=3 ttl=900ms waiting=-"; read != want {
		t.Errorf("read-held line:\n%s\nwant\n%s", read, want)
	}
	fair := eventLine(event{Time: at, Kind: "contended", Lock: lockInfo{Key: "acct:1", Owner: "0123456789abcdef", Fence: 7,
		TTLMillis: 900, Waiters: 1, Queued: 2}})
	if !strings.Contains(fair, " owner=01234567… fence=7 ") || !strings.Contains(fair, "waiting=1 proc, 2 in line") {
		t.Errorf("fair key's line %q, want its owner and 2 in line", fair)
	}
}

// show writes "-" for a holder field the lock does not carry (a core Locker stores no trace;
// an etcd or ZooKeeper read key no holder at all), not an empty pair of quotes.
func TestShowDashesTheHolderFieldsALockLacks(t *testing.T) {
	var b strings.Builder
	if err := lockDetail(&b, lockInfo{Key: "order:1", RedisKey: "lock:order:1", Owner: "o", Fence: 7, TTLMillis: 900,
		Own: true, Host: "pod-7"}); err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		k, v, _ := strings.Cut(line, "  ")
		rows[k] = strings.TrimSpace(v)
	}
	if rows["host"] != "pod-7" || rows["pid"] != "-" || rows["trace"] != "-" {
		t.Errorf("show of a lock with a host only:\n%s\nwant host pod-7, pid -, trace -", b.String())
	}
}

// ls, show and their JSON name a lock's kind as its holder stored it (kind=permits:3 for a
// permit of a semaphore of 3), which the drift alert tells operators to read back; a plain
// lock, the common case, adds nothing to the table's HOLDER.
func TestListAndShowNameTheKindOfALock(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	sem := processLocker(t, srv, flightlock.WithPermits(3))
	permit, err := sem.Lock(ctx, "export:acme")
	if err != nil {
		t.Fatal(err)
	}
	defer permit.Release(ctx)
	plain, err := processLocker(t, srv).Lock(ctx, "order:1")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Release(ctx)

	code, out, errs := cli(t, nil, "-addr", srv.Addr, "-o", "json", "ls")
	if code != exitOK {
		t.Fatalf("ls: exit %d: %s", code, errs)
	}
	var locks []lockInfo
	if err := json.Unmarshal([]byte(out), &locks); err != nil {
		t.Fatalf("ls JSON %q: %v", out, err)
	}
	var permitKey string
	for _, l := range locks {
		want := "lock"
		if strings.HasPrefix(l.Key, "export:acme") {
			want, permitKey = "permits:3", l.Key
		}
		if l.Kind != want {
			t.Errorf("%s: kind %q, want %q", l.Key, l.Kind, want)
		}
	}
	_, table, _ := cli(t, nil, "-addr", srv.Addr, "ls")
	for _, line := range strings.Split(table, "\n") {
		switch {
		case strings.HasPrefix(line, "export:acme") && !strings.Contains(line, "kind=permits:3"):
			t.Errorf("ls row of a permit: %q, want kind=permits:3", line)
		case strings.HasPrefix(line, "order:1 ") && strings.Contains(line, "kind="):
			t.Errorf("ls row of a plain lock: %q, want no kind", line)
		}
	}
	if _, shown, _ := cli(t, nil, "-addr", srv.Addr, "show", permitKey); !strings.Contains(shown, "kind ") ||
		!strings.Contains(shown, "permits:3") {
		t.Errorf("show of a permit:\n%s\nwant its kind, permits:3", shown)
	}
}

// show of a key held for reading says whose host and pid it prints (the reader that came
// last: the key carries no one's else), and no TTL per reader on ZooKeeper, which has none;
// unlock's line counts the readers it removed instead of the holds of an owner it has not.
func TestShowAndUnlockOfAKeyHeldForReading(t *testing.T) {
	var b strings.Builder
	if err := lockDetail(&b, lockInfo{Key: "acct:7", RedisKey: "lock:acct:7", Readers: 2, TTLMillis: 900, Own: true,
		Host: "pod-7", Pid: "311"}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "pod-7 (of the reader that came last)") {
		t.Errorf("show of a key two read, on Redis:\n%s\nwant its host named as the last reader's", b.String())
	}
	b.Reset()
	zk := lockInfo{Key: "acct:7", ZNode: "/flightlock/lock:acct:7", Store: storeZookeeper, Readers: 2, TTLMillis: -1, Fence: 9}
	if err := lockDetail(&b, zk); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "TTL") {
		t.Errorf("show of a key two read, on ZooKeeper:\n%s\nwant no TTL per reader", b.String())
	}
	line := removedLine(zk, "no waiter mark")
	if want := "removed /flightlock/lock:acct:7: 2 readers ttl session; no waiter mark\n"; line != want {
		t.Errorf("unlock of a key two read:\n%q\nwant\n%q", line, want)
	}
}

// On ZooKeeper, where a lock lives as long as its holder's session, every line says so: a
// key held for reading too, not "ttl=none"; and the JSON lists no re-entries as [], as on the
// other stores, not null.
func TestZookeeperReadersLineAndEmptyReentries(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	line := eventLine(event{Time: at, Kind: "gone", Lock: lockInfo{Key: "acct:7", Store: storeZookeeper, Readers: 2, TTLMillis: -1}})
	if want := "03:04:05.000 gone      acct:7 readers=2 ttl=session waiting=-"; line != want {
		t.Errorf("ZooKeeper read-held line:\n%s\nwant\n%s", line, want)
	}
	b, err := json.Marshal(view(lockstore.LockInfo{Key: "order:1", StoreKey: "/flightlock/lock:order:1", Own: true, TTL: lockstore.NoTTL}, storeZookeeper))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"reentries":[]`) {
		t.Errorf("ZooKeeper lock JSON %s, want reentries []", b)
	}
}
