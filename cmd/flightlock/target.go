package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/conf"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"gopkg.in/yaml.v2" // the YAML parser go-zero's conf loader uses, so the file reads the same

	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/middleware"
)

// Stores the CLI reads.
const (
	storeRedis     = "redis"
	storeEtcd      = "etcd"
	storeZookeeper = "zookeeper"
)

// target is where the locks are: a Redis, an etcd or a ZooKeeper, and the prefix of the lock
// keys.
type target struct {
	store  string // storeRedis, storeEtcd or storeZookeeper
	redis  middleware.RedisConf
	etcd   middleware.EtcdConf      // store etcd: the cluster; its Key goes before prefix
	zk     middleware.ZookeeperConf // store zookeeper: the ensemble; the locks are nodes under its Root
	prefix string
	from   string // for messages: "etc/x.yaml (Order.Lock)", "-addr", "-etcd" or "-zookeeper"
}

// driver is the section of the target's store, with the flags applied: what opens it.
func (t target) driver() lockstore.Driver {
	sec, _ := middleware.LockConf{Redis: t.redis, Etcd: t.etcd, Zookeeper: t.zk}.Section(t.store)
	return sec.Driver
}

// keyPrefix is what goes before a rendered key in the store, as its driver says: Prefix in
// Redis, Etcd.Key + Prefix in etcd; in ZooKeeper Prefix, in the key's node name under
// Zookeeper.Root.
func (t target) keyPrefix() string { return t.driver().KeyPrefix(t.prefix) }

// resolveTarget reads the Lock section of o.file, if any, chooses its store and applies the
// flags over it. The store is the one -store names, etcd with -etcd, ZooKeeper with
// -zookeeper; without them and -addr, the section's own (middleware.LockConf.DefaultStore:
// the one it names, the first of Redis, etcd and ZooKeeper when it names several); Redis
// otherwise.
func resolveTarget(o options) (target, error) {
	var (
		lc   middleware.LockConf
		t    target
		path string
		err  error
	)
	if o.file != "" {
		if lc, path, err = loadLockSection(o.file, o.section); err != nil {
			return target{}, err
		}
		t.from = o.file + " (" + path + ")"
	} else {
		if err := conf.FillDefault(&lc); err != nil {
			return target{}, err
		}
		t.from = "-addr"
		if o.etcd != "" {
			t.from = "-etcd"
		} else if o.zk != "" {
			t.from = "-zookeeper"
		}
	}
	t.redis, t.etcd, t.zk, t.prefix = lc.Redis, lc.Etcd, lc.Zookeeper, lc.Prefix
	redisNamed := t.redis.Host != "" || t.redis.Sentinel.MasterName != ""
	switch {
	case o.store != "":
		t.store = o.store
	case o.etcd != "":
		t.store = storeEtcd
	case o.zk != "":
		t.store = storeZookeeper
	case o.addr == "":
		t.store, _ = lc.DefaultStore()
	default:
		t.store = storeRedis
	}
	if o.prefix != "" {
		t.prefix = o.prefix
	}
	switch t.store {
	case storeEtcd:
		return etcdTarget(t, o, path)
	case storeZookeeper:
		return zookeeperTarget(t, o, path)
	}

	if o.etcdKey != "" || o.zkRoot != "" {
		return target{}, otherStoreFlag(o, storeRedis)
	}
	if o.file != "" && !redisNamed && o.addr == "" {
		missing := path + ".Redis has no Host"
		if len(t.etcd.Hosts) == 0 && len(t.zk.Hosts) == 0 {
			missing = path + " names no store, neither Redis.Host (or Sentinel) nor Etcd.Hosts nor Zookeeper.Hosts"
		}
		if o.store == storeRedis && (len(t.etcd.Hosts) > 0 || len(t.zk.Hosts) > 0) {
			// The command line chose a store the file gives no address; the file names another.
			var in []string
			if len(t.etcd.Hosts) > 0 {
				in = append(in, "etcd ("+path+".Etcd.Hosts)")
			}
			if len(t.zk.Hosts) > 0 {
				in = append(in, "ZooKeeper ("+path+".Zookeeper.Hosts)")
			}
			return target{}, flagError{fmt.Errorf("%s: %s: that service locks in %s: leave out -store redis "+
				"to read its locks there, or give the Redis to read with -addr", o.file, missing, strings.Join(in, " and "))}
		}
		err := fmt.Errorf("%s: %s: that service locks in an embedded in-memory Redis "+
			"that only its own process sees, and there is nothing to inspect from outside.%s",
			o.file, missing, topLevelRedisHint(o.file))
		if o.store == storeRedis { // the command line chose a store the file gives no address
			err = flagError{err}
		}
		return target{}, err
	}
	if o.addr != "" {
		t.redis.Host, t.redis.Sentinel = o.addr, middleware.SentinelConf{}
	}
	if o.typ != "" {
		t.redis.Type = o.typ
	}
	if o.user != "" {
		t.redis.User = o.user
	}
	if o.pass != "" {
		t.redis.Pass = o.pass
	}
	if o.tls {
		t.redis.Tls = true
	}
	t.redis.NonBlock = true // connect reads the store within -timeout instead of a ping at start
	t.redis.Type = strings.ToLower(cmp.Or(t.redis.Type, "node"))
	if t.redis.Type != "node" && t.redis.Type != "cluster" {
		// Only -type can say so: the file's loader refuses another Type (options=node|cluster).
		return target{}, flagError{fmt.Errorf("Redis type must be node or cluster, got %q", t.redis.Type)}
	}
	return t, nil
}

