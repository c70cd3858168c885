package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/etcdstore"
	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
)

// etcdLocker is a Locker of its own process (its own client and store) on the etcd of c, with
// the go-zero layer's key layout: Etcd.Key "flightlock/" + Prefix "lock:".
func etcdLocker(t *testing.T, c *etcdtest.Cluster, opts ...flightlock.Option) *flightlock.Locker {
	t.Helper()
	store, err := etcdstore.New(c.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() }) // before the client's close, registered first
	opts = append([]flightlock.Option{flightlock.WithPrefix("flightlock/lock:"), flightlock.WithTTL(5 * time.Second),
		flightlock.WithMetadata(func(context.Context) string { return "host=h1 pid=42" })}, opts...)
	l, err := flightlock.New(store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// ownerOf reads the owner token of a lock straight from etcd: the first field of its value.
func ownerOf(t *testing.T, ecli *clientv3.Client, key string) string {
	t.Helper()
	resp, err := ecli.Get(context.Background(), key)
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("read %s: %v (%d keys)", key, err, len(resp.Kvs))
	}
	owner, _, _ := strings.Cut(string(resp.Kvs[0].Value), " ")
	return owner
}

// TestLockJSON: an etcd lock marshals without the owner and redis_key fields; a Redis lock as
// before, with both.
func TestLockJSON(t *testing.T) {
	r, _ := json.Marshal(lockInfo{Key: "k", RedisKey: "lock:k", Owner: "o"})
	e, _ := json.Marshal(lockInfo{Key: "k", Store: storeEtcd, EtcdKey: "flightlock/lock:k", Fence: 1 << 20})
	if !strings.Contains(string(r), `"owner":"o"`) || !strings.Contains(string(r), `"redis_key":"lock:k"`) || strings.Contains(string(r), `"store"`) {
		t.Errorf("Redis lock: %s", r)
	}
	if strings.Contains(string(e), `"owner"`) || strings.Contains(string(e), `"redis_key"`) ||
		!strings.Contains(string(e), `"etcd_key":"flightlock/lock:k"`) || !strings.Contains(string(e), `"fence":1048576`) {
		t.Errorf("etcd lock: %s", e)
	}
}

// etcdLockerOn is a Locker of its own process on the client ecli, with etcdLocker's key
// layout.
func etcdLockerOn(t *testing.T, ecli *clientv3.Client) *flightlock.Locker {
	t.Helper()
	store, err := etcdstore.New(ecli)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	l, err := flightlock.New(store, flightlock.WithPrefix("flightlock/lock:"), flightlock.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// endLeaseOf revokes the lease that the lock key is on, through ecli: the end of a holder's
// lease (its process died, or was cut off for longer than the lease), which watch reports as
// an expiry.
func endLeaseOf(ctx context.Context, ecli *clientv3.Client, key string) error {
	resp, err := ecli.Get(ctx, key)
	if err != nil {
		return err
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].Lease == 0 {
		return fmt.Errorf("%s is not held on a lease", key)
	}
	_, err = ecli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	return err
}

// probeKey is the lock that untilWatching takes and releases; watchEvents leaves it out.
const probeKey = "order:probe"

// untilWatching takes and releases probeKey with l until the JSON watch writing to out reports
// it: a JSON watch prints nothing before its first event, and a lock taken before its first
// read would be in that read, not an event.
func untilWatching(t *testing.T, l *flightlock.Locker, out *syncBuffer) {
	t.Helper()
	waitFor(t, "the watch to start", func() bool {
		lease, err := l.Lock(context.Background(), probeKey)
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // for the event, before taking the probe again
		return strings.Contains(out.String(), probeKey)
	})
}

// watchEvents are the kinds and keys that a JSON watch printed but probeKey's ("resumed"
// has no key).
func watchEvents(t *testing.T, out string) []string {
	var got []string
	for _, ev := range events(t, out) {
		if !strings.HasSuffix(ev, " "+probeKey) {
			got = append(got, strings.TrimSpace(ev))
		}
	}
	return got
}

// TestEtcdWatchTellsExpiryFromRelease: a deletion by the holder and a forced unlock (the
// holder's lease lives on) print released; the end of the holder's lease prints expired.
func TestEtcdWatchTellsExpiryFromRelease(t *testing.T) {
	c := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	holder := etcdLocker(t, c)
	dying := etcdLockerOn(t, c.Client(t))
	ecli := c.Client(t)

	var out syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"-etcd", c.Endpoints()[0], "-o", "json", "watch", "order:*"}, strings.NewReader(""), &out, io.Discard)
	}()
	untilWatching(t, holder, &out)
	var want []string
	step := func(what string, do func() error, events ...string) {
		t.Helper()
		if err := do(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		want = append(want, events...)
		waitFor(t, what, func() bool { return len(watchEvents(t, out.String())) >= len(want) })
	}

	released, err := holder.Lock(ctx, "order:1")
	if err != nil {
		t.Fatal(err)
	}
	step("a release by its holder", func() error { return released.Release(ctx) }, "acquired order:1", "released order:1")
	if _, err := dying.Lock(ctx, "order:2"); err != nil {
		t.Fatal(err)
	}
	step("the end of the holder's lease", func() error { return endLeaseOf(ctx, ecli, "flightlock/lock:order:2") },
		"acquired order:2", "expired order:2")
	if _, err := holder.Lock(ctx, "order:3"); err != nil {
		t.Fatal(err)
	}
	step("a forced unlock", func() error {
		if code, _, errs := cli(t, nil, "-etcd", c.Endpoints()[0], "-yes", "unlock", "order:3"); code != exitOK {
			return fmt.Errorf("exit %d: %s", code, errs)
		}
		return nil
	}, "acquired order:3", "released order:3")

	endWatch(t, cancel, done, &out, want)
}

