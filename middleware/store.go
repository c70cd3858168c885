package middleware

import (
	"crypto/tls"
	"errors"
	"strings"

	"github.com/flightlock/flightlock/lockstore"
	"github.com/redis/go-redis/v9"
	zeroredis "github.com/zeromicro/go-zero/core/stores/redis"
)

// NewStore builds a lock store and its go-redis client from go-zero's RedisConf: Type "node"
// (the default; Host is one address) or "cluster" (Host lists seed addresses, comma
// separated), with User, Pass, Tls and Protocol (default 3) honoured. For Sentinel, build a
// redis.NewFailoverClient and use lockstore.New; for an in-memory store, lockstore/embedded.
//
// The client is built for locking: CLIENT SETINFO is never sent (Redis 7.0 rejects it), and a
// call's context deadline bounds its socket I/O, so an unreachable Redis fails a request within
// its deadline instead of after go-redis's read timeouts and retries. Close the store to close
// the client.
//
// It lives here, in the go-zero layer, so that lockstore imports go-redis and the standard
// library only (issue 9).
func NewStore(conf zeroredis.RedisConf, opts ...lockstore.Option) (*lockstore.RedisStore, error) {
	if strings.TrimSpace(conf.Host) == "" {
		return nil, errors.New("flightlock: Redis.Host is empty (use embedded.New for an in-memory store)")
	}
	var tlsConfig *tls.Config
	if conf.Tls {
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	protocol := conf.Protocol
	if protocol == 0 {
		protocol = 3
	}
	var client redis.UniversalClient
	switch conf.Type {
	case "", zeroredis.NodeType:
		client = redis.NewClient(&redis.Options{
			Addr:                  conf.Host,
			Username:              conf.User,
			Password:              conf.Pass,
			TLSConfig:             tlsConfig,
			Protocol:              protocol,
			DisableIdentity:       true,
			ContextTimeoutEnabled: true,
		})
	case zeroredis.ClusterType:
		client = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:                 splitHosts(conf.Host),
			Username:              conf.User,
			Password:              conf.Pass,
			TLSConfig:             tlsConfig,
			Protocol:              protocol,
			DisableIdentity:       true,
			ContextTimeoutEnabled: true,
		})
	default:
		return nil, errors.New(`flightlock: Redis.Type must be "node" or "cluster", got "` + conf.Type + `"`)
	}
	all := make([]lockstore.Option, 0, len(opts)+1)
	all = append(all, opts...)
	all = append(all, lockstore.WithOnClose(client.Close))
	return lockstore.New(client, all...), nil
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
