package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/etcdstore"
	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/internal/testenv/zktest"
	"github.com/flightlock/flightlock/zkstore"
)

// storeServer is a store the CLI is run against: started for one test, with a Locker of its
// own process in the service's key layout, and the flags that name it without a file.
type storeServer struct {
	locker func(opts ...flightlock.Option) *flightlock.Locker
	flags  []string
	// changed is how unlock says the lock it read is now another grant's: Redis names the
	// new owner, etcd and ZooKeeper have none to name.
	changed string
}

// cliStores are the stores the CLI reads, each started on a loopback port of its own.
var cliStores = []struct {
	name  string
	start func(t *testing.T) storeServer
}{
	{"redis", func(t *testing.T) storeServer {
		srv := redistest.Start(t)
		return storeServer{
			locker:  func(opts ...flightlock.Option) *flightlock.Locker { return processLocker(t, srv, opts...) },
			flags:   []string{"-addr", srv.Addr},
			changed: "changed after it was read (now held by ",
		}
	}},
	{"etcd", func(t *testing.T) storeServer {
		c := etcdtest.Start(t)
		return storeServer{
			locker:  func(opts ...flightlock.Option) *flightlock.Locker { return etcdLocker(t, c, opts...) },
			flags:   []string{"-etcd", c.Endpoints()[0]},
			changed: "changed after it was read (now held by a new grant",
		}
	}},
	{"zookeeper", func(t *testing.T) storeServer {
		srv := zktest.Start(t)
		return storeServer{
			locker: func(opts ...flightlock.Option) *flightlock.Locker {
				l, _ := zkLocker(t, srv.Addr, opts...)
				return l
			},
			flags:   []string{"-zookeeper", srv.Addr},
			changed: "changed after it was read (now held by a new grant",
		}
	}},
}

// TestUnlockRemovesOnlyTheGrantItShowedOnEveryStore: when the lock changes hands between the
// read and the confirmation, unlock removes nothing (the operator agreed to remove one holder,
// not the next): on Redis, on etcd (the revision compare) and on ZooKeeper (another node,
// another fence), each named by its flag and no file.
func TestUnlockRemovesOnlyTheGrantItShowedOnEveryStore(t *testing.T) {
	for _, store := range cliStores {
		t.Run(store.name, func(t *testing.T) {
			s := store.start(t)
			ctx := context.Background()
			l := s.locker()
			first, err := l.Lock(ctx, "stock:7")
			if err != nil {
				t.Fatal(err)
			}
			var second *flightlock.Lease
			// The operator reads, then (while the prompt waits) the first holder releases and
			// a second one takes the key; then the operator says yes.
			stdin := regrabOnPrompt(t, l, first, "stock:7", &second)
			code, _, errs := cli(t, stdin, append(s.flags, "unlock", "stock:7")...)
			if code != exitError || !strings.Contains(errs, s.changed) || !strings.Contains(errs, "nothing removed") {
				t.Fatalf("unlock of a lock that changed hands: exit %d: %s", code, errs)
			}
			if err := second.Release(ctx); err != nil {
				t.Errorf("the second holder's lock was touched: %v", err)
			}
		})
	}
}

// resolveCase is a Lock section and flags, and the target resolveTarget makes of them: the
// store, the key prefix, and the settings of the store chosen; or an error.
type resolveCase struct {
	name, content string
	file          string // the file's name; x.yaml if empty
	o             options
	store, hosts  string // want
	prefix        string // the whole key prefix: Etcd.Key + Prefix on etcd
	user, pass    string // etcd's
	root          string // ZooKeeper's
	session       time.Duration
	host, typ     string // Redis's
	err           string
}