// TestEtcdWatchResumesAfterEtcdEndsIt: the member a watch reads from is killed; meanwhile, on
// the other two members, one lock is released, one holder's lease ends, a lock is taken, and
// the history is compacted past the watch's revision, so the restarted member ends the watch
// (compacted). The watch resumes: it says so and why, reports the three changes as released,
// expired and acquired, then hears the later release of the new lock.
func TestEtcdWatchResumesAfterEtcdEndsIt(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The watched member is a follower: the others keep their leader while it is down, so
	// the holders' calls meet no election.
	leader := c.Leader(10 * time.Second)
	watched := c.Followers(leader)[0]
	others := []*etcdtest.Member{leader, c.Followers(leader)[1]}
	// The holders' clients are on the other members, which stay up.
	ecli := etcdtest.NewClient(t, others[0].ClientURL, others[1].ClientURL)
	holder := etcdLockerOn(t, ecli)
	dying := etcdLockerOn(t, etcdtest.NewClient(t, others[0].ClientURL, others[1].ClientURL))
	before, err := holder.Lock(ctx, "order:0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dying.Lock(ctx, "order:2"); err != nil {
		t.Fatal(err)
	}

	var out, text syncBuffer
	done := make(chan int, 2)
	go func() {
		done <- run(ctx, []string{"-etcd", watched.ClientURL, "-o", "json", "watch", "order:*"}, strings.NewReader(""), &out, io.Discard)
	}()
	go func() {
		done <- run(ctx, []string{"-etcd", watched.ClientURL, "watch", "order:*"}, strings.NewReader(""), &text, io.Discard)
	}()
	waitFor(t, "the watch to start", func() bool { return strings.Contains(text.String(), "2 held") })
	untilWatching(t, holder, &out)

	watched.Kill()
	if err := before.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := endLeaseOf(ctx, ecli, "flightlock/lock:order:2"); err != nil {
		t.Fatal(err)
	}
	taken, err := holder.Lock(ctx, "order:1")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := ecli.Get(ctx, "flightlock/lock:order:1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ecli.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	watched.Restart()

	want := []string{"resumed", "released order:0", "expired order:2", "acquired order:1"}
	waitFor(t, "the resumed watch", func() bool { return len(watchEvents(t, out.String())) >= len(want) })
	// The text watch resumes on its own schedule: a release before it has seen the lock taken
	// would fall between its listings, and it would rightly report nothing.
	waitForText(t, "the resumed text watch to see order:1 taken", &text, "acquired  order:1")
	if err := taken.Release(ctx); err != nil {
		t.Fatal(err)
	}
	want = append(want, "released order:1")
	waitFor(t, "the release after the resume", func() bool { return len(watchEvents(t, out.String())) >= len(want) })
	waitForText(t, "the text watch to report the release", &text, "released  order:1")

	cancel()
	for range 2 {
		if code := <-done; code != exitOK {
			t.Fatalf("watch: exit %d", code)
		}
	}
	if got := watchEvents(t, out.String()); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	lines := text.String()
	if !regexp.MustCompile(`resumed +at revision \d+ \(the watch ended: .*compacted\); 1 held`).MatchString(lines) ||
		!strings.Contains(lines, "expired   order:2") || !strings.Contains(lines, "acquired  order:1") {
		t.Errorf("watch lines:\n%s", lines)
	}
}

// TestEtcdWatchReportsAContentionOnce: a waiter puts the key's waiter mark again at each retry;
// watch reports the first put of a grant's mark as contended, as on the other stores, not a
// line per retry.
func TestEtcdWatchReportsAContentionOnce(t *testing.T) {
	c := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	holder := etcdLocker(t, c)
	waiter := etcdLocker(t, c, flightlock.WithWait(30*time.Second))

	var out syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"-etcd", c.Endpoints()[0], "-o", "json", "watch", "order:*"}, strings.NewReader(""), &out, io.Discard)
	}()
	untilWatching(t, holder, &out)
	lease, err := holder.Lock(ctx, "order:1")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *flightlock.Lease, 1)
	go func() {
		l, err := waiter.Lock(ctx, "order:1")
		if err != nil {
			t.Errorf("the waiter: %v", err)
		}
		got <- l
	}()
	waitFor(t, "the waiter's contention", func() bool {
		return slices.Contains(watchEvents(t, out.String()), "contended order:1")
	})
	time.Sleep(time.Second) // the waiter retries meanwhile, putting its mark again
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if l := <-got; l != nil {
		_ = l.Release(ctx)
	}
	want := []string{"acquired order:1", "contended order:1", "released order:1", "acquired order:1", "released order:1"}
	waitFor(t, "the events", func() bool { return len(watchEvents(t, out.String())) >= len(want) })
	endWatch(t, cancel, done, &out, want)
}

