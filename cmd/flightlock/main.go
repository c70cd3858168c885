// Command flightlock shows an operator the locks that flightlock services hold in Redis, etcd
// or ZooKeeper, and removes a stuck one. It reads the service's own config file (its Lock:
// section: Redis, Etcd or Zookeeper, and Prefix) or takes a store's address:
//
//	flightlock -f etc/order-api.yaml ls 'order:*'   # held locks: owner, fence, TTL, holder, waiters
//	flightlock -f etc/order-api.yaml show order:42  # one lock in full
//	flightlock -f etc/order-api.yaml unlock order:42  # force-release after confirmation (-yes)
//	flightlock -addr 127.0.0.1:6379 watch           # live acquisitions, releases, contention
//	flightlock -etcd 127.0.0.1:2379 ls 'acct:*'     # the same on etcd (under -etcd-key, default flightlock/)
//	flightlock -zookeeper 127.0.0.1:2181 ls         # on ZooKeeper (under -zookeeper-root, default /flightlock)
//
// Keys are written as the rules render them, without the Prefix (nor, in etcd, Etcd.Key).
// -o json prints JSON for scripts. In etcd and ZooKeeper the owner token of a lock is never
// printed: a propagated owner token lets its bearer re-enter the lock.
//
// flightlock check catches lock mistakes before they ship, without a store: it reads
// the Lock sections of a config file as go-zero and middleware.New read them, and checks the
// rules against the service's own API definition, read with goctl's parser (.api) and a
// protobuf parser (.proto):
//
//	flightlock check -f etc/order-api.yaml -api order.api     # REST rules
//	flightlock check -f etc/inventory.yaml -proto inventory.proto  # zrpc rules
//
// It prints one finding per line as file:line: message (warnings as file:line: warning:
// message) and exits with status 1 when any is an error, for CI and editors. Install with
//
//	go install github.com/flightlock/flightlock/cmd/flightlock@latest
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	redis.SetLogger(silent{}) // failures reach the operator as errors, once, not as pool logs
	if os.Getenv("ETCD_CLIENT_DEBUG") == "" {
		// The same for the etcd client's retry warnings: middleware.EtcdConf.Client builds its
		// logger from this variable.
		_ = os.Setenv("ETCD_CLIENT_DEBUG", "fatal")
	}
	os.Exit(run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// silent drops go-redis's internal log lines.
type silent struct{}

func (silent) Printf(context.Context, string, ...any) {}

const usage = `usage: flightlock [flags] command [args]

Commands:
  check            check the Lock sections of a config without a store:
                   flightlock check -f etc/x.yaml [-api x.api]... [-proto x.proto]...
                   (flightlock check -h for its flags)
  ls [pattern]     held locks whose key matches pattern (a Redis glob, default *; on etcd
                   and ZooKeeper the same glob, matched on a read of the prefix)
  show KEY         one lock in full
  unlock KEY       force-release a lock after confirmation, waking its waiters
  watch [pattern]  live view of acquisitions, releases and contention

KEY and pattern are lock keys as the rules render them (order:42), without Prefix.

Where the locks are (-f, -addr, -etcd or -zookeeper; flags override the file). A Lock section
is read in the one store it names (Redis.Host or Sentinel, Etcd.Hosts, Zookeeper.Hosts); one
that names several is read in the first of Redis, etcd and ZooKeeper unless -store says which.
In etcd the keys are Etcd.Key + Prefix + KEY and TLS comes from the file's Etcd.CertFile,
CertKeyFile and CACertFile; in ZooKeeper each lock is a node under Zookeeper.Root named
Prefix + KEY (escaped), held by its holder's session. Neither prints the owner token:

  flightlock -f etc/x.yaml -store etcd ls         # a section with several stores: its etcd
  flightlock -etcd 10.0.0.7:2379,10.0.0.8:2379 -etcd-key flightlock/ show acct:42
  flightlock -zookeeper 10.0.0.9:2181 -zookeeper-root /flightlock ls 'order:*'

`

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the command failed, or found nothing to show or remove, or no flightlock lock
	exitUsage = 2
)

