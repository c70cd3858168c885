package middleware

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	zeroredis "github.com/zeromicro/go-zero/core/stores/redis"
	"github.com/zeromicro/go-zero/rest"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/redisstore"
)

// WithStore builds the Locker from the LockConf on a shared store, and every lock it takes
// names its holder (host, pid) next to the owner token for operators.
func TestWithStoreUsesConfAndRecordsHolder(t *testing.T) {
	tr := newTestRedis(t)
	m, err := New(LockConf{Prefix: "svc:", Rules: []Rule{{Method: http.MethodPost, Path: "/p/:id", Key: "id:{id}"}}},
		WithStore(tr.store))
	if err != nil {
		t.Fatal(err)
	}
	var value string
	s := serverless(t, restConf(t, time.Second), m, []rest.Route{{Method: http.MethodPost, Path: "/p/:id",
		Handler: func(w http.ResponseWriter, r *http.Request) { value, _ = tr.mr.Get("svc:id:7") }}})
	rec := serve(s, httptest.NewRequest(http.MethodPost, "/p/7", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d", rec.Code)
	}
	if want := fmt.Sprintf(" pid=%d", os.Getpid()); !strings.Contains(value, " host=") || !strings.Contains(value, want) {
		t.Fatalf("lock value %q does not name its holder", value)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	// Close leaves a store given with WithStore open.
	if _, err := tr.store.TTL(context.Background(), "svc:none"); err != nil && !strings.Contains(err.Error(), "not held") {
		t.Fatalf("store closed by Middleware.Close: %v", err)
	}
}

// NewStore builds the go-redis client that go-zero's RedisConf describes, with the options
// locking needs, and the store's Close closes it.
func TestNewStoreClient(t *testing.T) {
	// NonBlock: no start-up ping (go-zero's meaning), which no server here would answer.
	node, err := NewStore(zeroredis.RedisConf{Host: "127.0.0.1:1", User: "u", Pass: "p", Tls: true, NonBlock: true})
	if err != nil {
		t.Fatal(err)
	}
	nc := node.Client().(*redis.Client)
	o := nc.Options()
	if o.Addr != "127.0.0.1:1" || o.Username != "u" || o.Password != "p" || o.Protocol != 3 ||
		o.TLSConfig == nil || o.TLSConfig.MinVersion != tls.VersionTLS12 ||
		!o.DisableIdentity || !o.ContextTimeoutEnabled {
		t.Fatalf("node client options: %+v", o)
	}
	if err := node.Close(); err != nil {
		t.Fatal(err)
	}
	if err := nc.Ping(context.Background()).Err(); !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("client after store Close: %v, want redis.ErrClosed", err)
	}

	cluster, err := NewStore(zeroredis.RedisConf{Host: " 127.0.0.1:1, 127.0.0.1:2 ,", Type: zeroredis.ClusterType, Protocol: 2, NonBlock: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	co := cluster.Client().(*redis.ClusterClient).Options()
	if strings.Join(co.Addrs, ",") != "127.0.0.1:1,127.0.0.1:2" || co.Protocol != 2 || co.TLSConfig != nil ||
		!co.DisableIdentity || !co.ContextTimeoutEnabled {
		t.Fatalf("cluster client options: %+v", co)
	}

	for _, c := range []zeroredis.RedisConf{{}, {Host: " "}, {Host: "127.0.0.1:1", Type: "sentinel"}} {
		if s, err := NewStore(c); err == nil {
			_ = s.Close()
			t.Errorf("NewStore(%+v) succeeded, want an error", c)
		}
	}
}

// A store from NewStore takes locks on the Redis it names.
func TestNewStoreLocks(t *testing.T) {
	mr := miniredis.RunT(t)
	s, err := NewStore(zeroredis.RedisConf{Host: mr.Addr(), Protocol: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Acquire(context.Background(), lockstore.Request{Key: "lock:n", Owner: "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", TTL: time.Second})
	if err != nil || !got.Acquired || !mr.Exists("lock:n") {
		t.Fatalf("acquire: %+v %v", got, err)
	}
}

// TestNoStoreRefusalNamesEtcdToo: a Lock section that names no store is refused in pro mode
// with the field that is empty, and told that an etcd store would do as well as a Redis.
func TestNoStoreRefusalNamesEtcdToo(t *testing.T) {
	conf := LockConf{Rules: []Rule{{Method: "POST", Path: "/order", Key: "order:{header.x-uid}"}}}
	_, err := New(conf, WithServiceMode("pro"))
	if err == nil || !strings.HasPrefix(err.Error(), "Lock.Redis.Host: ") || !strings.Contains(err.Error(), "Lock.Etcd.Hosts") {
		t.Fatalf("New with no store in pro mode: %v, want an error naming Lock.Redis.Host and Lock.Etcd.Hosts", err)
	}
}

// The Middleware's locks, Locker()'s among them, carry the host and pid of the core's default
// metadata and the request's trace id, which sameTrace and `flightlock show` read back.
func TestMiddlewareLocksCarryTheTraceID(t *testing.T) {
	tr := newTestRedis(t)
	m, err := New(LockConf{}, WithStore(tr.store))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	traceID := oteltrace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	ctx := oteltrace.ContextWithSpanContext(context.Background(), oteltrace.NewSpanContext(oteltrace.SpanContextConfig{
		TraceID: traceID, SpanID: oteltrace.SpanID{1}, TraceFlags: oteltrace.FlagsSampled}))
	lease, err := m.Locker().Lock(ctx, "job:interest")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	client := redis.NewClient(&redis.Options{Addr: tr.mr.Addr(), Protocol: 2, DisableIdentity: true})
	defer client.Close()
	info, err := redisstore.NewInspector(client, "lock:").Lookup(context.Background(), "job:interest")
	if err != nil || info.Trace != traceID.String() || info.Pid != strconv.Itoa(os.Getpid()) {
		t.Errorf("holder %+v, %v; want trace %s and this pid", info, err, traceID)
	}
}

// boundedTTLStore is a store that keeps no lock longer than maxTTL (as ZooKeeper's session
// bounds a lock's TTL).
type boundedTTLStore struct {
	lockstore.Store
	maxTTL time.Duration
}

func (s boundedTTLStore) Capabilities() lockstore.Capabilities {
	c := s.Store.Capabilities()
	c.MaxTTL, c.MaxTTLReason = s.maxTTL, "the test store's bound"
	return c
}

// A Lock.TTL that a store given with WithStore cannot keep is refused at start-up naming
// Lock.TTL, as it is for a store the Lock section opens.
func TestWithStoreRefusesATTLTheStoreCannotKeepNamingLockTTL(t *testing.T) {
	tr := newTestRedis(t)
	_, err := New(LockConf{TTL: 10 * time.Second}, WithStore(boundedTTLStore{tr.store, 5 * time.Second}))
	if err == nil || !strings.HasPrefix(err.Error(), "Lock.TTL: ") {
		t.Fatalf("New = %v, want an error that names Lock.TTL", err)
	}
	if _, err := New(LockConf{TTL: 5 * time.Second}, WithStore(boundedTTLStore{tr.store, 5 * time.Second})); err != nil {
		t.Fatalf("New with a TTL the store keeps = %v", err)
	}
}

// A rule's Store names where it locks; a Locker or a store given with WithLocker or WithStore
// (on a Lock section that names no other store) is the only place the rules can lock, so a
// rule that names another store is refused, naming its Store, instead of locking elsewhere.
func TestInjectedStoreRefusesARuleNamingAnotherStore(t *testing.T) {
	tr := newTestRedis(t)
	key := func(*http.Request) (string, error) { return "k", nil }
	for _, tt := range []struct {
		name  string
		c     LockConf
		opts  []Option
		field string // the field the error must name; "" for none
	}{
		{"WithLocker, a rule on the section's etcd", LockConf{Etcd: EtcdConf{Hosts: []string{"127.0.0.1:1"}},
			Rules: []Rule{{Path: "/a", Key: "a", Store: "etcd"}}}, []Option{WithLocker(tr.locker(t))}, "Lock.Rules[0].Store"},
		{"WithLocker, a Go rule on the section's ZooKeeper", LockConf{Zookeeper: ZookeeperConf{Hosts: []string{"127.0.0.1:1"}}},
			[]Option{WithLocker(tr.locker(t)), WithHTTPRule(Rule{Method: http.MethodPost, Path: "/a", Store: "Zookeeper"}, key)},
			"WithHTTPRule(POST /a).Store"},
		{"WithLocker, a rule on a store the section does not name", LockConf{Rules: []Rule{{Path: "/a", Key: "a", Store: "etcd"}}},
			[]Option{WithLocker(tr.locker(t))}, "Lock.Rules[0].Store"},
		{"WithLocker, a rule on its own store", LockConf{Rules: []Rule{{Path: "/a", Key: "a", Store: "redis"}}},
			[]Option{WithLocker(tr.locker(t))}, ""},
		{"WithStore, a rule on its own store", LockConf{Rules: []Rule{{Path: "/a", Key: "a", Store: "redis"}}},
			[]Option{WithStore(tr.store)}, ""},
	} {
		m, err := New(tt.c, tt.opts...)
		switch {
		case tt.field == "" && err != nil:
			t.Errorf("%s: %v, want the rule taken", tt.name, err)
		case tt.field != "" && (err == nil || !strings.HasPrefix(err.Error(), tt.field+":")):
			t.Errorf("%s: %v, want an error naming %s", tt.name, err, tt.field)
		}
		if err == nil {
			_ = m.Close()
		}
	}
	m, err := New(LockConf{}, WithLocker(tr.locker(t)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Route(Rule{Path: "/a", Key: "a", Store: "etcd"}); err == nil || !strings.HasPrefix(err.Error(), "Rule.Store:") {
		t.Errorf("Route naming etcd beside WithLocker: %v, want an error naming Rule.Store", err)
	}
}

// WithLocker and WithStore each say where every rule locks: given both, one of them would be
// dropped, and given nil, New would build a store of its own in their place (the embedded
// one, in dev). Both are refused at start-up, naming the option.
func TestWithLockerAndWithStoreRefuseNilAndEachOther(t *testing.T) {
	tr := newTestRedis(t)
	for _, tt := range []struct {
		name  string
		opts  []Option
		field string
	}{
		{"both", []Option{WithLocker(tr.locker(t)), WithStore(tr.store)}, "WithStore"},
		{"both, the other order", []Option{WithStore(tr.store), WithLocker(tr.locker(t))}, "WithStore"},
		{"a nil Locker", []Option{WithLocker(nil)}, "WithLocker"},
		{"a nil store", []Option{WithStore(nil)}, "WithStore"},
	} {
		m, err := New(LockConf{}, tt.opts...)
		if err == nil || !strings.HasPrefix(err.Error(), tt.field+":") || !errors.Is(err, lockstore.ErrConfig) {
			t.Errorf("%s: %v, want a config error naming %s", tt.name, err, tt.field)
		}
		if err == nil {
			_ = m.Close()
		}
	}
}

// Each rule says the kind of its locks (Permits, Mode, Fair; a plain lock when it says none),
// and its Locker derives from WithLocker's with l.With, which keeps l's kind: a read, fair or
// semaphore Locker would make a plain rule's locks reads that run together, or permits. Such a
// Locker is refused at start-up, naming WithLocker; one with other options is taken.
func TestWithLockerRefusesALockerThatIsNotAPlainLock(t *testing.T) {
	tr := newTestRedis(t)
	plain := LockConf{Rules: []Rule{{Method: http.MethodPut, Path: "/order/:id", Key: "order:{path.id}"}}}
	for _, tt := range []struct {
		name   string
		opts   []flightlock.Option
		refuse bool
	}{
		{"read", []flightlock.Option{flightlock.WithRead()}, true},
		{"fair", []flightlock.Option{flightlock.WithFair()}, true},
		{"a semaphore", []flightlock.Option{flightlock.WithPermits(3)}, true},
		{"a plain lock", nil, false},
		{"a plain lock with settings", []flightlock.Option{flightlock.WithMode(flightlock.Reject), flightlock.WithPrefix("svc:"),
			flightlock.WithFailOpen(true)}, false},
	} {
		m, err := New(plain, WithLocker(tr.locker(t, tt.opts...)))
		switch {
		case tt.refuse && (err == nil || !strings.HasPrefix(err.Error(), "WithLocker:") || !errors.Is(err, lockstore.ErrConfig)):
			t.Errorf("%s Locker: %v, want a config error naming WithLocker", tt.name, err)
		case !tt.refuse && err != nil:
			t.Errorf("%s Locker: %v, want it taken", tt.name, err)
		}
		if err == nil {
			_ = m.Close()
		}
	}
}
