package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
	"github.com/flightlock/flightlock/internal/testenv/zktest"
	"github.com/flightlock/flightlock/zkstore"
)

// The ZooKeeper rows (-store zookeeper): flightlock on zkstore, go-zookeeper's own lock recipe
// (zk.NewLock, the peer), and the floor, a bare Create + Delete of an ephemeral node; on one
// private standalone ZooKeeper server started here: Debian's package run as
// `java ... QuorumPeerMain zoo.cfg` on a free loopback port, a fresh data directory (the
// transaction log fsynced, ZooKeeper's default), killed by its pid at the end. They run
// scenarios 1-3.
const (
	// rowZKLock is zk.NewLock on a lock node that exists: the recipe's steady state on a key
	// it has seen (it never deletes the node it locks under).
	rowZKLock = "zklock"
	// rowZKLockFresh is zk.NewLock on a path of its own per operation: the recipe's first use
	// of a key, which creates the lock node (and leaves it behind).
	rowZKLockFresh = "zklock-fresh"
)

// The nodes each row works under; flightlock's are zkstore's default root.
const (
	zkFloorRoot = "/floor"
	zkLockRoot  = "/zklock"
)

type zkBackend struct {
	procBackend
	addr    string // 127.0.0.1:port, the client port
	tick    time.Duration
	version string // from the srvr four-letter word
	java    string // first line of `java -version`

	c          *config
	own        *zkstore.Store // the store whose session conn is: its MaxTTL and root are every client's
	conn       *zk.Conn       // the floor's and zk.NewLock's session
	acl        []zk.ACL
	floorValue []byte // the bytes flightlock writes in a key node
}

// rows are the floor and zk.NewLock on a fresh lock path beside flightlock and zk.NewLock
// in scenario 1, those two alone on a hot key.
func (z *zkBackend) rows(scenario int) []string {
	if scenario == 1 {
		return []string{rowFloor, rowFlight, rowZKLock, rowZKLockFresh}
	}
	return []string{rowFlight, rowZKLock}
}
func (z *zkBackend) describe() string {
	return fmt.Sprintf("zookeeper %s (pid %d, %s) on %s, tickTime %v, data in %s (%s)", z.version, z.Pid(), z.java, z.addr, z.tick, z.Dir, z.fsType)
}

func (z *zkBackend) workerArgs(c *config) []string {
	return []string{"-addr", z.addr, "-zk-session", c.zkSession.String()}
}

func (z *zkBackend) attach(addr string) { z.addr = addr }

// peerGoroutines and dropGoroutinesBeyond have nothing to do: every zk.NewLock goroutine of a
// process shares its session, as the goroutines of a service share its client.
func (z *zkBackend) peerGoroutines(int) error { return nil }
func (z *zkBackend) dropGoroutinesBeyond(int) {}

// zkJVMFlags keep the JVM's own choices (JIT, collector) as a server started by zkServer.sh
// would, bound its heap, and quiet its log. The test harness (internal/testenv/zktest) stops
// the JIT at C1 and fsyncs nothing, which makes a server start fast but serve slower than one
// in production; a benchmark wants the latter.
var zkJVMFlags = []string{
	"-Xms256m", "-Xmx512m", "-XX:-UsePerfData",
	"-Djava.net.preferIPv4Stack=true",
	"-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
}