// etcdTarget applies the etcd flags over the file's Etcd section: -etcd (hosts), -etcd-key,
// -user and -pass (the FLIGHTLOCK_REDIS_PASS variable is Redis's only). TLS comes from the
// file's CertFile, CertKeyFile and CACertFile.
func etcdTarget(t target, o options, path string) (target, error) {
	if len(t.etcd.Hosts) == 0 && t.etcd.Key == "" {
		// A file without an Etcd section leaves EtcdConf's defaults (Key, the lease margin)
		// unfilled: fill them as go-zero fills a section's, as without a file.
		if err := conf.FillDefault(&t.etcd); err != nil {
			return target{}, err
		}
	}
	switch {
	case o.zkRoot != "":
		return target{}, otherStoreFlag(o, storeEtcd)
	case o.addr != "" || o.typ != "" || o.tls:
		return target{}, flagError{fmt.Errorf("-addr, -type and -tls are Redis's; the locks are read in etcd here (-etcd host:port; TLS from the file's Etcd.CertFile, CertKeyFile and CACertFile)")}
	case o.etcd != "":
		t.etcd.Hosts = strings.Split(o.etcd, ",")
		if o.file != "" {
			t.from = "-etcd, with " + t.from
		}
	case len(t.etcd.Hosts) == 0: // -store etcd: a section that names etcd has hosts
		return target{}, flagError{fmt.Errorf("%s: %s.Etcd.Hosts is empty: pass -etcd host:port", o.file, path)}
	}
	if o.etcdKey != "" {
		t.etcd.Key = o.etcdKey
	}
	t.etcd.DialTimeout = o.timeout
	if o.user != "" {
		t.etcd.User = o.user
	}
	if o.pass != "" && !o.passFromEnv {
		t.etcd.Pass = o.pass
	}
	if (t.etcd.User == "") != (t.etcd.Pass == "") {
		// The client sends an account only with both, and the locks would be read as no one.
		// The file's section has both or neither (its loader refuses one alone), so the half
		// given is a flag's, and the other half comes from a flag or from the file.
		given, missing, env := "-user", "-pass", ""
		if t.etcd.User == "" {
			given, missing = "-pass", "-user"
		} else if o.passFromEnv {
			env = " (FLIGHTLOCK_REDIS_PASS is Redis's only)"
		}
		return target{}, flagError{fmt.Errorf("%s without %s: etcd is sent an account only with both its user and its password: "+
			"give %s too%s, or set Lock.Etcd.User and Pass in the -f file", given, missing, missing, env)}
	}
	return t, nil
}

// otherStoreFlag refuses -etcd-key or -zookeeper-root when the locks are read in store, a
// store that has no such setting: the flag would be dropped.
func otherStoreFlag(o options, store string) error {
	flag, owner := "-etcd-key", "etcd's Etcd.Key"
	if o.zkRoot != "" && store != storeZookeeper {
		flag, owner = "-zookeeper-root", "ZooKeeper's Zookeeper.Root"
	}
	return flagError{fmt.Errorf("%s is %s, but the locks are read in %s here: leave it out, or read them in the store it belongs to", flag, owner, store)}
}