// options are the command line's flags.
type options struct {
	file     string        // -f: the service's config file
	section  string        // -lock: which Lock section of the file, when it has several
	addr     string        // -addr: Redis host:port (node), or seed addresses (cluster)
	etcd     string        // -etcd: etcd members, host:port,...
	etcdKey  string        // -etcd-key: the Etcd.Key before Prefix
	zk       string        // -zookeeper: ZooKeeper servers, host:port,...
	zkRoot   string        // -zookeeper-root: the Zookeeper.Root the locks live under
	store    string        // -store: redis, etcd or zookeeper, for a Lock section that names several
	typ      string        // -type: node or cluster
	user     string        // -user
	pass     string        // -pass
	tls      bool          // -tls
	prefix   string        // -prefix: the Lock section's Prefix
	output   string        // -o: table or json
	timeout  time.Duration // -timeout: bound of one command's Redis calls
	yes      bool          // -yes: unlock without asking
	shadow   bool          // -shadow: include the locks of shadow rules
	limit    int           // -limit: at most this many locks listed
	interval time.Duration // -interval: watch's refresh and polling period
	duration time.Duration // -for: how long watch runs (0: until interrupted)

	passFromEnv bool            // pass came from FLIGHTLOCK_REDIS_PASS, which is Redis's only
	set         map[string]bool // the flags given on the command line, by name
}

// commandFlags are the flags that only some commands read; check refuses them on the others.
var commandFlags = []struct {
	name string
	cmds []string
}{
	{"yes", []string{"unlock"}},
	{"limit", []string{"ls"}},
	{"shadow", []string{"ls", "watch"}},
	{"interval", []string{"watch"}},
	{"for", []string{"watch"}},
}

func (o *options) flags(stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("flightlock", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.file, "f", "", "the service's config `file` (YAML or JSON); its Lock section says where the locks are")
	fs.StringVar(&o.section, "lock", "", "the Lock section to use when the file has several, by its `path` (Order.Lock)")
	fs.StringVar(&o.addr, "addr", "", "Redis `host:port` (for -type cluster, comma-separated seed addresses)")
	fs.StringVar(&o.etcd, "etcd", "", "etcd members' `host:port,...`: read the locks in etcd")
	fs.StringVar(&o.etcdKey, "etcd-key", "", `etcd: the Etcd.Key before Prefix (default: the file's, else "flightlock/")`)
	fs.StringVar(&o.zk, "zookeeper", "", "ZooKeeper servers' `host:port,...`: read the locks in ZooKeeper")
	fs.StringVar(&o.zkRoot, "zookeeper-root", "", `ZooKeeper: the Zookeeper.Root the locks live under (default: the file's, else "/flightlock")`)
	fs.StringVar(&o.store, "store", "", "`redis, etcd or zookeeper`: the store to read when the Lock section names several (default: the first of them)")
	fs.StringVar(&o.typ, "type", "", "Redis type: node or cluster (default: the file's, else node)")
	fs.StringVar(&o.user, "user", "", "Redis or etcd user")
	fs.StringVar(&o.pass, "pass", "", "Redis or etcd password (or set FLIGHTLOCK_REDIS_PASS, for Redis only)")
	fs.BoolVar(&o.tls, "tls", false, "connect with TLS, as go-zero's Tls (certificate not verified)")
	fs.StringVar(&o.prefix, "prefix", "", `the Lock section's Prefix (default: the file's, else "lock:")`)
	fs.StringVar(&o.output, "o", "table", "output: table or json")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "bound of one command's store calls")
	fs.BoolVar(&o.yes, "yes", false, "unlock: do not ask for confirmation (for scripts)")
	fs.BoolVar(&o.shadow, "shadow", false, "ls and watch: include the locks of shadow rules (shadow:...)")
	fs.IntVar(&o.limit, "limit", 0, "ls: list at most this many locks (0: all)")
	fs.DurationVar(&o.interval, "interval", 500*time.Millisecond, "watch on Redis and ZooKeeper: refresh period, and polling period (on Redis, without keyspace notifications)")
	fs.DurationVar(&o.duration, "for", 0, "watch: stop after this long (0: until interrupted)")
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	return fs
}

// errUsage marks errors that print the usage.
var errUsage = errors.New("usage")

// flagError is resolveTarget's error for store flags that contradict each other or the -f
// file, or that choose a store and give it no address or half an account: a command line
// refused, exit status 2 as for errUsage, without the usage text (the message names the flag).
type flagError struct{ error }

func (e flagError) Unwrap() error { return e.error }