// start starts the server with tickTime -zk-tick under a temporary directory in -datadir
// and waits until it serves.
func (z *zkBackend) start(c *config) error {
	java, err := exec.LookPath(c.javaBin)
	if err != nil {
		return fmt.Errorf("java: %v (apt-get install zookeeper)", err)
	}
	if _, err := os.Stat(c.zkJar); err != nil {
		return fmt.Errorf("zookeeper jar: %v (apt-get install zookeeper)", err)
	}
	classpath := c.zkJar
	// slf4j-simple (libslf4j-java, a dependency of the package) gives the server a log; the
	// jar's manifest names the other libraries it needs.
	simple := filepath.Join(filepath.Dir(c.zkJar), "slf4j-simple.jar")
	if _, err := os.Stat(simple); err == nil {
		classpath += string(os.PathListSeparator) + simple
	}
	if err := z.makeDir(c.dataDir, "zk"); err != nil {
		return err
	}
	z.addr, z.tick = freeAddrs(1)[0], c.zkTick
	if out, err := exec.Command(java, "-version").CombinedOutput(); err == nil {
		first, _, _ := strings.Cut(string(out), "\n")
		z.java = strings.TrimSpace(first)
	}
	host, port, _ := net.SplitHostPort(z.addr)
	conf := filepath.Join(z.Dir, "zoo.cfg")
	// The session timeouts a server grants run from 2 to 20 ticks by default; syncLimit is the
	// sample configuration's (zkstore checks a session against both).
	body := fmt.Sprintf("tickTime=%d\ninitLimit=10\nsyncLimit=5\ndataDir=%s\nclientPort=%s\nclientPortAddress=%s\n"+
		// No admin server: it would bind port 8080. The four-letter words tell zkstore the
		// ensemble's settings and this benchmark the server's counters.
		"admin.enableServer=false\n4lw.commands.whitelist=*\n",
		z.tick.Milliseconds(), filepath.Join(z.Dir, "data"), port, host)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		_ = os.RemoveAll(z.Dir)
		return err
	}
	args := append(append([]string{}, zkJVMFlags...), "-cp", classpath, "org.apache.zookeeper.server.quorum.QuorumPeerMain", conf)
	cmd := exec.Command(java, args...)
	cmd.Dir = z.Dir
	return z.Run("zookeeper", cmd, 60*time.Second, func() (bool, error) {
		srvr, err := zktest.FourLetterWord(z.addr, "srvr", 2*time.Second)
		if !strings.Contains(srvr, "Mode: standalone") {
			return false, err
		}
		for _, line := range strings.Split(srvr, "\n") {
			if v, ok := strings.CutPrefix(line, "Zookeeper version: "); ok {
				z.version, _, _ = strings.Cut(v, ",")
				// Debian's build leaves its git id unexpanded: "3.8.0-${mvngit.commit.id}".
				z.version, _, _ = strings.Cut(z.version, "-${")
			}
		}
		return true, nil
	})
}

// counters reads the server's mntr: the packets (requests, pings included) it received from
// clients, and the fsyncs of its transaction log.
func (z *zkBackend) counters() serverStats {
	out, err := zktest.FourLetterWord(z.addr, "mntr", 2*time.Second)
	if err != nil {
		return serverStats{}
	}
	var st serverStats
	figures(out, func(name string, v float64) {
		switch name {
		case "zk_packets_received":
			st.reqs, st.ok = v, true
		case "zk_cnt_fsynctime":
			st.fsyncs = v
		}
	})
	return st
}

// dial opens a zkstore session on the server, as every client of the rows asks for it.
func (b *zkBackend) dial() (*zkstore.Store, error) {
	return zkstore.Dial(zkstore.Config{Hosts: []string{b.addr}, SessionTimeout: b.c.zkSession})
}

// open makes the floor's and zk.NewLock's session through zkstore.Dial.
func (b *zkBackend) open(c *config) error {
	b.c, b.acl = c, zk.WorldACL(zk.PermAll)
	var err error
	if b.own, err = b.dial(); err != nil {
		return err
	}
	b.conn = b.own.Conn()
	progress("flightlock: session %v, MaxTTL %v, TTL %v", c.zkSession, b.own.MaxTTL(), flightTTL)
	for _, p := range []string{zkFloorRoot, zkLockRoot} {
		if _, err := b.conn.Create(p, nil, 0, b.acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("create %s: %w", p, err)
		}
	}
	return nil
}

func (b *zkBackend) close() {
	if b.own != nil {
		_ = b.own.Close()
	}
}

// newStore is a zkstore with a session of its own, which must keep the TTL of the other
// stores' rows (zkstore.Store.MaxTTL).
func (b *zkBackend) newStore() (closingStore, error) { return b.dial() }

func (b *zkBackend) floorFrom(key string) (err error) {
	b.floorValue, _, err = b.conn.Get(b.own.Root() + "/" + key)
	return err
}

// lockOf is the floor or zk.NewLock, on this process's session; zk.NewLock's lock for i < 0
// (scenario 1's "lock node exists" row) locks one lock path whatever the key.
func (b *zkBackend) lockOf(row string, i int) impl {
	switch {
	case row == rowFloor:
		return zkFloor{b}
	case row == rowZKLock && i < 0:
		return zkLockRow{b, zkLockRoot + "/s1"}
	}
	return zkLockRow{b, ""}
}

// zkLockRow is zk.NewLock on the lock path of the key (path "": one per key), a zk.Lock made
// per Lock (it remembers the node it created, and NewLock sends nothing). The recipe takes no
// context: it waits until it holds the lock or the session fails, so the Lock's bound does not
// apply to this row.
type zkLockRow struct {
	b    *zkBackend
	path string
}

func (z zkLockRow) key(base string) string { return cmp.Or(z.path, zkLockRoot+"/"+base) }

func (z zkLockRow) lock(_ context.Context, key string) (any, error) {
	l := zk.NewLock(z.b.conn, key, z.b.acl)
	return l, l.Lock()
}

func (z zkLockRow) tryLock(ctx context.Context, key string) (any, error) { return z.lock(ctx, key) }

