// Package redisconf is the Lock.Redis section of a go-zero service and its lockstore.Driver,
// apart from redisstore so that a program using the store alone does not link go-zero.
package redisconf

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/zeromicro/go-zero/core/conf"
	zeroredis "github.com/zeromicro/go-zero/core/stores/redis"

	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/redisstore"
)

// Conf is go-zero's redis.RedisConf field for field, names, defaults and meanings (Type "node" or
// "cluster", User, Pass, Tls unverified, NonBlock false pinging within PingTimeout, Protocol,
// MaintNotifications), so a service's Redis section copies under Lock: as is. It differs:
//   - Host is optional: no Host and no Sentinel means the embedded in-memory store.
//   - Type and MaintNotifications are taken in any case; Validate names a bad one.
//   - The client never sends CLIENT SETINFO (Redis 7.0 rejects it): no DisableIdentity. A
//     LockConf built in Go has NonBlock false unless set, so it pings.
//
// It adds Lanes (redisstore.WithLanes: 0 the default, -1 none), Sentinel (the primary found
// through Sentinel; Host empty), Replicas and ReplicaTimeout (redisstore.WithReplicas).
type Conf struct {
	Host               string        `json:",optional"`
	Type               string        `json:",default=node"`
	User               string        `json:",optional"`
	Pass               string        `json:",optional"`
	Tls                bool          `json:",optional"`
	NonBlock           bool          `json:",default=true"`
	Protocol           int           `json:",default=3"`
	MaintNotifications string        `json:",default=disabled"`
	PingTimeout        time.Duration `json:",default=1s"`
	Lanes              int           `json:",optional"`
	Sentinel           SentinelConf  `json:",optional"`
	Replicas           int           `json:",optional"`
	ReplicaTimeout     time.Duration `json:",default=100ms"`
}

// SentinelConf locates the primary through Redis Sentinel: the monitored master's name, the
// Sentinels' addresses (host:port) and their own credentials.
type SentinelConf struct {
	MasterName string   `json:",optional"`
	Addrs      []string `json:",optional"`
	User       string   `json:",optional"`
	Pass       string   `json:",optional"`
}

// Embedded reports whether r names no Redis (no Host, no Sentinel): the embedded store.
func (r Conf) Embedded() bool { return r.Host == "" && r.Sentinel.MasterName == "" }

// StoreOptions are the store options that r sets (Lanes, Replicas).
func (r Conf) StoreOptions() []redisstore.Option {
	var opts []redisstore.Option
	switch {
	case r.Lanes < 0:
		opts = append(opts, redisstore.WithLanes(0))
	case r.Lanes > 0:
		opts = append(opts, redisstore.WithLanes(r.Lanes))
	}
	if r.Replicas > 0 {
		opts = append(opts, redisstore.WithReplicas(r.Replicas, r.ReplicaTimeout))
	}
	return opts
}

// Name implements lockstore.Driver.
func (r Conf) Name() string { return "redis" }

// Configured reports whether r names a Redis: a Host or a Sentinel.
func (r Conf) Configured() bool { return !r.Embedded() }

// KeyPrefix is prefix: a lock's Redis key is prefix + key.
func (r Conf) KeyPrefix(prefix string) string { return prefix }

// Check implements lockstore.Driver: Redis, or without a Host the embedded store (the go-zero
// layer opens it), serves every use.
func (r Conf) Check(string, lockstore.Use) error { return nil }

// Open implements lockstore.Driver: the store on Client, with StoreOptions, closing the client.
func (r Conf) Open(prefix string) (*lockstore.Backend, error) {
	client, err := r.Client()
	if err != nil {
		return nil, err
	}
	s := redisstore.New(client, append(r.StoreOptions(), redisstore.WithOnClose(client.Close))...)
	b := s.Describe(r.KeyPrefix(prefix))
	b.Close = s.Close
	return b, nil
}

