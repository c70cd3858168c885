package middleware

import (
	"cmp"
	"context"
	"fmt"
	"strings"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/redisstore"
	"github.com/flightlock/flightlock/middleware/rules"
	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/core/service"
	zeroredis "github.com/zeromicro/go-zero/core/stores/redis"
	"github.com/zeromicro/go-zero/core/trace"
)

// NewStore builds a lock store and its go-redis client from go-zero's RedisConf, with go-zero's
// meanings: Type "node" (Host is one address; empty means node) or "cluster" (Host lists seed
// addresses, comma separated); User and Pass; Tls, which encrypts without verifying the
// server's certificate, as go-zero's own client does (InsecureSkipVerify; to verify, build the
// go-redis client with your tls.Config and use redisstore.New); Protocol (0 means go-redis's
// default, 3); MaintNotifications ("" means disabled, as in go-zero). With NonBlock false, as
// in a RedisConf built in Go, NewStore pings Redis and fails when it does not answer within
// PingTimeout (0 means 1s), as go-zero's redis.NewRedis does; go-zero's conf loader defaults
// NonBlock to true, which starts without a round trip. For Sentinel, build a
// redis.NewFailoverClient and use redisstore.New; for an in-memory store, lockstore/embedded.
//
// The client is built for locking: CLIENT SETINFO is never sent, whatever DisableIdentity says
// (Redis 7.0 rejects it), and a call's context deadline bounds its socket I/O, so an
// unreachable Redis fails a request within its deadline instead of after go-redis's read
// timeouts and retries. Close the store to close the client.
func NewStore(conf zeroredis.RedisConf, opts ...redisstore.Option) (*redisstore.RedisStore, error) {
	client, err := rules.NewRedisClient(conf)
	if err != nil {
		return nil, err
	}
	all := make([]redisstore.Option, 0, len(opts)+1)
	all = append(all, opts...)
	all = append(all, redisstore.WithOnClose(client.Close))
	return redisstore.New(client, all...), nil
}

// EmbeddedStore opens the embedded in-memory Redis that a LockConf naming no store runs on, for
// development; nil (the default) refuses such a config at start-up. A development binary sets
// it in main, before it builds the middleware:
//
//	flmw.EmbeddedStore = embedded.New // github.com/flightlock/flightlock/lockstore/embedded
//
// Production binaries leave it nil, and then link neither miniredis nor its Lua interpreter.
// New refuses the embedded store in pre and pro mode whatever this says.
var EmbeddedStore func(opts ...redisstore.Option) (*redisstore.RedisStore, error)

// embeddedStoreLine is the line that sets EmbeddedStore, as an error names it.
const embeddedStoreLine = "flmw.EmbeddedStore = embedded.New (github.com/flightlock/flightlock/lockstore/embedded)"

// newRedisLocker builds the store that c.Redis describes and the Locker on it, for a service in
// go-zero mode mode ("" when unknown). Without a host the store is the embedded one, when the
// binary sets EmbeddedStore, and never silently: refused in pre and pro, logged at error
// level otherwise.
func newRedisLocker(c LockConf, mode string) (*flightlock.Locker, func() error, error) {
	var (
		store *redisstore.RedisStore
		err   error
	)
	if c.Redis.Embedded() {
		shared := "the shared Redis (or Lock.Etcd.Hosts or Lock.Zookeeper.Hosts, to lock there)"
		if c.Etcd.Named() || c.Zookeeper.Named() { // only Store: redis rules get here: they need a Redis
			shared = "the shared Redis"
		}
		if mode == service.PreMode || mode == service.ProMode {
			return nil, nil, rules.FieldError("Lock.Redis.Host", "is empty in %s mode: the embedded in-memory Redis would give "+
				"each process locks of its own; set %s (for per-process locks on purpose, pass an embedded "+
				"store with WithStore)", mode, shared)
		}
		if EmbeddedStore == nil {
			return nil, nil, rules.FieldError("Lock.Redis.Host", "is empty and this binary links no embedded store: set "+
				"%s, or, for development, add %s to the service's main.go", shared, embeddedStoreLine)
		}
		logx.Errorf("flightlock: Lock.Redis.Host is not set (service mode %q): locks live in an embedded in-memory Redis "+
			"that no other process shares, for development only; New refuses this in pre and pro mode (WithServiceMode)", cmp.Or(mode, "unknown"))
		store, err = EmbeddedStore(c.Redis.StoreOptions()...)
	} else {
		var client redis.UniversalClient
		if client, err = c.Redis.Client(); err == nil {
			store = redisstore.New(client, append(c.Redis.StoreOptions(), redisstore.WithOnClose(client.Close))...)
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
// on store. Its locks carry the host, pid and go-zero trace id of their holder beside the owner
// token, which sameTrace reads back. What the locks of Locker() do (a job's, a handler's own)
// is counted and logged as the rule "Locker".
func lockerOn(store lockstore.Store, c LockConf) (*flightlock.Locker, error) {
	l, err := flightlock.New(store,
		flightlock.WithPrefix(c.Prefix),
		flightlock.WithTTL(c.TTL),
		flightlock.WithMaxHold(c.MaxHold),
		flightlock.WithWait(c.Wait),
		flightlock.WithRetry(c.Retry.Strategy()),
		flightlock.WithHolderField("trace", trace.TraceIDFromContext), // " trace=<id>" when the request has one
		flightlock.WithHolderCheck(sameTrace),
		flightlock.WithObserver(newRuleStats("Locker", "", rules.StoreName(store), rules.Rule{}).observer(newLogSummary())),
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

// newStoreLocker opens the store of section (Lock.Etcd, Lock.Zookeeper) and builds the Locker
// on it, under prefix + Prefix; a Lock.TTL the store cannot keep (its Capabilities) is
// refused naming Lock.TTL. The returned func closes the store.
func newStoreLocker[S lockstore.Store](c LockConf, section, prefix string, open func() (S, func() error, error)) (*flightlock.Locker, func() error, error) {
	store, closeStore, err := open()
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", section, err)
	}
	var l *flightlock.Locker
	if err = store.Capabilities().CheckTTL(c.TTL); err != nil {
		err = rules.FieldError("Lock.TTL", "%v", err)
	} else {
		c.Prefix = prefix + c.Prefix
		l, err = lockerOn(store, c)
	}
	if err != nil {
		_ = closeStore()
		return nil, nil, err
	}
	return l, closeStore, nil
}
