package middleware

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/redisstore"
	"github.com/flightlock/flightlock/lockstore/redisstore/redisconf"
	"github.com/flightlock/flightlock/middleware/rules"
	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/core/service"
	zeroredis "github.com/zeromicro/go-zero/core/stores/redis"
	"github.com/zeromicro/go-zero/core/trace"
)

// NewStore builds a lock store and its go-redis client from go-zero's RedisConf, with go-zero's
// meanings (see redisconf.Conf); with NonBlock false it pings Redis within PingTimeout. For
// Sentinel, give a redis.NewFailoverClient to redisstore.New. The client never sends CLIENT
// SETINFO (Redis 7.0 rejects it), and a call's context deadline bounds its socket I/O, so an
// unreachable Redis fails a request within its deadline. Close the store to close the client.
func NewStore(conf zeroredis.RedisConf, opts ...redisstore.Option) (*redisstore.RedisStore, error) {
	return redisconf.NewStore(conf, opts...)
}

// EmbeddedStore opens the embedded in-memory Redis that a LockConf naming no store runs on, for
// development; nil (the default) refuses such a config, so production binaries link no
// miniredis. New refuses it in pre and pro mode regardless. A development main sets:
//
//	flmw.EmbeddedStore = embedded.New // github.com/flightlock/flightlock/lockstore/embedded
var EmbeddedStore func(opts ...redisstore.Option) (*redisstore.RedisStore, error)

// embeddedStoreLine is the line that sets EmbeddedStore, as an error names it.
const embeddedStoreLine = "flmw.EmbeddedStore = embedded.New (github.com/flightlock/flightlock/lockstore/embedded)"

// openSection opens the store sec names, through its driver, or for a section naming none the
// embedded store, as EmbeddedStore and WithServiceMode say (mode: "" when unknown).
func openSection(sec rules.Section, c LockConf, mode string) (*lockstore.Backend, error) {
	if sec.Configured() {
		b, err := sec.Open(c.Prefix)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sec.Field, err)
		}
		return b, nil
	}
	shared := "the shared Redis (or Lock.Etcd.Hosts or Lock.Zookeeper.Hosts, to lock there)"
	if named, _ := c.DefaultStore(); named != sec.Name() { // only rules that name this store get here
		shared = "the shared Redis"
	}
	if mode == service.PreMode || mode == service.ProMode {
		dev := ""
		if mode == service.ProMode {
			dev = "; in development, set Mode: dev (go-zero runs a YAML without Mode in pro mode)"
		}
		return nil, rules.FieldError(sec.Field+".Host", "is empty in %s mode: the embedded in-memory Redis would give "+
			"each process locks of its own; set %s (for per-process locks on purpose, pass an embedded "+
			"store with WithStore)%s", mode, shared, dev)
	}
	if EmbeddedStore == nil {
		return nil, rules.FieldError(sec.Field+".Host", "is empty and this binary links no embedded store: set "+
			"%s, or, for development, add %s to the service's main.go", shared, embeddedStoreLine)
	}
	logx.Errorf("flightlock: %s.Host is not set (service mode %q): locks live in an embedded in-memory Redis "+
		"that no other process shares, nor any other Middleware of this one (services of one binary meet on a key "+
		"only when each gets one embedded store through WithStore), for development only; New refuses this in "+
		"pre and pro mode (WithServiceMode)", sec.Field, cmp.Or(mode, "unknown"))
	store, err := EmbeddedStore(c.Redis.StoreOptions()...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", sec.Field, err)
	}
	b := store.Describe(sec.KeyPrefix(c.Prefix))
	b.Close = store.Close
	return b, nil
}

// baseOn builds the base Locker that c, normalized, describes on b's store, under b's prefix,
// refusing a Lock.TTL the store cannot keep. Its locks carry their holder's trace id, which
// sameTrace reads back; those of Locker() are counted and logged as the rule "Locker".
func baseOn(b *lockstore.Backend, c LockConf) (*flightlock.Locker, error) {
	if err := b.Store.Capabilities().CheckTTL(c.TTL); err != nil {
		return nil, rules.FieldError("Lock.TTL", "%v", err)
	}
	l, err := flightlock.New(b.Store,
		flightlock.WithPrefix(b.Prefix),
		flightlock.WithTTL(c.TTL),
		flightlock.WithMaxHold(c.MaxHold),
		flightlock.WithWait(c.Wait),
		flightlock.WithRetry(c.Retry.Strategy()),
		flightlock.WithHolderField("trace", trace.TraceIDFromContext), // " trace=<id>" when the request has one
		flightlock.WithHolderCheck(sameTrace),
		flightlock.WithObserver(newRuleStats("Locker", "", b.Name, rules.Rule{}).observer(newLogSummary())),
	)
	if err != nil {
		return nil, fmt.Errorf("Lock: %w", err)
	}
	return l, nil
}

// sameTrace refuses to wait for a key whose holder belongs to the request's own trace: a
// nested call that locks its caller's key would wait for its caller until a deadline. Sibling
// calls of one trace on one key are refused too: the check cannot tell them apart.
func sameTrace(ctx context.Context, holder string) error {
	if id := trace.TraceIDFromContext(ctx); id != "" && slices.Contains(strings.Fields(holder), "trace="+id) {
		return ErrNestedLock
	}
	return nil
}