// TestResolveTargetReadsEachStoresSection: which store a Lock section (found in a YAML or
// JSON file, with its keys in any case and the environment expanded) and the flags choose,
// and, for Redis, etcd and ZooKeeper, the settings of that store they give (host, prefix and
// type on Redis; hosts and account on etcd; hosts, root and session timeout on ZooKeeper),
// checked when that store is the one chosen; or the error, naming what is wrong.
func TestResolveTargetReadsEachStoresSection(t *testing.T) {
	t.Setenv("FLIGHTLOCK_TEST_HOST", "10.0.0.9:6379")
	stores := []struct {
		name     string
		cases    []resolveCase
		settings func(t *testing.T, got target, c resolveCase) // of the target on this store
	}{
		{name: storeRedis, cases: []resolveCase{
			{name: "top-level Lock with defaults", file: "a.yaml", content: "Name: x\nLock:\n  Redis: {Host: 'r:1'}\n",
				store: "redis", host: "r:1", prefix: "lock:", typ: "node"},
			{name: "keys in any case, env expanded", file: "a.yaml",
				content: "lock:\n  redis: {host: '${FLIGHTLOCK_TEST_HOST}', type: Cluster}\n  prefix: 'l:'\n",
				store:   "redis", host: "10.0.0.9:6379", prefix: "l:", typ: "cluster"},
			{name: "several sections on one Redis", file: "a.yaml",
				content: "Order:\n  Lock: {Redis: {Host: 'r:1'}}\nBalance:\n  Lock: {Redis: {Host: 'r:1'}}\n",
				store:   "redis", host: "r:1", prefix: "lock:", typ: "node"},
			{name: "several sections on different Redis", file: "a.yaml",
				content: "Order:\n  Lock: {Redis: {Host: 'r:1'}}\nBalance:\n  Lock: {Redis: {Host: 'r:2'}}\n",
				err:     "choose one with -lock"},
			{name: "-lock chooses", file: "a.yaml", o: options{section: "balance.lock"},
				content: "Order:\n  Lock: {Redis: {Host: 'r:1'}}\nBalance:\n  Lock: {Redis: {Host: 'r:2'}, Prefix: 'b:'}\n",
				store:   "redis", host: "r:2", prefix: "b:", typ: "node"},
			{name: "-lock names no section", file: "a.yaml", o: options{section: "Nope.Lock"},
				content: "Order:\n  Lock: {Redis: {Host: 'r:1'}}\n", err: "has no Lock section Nope.Lock; it has Order.Lock"},
			{name: "Lock without Redis: embedded", file: "a.yaml",
				content: "Redis: {Host: 'shared:6379'}\nOrder:\n  Lock: {Rules: []}\n",
				err:     "pass -addr shared:6379"},
			{name: "Lock without any store names both", file: "a.yaml",
				content: "Order:\n  Lock: {Rules: []}\n",
				err:     "Order.Lock names no store, neither Redis.Host (or Sentinel) nor Etcd.Hosts nor Zookeeper.Hosts"},
			{name: "Lock on etcd read in Redis lacks a Redis only", file: "a.yaml", o: options{store: "redis"},
				content: "Order:\n  Lock: {Etcd: {Hosts: ['e:1']}}\n",
				err:     "Order.Lock.Redis has no Host: that service locks in etcd (Order.Lock.Etcd.Hosts): leave out -store redis"},
			{name: "Lock on ZooKeeper read in Redis lacks a Redis only", file: "a.yaml", o: options{store: "redis"},
				content: "Order:\n  Lock: {Zookeeper: {Hosts: ['z:1']}}\n",
				err:     "Order.Lock.Redis has no Host: that service locks in ZooKeeper (Order.Lock.Zookeeper.Hosts): leave out -store redis"},
			{name: "Lock without Redis, -addr given", file: "a.yaml", o: options{addr: "x:2"},
				content: "Order:\n  Lock: {Prefix: 'o:'}\n", store: "redis", host: "x:2", prefix: "o:", typ: "node"},
			{name: "flags override the file", file: "a.yaml", o: options{addr: "x:3", prefix: "p:", typ: "CLUSTER"},
				content: "Lock: {Redis: {Host: 'r:1'}}\n", store: "redis", host: "x:3", prefix: "p:", typ: "cluster"},
			{name: "no Lock section", file: "a.yaml", content: "Name: x\n", err: "has no Lock section"},
			{name: "bad YAML", file: "a.yaml", content: "Lock: [\n", err: "a.yaml"},
			{name: "JSON", file: "a.json", content: `{"Lock": {"Redis": {"Host": "j:1"}}}`, store: "redis", host: "j:1", prefix: "lock:", typ: "node"},
			{name: "TOML", file: "a.toml", content: "[Lock]\n", err: "only YAML and JSON"},
			{name: "bad type", file: "a.yaml", content: "Lock: {Redis: {Host: 'r:1', Type: sentinel}}\n", err: "Lock.Redis.Type: must be one of node, cluster"},
			{name: "no file", o: options{addr: "a:1"}, store: "redis", host: "a:1", prefix: "lock:", typ: "node"},
		}, settings: func(t *testing.T, got target, c resolveCase) {
			if got.redis.Host != c.host || got.prefix != c.prefix || got.redis.Type != c.typ {
				t.Errorf("host %q prefix %q type %q, want %q %q %q", got.redis.Host, got.prefix, got.redis.Type, c.host, c.prefix, c.typ)
			}
		}},
		{name: storeEtcd, cases: []resolveCase{
			{name: "etcd only", content: "Lock:\n  Etcd: {Hosts: ['e:1', 'e:2']}\n", store: "etcd", hosts: "e:1,e:2", prefix: "flightlock/lock:"},
			{name: "etcd with key, prefix, account", content: "Lock:\n  Etcd: {Hosts: ['e:1'], Key: 'k/', User: u, Pass: p}\n  Prefix: 'p:'\n",
				store: "etcd", hosts: "e:1", prefix: "k/p:", user: "u", pass: "p"},
			{name: "both: Redis", content: "Lock:\n  Redis: {Host: 'r:1'}\n  Etcd: {Hosts: ['e:1']}\n", store: "redis", prefix: "lock:"},
			{name: "both, -store etcd", content: "Lock:\n  Redis: {Host: 'r:1'}\n  Etcd: {Hosts: ['e:1']}\n", o: options{store: "etcd"},
				store: "etcd", hosts: "e:1", prefix: "flightlock/lock:"},
			{name: "flags over the file", content: "Lock:\n  Etcd: {Hosts: ['e:1'], User: u, Pass: p}\n",
				o: options{etcd: "x:1,x:2", etcdKey: "fl/", prefix: "q:", pass: "P"}, store: "etcd", hosts: "x:1,x:2", prefix: "fl/q:", user: "u", pass: "P"},
			{name: "FLIGHTLOCK_REDIS_PASS is Redis's", content: "Lock:\n  Etcd: {Hosts: ['e:1'], User: u, Pass: p}\n",
				o: options{pass: "env", passFromEnv: true}, store: "etcd", hosts: "e:1", prefix: "flightlock/lock:", user: "u", pass: "p"},
			{name: "-etcd over a Redis section", content: "Lock:\n  Redis: {Host: 'r:1'}\n", o: options{etcd: "e:9"},
				store: "etcd", hosts: "e:9", prefix: "flightlock/lock:"},
			{name: "-addr over an etcd section", content: "Lock:\n  Etcd: {Hosts: ['e:1']}\n", o: options{addr: "r:2"}, store: "redis", prefix: "lock:"},
			{name: "-store etcd, no hosts", content: "Lock:\n  Redis: {Host: 'r:1'}\n", o: options{store: "etcd"}, err: "Lock.Etcd.Hosts is empty: pass -etcd"},
			{name: "-store etcd with -addr", content: "Lock:\n  Etcd: {Hosts: ['e:1']}\n", o: options{store: "etcd", addr: "r:1"}, err: "are Redis's"},
			{name: "no file, -etcd", o: options{etcd: "e:3"}, store: "etcd", hosts: "e:3", prefix: "flightlock/lock:"},
			{name: "sections on different etcd clusters", content: "A:\n  Lock: {Etcd: {Hosts: ['e:1']}}\nB:\n  Lock: {Etcd: {Hosts: ['e:2']}}\n",
				err: "choose one with -lock"},
		}, settings: func(t *testing.T, got target, c resolveCase) {
			if strings.Join(got.etcd.Hosts, ",") != c.hosts || got.etcd.User != c.user || got.etcd.Pass != c.pass {
				t.Errorf("hosts %v user %q pass %q, want %s %q %q", got.etcd.Hosts, got.etcd.User, got.etcd.Pass, c.hosts, c.user, c.pass)
			}
		}},
		{name: storeZookeeper, cases: []resolveCase{
			{name: "zookeeper only", content: "Lock:\n  Zookeeper: {Hosts: ['z:1', 'z:2']}\n", store: "zookeeper", hosts: "z:1,z:2",
				root: "/flightlock", prefix: "lock:", session: 40 * time.Second},
			{name: "root, session, prefix", content: "Lock:\n  Zookeeper: {Hosts: ['z:1'], Root: /locks/svc, SessionTimeout: 12s}\n  Prefix: 'p:'\n  TTL: 5s\n",
				store: "zookeeper", hosts: "z:1", root: "/locks/svc", prefix: "p:", session: 12 * time.Second},
			{name: "Redis and zookeeper: Redis", content: "Lock:\n  Redis: {Host: 'r:1'}\n  Zookeeper: {Hosts: ['z:1']}\n", store: "redis", prefix: "lock:"},
			{name: "etcd and zookeeper: etcd", content: "Lock:\n  Etcd: {Hosts: ['e:1']}\n  Zookeeper: {Hosts: ['z:1']}\n", store: "etcd",
				prefix: "flightlock/lock:"},
			{name: "-store zookeeper", content: "Lock:\n  Redis: {Host: 'r:1'}\n  Zookeeper: {Hosts: ['z:1']}\n", o: options{store: "zookeeper"},
				store: "zookeeper", hosts: "z:1", root: "/flightlock", prefix: "lock:", session: 40 * time.Second},
			{name: "flags over the file", content: "Lock:\n  Zookeeper: {Hosts: ['z:1']}\n", o: options{zk: "y:1,y:2", zkRoot: "/other", prefix: "q:"},
				store: "zookeeper", hosts: "y:1,y:2", root: "/other", prefix: "q:", session: 40 * time.Second},
			{name: "-zookeeper over a Redis section", content: "Lock:\n  Redis: {Host: 'r:1'}\n", o: options{zk: "z:9"},
				store: "zookeeper", hosts: "z:9", root: "/flightlock", prefix: "lock:", session: 40 * time.Second},
			{name: "-addr over a zookeeper section", content: "Lock:\n  Zookeeper: {Hosts: ['z:1']}\n", o: options{addr: "r:2"}, store: "redis", prefix: "lock:"},
			{name: "-store zookeeper, no hosts", content: "Lock:\n  Redis: {Host: 'r:1'}\n", o: options{store: "zookeeper"},
				err: "Lock.Zookeeper.Hosts is empty: pass -zookeeper"},
			{name: "-store zookeeper with -user", content: "Lock:\n  Zookeeper: {Hosts: ['z:1']}\n", o: options{store: "zookeeper", user: "u"},
				err: "are Redis's or etcd's"},
			{name: "no file, -zookeeper", o: options{zk: "z:3"}, store: "zookeeper", hosts: "z:3", root: "/flightlock", prefix: "lock:", session: 40 * time.Second},
			{name: "sections on different roots", content: "A:\n  Lock: {Zookeeper: {Hosts: ['z:1']}}\nB:\n  Lock: {Zookeeper: {Hosts: ['z:1'], Root: /b}}\n",
				err: "choose one with -lock"},
		}, settings: func(t *testing.T, got target, c resolveCase) {
			if strings.Join(got.zk.Hosts, ",") != c.hosts || got.zk.Root != c.root || got.zk.SessionTimeout != c.session {
				t.Errorf("hosts %v root %q session %v, want %s %q %v", got.zk.Hosts, got.zk.Root, got.zk.SessionTimeout, c.hosts, c.root, c.session)
			}
		}},
	}
	for _, store := range stores {
		t.Run(store.name, func(t *testing.T) {
			for _, c := range store.cases {
				t.Run(c.name, func(t *testing.T) {
					o := c.o
					switch {
					case c.file != "":
						o.file = writeFile(t, c.file, c.content)
					case c.content != "":
						o.file = writeFile(t, "x.yaml", c.content)
					}
					got, err := resolveTarget(o)
					if c.err != "" {
						if err == nil || !strings.Contains(err.Error(), c.err) {
							t.Fatalf("error %v, want one containing %q", err, c.err)
						}
						return
					}
					if err != nil {
						t.Fatal(err)
					}
					if got.store != c.store || got.keyPrefix() != c.prefix {
						t.Errorf("store %q prefix %q, want %q %q", got.store, got.keyPrefix(), c.store, c.prefix)
					}
					if c.store == store.name {
						store.settings(t, got, c)
					}
				})
			}
		})
	}
}