// NewStore is the store on NewClient(conf), with opts; closing it closes the client.
func NewStore(conf zeroredis.RedisConf, opts ...redisstore.Option) (*redisstore.RedisStore, error) {
	client, err := NewClient(conf)
	if err != nil {
		return nil, err
	}
	return redisstore.New(client, append(slices.Clip(opts), redisstore.WithOnClose(client.Close))...), nil
}

// Validate implements lockstore.Driver.
func (r Conf) Validate(section, _ string) []error {
	var ps []error
	add := func(err error) {
		if err != nil {
			ps = append(ps, err)
		}
	}
	add(oneOf(section+".Type", r.Type, zeroredis.NodeType, zeroredis.ClusterType))
	if r.Lanes < -1 {
		add(lockstore.FieldError(section+".Lanes", "must be -1 (no batching), 0 (the default) or a number of lanes, got %d", r.Lanes))
	}
	if !slices.Contains([]int{0, 2, 3}, r.Protocol) {
		add(lockstore.FieldError(section+".Protocol", "must be one of 2, 3; got %d", r.Protocol))
	}
	add(oneOf(section+".MaintNotifications", r.MaintNotifications, string(maintnotifications.ModeDisabled),
		string(maintnotifications.ModeEnabled), string(maintnotifications.ModeAuto)))
	if r.PingTimeout < 0 {
		add(lockstore.FieldError(section+".PingTimeout", "must not be negative, got %v", r.PingTimeout))
	}
	add(r.checkFailover(section))
	return ps
}

// oneOf checks that v is empty (the default) or one of allowed.
func oneOf(field, v string, allowed ...string) error {
	if v == "" || slices.Contains(allowed, v) {
		return nil
	}
	return lockstore.FieldError(field, "must be one of %s; got %q", strings.Join(allowed, ", "), v)
}

// defaultReplicaTimeout is ReplicaTimeout's default, from its tag (FillDefault fails only on a
// malformed tag, which every test would hit).
var defaultReplicaTimeout = func() time.Duration {
	var c Conf
	if err := conf.FillDefault(&c); err != nil {
		panic(fmt.Sprintf("flightlock: the tags of redisconf.Conf: %v", err))
	}
	return c.ReplicaTimeout
}()

// checkFailover validates Sentinel and Replicas.
func (r Conf) checkFailover(section string) error {
	sn := r.Sentinel
	switch {
	case sn.MasterName == "" && (len(sn.Addrs) > 0 || sn.User != "" || sn.Pass != ""):
		return lockstore.FieldError(section+".Sentinel.MasterName", "is empty, but the Sentinel section sets other fields: name the master")
	case sn.MasterName != "" && len(sn.Addrs) == 0:
		return lockstore.FieldError(section+".Sentinel.Addrs", "is empty: list the Sentinels (host:port)")
	case sn.MasterName != "" && r.Host != "":
		return lockstore.FieldError(section+".Host", "is set together with Sentinel: the Sentinels name the primary; leave Host empty")
	case sn.MasterName != "" && r.Type == zeroredis.ClusterType:
		return lockstore.FieldError(section+".Type", "is cluster together with Sentinel: a Cluster fails over on its own")
	case r.Replicas < 0:
		return lockstore.FieldError(section+".Replicas", "must not be negative, got %d", r.Replicas)
	case r.ReplicaTimeout < 0:
		return lockstore.FieldError(section+".ReplicaTimeout", "must not be negative, got %v", r.ReplicaTimeout)
	case r.Replicas == 0 && r.ReplicaTimeout > 0 && r.ReplicaTimeout != defaultReplicaTimeout:
		// Zero is a Conf built in Go, not yet given its default; the default cannot be told
		// from a value written out.
		return lockstore.FieldError(section+".ReplicaTimeout", "is %v, but Replicas is 0, so no WAIT is sent for it to bound: "+
			"set Replicas, or leave ReplicaTimeout out", r.ReplicaTimeout)
	}
	if errs := lockstore.HostErrors(section+".Sentinel.Addrs", sn.Addrs); errs != nil {
		return errs[0]
	}
	return nil
}

