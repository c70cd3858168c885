package middleware

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/etcdstore"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/middleware/internal/devhook"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/core/service"
	zeroredis "github.com/zeromicro/go-zero/core/stores/redis"
	"github.com/zeromicro/go-zero/core/trace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// NewStore builds a lock store and its go-redis client from go-zero's RedisConf, with go-zero's
// meanings: Type "node" (Host is one address; empty means node) or "cluster" (Host lists seed
// addresses, comma separated); User and Pass; Tls, which encrypts without verifying the
// server's certificate, as go-zero's own client does (InsecureSkipVerify; to verify, build the
// go-redis client with your tls.Config and use lockstore.New); Protocol (0 means go-redis's
// default, 3); MaintNotifications ("" means disabled, as in go-zero). With NonBlock false, as
// in a RedisConf built in Go, NewStore pings Redis and fails when it does not answer within
// PingTimeout (0 means 1s), as go-zero's redis.NewRedis does; go-zero's conf loader defaults
// NonBlock to true, which starts without a round trip. For Sentinel, build a
// redis.NewFailoverClient and use lockstore.New; for an in-memory store, lockstore/embedded.
//
// The client is built for locking: CLIENT SETINFO is never sent, whatever DisableIdentity says
// (Redis 7.0 rejects it), and a call's context deadline bounds its socket I/O, so an
// unreachable Redis fails a request within its deadline instead of after go-redis's read
// timeouts and retries. Close the store to close the client.
//
// It lives here, in the go-zero layer, so that lockstore imports go-redis and the standard
// library only.
func NewStore(conf zeroredis.RedisConf, opts ...lockstore.Option) (*lockstore.RedisStore, error) {
	client, err := newClient(conf)
	if err != nil {
		return nil, err
	}
	all := make([]lockstore.Option, 0, len(opts)+1)
	all = append(all, opts...)
	all = append(all, lockstore.WithOnClose(client.Close))
	return lockstore.New(client, all...), nil
}

// newClient is the go-redis client that NewStore builds for conf.
func newClient(conf zeroredis.RedisConf) (redis.UniversalClient, error) {
	if strings.TrimSpace(conf.Host) == "" {
		return nil, errors.New("flightlock: Redis.Host is empty (for an in-memory store, lockstore/embedded.New)")
	}
	var tlsConfig *tls.Config
	if conf.Tls {
		// go-zero's meaning of Tls (core/stores/redis: redisclientmanager.go and
		// redisclustermanager.go): encrypted, the certificate not verified. The same YAML
		// must not fail here when it works for the service's other Redis clients.
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true} //nolint:gosec // go-zero's Tls
	}
	maint := &maintnotifications.Config{Mode: maintnotifications.Mode(conf.MaintNotifications)}
	if maint.Mode == "" {
		maint.Mode = maintnotifications.ModeDisabled // go-zero's reading of an empty mode
	}
	var client redis.UniversalClient
	switch conf.Type {
	case "", zeroredis.NodeType:
		client = redis.NewClient(&redis.Options{
			Addr:                     conf.Host,
			Username:                 conf.User,
			Password:                 conf.Pass,
			TLSConfig:                tlsConfig,
			Protocol:                 conf.Protocol,
			MaintNotificationsConfig: maint,
			DisableIdentity:          true,
			ContextTimeoutEnabled:    true,
		})
	case zeroredis.ClusterType:
		client = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:                    splitHosts(conf.Host),
			Username:                 conf.User,
			Password:                 conf.Pass,
			TLSConfig:                tlsConfig,
			Protocol:                 conf.Protocol,
			MaintNotificationsConfig: maint,
			DisableIdentity:          true,
			ContextTimeoutEnabled:    true,
		})
	default:
		return nil, errors.New(`flightlock: Redis.Type must be "node" or "cluster", got "` + conf.Type + `"`)
	}
	if !conf.NonBlock {
		if err := ping(client, conf.PingTimeout); err != nil {
			_ = client.Close()
			return nil, fmt.Errorf("flightlock: redis connect error, addr: %s: %w", conf.Host, err)
		}
	}
	return client, nil
}

// Client is the go-redis client that New builds for r: go-zero's meanings for Host, Type,
// User, Pass, Tls, Protocol, MaintNotifications, NonBlock and PingTimeout (as NewStore), or,
// with Sentinel set, go-redis's failover client on the primary that the Sentinels name. For
// tools that read the locks (cmd/flightlock) and for stores built with lockstore.New and
// options of their own. The caller closes it.
func (r RedisConf) Client() (redis.UniversalClient, error) {
	if r.Sentinel.MasterName == "" {
		return newClient(r.zero())
	}
	var tlsConfig *tls.Config
	if r.Tls {
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true} //nolint:gosec // go-zero's Tls
	}
	// go-redis's failover client has no maintenance notifications: MaintNotifications is not used.
	client := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            r.Sentinel.MasterName,
		SentinelAddrs:         r.Sentinel.Addrs,
		SentinelUsername:      r.Sentinel.User,
		SentinelPassword:      r.Sentinel.Pass,
		Username:              r.User,
		Password:              r.Pass,
		TLSConfig:             tlsConfig,
		Protocol:              r.Protocol,
		DisableIdentity:       true,
		ContextTimeoutEnabled: true,
	})
	if !r.NonBlock {
		if err := ping(client, r.PingTimeout); err != nil {
			_ = client.Close()
			return nil, fmt.Errorf("flightlock: redis connect error, sentinel master %s at %v: %w", r.Sentinel.MasterName, r.Sentinel.Addrs, err)
		}
	}
	return client, nil
}