// TestUsageErrorsOfEachStoresFlags: the flags of etcd and of ZooKeeper that name different
// stores, a -store that contradicts them, and a server that cannot be reached, each with its
// exit code and message.
func TestUsageErrorsOfEachStoresFlags(t *testing.T) {
	closed := closedAddr(t)
	type usageCase struct {
		args []string
		code int
		msg  string
	}
	stores := []struct {
		name  string
		env   map[string]string
		cases []usageCase
	}{
		{name: storeEtcd, env: map[string]string{"ETCD_CLIENT_DEBUG": "fatal"}, // as main sets it: no retry warnings
			cases: []usageCase{
				{[]string{"-addr", "a:1", "-etcd", "e:1", "ls"}, exitUsage, "-addr (Redis), -etcd and -zookeeper name different stores"},
				{[]string{"-etcd", "e:1", "-store", "zk", "ls"}, exitUsage, "-store must be redis, etcd or zookeeper"},
				{[]string{"-etcd", "e:1", "-store", "redis", "ls"}, exitUsage, "-store redis with another store's flags"},
				{[]string{"-etcd", closed, "-timeout", "1s", "ls"}, exitError, "cannot reach etcd " + closed + " (from -etcd)"},
			}},
		{name: storeZookeeper, cases: []usageCase{
			{[]string{"-addr", "a:1", "-zookeeper", "z:1", "ls"}, exitUsage, "name different stores"},
			{[]string{"-etcd", "e:1", "-zookeeper", "z:1", "ls"}, exitUsage, "name different stores"},
			{[]string{"-zookeeper", "z:1", "-store", "etcd", "ls"}, exitUsage, "-store etcd with another store's flags"},
			{[]string{"-zookeeper", closed, "-timeout", "1s", "ls"}, exitError, "cannot reach zookeeper " + closed + " under /flightlock (from -zookeeper)"},
		}},
	}
	for _, store := range stores {
		t.Run(store.name, func(t *testing.T) {
			for k, v := range store.env {
				t.Setenv(k, v)
			}
			for _, c := range store.cases {
				if code, _, errs := cli(t, nil, c.args...); code != c.code || !strings.Contains(errs, c.msg) {
					t.Errorf("flightlock %q: exit %d, stderr %q; want exit %d and %q", c.args, code, errs, c.code, c.msg)
				}
			}
		})
	}
}