// where names the store for messages: etcd or ZooKeeper and its hosts, the Redis Host, or
// the Sentinel master.
func (t target) where() string {
	switch t.store {
	case storeEtcd:
		return "etcd " + strings.Join(t.etcd.Hosts, ",")
	case storeZookeeper:
		return "zookeeper " + strings.Join(t.zk.Hosts, ",") + " under " + t.zk.Root
	}
	if t.redis.Sentinel.MasterName != "" {
		return fmt.Sprintf("sentinel master %s via %s", t.redis.Sentinel.MasterName, strings.Join(t.redis.Sentinel.Addrs, ","))
	}
	return t.redis.Host
}

// lockSection is a Lock mapping found in a config file, and its path ("Lock", "Order.Lock").
type lockSection struct {
	path string
	raw  any
}

// loadLockSection reads the Lock section of a service's config file, filled with the defaults
// the service itself gets (go-zero's conf loader on LockConf). A file with several (one per
// service, as in the example) needs -lock unless they all name the same Redis and Prefix.
func loadLockSection(file, want string) (middleware.LockConf, string, error) {
	doc, err := readConfigFile(file)
	if err != nil {
		return middleware.LockConf{}, "", err
	}
	var found []lockSection
	findLockSections(doc, "", &found)
	if len(found) == 0 {
		return middleware.LockConf{}, "", fmt.Errorf("%s has no Lock section: pass -addr (and -prefix) instead", file)
	}
	if want != "" {
		i := slices.IndexFunc(found, func(s lockSection) bool { return strings.EqualFold(s.path, want) })
		if i < 0 {
			return middleware.LockConf{}, "", flagError{fmt.Errorf("%s has no Lock section %s; it has %s", file, want, sectionPaths(found))}
		}
		found = found[i : i+1]
	}
	confs := make([]middleware.LockConf, len(found))
	for i, s := range found {
		b, err := json.Marshal(s.raw)
		if err != nil {
			return middleware.LockConf{}, "", fmt.Errorf("%s: %s: %w", file, s.path, err)
		}
		if err := conf.LoadFromJsonBytes(b, &confs[i]); err != nil {
			return middleware.LockConf{}, "", fmt.Errorf("%s: %s: %w", file, s.path, err)
		}
	}
	for _, c := range confs[1:] {
		if c.Redis.Host != confs[0].Redis.Host || c.Prefix != confs[0].Prefix ||
			!slices.Equal(c.Etcd.Hosts, confs[0].Etcd.Hosts) || c.Etcd.Key != confs[0].Etcd.Key ||
			!slices.Equal(c.Zookeeper.Hosts, confs[0].Zookeeper.Hosts) || c.Zookeeper.Root != confs[0].Zookeeper.Root {
			return middleware.LockConf{}, "", fmt.Errorf("%s has Lock sections on different Redis hosts, etcd clusters, ZooKeeper ensembles or prefixes (%s): choose one with -lock",
				file, sectionPaths(found))
		}
	}
	return confs[0], found[0].path, nil
}