// TestEtcdFlagOverAFileWithoutAnEtcdSection: -etcd over a service's file whose Lock section
// names Redis only reads the locks in that etcd with the section's Prefix and EtcdConf's
// defaults (Key, the lease margin), as -etcd without a file does, and says the hosts came
// from the flag.
func TestEtcdFlagOverAFileWithoutAnEtcdSection(t *testing.T) {
	c := etcdtest.Start(t)
	ctx := context.Background()
	lease, err := etcdLocker(t, c).Lock(ctx, "order:1")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	file := writeFile(t, "order.yaml", "Name: order-api\nLock:\n  Redis:\n    Host: 127.0.0.1:1\n  Prefix: \"lock:\"\n")
	code, out, errs := cli(t, nil, "-f", file, "-etcd", c.Endpoints()[0], "ls")
	if code != exitOK || !strings.Contains(out, "order:1 ") {
		t.Errorf("-etcd over a Redis-only file: exit %d:\n%s%s", code, out, errs)
	}
	code, _, errs = cli(t, nil, "-f", file, "-etcd", closedAddr(t), "-timeout", "1s", "ls")
	if code != exitError || !strings.Contains(errs, "(from -etcd, with "+file+" (Lock))") {
		t.Errorf("-etcd over a file, unreachable: exit %d: %s; want the hosts named as the flag's", code, errs)
	}
}

// TestEtcdAccountErrorsSayWhatToGive: an etcd with auth enabled, asked without an account,
// with a wrong password, or with an account whose roles do not cover the locks, fails every
// command with a message that names -user, -pass and the file's Etcd.User and Pass (or the
// role to grant), exit 1; the right account reads the locks. (Half an account, -user
// without -pass, is refused before any call: TestEtcdAccountFlagsComeInPairs.)
func TestEtcdAccountErrorsSayWhatToGive(t *testing.T) {
	t.Setenv("FLIGHTLOCK_REDIS_PASS", "")
	c := etcdtest.Start(t)
	ecli := c.Client(t)
	ctx := context.Background()
	for _, step := range []func() error{
		func() error { _, err := ecli.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := ecli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := ecli.UserAdd(ctx, "nobody", "nobodypw"); return err },
		func() error { _, err := ecli.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	ep := c.Endpoints()[0]
	account := "etcd refused the account: give its user and password with -user and -pass, or set Lock.Etcd.User and Pass in the -f file"
	for _, args := range [][]string{
		{"-etcd", ep, "ls"},
		{"-etcd", ep, "show", "order:1"},
		{"-etcd", ep, "-user", "root", "-pass", "wrong", "ls"},
		{"-f", writeFile(t, "svc.yaml", fmt.Sprintf("Lock:\n  Etcd: {Hosts: [%q], User: root, Pass: wrong}\n", ep)), "ls"},
	} {
		code, out, errs := cli(t, nil, append(args, "-timeout", "5s")...)
		if code != exitError || !strings.Contains(errs, account) {
			t.Errorf("flightlock %q: exit %d\n%s%s\nwant exit 1 and %q", args, code, out, errs, account)
		}
	}
	code, out, errs := cli(t, nil, "-etcd", ep, "-user", "nobody", "-pass", "nobodypw", "-timeout", "5s", "ls")
	if want := "the etcd account nobody may not read flightlock/lock:: grant it a role that reads that prefix"; code != exitError || !strings.Contains(errs, want) {
		t.Errorf("an account without a role: exit %d\n%s%s\nwant exit 1 and %q", code, out, errs, want)
	}
	if code, out, errs := cli(t, nil, "-etcd", ep, "-user", "root", "-pass", "rootpw", "-timeout", "5s", "ls"); code != exitOK {
		t.Errorf("with the account: exit %d\n%s%s", code, out, errs)
	}
}

// endWatch ends a watch run by cancelling its context and checks that it exited 0 having
// printed exactly the events want, in order.
func endWatch(t *testing.T, cancel context.CancelFunc, done <-chan int, out *syncBuffer, want []string) {
	t.Helper()
	cancel()
	if code := <-done; code != exitOK {
		t.Fatalf("watch: exit %d", code)
	}
	if got := watchEvents(t, out.String()); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