// TestWatchFollowsLocksOnEveryStore follows locks through acquisition, contention (another
// process refused) and release, on etcd with an etcd watch and on ZooKeeper by polling,
// leaving out a key the pattern does not match, and a lock held before the watch started;
// -for ends it. The lines say what is watched and how, give the fence (and, on ZooKeeper,
// ttl=session), and never the owner; on etcd the JSON acquisition has the fence, the holder
// and a TTL.
func TestWatchFollowsLocksOnEveryStore(t *testing.T) {
	stores := []struct {
		name string
		// start starts the store and gives two Lockers of processes of their own, the watch's
		// arguments before its command, and the first line it prints with "1 held".
		start func(t *testing.T) (holder, other *flightlock.Locker, args []string, watching string)
		gap   time.Duration // between changes: the streams (or polls) see each one apart
		gone  string        // the event of a release
		ttl   string        // what the lines say of the TTL after the fence
		first func(t *testing.T, ev event, lease *flightlock.Lease)
	}{
		{name: storeEtcd, start: func(t *testing.T) (*flightlock.Locker, *flightlock.Locker, []string, string) {
			c := etcdtest.Start(t)
			return etcdLocker(t, c), etcdLocker(t, c), []string{"-etcd", c.Endpoints()[0], "-for", "4s"},
				"watching flightlock/lock:order:* on etcd " + c.Endpoints()[0] + " (etcd watch); 1 held"
		}, gap: 200 * time.Millisecond, gone: "released", first: func(t *testing.T, ev event, lease *flightlock.Lease) {
			if ev.Lock.Fence != lease.Fence() || ev.Lock.Host != "h1" || ev.Lock.TTLMillis <= 0 {
				t.Errorf("acquired: %+v, want fence %d, holder h1 and a TTL", ev.Lock, lease.Fence())
			}
		}},
		{name: storeZookeeper, start: func(t *testing.T) (*flightlock.Locker, *flightlock.Locker, []string, string) {
			srv := zktest.Start(t)
			holder, _ := zkLocker(t, srv.Addr)
			other, _ := zkLocker(t, srv.Addr)
			return holder, other, []string{"-zookeeper", srv.Addr, "-interval", "100ms", "-for", "5s"},
				"watching lock:order:* on zookeeper " + srv.Addr + " under /flightlock (polling every 100ms); 1 held"
		}, gap: 300 * time.Millisecond, gone: "gone", ttl: " ttl=session"},
	}
	for _, store := range stores {
		t.Run(store.name, func(t *testing.T) {
			ctx := context.Background()
			holder, other, args, watching := store.start(t)
			before, err := holder.Lock(ctx, "order:0")
			if err != nil {
				t.Fatal(err)
			}
			var out, text syncBuffer
			done := make(chan int, 2)
			args = append(args, "watch", "order:*")
			go func() {
				done <- run(ctx, append([]string{"-o", "json"}, args...), strings.NewReader(""), &out, io.Discard)
			}()
			go func() { done <- run(ctx, args, strings.NewReader(""), &text, io.Discard) }() // the same as lines, for people
			waitFor(t, "watch to start", func() bool { return strings.Contains(text.String(), "1 held") })
			time.Sleep(store.gap) // the JSON one too

			lease, err := holder.Lock(ctx, "order:1")
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(store.gap) // the contention after the acquisition
			if _, err := other.TryLock(ctx, "order:1"); !errors.Is(err, flightlock.ErrBusy) {
				t.Fatalf("a second owner on a held lock: %v, want ErrBusy", err)
			}
			time.Sleep(store.gap)
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			time.Sleep(store.gap)
			if err := before.Release(ctx); err != nil {
				t.Fatal(err)
			}
			acct, err := holder.Lock(ctx, "acct:1") // not matched: never reported
			if err != nil {
				t.Fatal(err)
			}
			_ = acct.Release(ctx)

			want := []string{"acquired order:1", "contended order:1", store.gone + " order:1", store.gone + " order:0"}
			waitFor(t, "the events", func() bool { return len(events(t, out.String())) >= len(want) })
			for range 2 {
				if code := <-done; code != exitOK {
					t.Fatalf("watch: exit %d", code)
				}
			}
			if got := events(t, out.String()); strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			if store.first != nil {
				var first event
				_ = json.Unmarshal([]byte(strings.SplitN(out.String(), "\n", 2)[0]), &first)
				store.first(t, first, lease)
			}
			lines := text.String()
			if !strings.Contains(lines, watching) ||
				!strings.Contains(lines, "acquired  order:1 fence="+strconv.FormatInt(lease.Fence(), 10)+store.ttl) || strings.Contains(lines, "owner=") {
				t.Errorf("watch lines:\n%s", lines)
			}
		})
	}
}