func (z zkLockRow) unlock(_ context.Context, _ string, h any) error { return h.(*zk.Lock).Unlock() }

func (zkLockRow) roundTrips() int64 { return 0 }
func (zkLockRow) close()            {}

// zkFloor is the floor: a bare Create of an ephemeral node holding what flightlock writes in
// a key node, then its Delete.
type zkFloor struct{ b *zkBackend }

func (f zkFloor) key(base string) string { return zkFloorRoot + "/" + base }

func (f zkFloor) lock(_ context.Context, key string) (any, error) {
	_, err := f.b.conn.Create(key, f.b.floorValue, zk.FlagEphemeral, f.b.acl)
	return nil, err
}

func (f zkFloor) tryLock(ctx context.Context, key string) (any, error) { return f.lock(ctx, key) }

func (f zkFloor) unlock(_ context.Context, key string, _ any) error { return f.b.conn.Delete(key, -1) }

func (zkFloor) roundTrips() int64 { return 0 }
func (zkFloor) close()            {}

func (z *zkBackend) notes() storeNotes {
	return storeNotes{
		name: "zookeeper", title: "ZooKeeper", scenarios: []int{1, 2, 3}, peer: rowZKLock,
		reqUnit: "requests", reqCol: "requests", cpuCol: "server CPU", floorShort: "bare create+delete", peerShort: "zk.NewLock", peerThe: "zk.NewLock",
		labels: map[string]string{
			rowFloor:       "bare Create + Delete of an ephemeral node (the floor)",
			rowFlight:      "flightlock on zkstore (Lock + Release)",
			rowZKLock:      "go-zookeeper zk.NewLock (Lock + Unlock), lock node exists",
			rowZKLockFresh: "go-zookeeper zk.NewLock (Lock + Unlock), a fresh lock path per operation",
		},
		floors:  [][2]string{{rowFloor, "floor"}},
		peerHow: "each contender creates its node and lists the path, each waiter watches its predecessor, and each unlock is another write",
		s1Note:  " zk.NewLock's first row locks one lock path, again and again.",
		goals:   (*report).storeGoalSets,
		head: func(r *report, w writer) {
			p, c := lines(w), r.cfg
			p("# ZooKeeper benchmarks")
			p("")
			p("Generated by `bench/cmd/lockbench -store zookeeper` on %s. flightlock's ZooKeeper store (`zkstore`) against", r.started.Format("2006-01-02 15:04 MST"))
			p("go-zookeeper's own lock recipe, `zk.NewLock` (github.com/go-zookeeper/zk v1.0.4, the client `zkstore` runs on), and")
			p("the floor, a bare `Create` + `Delete` of an ephemeral node, on one private ZooKeeper server. The Redis rows are in")
			p("[benchmarks.md](benchmarks.md), the etcd rows in [benchmarks-etcd.md](benchmarks-etcd.md).")
			p("")
			howItWasRun(p, c)
			p("- One standalone ZooKeeper server started by the command: Debian's package run as `java %s -cp %s:slf4j-simple.jar", strings.Join(zkJVMFlags, " "), c.zkJar)
			p("  org.apache.zookeeper.server.quorum.QuorumPeerMain zoo.cfg` (the JVM's own JIT and collector otherwise), on a free")
			p("  loopback port, a fresh data directory on %s; `tickTime=%d`, `initLimit=10`, `syncLimit=5`, the session", z.fsType, c.zkTick.Milliseconds())
			p("  timeouts it grants at their defaults (2 to 20 ticks), the transaction log fsynced before a write is")
			p("  acknowledged (ZooKeeper's default, as etcd's rows keep etcd's), `4lw.commands.whitelist=*`, admin server off;")
			p("  killed by its pid at the end.")
			p("- Sessions: every session (this process's for the floor and zk.NewLock, flightlock's store, each worker's) asks")
			p("  for %v; `zkstore.Store.MaxTTL()` is then %v (two thirds of the session less syncLimit + 1 ticks; a standalone", c.zkSession, z.own.MaxTTL().Round(100*time.Millisecond))
			p("  server's `conf` reports no syncLimit, so one tick here; an ensemble with this syncLimit of 5 leaves %v), and flightlock's",
				(c.zkSession*2/3 - 6*c.zkTick).Round(100*time.Millisecond))
			p("  Locker is `flightlock.New(store, WithTTL(%v), WithWait(%v))`, the TTL of the other stores' rows, handoff at its", flightTTL, c.lockTimeout)
			p("  defaults (%d handoffs or %v per grant).", flightlock.DefaultHandoff, flightlock.DefaultHandoffWindow)
			p("- zk.NewLock is the recipe as its package ships it: a protected ephemeral sequential node under the lock path, the")
			p("  path's children listed, a watch on the predecessor, the node deleted on Unlock. One `zk.Lock` per goroutine and")
			p("  key (a Lock remembers its node), all on their process's one session. Its Lock takes no context, so the Lock")
			p("  bound does not apply to it. It never deletes the lock path: on a key it has seen the path exists (the")
			p("  \"lock node exists\" row); the first use of a key creates it (an `Exists` per level, a `Create`), which the")
			p("  \"fresh lock path\" row pays every time.")
			commonBullets(p, c, "the JVM compiles the server's hot paths meanwhile")
			p("- Requests and fsyncs per operation: deltas of the server's `mntr` counters over the row (`zk_packets_received`,")
			p("  every request of every client, session pings included; `zk_cnt_fsynctime`, the fsyncs of the transaction")
			p("  log), divided by the operations or critical sections counted; likewise the CPU time of the server process")
			p("  (from /proc, 10ms ticks) and, in scenarios 1 and 2, of the benchmark process (the client).")
			p("")
			w("## Machine\n\n")
			r.machineTable(w)
		},
		machine: []string{fmt.Sprintf("| ZooKeeper (`srvr`) | %s |", z.version), fmt.Sprintf("| JVM (`java -version`) | %s |", z.java)},
		dataDir: fmt.Sprintf("| ZooKeeper data directory | %s (transaction log fsynced) |", z.fsType),
		s1Ratios: func(r *report) string {
			fo := r.med(1, rowFloor, p50)
			return fmt.Sprintf("p50 against the floor's: flightlock %.2fx, zk.NewLock %.2fx (lock node exists), %.2fx (fresh lock path).",
				safeDiv(r.med(1, rowFlight, p50), fo), safeDiv(r.med(1, rowZKLock, p50), fo), safeDiv(r.med(1, rowZKLockFresh, p50), fo))
		},
		closing: zkHowToRead,
	}
}