// run is the command: it returns the exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "check" { // flags of its own, and no Redis
		return runCheck(args[1:], stdout, stderr)
	}
	var o options
	fs := o.flags(stderr)
	pos, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		return exitUsage // the flag package printed the error and the usage
	}
	o.set = make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	if o.pass == "" {
		o.pass = os.Getenv("FLIGHTLOCK_REDIS_PASS")
		o.passFromEnv = o.pass != ""
	}
	if err := o.check(pos); err != nil {
		fmt.Fprintf(stderr, "flightlock: %v\n", err)
		if errors.Is(err, errUsage) {
			fs.Usage()
		}
		return exitUsage
	}

	t, err := resolveTarget(o)
	if err != nil {
		fmt.Fprintf(stderr, "flightlock: %v\n", err)
		if _, ok := errors.AsType[flagError](err); ok {
			return exitUsage
		}
		return exitError // the -f file: unreadable, no Lock section, no store named
	}
	cli, err := connect(ctx, t, o.timeout)
	if err != nil {
		fmt.Fprintf(stderr, "flightlock: %v\n", err)
		return exitError
	}
	defer cli.close()

	out := &printer{w: stdout, json: o.output == "json"}
	switch cmd, rest := pos[0], pos[1:]; cmd {
	case "ls":
		err = cmdList(ctx, cli, out, o, arg(rest, "*"))
	case "show":
		err = cmdShow(ctx, cli, out, o, rest[0])
	case "unlock":
		err = cmdUnlock(ctx, cli, out, o, rest[0], stdin, stderr)
	case "watch":
		err = cmdWatch(ctx, cli, out, o, arg(rest, "*"))
	}
	if err != nil {
		fmt.Fprintf(stderr, "flightlock: %v\n", t.refused(err))
		return exitError
	}
	return exitOK
}

// check refuses a command line that names no known command, has the wrong number of arguments,
// bad flag values or a flag that its command ignores (commandFlags).
func (o *options) check(pos []string) error {
	if len(pos) == 0 {
		return fmt.Errorf("%w: no command", errUsage)
	}
	want := map[string][2]int{"ls": {0, 1}, "show": {1, 1}, "unlock": {1, 1}, "watch": {0, 1}}
	n, ok := want[pos[0]]
	switch {
	case pos[0] == "check":
		return fmt.Errorf("%w: check comes first, its flags after it: flightlock check -f etc/x.yaml", errUsage)
	case !ok:
		return fmt.Errorf("%w: unknown command %q", errUsage, pos[0])
	case len(pos)-1 < n[0] || len(pos)-1 > n[1]:
		return fmt.Errorf("%w: %s takes %s", errUsage, pos[0], map[[2]int]string{{0, 1}: "at most one pattern", {1, 1}: "one KEY"}[n])
	case o.file == "" && o.addr == "" && o.etcd == "" && o.zk == "":
		return fmt.Errorf("%w: say where the locks are: -f etc/service.yaml or -addr host:port (Redis), -etcd host:port or -zookeeper host:port", errUsage)
	case o.addr != "" && o.etcd != "" || o.zk != "" && (o.addr != "" || o.etcd != ""):
		return fmt.Errorf("%w: -addr (Redis), -etcd and -zookeeper name different stores: give one", errUsage)
	case o.section != "" && o.file == "":
		return fmt.Errorf("%w: -lock picks a Lock section of the -f file, and there is none: give -f, or leave -lock out", errUsage)
	case o.store != "" && o.store != storeRedis && o.store != storeEtcd && o.store != storeZookeeper:
		return fmt.Errorf("%w: -store must be redis, etcd or zookeeper, got %q", errUsage, o.store)
	case o.store != "" && o.store != storeEtcd && (o.etcd != "" || o.etcdKey != ""),
		o.store != "" && o.store != storeZookeeper && (o.zk != "" || o.zkRoot != ""):
		return fmt.Errorf("%w: -store %s with another store's flags (-etcd, -etcd-key, -zookeeper, -zookeeper-root): give one store", errUsage, o.store)
	case o.output != "table" && o.output != "json":
		return fmt.Errorf("%w: -o must be table or json, got %q", errUsage, o.output)
	case o.timeout <= 0 || o.interval <= 0 || o.duration < 0 || o.limit < 0:
		return fmt.Errorf("%w: -timeout and -interval must be positive, -for and -limit not negative", errUsage)
	}
	for _, f := range commandFlags {
		if o.set[f.name] && !slices.Contains(f.cmds, pos[0]) {
			return fmt.Errorf("%w: -%s is %s's: %s ignores it", errUsage, f.name, strings.Join(f.cmds, "'s and "), pos[0])
		}
	}
	for _, a := range pos[1:] {
		if a == "" {
			return fmt.Errorf("%w: an empty key or pattern", errUsage)
		}
	}
	return nil
}

// parseInterspersed parses flags anywhere on the command line (flightlock ls -o json 'order:*'),
// returning the other arguments in order.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// arg is the first of rest, or def.
func arg(rest []string, def string) string {
	if len(rest) > 0 {
		return rest[0]
	}
	return def
}