// commandsStore is a store with the locks of a service's processes, for ls, show and unlock.
type commandsStore struct {
	file            string // the service's YAML, with a Lock section that names this store only
	holder, waiter  *flightlock.Locker
	key             string                             // where order:alice is held: etcd key or znode
	noMatch         string                             // what ls of stock:* says
	owner           func() string                      // the holder's owner token; nil: none to read
	marked, held    func(ctx context.Context) bool     // order:alice's waiter mark; order:alice
	lsLock          func(t *testing.T, l lockInfo)     // the store's own fields of order:alice in ls -o json
	tableHas        []string                           // more in ls's table of order:*
	showJSON        func(t *testing.T, shown lockInfo) // checks of show -o json; nil: not run
	showLabel       string                             // the name of the key's line in show
	showHas         []string                           // more in show's table
	markGoneChecked bool                               // after the unlock, marked is checked false
}

// TestLsShowUnlockOnEveryStore takes locks with the store's package and flightlock, then runs
// ls, show and unlock on them from the service's YAML, on etcd and on ZooKeeper: the locks
// with their keys (etcd key or znode), fences, holders and waiter marks, never the owner
// token (on etcd, where it can be read, its text is looked for in every output), a TTL on
// etcd's lease and none on ZooKeeper (a hold lives with its session); ls's globs and limit;
// show's details and the refusal of a free key; unlock removes nothing unconfirmed, then the
// key and its mark, and the waiter of another process gets the lock (with a higher fence)
// while the holder still runs; a second unlock finds nothing held.
func TestLsShowUnlockOnEveryStore(t *testing.T) {
	const lease5s = 6_000 // the 5s TTL of etcdLocker plus the 1s margin, in ms
	stores := []struct {
		name  string
		start func(t *testing.T, ctx context.Context, fence func() int64) commandsStore
	}{
		{name: storeEtcd, start: func(t *testing.T, ctx context.Context, fence func() int64) commandsStore {
			c := etcdtest.Start(t)
			ecli := c.Client(t)
			const full = "flightlock/lock:order:alice"
			count := func(key string) int {
				resp, err := ecli.Get(ctx, key)
				if err != nil {
					return -1
				}
				return len(resp.Kvs)
			}
			return commandsStore{
				file:    writeFile(t, "svc.yaml", fmt.Sprintf("Name: svc\nLock:\n  Etcd: {Hosts: [%q]}\n  Rules: []\n", c.Endpoints()[0])),
				holder:  etcdLocker(t, c),
				waiter:  etcdLocker(t, c, flightlock.WithWait(time.Minute)),
				key:     full,
				noMatch: "no lock held matches flightlock/lock:stock:*",
				owner:   func() string { return ownerOf(t, ecli, full) },
				marked:  func(context.Context) bool { return count(etcdstore.WaiterKey(full)) == 1 },
				held:    func(context.Context) bool { return count(full) == 1 },
				lsLock: func(t *testing.T, l lockInfo) {
					if l.Store != storeEtcd || l.EtcdKey != full || l.Owner != "" {
						t.Errorf("store %q key %q owner %q, want etcd, %s, no owner", l.Store, l.EtcdKey, l.Owner, full)
					}
					if l.TTLMillis <= 0 || l.TTLMillis > lease5s || l.Lease == "" {
						t.Errorf("ttl %dms on lease %q, want within the 5s TTL plus the 1s margin", l.TTLMillis, l.Lease)
					}
					if l.Waiters != 0 {
						t.Errorf("waiters %d: want the waiter mark, no count", l.Waiters)
					}
				},
				// show: the revision unlock compares, the lease, the fence floor key.
				showJSON: func(t *testing.T, shown lockInfo) {
					resp, err := ecli.Get(ctx, full)
					if err != nil {
						t.Fatal(err)
					}
					kv := resp.Kvs[0]
					if shown.Fence != fence() || shown.ModRevision != kv.ModRevision || shown.CreateRevision != kv.CreateRevision ||
						shown.Lease != strconv.FormatInt(kv.Lease, 16) || shown.FenceCounterKey != etcdstore.FloorKey(full) || shown.FenceCounter != nil || !shown.Contended {
						t.Errorf("show: %+v; want the key's revisions %d/%d, lease %x, fence %d, no floor, the mark", shown, kv.CreateRevision, kv.ModRevision, kv.Lease, fence())
					}
				},
				showLabel:       "etcd key",
				showHas:         []string{"owner"},
				markGoneChecked: true,
			}
		}},
		{name: storeZookeeper, start: func(t *testing.T, ctx context.Context, fence func() int64) commandsStore {
			srv := zktest.Start(t)
			const node = "/flightlock/lock:order:alice"
			holder, store := zkLocker(t, srv.Addr)
			waiter, _ := zkLocker(t, srv.Addr, flightlock.WithWait(time.Minute))
			in := zkstore.NewInspector(store, "lock:")
			return commandsStore{
				file:    writeFile(t, "svc.yaml", "Name: svc\nLock:\n  Zookeeper: {Hosts: ['"+srv.Addr+"'], SessionTimeout: 10s}\n  TTL: 3s\n  Rules: []\n"),
				holder:  holder,
				waiter:  waiter,
				key:     node,
				noMatch: "no lock held matches lock:stock:* on zookeeper " + srv.Addr + " under /flightlock",
				marked: func(ctx context.Context) bool {
					l, err := in.Lookup(ctx, "order:alice")
					return err == nil && l.Contended
				},
				held: func(ctx context.Context) bool {
					_, err := in.Lookup(ctx, "order:alice")
					return err == nil
				},
				lsLock: func(t *testing.T, l lockInfo) {
					if l.Store != storeZookeeper || l.ZNode != node || l.Owner != "" {
						t.Errorf("store %q node %q owner %q, want zookeeper, %s, no owner", l.Store, l.ZNode, l.Owner, node)
					}
					if l.TTLMillis != -1 {
						t.Errorf("ttl %dms, want -1: a hold lives as long as its session", l.TTLMillis)
					}
				},
				tableHas:  []string{"session"},
				showLabel: "znode",
				showHas:   []string{"ZooKeeper session"},
			}
		}},
	}
	for _, store := range stores {
		t.Run(store.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var lease *flightlock.Lease
			s := store.start(t, ctx, func() int64 { return lease.Fence() })
			var err error
			if lease, err = s.holder.Lock(ctx, "order:alice"); err != nil {
				t.Fatal(err)
			}
			other, err := s.holder.Lock(ctx, "acct:1")
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = other.Release(ctx) }()
			noOwner := func(what, out string) {}
			if s.owner != nil {
				owner := s.owner()
				noOwner = func(what, out string) {
					t.Helper()
					if strings.Contains(out, owner) || strings.Contains(out, owner[:8]) {
						t.Errorf("%s printed the owner token %s:\n%s", what, owner, out)
					}
				}
			}

			// A waiter in another process: refused, it sets the waiter mark and watches the key.
			waiterGot := make(chan *flightlock.Lease, 1)
			go func() {
				l, err := s.waiter.Lock(ctx, "order:alice")
				if err != nil {
					t.Errorf("waiter: %v", err)
				}
				waiterGot <- l
			}()
			waitFor(t, "the waiter's mark", func() bool { return s.marked(ctx) })

			// ls -o json: both locks, with key, fence, holder, waiter mark, and no owner field.
			code, out, errs := cli(t, nil, "-f", s.file, "ls", "-o", "json")
			if code != exitOK {
				t.Fatalf("ls: exit %d: %s", code, errs)
			}
			noOwner("ls -o json", out)
			if strings.Contains(out, `"owner"`) || strings.Contains(out, `"redis_key"`) {
				t.Errorf("ls -o json has owner or redis_key fields:\n%s", out)
			}
			var locks []lockInfo
			if err := json.Unmarshal([]byte(out), &locks); err != nil {
				t.Fatalf("ls -o json: %v\n%s", err, out)
			}
			if len(locks) != 2 || locks[0].Key != "acct:1" || locks[1].Key != "order:alice" {
				t.Fatalf("ls: %+v, want acct:1 and order:alice", locks)
			}
			l := locks[1]
			s.lsLock(t, l)
			if l.Fence != lease.Fence() || !l.Own || len(l.Reentries) != 0 {
				t.Errorf("fence %d own %v reentries %v, want the lease's fence %d and the own hold only", l.Fence, l.Own, l.Reentries, lease.Fence())
			}
			if l.Host != "h1" || l.Pid != "42" {
				t.Errorf("holder host=%q pid=%q, want h1 42", l.Host, l.Pid)
			}
			if !l.Contended || locks[0].Contended {
				t.Errorf("contended %v and %v, want order:alice's mark only", l.Contended, locks[0].Contended)
			}

			// Tables, with the glob on the rendered key.
			code, out, _ = cli(t, nil, "-f", s.file, "ls", "order:*")
			noOwner("ls table", out)
			if code != exitOK || !strings.Contains(out, "order:alice") || strings.Contains(out, "acct:1") ||
				!strings.Contains(out, "refused") || !strings.Contains(out, "pid=42") || !strings.Contains(out, strconv.FormatInt(l.Fence, 10)) {
				t.Errorf("ls order:* table: exit %d:\n%s", code, out)
			}
			for _, has := range s.tableHas {
				if !strings.Contains(out, has) {
					t.Errorf("ls order:* table has no %q:\n%s", has, out)
				}
			}
			if code, out, _ = cli(t, nil, "-f", s.file, "ls", "acct:?"); code != exitOK || !strings.Contains(out, "acct:1") || strings.Contains(out, "order:alice") {
				t.Errorf("ls acct:? table: exit %d:\n%s", code, out)
			}
			if code, out, _ = cli(t, nil, "-f", s.file, "ls", "stock:*"); code != exitOK || !strings.Contains(out, s.noMatch) {
				t.Errorf("ls of a pattern with no lock: exit %d: %s", code, out)
			}
			if code, out, _ = cli(t, nil, "-f", s.file, "ls", "-limit", "1"); code != exitOK || !strings.Contains(out, "acct:1") || !strings.Contains(out, "and 1 more") {
				t.Errorf("ls -limit 1: exit %d:\n%s", code, out)
			}

			if s.showJSON != nil {
				code, out, errs = cli(t, nil, "-f", s.file, "show", "order:alice", "-o", "json")
				noOwner("show -o json", out)
				var shown lockInfo
				if code != exitOK || json.Unmarshal([]byte(out), &shown) != nil {
					t.Fatalf("show: exit %d: %s %s", code, out, errs)
				}
				s.showJSON(t, shown)
			}
			code, out, _ = cli(t, nil, "-f", s.file, "show", "order:alice")
			noOwner("show", out)
			if code != exitOK || !regexp.MustCompile(`(?m)^`+s.showLabel+` +`+s.key+`$`).MatchString(out) || !strings.Contains(out, "waiter mark set") ||
				!strings.Contains(out, "not shown") {
				t.Errorf("show table: exit %d:\n%s", code, out)
			}
			for _, has := range s.showHas {
				if !strings.Contains(out, has) {
					t.Errorf("show table has no %q:\n%s", has, out)
				}
			}
			if code, _, errs = cli(t, nil, "-f", s.file, "show", "order:bob"); code != exitError || !strings.Contains(errs, "not held") {
				t.Errorf("show of a free key: exit %d: %s", code, errs)
			}

			// unlock, not confirmed: nothing removed.
			code, _, errs = cli(t, strings.NewReader("n\n"), "-f", s.file, "unlock", "order:alice")
			noOwner("unlock's prompt", errs)
			if code != exitError || !strings.Contains(errs, "not confirmed") || !strings.Contains(errs, "Force-release "+s.key+"?") {
				t.Fatalf("unlock answered n: exit %d: %s", code, errs)
			}
			if !s.held(ctx) {
				t.Fatal("unlock answered n removed the lock")
			}
			// -yes: the key and its mark go, and the waiter gets the lock while the holder
			// still holds its lease (it learns of the loss at its next refresh).
			code, out, errs = cli(t, nil, "-f", s.file, "-yes", "unlock", "order:alice")
			noOwner("unlock", out+errs)
			if code != exitOK || !strings.Contains(out, "removed "+s.key+": fence "+strconv.FormatInt(lease.Fence(), 10)) ||
				!strings.Contains(out, "deleted its waiter mark") {
				t.Fatalf("unlock -yes: exit %d:\n%s%s", code, out, errs)
			}
			select {
			case got := <-waiterGot:
				if got == nil {
					t.Fatal("the waiter got no lease")
				}
				if got.Fence() <= lease.Fence() {
					t.Errorf("the waiter's fence %d is not above the removed holder's %d", got.Fence(), lease.Fence())
				}
				if err := got.Release(ctx); err != nil {
					t.Errorf("waiter release: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the waiter was not woken by the unlock")
			}
			if err := lease.Release(ctx); err == nil {
				t.Error("the removed holder's release succeeded")
			}
			if s.markGoneChecked && s.marked(ctx) {
				t.Error("the waiter mark is still there")
			}
			if code, _, errs = cli(t, nil, "-f", s.file, "-yes", "unlock", "order:alice"); code != exitError || !strings.Contains(errs, "not held") {
				t.Errorf("unlock of a free key: exit %d: %s", code, errs)
			}
		})
	}
}