// defaultPingTimeout bounds the start-up ping when PingTimeout is 0, as in go-zero's
// redis.NewRedis.
const defaultPingTimeout = time.Second

// ping checks that Redis answers within timeout (0: defaultPingTimeout), for NonBlock false.
func ping(client redis.UniversalClient, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = defaultPingTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return client.Ping(ctx).Err()
}

// splitHosts returns the comma-separated addresses in hosts, trimmed, without empty ones.
func splitHosts(hosts string) []string {
	var out []string
	for _, h := range strings.Split(hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			out = append(out, h)
		}
	}
	return out
}

// devstoreImport is the package that links the embedded store into a binary.
const devstoreImport = "github.com/flightlock/flightlock/middleware/devstore"

// newRedisLocker builds the store that c.Redis describes and the Locker on it, for a service in
// go-zero mode mode ("" when unknown). Without a host the store is the embedded one, when the
// binary links it (devstore), and never silently: refused in pre and pro, logged at error
// level otherwise.
func newRedisLocker(c LockConf, mode string) (*flightlock.Locker, func() error, error) {
	var (
		store *lockstore.RedisStore
		err   error
	)
	if c.Redis.embedded() {
		if mode == service.PreMode || mode == service.ProMode {
			return nil, nil, fieldError("Lock.Redis.Host", "is empty in %s mode: the embedded in-memory Redis would give "+
				"each process locks of its own; set the shared Redis (for per-process locks on purpose, pass an embedded "+
				"store with WithStore)", mode)
		}
		if devhook.Open == nil {
			return nil, nil, fieldError("Lock.Redis.Host", "is empty and this binary links no embedded store: set the "+
				"shared Redis, or, for development, add import _ %q to the service's main.go", devstoreImport)
		}
		logx.Errorf("flightlock: Lock.Redis.Host is not set (service mode %q): locks live in an embedded in-memory Redis "+
			"that no other process shares, for development only; New refuses this in pre and pro mode (WithServiceMode)", cmp.Or(mode, "unknown"))
		store, err = devhook.Open(c.Redis.storeOptions()...)
	} else {
		var client redis.UniversalClient
		if client, err = c.Redis.Client(); err == nil {
			store = lockstore.New(client, append(c.Redis.storeOptions(), lockstore.WithOnClose(client.Close))...)
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("Lock.Redis: %w", err)
	}
	l, err := lockerOn(store, c)
	if err != nil {
		_ = store.Close()
		return nil, nil, err
	}
	return l, store.Close, nil
}

// lockerOn builds the Locker that c, normalized (its defaults filled from the tags), describes
// on store. Locks carry the host, pid and go-zero trace id of their holder beside the owner
// token, for operators (GET lock:order:42).
func lockerOn(store lockstore.Store, c LockConf) (*flightlock.Locker, error) {
	host, _ := os.Hostname()
	holder := "host=" + strings.ReplaceAll(host, " ", "_") + " pid=" + strconv.Itoa(os.Getpid())
	l, err := flightlock.New(store,
		flightlock.WithPrefix(c.Prefix),
		flightlock.WithTTL(c.TTL),
		flightlock.WithMaxHold(c.MaxHold),
		flightlock.WithWait(c.Wait),
		flightlock.WithRetry(c.Retry.strategy()),
		flightlock.WithMetadata(func(ctx context.Context) string {
			if id := trace.TraceIDFromContext(ctx); id != "" {
				return holder + " trace=" + id
			}
			return holder
		}),
		flightlock.WithHolderCheck(sameTrace),
	)
	if err != nil {
		return nil, fmt.Errorf("Lock: %w", err)
	}
	return l, nil
}

// sameTrace refuses to wait for a key whose holder belongs to the request's own trace: a
// nested call (a zrpc method called while its caller holds the key, go-zero propagating the
// trace) that locks its caller's key would wait for its own caller until a deadline. Different
// traces, or a request without one, wait as usual. Calls of one trace that are not nested
// (siblings that lock one key) are refused too: the check cannot tell them apart.
func sameTrace(ctx context.Context, holder string) error {
	id := trace.TraceIDFromContext(ctx)
	if id == "" {
		return nil
	}
	for _, f := range strings.Fields(holder) {
		if f == "trace="+id {
			return ErrNestedLock
		}
	}
	return nil
}

// Client is the etcd client that New builds for e, as go-zero's discov does
// (core/discov/internal: DialClient and AddTLS): e.Hosts as endpoints, User and Pass when both
// are set, TLS from CertFile, CertKeyFile and CACertFile when all three are set (with
// InsecureSkipVerify), AutoSyncInterval one minute, RejectOldCluster and PermitWithoutStream.
// DialTimeout (0 means 5s, go-zero's) bounds the first connection: New fails when no member
// answers within it. For tools that read the locks (cmd/flightlock) and stores built with
// etcdstore.New and options of their own. The caller closes it.
func (e EtcdConf) Client() (*clientv3.Client, error) {
	hosts := make([]string, 0, len(e.Hosts))
	for _, h := range e.Hosts {
		if h = strings.TrimSpace(h); h != "" {
			hosts = append(hosts, h)
		}
	}
	if len(hosts) == 0 {
		return nil, errors.New("flightlock: Etcd.Hosts is empty")
	}
	cfg := clientv3.Config{
		Endpoints:           hosts,
		AutoSyncInterval:    time.Minute,
		DialTimeout:         cmp.Or(e.DialTimeout, defaultEtcdDialTimeout),
		RejectOldCluster:    true,
		PermitWithoutStream: true,
	}
	if e.User != "" && e.Pass != "" {
		cfg.Username, cfg.Password = e.User, e.Pass
	}
	if e.CertFile != "" && e.CertKeyFile != "" && e.CACertFile != "" {
		cert, err := tls.LoadX509KeyPair(e.CertFile, e.CertKeyFile)
		if err != nil {
			return nil, fmt.Errorf("flightlock: Etcd.CertFile and CertKeyFile: %w", err)
		}
		ca, err := os.ReadFile(e.CACertFile)
		if err != nil {
			return nil, fmt.Errorf("flightlock: Etcd.CACertFile: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca) {
			return nil, fmt.Errorf("flightlock: Etcd.CACertFile %s holds no PEM certificate", e.CACertFile)
		}
		cfg.TLS = &tls.Config{
			MinVersion:         tls.VersionTLS12,
			Certificates:       []tls.Certificate{cert},
			RootCAs:            pool,
			InsecureSkipVerify: e.InsecureSkipVerify, //nolint:gosec // go-zero's InsecureSkipVerify, off by default
		}
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		if cfg.TLS != nil {
			// The etcd client retries a failed handshake until DialTimeout and then reports
			// only the timeout; the certificate error that caused it went to its log. Ask
			// the first member once more to put the cause in the error.
			if cause := tlsHandshakeError(hosts[0], cfg.TLS, min(cfg.DialTimeout, 2*time.Second)); cause != nil {
				return nil, fmt.Errorf("flightlock: etcd connect error, hosts %v: %w (TLS with %s: %v)", hosts, err, hosts[0], cause)
			}
		}
		return nil, fmt.Errorf("flightlock: etcd connect error, hosts %v: %w", hosts, err)
	}
	return cli, nil
}

// tlsHandshakeError dials host (an etcd endpoint: "https://h:p" or "h:p") within d, runs the
// TLS handshake with conf as the etcd client would (the server name from the endpoint), and
// reads once, so that a client certificate the member refuses (reported after the handshake
// in TLS 1.3) shows too. It returns the first error of those, or nil when none came in time.
func tlsHandshakeError(host string, conf *tls.Config, d time.Duration) error {
	addr := host
	if u, err := url.Parse(host); err == nil && u.Host != "" {
		addr = u.Host
	}
	name, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil
	}
	c := conf.Clone()
	if c.ServerName == "" {
		c.ServerName = name
	}
	c.NextProtos = []string{"h2"}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: d}, "tcp", addr, c)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(d))
	if _, err := conn.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
		return err
	}
	return nil
}