// NewClient is the go-redis client that NewStore builds for conf.
func NewClient(conf zeroredis.RedisConf) (redis.UniversalClient, error) {
	if strings.TrimSpace(conf.Host) == "" {
		return nil, errors.New("flightlock: Redis.Host is empty (for an in-memory store, lockstore/embedded.New)")
	}
	return fromGoZero(conf).dial()
}

// fromGoZero is go-zero's conf as a Conf with no Sentinel, Lanes or Replicas.
func fromGoZero(conf zeroredis.RedisConf) Conf {
	return Conf{Host: conf.Host, Type: conf.Type, User: conf.User, Pass: conf.Pass, Tls: conf.Tls, NonBlock: conf.NonBlock,
		Protocol: conf.Protocol, MaintNotifications: conf.MaintNotifications, PingTimeout: conf.PingTimeout}
}

// Client is the go-redis client New builds for r (with Sentinel, go-redis's failover client),
// for tools and for stores built with options of their own. The caller closes it.
func (r Conf) Client() (redis.UniversalClient, error) {
	if r.Embedded() {
		return nil, lockstore.FieldError("Lock.Redis.Host", "is empty, so there is no Redis to connect to: set it, or lock through "+
			"the Middleware's Locker() (New(c.Lock).Locker()), which runs on the embedded store in development")
	}
	return r.dial()
}

// dial is the go-redis client of r, or with a Sentinel MasterName of the primary the Sentinels
// name (not using Host, Type, nor MaintNotifications, which the failover client lacks).
func (r Conf) dial() (redis.UniversalClient, error) {
	sn := r.Sentinel
	maint := &maintnotifications.Config{Mode: maintnotifications.Mode(r.MaintNotifications)}
	if maint.Mode == "" {
		maint.Mode = maintnotifications.ModeDisabled // go-zero's reading of an empty mode
	}
	opts := &redis.UniversalOptions{
		Username:                 r.User,
		Password:                 r.Pass,
		MasterName:               sn.MasterName,
		SentinelUsername:         sn.User,
		SentinelPassword:         sn.Pass,
		Protocol:                 r.Protocol,
		MaintNotificationsConfig: maint,
		DisableIdentity:          true,
		ContextTimeoutEnabled:    true,
	}
	if r.Tls {
		// go-zero's meaning of Tls, certificates not verified, so that YAML that works for the
		// service's other Redis clients works here.
		opts.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true} //nolint:gosec // go-zero's Tls
	}
	where := "addr: " + r.Host
	switch {
	case sn.MasterName != "":
		opts.Addrs, where = sn.Addrs, fmt.Sprintf("sentinel master %s at %v", sn.MasterName, sn.Addrs)
	case r.Type == "" || r.Type == zeroredis.NodeType:
		opts.Addrs = []string{r.Host} // a node's one address never makes a cluster
	case r.Type == zeroredis.ClusterType:
		opts.Addrs, opts.IsClusterMode = lockstore.TrimHosts(strings.Split(r.Host, ",")), true
	default:
		return nil, errors.New(`flightlock: Redis.Type must be "node" or "cluster", got "` + r.Type + `"`)
	}
	return connect(redis.NewUniversalClient(opts), r.NonBlock, r.PingTimeout, where)
}

// connect returns client once Redis answered a ping within timeout (0: 1s, as go-zero's
// redis.NewRedis), unless nonBlock; else it closes client, naming its Redis by where.
func connect(client redis.UniversalClient, nonBlock bool, timeout time.Duration, where string) (redis.UniversalClient, error) {
	if nonBlock {
		return client, nil
	}
	if timeout <= 0 {
		timeout = time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("flightlock: redis connect error, %s: %w", where, err)
	}
	return client, nil
}