// TestNotHeldSaysWhatTheOperatorMayHaveMeant: show, unlock and ls of a key that is not held name,
// on every store, the held permits of its semaphore when its first permit (the key itself) is
// free, the key without the Prefix written before it, and ls for a pattern.
func TestNotHeldSaysWhatTheOperatorMayHaveMeant(t *testing.T) {
	for _, store := range cliStores {
		t.Run(store.name, func(t *testing.T) {
			s := store.start(t)
			ctx := context.Background()
			sem := s.locker(flightlock.WithPermits(3))
			var first *flightlock.Lease
			var others []*flightlock.Lease
			for range 3 {
				lease, err := sem.Lock(flightlock.NewOwner(ctx), "export:acme")
				if err != nil {
					t.Fatal(err)
				}
				if strings.HasSuffix(lease.Key(), ":export:acme") {
					first = lease
				} else {
					others = append(others, lease)
				}
			}
			if first == nil || len(others) != 2 {
				t.Fatalf("3 permits taken, and none is the key's own: %d others", len(others))
			}
			if err := first.Release(ctx); err != nil {
				t.Fatal(err)
			}
			defer func() {
				for _, l := range others {
					_ = l.Release(ctx)
				}
			}()
			plain, err := s.locker().Lock(ctx, "order:1")
			if err != nil {
				t.Fatal(err)
			}
			defer plain.Release(ctx)

			for _, c := range []struct {
				args []string
				want []string
			}{
				{[]string{"show", "export:acme"}, []string{"not held; 2 other permits of its semaphore are held: export:acme#", "flightlock ls 'export:acme*'"}},
				{[]string{"unlock", "-yes", "export:acme"}, []string{"2 other permits of its semaphore are held", "nothing removed"}},
				{[]string{"show", "lock:order:1"}, []string{"not held; keys are written without the prefix \"lock:\": did you mean order:1?"}},
				{[]string{"show", "order:*"}, []string{"not held; show and unlock take one key, not a pattern: flightlock ls 'order:*'"}},
			} {
				code, out, errs := cli(t, nil, append(s.flags, c.args...)...)
				if code != exitError {
					t.Errorf("%v: exit %d, want %d:\n%s%s", c.args, code, exitError, out, errs)
				}
				for _, w := range c.want {
					if !strings.Contains(errs, w) {
						t.Errorf("%v says:\n%s\nwant %q in it", c.args, errs, w)
					}
				}
			}
			// ls of the same key finds nothing, which is no error (exit 0, and for scripts the
			// empty list), but says where the permits are.
			code, out, errs := cli(t, nil, append(s.flags, "ls", "export:acme")...)
			if code != exitOK || !strings.Contains(out, "no lock held matches") ||
				!strings.Contains(out, "; 2 other permits of its semaphore are held: export:acme#") || !strings.Contains(out, "flightlock ls 'export:acme*'") {
				t.Errorf("ls export:acme: exit %d\n%s%s\nwant exit 0 and the held permits", code, out, errs)
			}
			if code, out, errs := cli(t, nil, append(s.flags, "ls", "-o", "json", "export:acme")...); code != exitOK || strings.TrimSpace(out) != "[]" {
				t.Errorf("ls -o json export:acme: exit %d\n%s%s\nwant exit 0 and []", code, out, errs)
			}
		})
	}
}