// howToRead is the closing paragraph, with this run's figures.
func zkHowToRead(r *report, w writer) {
	p, c := lines(w), r.cfg
	p("## How to read it")
	p("")
	var parts []string
	if c.scenarios[1] {
		fo, fl := r.med(1, rowFloor, p50), r.med(1, rowFlight, p50)
		parts = append(parts, fmt.Sprintf("Scenario 1 is the price of one lock when nobody contends. The server fsyncs "+
			"every write before it answers, so compare the requests and fsyncs per operation before the times. The floor "+
			"is two requests, both writes (%s requests, %s fsyncs per operation measured). flightlock's Acquire is one "+
			"multi (the key node, its ephemeral hold, and a set that reads the fence) and its Release, when the hold is "+
			"the grant's only one (no re-entry), one multi that deletes hold and node without reading either: %s requests "+
			"and %s fsyncs, the floor's two writes, in multis of three and two operations where the floor sends one each "+
			"(a node with other holds fails that multi whole, and only then does the Release read the node). So its p50 is %s against "+
			"%s (%.2fx), with %s of server CPU against %s and %s of client CPU against %s per operation. zk.NewLock on an "+
			"existing lock path is a create, a listing of the path's children and a delete (%s requests, p50 %s); on a "+
			"fresh path it first looks the path up and creates it (%s requests, %s fsyncs, p50 %s).",
			perOp(r.med(1, rowFloor, reqs)), perOp(r.med(1, rowFloor, fsy)),
			perOp(r.med(1, rowFlight, reqs)), perOp(r.med(1, rowFlight, fsy)),
			mdfmt.Dur(fl), mdfmt.Dur(fo), safeDiv(fl, fo),
			mdfmt.Dur(r.med(1, rowFlight, scpu)), mdfmt.Dur(r.med(1, rowFloor, scpu)),
			mdfmt.Dur(r.med(1, rowFlight, ccpu)), mdfmt.Dur(r.med(1, rowFloor, ccpu)),
			perOp(r.med(1, rowZKLock, reqs)), mdfmt.Dur(r.med(1, rowZKLock, p50)),
			perOp(r.med(1, rowZKLockFresh, reqs)), perOp(r.med(1, rowZKLockFresh, fsy)),
			mdfmt.Dur(r.med(1, rowZKLockFresh, p50))))
	}
	if c.scenarios[2] && c.scenarios[3] {
		parts = append(parts, r.hotKeyWhy())
	}
	if n := r.sum(2, rowFlight, failures) + r.sum(3, rowFlight, failures); n > 0 {
		parts = append(parts, fmt.Sprintf("flightlock's Locks failed %d times in scenarios 2 and 3 of this run (the "+
			"first errors are under their tables): its rows there count what got through before, and are not the "+
			"store's throughput on a hot key.", n))
	}
	for _, part := range parts {
		p("%s", part)
		p("")
	}
}
