package rules

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
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	clientv3 "go.etcd.io/etcd/client/v3"

	zeroredis "github.com/zeromicro/go-zero/core/stores/redis"
)

// NewRedisClient is the go-redis client that NewStore builds for conf.
func NewRedisClient(conf zeroredis.RedisConf) (redis.UniversalClient, error) {
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
// tools that read the locks (cmd/flightlock) and for stores built with redisstore.New and
// options of their own. The caller closes it.
func (r RedisConf) Client() (redis.UniversalClient, error) {
	if r.Embedded() {
		return nil, FieldError("Lock.Redis.Host", "is empty, so there is no Redis to connect to: set it, or lock through "+
			"the Middleware's Locker() (New(c.Lock).Locker()), which runs on the embedded store in development")
	}
	if r.Sentinel.MasterName == "" {
		return NewRedisClient(r.zero())
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
		return nil, FieldError("Lock.Etcd.Hosts", "is empty: list the etcd members to connect to")
	}
	cfg := clientv3.Config{
		Endpoints:           hosts,
		AutoSyncInterval:    time.Minute,
		DialTimeout:         cmp.Or(e.DialTimeout, defaultEtcdDialTimeout),
		RejectOldCluster:    true,
		PermitWithoutStream: true,
		// Pings find a member cut off with its connections open (frozen, or behind a black
		// hole): without them the client keeps sending a share of its calls there, and a
		// waiter's attempts can land on it until its wait runs out. Six seconds is the first
		// whole second etcd accepts by default (--grpc-keepalive-min-time 5s).
		DialKeepAliveTime:    6 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
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