// isTimeout reports whether err is a deadline that passed (a member that accepted the
// handshake and waits for the client to speak first).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// defaultEtcdDialTimeout is go-zero's dial timeout for etcd (core/discov/internal/vars.go).
const defaultEtcdDialTimeout = 5 * time.Second

// newEtcdLocker builds the etcd client and store that c.Etcd describes and the Locker on
// them, whose prefix is Etcd.Key + Prefix. The returned func closes the store and then the
// client; a lock still held then runs out with its lease (etcdstore.Store.Close).
func newEtcdLocker(c LockConf) (*flightlock.Locker, func() error, error) {
	cli, err := c.Etcd.Client()
	if err != nil {
		return nil, nil, fmt.Errorf("Lock.Etcd: %w", err)
	}
	store, err := etcdstore.New(cli, etcdstore.WithLeaseMargin(c.Etcd.LeaseMargin))
	if err != nil {
		_ = cli.Close()
		return nil, nil, fmt.Errorf("Lock.Etcd: %w", err)
	}
	closeAll := func() error { return errors.Join(store.Close(), cli.Close()) }
	c.Prefix = c.Etcd.Key + c.Prefix
	l, err := lockerOn(store, c)
	if err != nil {
		_ = closeAll()
		return nil, nil, err
	}
	return l, closeAll, nil
}

// storeName is the store label of s: "etcd" for an etcd store, "redis" for any other (the
// Redis store, or one a test injected).
func storeName(s lockstore.Store) string {
	if _, ok := s.(*etcdstore.Store); ok {
		return storeEtcd
	}
	return storeRedis
}