// TestForeignKeysUnderThePrefixAreNotLocks: keys under the prefix that flightlock did not
// write (etcdctl put, redis-cli set, a znode made in zkCli), an empty value among them, are
// listed marked "not a flightlock lock" (JSON unrecognized), show says so and fails (exit 1),
// and unlock refuses them (exit 1), on every store; none is ever shown as a lock.
func TestForeignKeysUnderThePrefixAreNotLocks(t *testing.T) {
	ctx := context.Background()
	for _, store := range []struct {
		name  string
		start func(t *testing.T) (flags []string, put func(key, value string))
	}{
		{"redis", func(t *testing.T) ([]string, func(string, string)) {
			srv := redistest.Start(t)
			return []string{"-addr", srv.Addr}, func(key, value string) {
				if err := srv.Client().Set(ctx, "lock:"+key, value, 0).Err(); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"etcd", func(t *testing.T) ([]string, func(string, string)) {
			c := etcdtest.Start(t)
			ecli := c.Client(t)
			return []string{"-etcd", c.Endpoints()[0]}, func(key, value string) {
				if _, err := ecli.Put(ctx, "flightlock/lock:"+key, value); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"zookeeper", func(t *testing.T) ([]string, func(string, string)) {
			srv := zktest.Start(t)
			conn, _ := zktest.Connect(t, 10*time.Second, srv.Addr)
			if _, err := conn.Create("/flightlock", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
				t.Fatal(err)
			}
			// A node with no child is not listed (no hold: a free key's node); one with a
			// child that is no hold of flightlock's is someone else's.
			return []string{"-zookeeper", srv.Addr}, func(key, value string) {
				p := "/flightlock/lock:" + key
				if _, err := conn.Create(p, []byte(value), 0, zk.WorldACL(zk.PermAll)); err != nil {
					t.Fatal(err)
				}
				if _, err := conn.Create(p+"/child", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
					t.Fatal(err)
				}
			}
		}},
	} {
		t.Run(store.name, func(t *testing.T) {
			flags, put := store.start(t)
			put("junk", "hello")
			put("empty", "")
			code, out, errs := cli(t, nil, append(flags, "ls")...)
			if code != exitOK || !regexp.MustCompile(`(?m)^empty .*not a flightlock lock`).MatchString(out) ||
				!regexp.MustCompile(`(?m)^junk .*not a flightlock lock`).MatchString(out) {
				t.Errorf("ls: exit %d\n%s%s\nwant both keys marked not a flightlock lock", code, out, errs)
			}
			code, out, errs = cli(t, nil, append(flags, "ls", "-o", "json")...)
			var locks []lockInfo
			if err := json.Unmarshal([]byte(out), &locks); code != exitOK || err != nil || len(locks) != 2 {
				t.Fatalf("ls -o json: exit %d, %v\n%s%s", code, err, out, errs)
			}
			for _, l := range locks {
				if l.Unrecognized == "" {
					t.Errorf("ls -o json lists %s as a lock: %+v", l.Key, l)
				}
			}
			for _, key := range []string{"junk", "empty"} {
				// show prints the value marked so and fails as unlock does: a script that
				// runs show to learn whether a lock is held must not read a foreign key as one.
				code, out, errs = cli(t, nil, append(flags, "show", key)...)
				if code != exitError || !strings.Contains(out, "(not a flightlock lock)") || !strings.Contains(errs, "is not a flightlock lock") {
					t.Errorf("show %s: exit %d\n%s%s\nwant it marked not a flightlock lock, exit 1", key, code, out, errs)
				}
				code, out, errs = cli(t, nil, append(flags, "show", "-o", "json", key)...)
				var l lockInfo
				if err := json.Unmarshal([]byte(out), &l); code != exitError || err != nil || l.Unrecognized == "" || !strings.Contains(errs, "is not a flightlock lock") {
					t.Errorf("show -o json %s: exit %d, %v\n%s%s\nwant it marked unrecognized, exit 1", key, code, err, out, errs)
				}
				code, out, errs = cli(t, nil, append(flags, "unlock", "-yes", key)...)
				if code != exitError || !strings.Contains(errs, "is not a flightlock lock") {
					t.Errorf("unlock %s: exit %d\n%s%s\nwant exit 1, not a flightlock lock", key, code, out, errs)
				}
			}
		})
	}
}