// readConfigFile parses a YAML or JSON config file, with ${VAR} expanded from the environment
// as go-zero's conf.UseEnv does (a file without variables reads the same either way).
func readConfigFile(file string) (any, error) {
	content, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	content = []byte(os.ExpandEnv(string(content)))
	var doc any
	switch strings.ToLower(filepath.Ext(file)) {
	case ".yaml", ".yml":
		err = yaml.Unmarshal(content, &doc)
		doc = stringKeys(doc)
	case ".json":
		err = json.Unmarshal(content, &doc)
	default:
		return nil, fmt.Errorf("%s: only YAML and JSON config files are read; pass -addr (and -prefix) instead", file)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return doc, nil
}

// stringKeys turns yaml.v2's map[interface{}]interface{} into map[string]any, all the way down.
func stringKeys(v any) any {
	switch v := v.(type) {
	case map[any]any:
		m := make(map[string]any, len(v))
		for k, x := range v {
			m[fmt.Sprint(k)] = stringKeys(x)
		}
		return m
	case []any:
		for i, x := range v {
			v[i] = stringKeys(x)
		}
	}
	return v
}

// findLockSections collects the mappings under a key "Lock" (in any case, as go-zero matches
// keys), depth first in key order, without looking inside them.
func findLockSections(v any, path string, out *[]lockSection) {
	m, ok := v.(map[string]any)
	if !ok {
		return
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		p := k
		if path != "" {
			p = path + "." + k
		}
		if _, isMap := m[k].(map[string]any); isMap && strings.EqualFold(k, "lock") {
			*out = append(*out, lockSection{path: p, raw: m[k]})
			continue
		}
		findLockSections(m[k], p, out)
	}
}

func sectionPaths(s []lockSection) string {
	paths := make([]string, len(s))
	for i, x := range s {
		paths[i] = x.path
	}
	return strings.Join(paths, ", ")
}

// topLevelRedisHint points at a top-level Redis section, which some services (the example)
// hand to their Lock section in code.
func topLevelRedisHint(file string) string {
	doc, err := readConfigFile(file)
	if err != nil {
		return ""
	}
	m, _ := doc.(map[string]any)
	for k, v := range m {
		if r, ok := v.(map[string]any); ok && strings.EqualFold(k, "redis") {
			for rk, host := range r {
				if strings.EqualFold(rk, "host") {
					return fmt.Sprintf(" If the service takes its lock Redis from the file's top-level Redis section in code, pass -addr %v.", host)
				}
			}
		}
	}
	return " If it locks on a Redis set in code, pass -addr."
}

// reachKey is the key that connect looks up: a lock key no template renders, so that any
// answer but "not held" is a store that cannot be read.
const reachKey = "flightlock:cli:probe"

// connect opens the target's store as the service's own opens it (its section's driver:
// hosts, account, TLS, a ZooKeeper session timeout checked against the servers'), within
// -timeout, and looks up one key, so that a wrong address or account fails here with the
// address in the message. The locks are read through the store's inspector, which never hands
// out an owner token. The CLI's connections and session are its own: closing them touches no
// service's hold.
func connect(ctx context.Context, t target, timeout time.Duration) (*backend, error) {
	type opened struct {
		b   *lockstore.Backend
		err error
	}
	done := make(chan opened, 1)
	go func() { // a ZooKeeper session is awaited up to a session timeout, without a context
		b, err := t.driver().Open(t.prefix)
		done <- opened{b, err}
	}()
	// The grace lets a client that bounds its own dial by -timeout (etcd) report why.
	tctx, cancel := context.WithTimeout(ctx, timeout+openGrace)
	defer cancel()
	var b *lockstore.Backend
	select {
	case o := <-done:
		if o.err != nil {
			return nil, t.unreachable(o.err)
		}
		b = o.b
	case <-tctx.Done():
		go func() { // a store that opens after all is closed at once
			if o := <-done; o.err == nil {
				_ = o.b.Close()
			}
		}()
		return nil, t.unreachable(fmt.Errorf("%w within %v", errNoSession, timeout))
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := b.Inspector.Lookup(pctx, reachKey); err != nil && !errors.Is(err, lockstore.ErrNotHeld) {
		_ = b.Close()
		return nil, t.unreachable(err)
	}
	return &backend{Inspector: b.Inspector, target: t, close: func() { _ = b.Close() }}, nil
}

// errNoSession is connect's error for a store that did not open within -timeout.
var errNoSession = errors.New("no session")

// openGrace is how much longer than -timeout connect waits for a store to open.
const openGrace = 250 * time.Millisecond

// unreachable is err, of a store that connect could not open or read, with its address.
func (t target) unreachable(err error) error {
	where := t.where()
	if t.store == storeRedis {
		where = "Redis at " + where
	}
	err = fmt.Errorf("cannot reach %s (from %s): %w", where, t.from, err)
	switch {
	case t.store != storeRedis && (errors.Is(err, errNoSession) || errors.Is(err, context.DeadlineExceeded)):
		err = fmt.Errorf("%w; %s", err, t.silentHint())
	case t.store != storeRedis:
		err = t.refused(err)
	case redis.IsAuthError(err) || redis.IsPermissionError(err):
		err = fmt.Errorf("%w; Redis refused the account: give its password with -pass (or FLIGHTLOCK_REDIS_PASS) "+
			"and its user with -user, or set Lock.Redis.Pass (and User) in the -f file", err)
	case errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET):
		// A server that hangs up on Redis's first command: etcd and ZooKeeper do, and so does
		// a Redis that serves TLS only.
		tls := "; with TLS, -tls"
		if t.redis.Tls {
			tls = ""
		}
		err = fmt.Errorf("%w; is %s a Redis server? -etcd names etcd members, -zookeeper ZooKeeper servers%s", err, t.where(), tls)
	case t.redis.Tls && errors.Is(err, context.DeadlineExceeded):
		// A plain server never answers the TLS handshake.
		err = fmt.Errorf("%w; with TLS on (-tls, or the file's Redis.Tls): does %s serve TLS? leave it off for a plain one", err, t.where())
	}
	return err
}

// silentHint says what to check of an etcd or ZooKeeper that did not answer within -timeout,
// host by host: where nothing accepts connections, that the server is down or the address
// wrong; where something does, that it may not be that store (or, on etcd, that TLS may be
// off on one side).
func (t target) silentHint() string {
	name, hosts, flag, field := "etcd", t.etcd.Hosts, "-etcd", "Etcd.Hosts"
	server, client := "the etcd member", "an etcd member's client address (2379 by default, not the peer port 2380)"
	tls := " For an etcd that serves TLS, give the file's Etcd.CertFile, CertKeyFile and CACertFile"
	if t.etcd.CertFile != "" { // with CertKeyFile and CACertFile: the file is refused otherwise
		tls = " TLS is on (the file's Etcd.CertFile, CertKeyFile and CACertFile): does it serve TLS, and accept that certificate?"
	}
	if t.store == storeZookeeper {
		name, hosts, flag, field = "ZooKeeper", t.zk.Hosts, "-zookeeper", "Zookeeper.Hosts"
		server, client, tls = "the ZooKeeper server", "a ZooKeeper server's client address (2181 by default)", ""
	}
	var hints, answered []string
	for _, h := range hosts {
		addr := h
		if u, err := url.Parse(h); err == nil && u.Host != "" {
			addr = u.Host // an etcd endpoint given as a URL
		}
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		switch {
		case errors.Is(err, syscall.ECONNREFUSED):
			hints = append(hints, fmt.Sprintf("nothing accepts connections at %s: is %s up, and is this its client address (%s, or the file's %s)?", addr, server, flag, field))
		case err != nil:
			hints = append(hints, fmt.Sprintf("cannot connect to %s (%v): is this the client address of %s (%s, or the file's %s)?", addr, err, server, flag, field))
		default:
			_ = conn.Close()
			answered = append(answered, addr)
		}
	}
	if len(answered) > 0 {
		hints = append(hints, fmt.Sprintf("%s accepts connections but did not answer as %s: is it %s?%s", strings.Join(answered, ", "), name, client, tls))
	}
	return strings.Join(hints, "; ")
}

// refused is err with what to check when it is an etcd's or ZooKeeper's refusal of the CLI's
// account or session, at connect or in a command; err itself otherwise.
func (t target) refused(err error) error {
	switch {
	case t.store == storeEtcd && (errors.Is(err, rpctypes.ErrUserEmpty) || errors.Is(err, rpctypes.ErrAuthFailed) ||
		errors.Is(err, rpctypes.ErrInvalidAuthToken) || errors.Is(err, rpctypes.ErrUserNotFound)):
		// The client sends an account only when both the user and its password are given.
		err = fmt.Errorf("%w; etcd refused the account: give its user and password with -user and -pass, "+
			"or set Lock.Etcd.User and Pass in the -f file", err)
	case t.store == storeEtcd && errors.Is(err, rpctypes.ErrPermissionDenied):
		err = fmt.Errorf("%w; the etcd account %s may not read %s: grant it a role that reads that prefix "+
			"(etcdctl role grant-permission ROLE --prefix read %s), or give another with -user and -pass", err, t.etcd.User, t.keyPrefix(), t.keyPrefix())
	case t.store == storeZookeeper && errors.Is(err, zk.ErrNoAuth):
		err = fmt.Errorf("%w; the node's ACL refuses the CLI's session, which authenticates as no one: flightlock creates its nodes "+
			"readable by all, so someone else set it (getAcl on the node, in zkCli)", err)
	}
	return err
}
