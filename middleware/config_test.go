package middleware

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/lockstore/redisstore"
	"github.com/zeromicro/go-zero/core/conf"
	_ "google.golang.org/grpc/reflection/grpc_reflection_v1" // registers a service for field checks
)

func TestValidateNamesTheField(t *testing.T) {
	ok := Rule{Method: http.MethodPost, Path: "/api/order/:uid", Key: "order:{uid}", OnBusy: "reject"}
	tests := []struct {
		name  string
		edit  func(c *LockConf)
		field string // "" means valid
	}{
		{"valid", func(*LockConf) {}, ""},
		{"valid rpc", func(c *LockConf) { c.Rules = append(c.Rules, Rule{RPC: "/pkg.Svc/Do", Key: "x:{id}"}) }, ""},
		{"words in any case", func(c *LockConf) {
			c.OnStoreError, c.Redis.Type, c.Retry.Backoff = "Open", "CLUSTER", "Linear"
			c.Rules[0].Method, c.Rules[0].OnBusy = "post", "Wait"
		}, ""},
		{"negative TTL", func(c *LockConf) { c.TTL = -time.Second }, "Lock.TTL:"},
		{"negative Wait", func(c *LockConf) { c.Wait = -1 }, "Lock.Wait:"},
		{"bad OnStoreError", func(c *LockConf) { c.OnStoreError = "maybe" }, "Lock.OnStoreError:"},
		{"bad backoff", func(c *LockConf) { c.Retry.Backoff = "fibonacci" }, "Lock.Retry.Backoff:"},
		{"bad redis type", func(c *LockConf) { c.Redis.Type = "sentinel" }, "Lock.Redis.Type:"},
		{"unknown OnBusy", func(c *LockConf) { c.Rules[0].OnBusy = "queue" }, "Lock.Rules[0].OnBusy:"},
		{"negative rule TTL", func(c *LockConf) { c.Rules[0].TTL = -1 }, "Lock.Rules[0].TTL:"},
		{"negative rule Wait", func(c *LockConf) { c.Rules[0].Wait = -1 }, "Lock.Rules[0].Wait:"},
		{"empty key", func(c *LockConf) { c.Rules[0].Key = "" }, "Lock.Rules[0].Key:"},
		{"unknown source", func(c *LockConf) { c.Rules[0].Key = "order:{foo.bar}" }, "Lock.Rules[0].Key:"},
		{"missing path var", func(c *LockConf) { c.Rules[0].Key = "order:{path.id}" }, "Lock.Rules[0].Key:"},
		{"unclosed brace", func(c *LockConf) { c.Rules[0].Key = "order:{uid" }, "Lock.Rules[0].Key:"},
		{"no route", func(c *LockConf) { c.Rules[0].Path = ""; c.Rules[0].Method = "" }, "Lock.Rules[0]:"},
		{"bad route", func(c *LockConf) { c.Rules[0].Path = "api/order" }, "Lock.Rules[0].Path:"},
		{"double slash", func(c *LockConf) { c.Rules[0].Path = "//api" }, "Lock.Rules[0].Path:"},
		{"bad method", func(c *LockConf) { c.Rules[0].Method = "FETCH" }, "Lock.Rules[0].Method:"},
		{"bad rpc", func(c *LockConf) { c.Rules[0].RPC = "pkg.Svc.Do" }, "Lock.Rules[0].RPC:"},
		{"duplicate route", func(c *LockConf) { c.Rules = append(c.Rules, ok) }, "Lock.Rules[1].Path:"},
		{"second rule", func(c *LockConf) { c.Rules = append(c.Rules, Rule{Path: "/x", Key: "x:{a}", OnBusy: "later"}) }, "Lock.Rules[1].OnBusy:"},
		{"registered rpc field", func(c *LockConf) {
			c.Rules = append(c.Rules, Rule{RPC: "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", Key: "h:{host}"})
		}, ""},
		{"unknown rpc field", func(c *LockConf) {
			c.Rules = append(c.Rules, Rule{RPC: "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", Key: "h:{hots}"})
		}, "Lock.Rules[1].Key:"},
		{"rpc message field", func(c *LockConf) {
			c.Rules = append(c.Rules, Rule{RPC: "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", Key: "h:{file_containing_extension}"})
		}, "Lock.Rules[1].Key:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := LockConf{Rules: []Rule{ok}}
			tt.edit(&c)
			err := c.Validate()
			switch {
			case tt.field == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tt.field != "" && (err == nil || !strings.HasPrefix(err.Error(), tt.field)):
				t.Fatalf("Validate = %v, want an error naming %s", err, tt.field)
			case tt.field != "" && (!errors.Is(err, flightlock.ErrConfig) || errors.Is(err, flightlock.ErrInvalidKey)):
				t.Fatalf("Validate = %v, want an ErrConfig", err)
			}
		})
	}
}

func TestLoadYAML(t *testing.T) {
	type config struct {
		Name string
		Lock LockConf
	}
	const good = `
Name: order-api
Lock:
  Rules:
    - Method: POST
      Path: /api/order/create
      Key: "order:{uid}"
    - RPC: /inventory.Inventory/Deduct
      Key: "sku:{sku}"
      OnBusy: wait
      Wait: 500ms
`
	var c config
	if err := conf.LoadFromYamlBytes([]byte(good), &c); err != nil {
		t.Fatalf("load: %v", err)
	}
	// go-zero leaves an absent optional section (Redis, Retry) at its zero value, which New
	// reads as the defaults.
	l := c.Lock
	switch {
	case l.Redis.Host != "":
		t.Errorf("Redis = %+v, want no host", l.Redis)
	case l.Prefix != "lock:" || l.TTL != 10*time.Second || l.MaxHold != time.Minute || l.Wait != 2*time.Second:
		t.Errorf("defaults not filled: %+v", l)
	case l.OnStoreError != "closed":
		t.Errorf("defaults not filled: %+v", l)
	case l.Rules[0].OnBusy != "wait" || l.Rules[1].OnBusy != "wait" || l.Rules[1].Wait != 500*time.Millisecond:
		t.Errorf("rules = %+v", l.Rules)
	}
	if err := l.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}

	// The embedded store runs when no host is set.
	m, err := New(l)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer m.Close()
	lease, err := m.Locker().TryLock(context.Background(), "probe")
	if err != nil {
		t.Fatalf("lock on the embedded store: %v", err)
	}
	if err := lease.Release(context.Background()); err != nil {
		t.Fatalf("release: %v", err)
	}

}

func TestLoadYAMLSectionDefaults(t *testing.T) {
	var r RedisConf
	if err := conf.LoadFromYamlBytes([]byte("Host: 127.0.0.1:6379\n"), &r); err != nil || r.Type != "node" || r.Protocol != 3 {
		t.Errorf("RedisConf defaults: %+v, %v", r, err)
	}
	var rc RetryConf
	if err := conf.LoadFromYamlBytes([]byte("Attempts: 3\n"), &rc); err != nil ||
		rc.Backoff != "exponential" || rc.Min != 5*time.Millisecond || rc.Max != 200*time.Millisecond {
		t.Errorf("RetryConf defaults: %+v, %v", rc, err)
	}
}

func TestLoadYAMLRefusesBadValues(t *testing.T) {
	type config struct {
		Name string
		Lock LockConf
	}

	// A value go-zero cannot parse fails at load, naming the value.
	if err := conf.LoadFromYamlBytes([]byte("Name: x\nLock:\n  TTL: ten\n"), &config{}); err == nil || !strings.Contains(err.Error(), "ten") {
		t.Errorf("load TTL: ten: %v, want an error naming %q", err, "ten")
	}
	// A word outside the allowed ones loads (the tags have no options=, whose check named no
	// field and was case-sensitive) and is refused by Validate, naming the field, the value and
	// the allowed values.
	bad := []struct {
		yaml, field, value, allowed string
	}{
		{"Lock:\n  Rules:\n    - Path: /a\n      Key: \"a:{x}\"\n      OnBusy: maybe\n", "Lock.Rules[0].OnBusy: ", "maybe", "reject, wait"},
		{"Lock:\n  Rules:\n    - Method: fetch\n      Path: /a\n      Key: \"a:{x}\"\n", "Lock.Rules[0].Method: ", "FETCH", "GET, HEAD, POST"},
		{"Lock:\n  OnStoreError: sometimes\n", "Lock.OnStoreError: ", "sometimes", "closed, open"},
		{"Lock:\n  Redis:\n    Host: 127.0.0.1:1\n    Type: ring\n", "Lock.Redis.Type: ", "ring", "node, cluster"},
		{"Lock:\n  Redis:\n    Host: 127.0.0.1:1\n    Protocol: 1\n", "Lock.Redis.Protocol: ", "1", "2, 3"},
		{"Lock:\n  Retry:\n    Backoff: random\n", "Lock.Retry.Backoff: ", "random", "none, linear, exponential"},
	}
	for _, tt := range bad {
		var c config
		if err := conf.LoadFromYamlBytes([]byte("Name: x\n"+tt.yaml), &c); err != nil {
			t.Errorf("load %q: %v", tt.yaml, err)
			continue
		}
		err := c.Lock.Validate()
		if err == nil || !strings.HasPrefix(err.Error(), tt.field) || !strings.Contains(err.Error(), tt.value) ||
			!strings.Contains(err.Error(), tt.allowed) || !errors.Is(err, flightlock.ErrConfig) {
			t.Errorf("Validate of %q: %v, want an ErrConfig naming %s, %q and %s", tt.yaml, err, tt.field, tt.value, tt.allowed)
		}
	}

	// go-zero runs Validate on the top-level config only: a LockConf loaded on its own is
	// checked at load time, one inside a service's config by New (or the service's Validate).
	// Either way the message names the field.
	const negative = "Rules:\n  - Path: /a\n    Key: \"a:{x}\"\n    TTL: -1s\n"
	var lc LockConf
	if err := conf.LoadFromYamlBytes([]byte(negative), &lc); err == nil || !strings.HasPrefix(err.Error(), "Lock.Rules[0].TTL") {
		t.Errorf("load negative TTL: %v, want an error naming Lock.Rules[0].TTL", err)
	}
	var sc config
	if err := conf.LoadFromYamlBytes([]byte("Name: x\nLock:\n  "+strings.ReplaceAll(negative, "\n", "\n  ")), &sc); err != nil {
		t.Fatalf("load: %v", err)
	}
	if _, err := New(sc.Lock); err == nil || !strings.HasPrefix(err.Error(), "Lock.Rules[0].TTL") {
		t.Errorf("New with a negative TTL: %v, want an error naming Lock.Rules[0].TTL", err)
	}
}

func TestRetryStrategy(t *testing.T) {
	tests := []struct {
		conf     RetryConf
		attempt  int
		min, max time.Duration
		ok       bool
	}{
		{RetryConf{Backoff: "none"}, 1, 0, 0, false},
		{RetryConf{Backoff: "linear", Min: 10 * time.Millisecond, Max: 25 * time.Millisecond}, 2, 20 * time.Millisecond, 20 * time.Millisecond, true},
		{RetryConf{Backoff: "linear", Min: 10 * time.Millisecond, Max: 25 * time.Millisecond}, 5, 25 * time.Millisecond, 25 * time.Millisecond, true},
		{RetryConf{Backoff: "exponential", Min: 8 * time.Millisecond, Max: 100 * time.Millisecond}, 2, 8 * time.Millisecond, 16 * time.Millisecond, true},
		{RetryConf{Min: 8 * time.Millisecond, Max: 100 * time.Millisecond, Attempts: 3}, 3, 0, 0, false},
	}
	for _, tt := range tests {
		d, ok := tt.conf.Strategy()(tt.attempt)
		if ok != tt.ok || (ok && (d < tt.min || d > tt.max)) {
			t.Errorf("%+v attempt %d = %v, %v; want [%v, %v], %v", tt.conf, tt.attempt, d, ok, tt.min, tt.max, tt.ok)
		}
	}
}

// Lock.Redis.Lanes reaches the store: unset is the default, -1 turns batching off, and
// anything below -1 is refused with the field's name.
func TestRedisLanes(t *testing.T) {
	for _, tt := range []struct {
		yaml  string
		lanes int
	}{
		{"Lock:\n  Prefix: \"l:\"\n", redisstore.DefaultLanes},
		{"Lock:\n  Redis:\n    Lanes: -1\n", 0},
		{"Lock:\n  Redis:\n    Lanes: 8\n", 8},
	} {
		var c struct{ Lock LockConf }
		if err := conf.LoadFromYamlBytes([]byte(tt.yaml), &c); err != nil {
			t.Fatalf("%q: %v", tt.yaml, err)
		}
		m, err := New(c.Lock)
		if err != nil {
			t.Fatalf("%q: New: %v", tt.yaml, err)
		}
		store, ok := m.Locker().Store().(*redisstore.RedisStore)
		if !ok {
			t.Fatalf("%q: store is %T", tt.yaml, m.Locker().Store())
		}
		if got := store.Lanes(); got != tt.lanes {
			t.Errorf("%q: store has %d lanes, want %d", tt.yaml, got, tt.lanes)
		}
		_ = m.Close()
	}
	_, err := New(LockConf{Redis: RedisConf{Lanes: -2}})
	if err == nil || !strings.Contains(err.Error(), "Lock.Redis.Lanes") {
		t.Fatalf("Lanes -2: %v, want an error that names Lock.Redis.Lanes", err)
	}
}

// TestLoadYAMLWords loads YAML through go-zero's own loader: a bad word fails naming the
// field and what it accepts (go-zero runs Validate when LockConf is the config it loads; New
// runs it for a LockConf inside a service's config), and the words are taken in any case, as
// goctl's .api files spell methods (post).
func TestLoadYAMLWords(t *testing.T) {
	const bogus = "Rules:\n  - Method: POST\n    Path: /api/order/:uid\n    Key: \"order:{uid}\"\n    OnBusy: bogus\n"
	var lc LockConf
	err := conf.LoadFromYamlBytes([]byte(bogus), &lc)
	if err == nil || !strings.HasPrefix(err.Error(), "Lock.Rules[0].OnBusy: ") || !strings.Contains(err.Error(), `"bogus"`) ||
		!strings.Contains(err.Error(), "reject, wait") || !errors.Is(err, flightlock.ErrConfig) {
		t.Errorf("load OnBusy: bogus: %v, want an ErrConfig naming Lock.Rules[0].OnBusy, the value and reject, wait", err)
	}
	var sc struct{ Lock LockConf }
	if err := conf.LoadFromYamlBytes([]byte("Lock:\n  "+strings.ReplaceAll(bogus, "\n", "\n  ")), &sc); err != nil {
		t.Fatalf("load inside a service config: %v", err)
	}
	if _, err := New(sc.Lock); err == nil || !strings.HasPrefix(err.Error(), "Lock.Rules[0].OnBusy: ") || !errors.Is(err, flightlock.ErrConfig) {
		t.Errorf("New with OnBusy: bogus: %v, want an ErrConfig naming Lock.Rules[0].OnBusy", err)
	}

	const anyCase = `OnStoreError: Open
Redis:
  Type: Node
Retry:
  Backoff: Linear
Rules:
  - Method: post
    Path: /api/order/:uid
    Key: "order:{uid}"
    OnBusy: Wait
`
	lc = LockConf{}
	if err := conf.LoadFromYamlBytes([]byte(anyCase), &lc); err != nil {
		t.Fatalf("load words in any case: %v", err)
	}
	n := lc.Normalized()
	if n.OnStoreError != "open" || n.Redis.Type != "node" || n.Retry.Backoff != "linear" ||
		n.Rules[0].Method != http.MethodPost || n.Rules[0].OnBusy != "wait" {
		t.Errorf("normalized: %+v", n)
	}
	if lc.Rules[0].Method != "post" {
		t.Error("normalized changed the config it was given")
	}
}

// Sentinel and Replicas load from YAML, reach the store's options, and bad combinations are
// refused naming the field.
func TestRedisFailoverConf(t *testing.T) {
	const yaml = "Lock:\n  Redis:\n    Sentinel:\n      MasterName: main\n      Addrs: [\"10.0.0.1:26379\", \"10.0.0.2:26379\"]\n" +
		"      Pass: s3cret\n    Replicas: 1\n"
	var c struct{ Lock LockConf }
	if err := conf.LoadFromYamlBytes([]byte(yaml), &c); err != nil {
		t.Fatal(err)
	}
	r := c.Lock.Redis
	if r.Sentinel.MasterName != "main" || len(r.Sentinel.Addrs) != 2 || r.Sentinel.Pass != "s3cret" || r.Replicas != 1 ||
		r.ReplicaTimeout != 100*time.Millisecond || r.Embedded() {
		t.Errorf("loaded %+v", r)
	}
	if got := len(r.StoreOptions()); got != 1 {
		t.Errorf("%d store options, want WithReplicas", got)
	}
	if err := c.Lock.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	if err := (LockConf{Redis: RedisConf{Host: "h:1", Replicas: 1, ReplicaTimeout: time.Second}}).Validate(); err != nil {
		t.Errorf("Validate with Replicas and a ReplicaTimeout: %v", err)
	}
	for _, tt := range []struct {
		redis RedisConf
		field string
	}{
		{RedisConf{Sentinel: SentinelConf{MasterName: "m"}}, "Lock.Redis.Sentinel.Addrs"},
		{RedisConf{Sentinel: SentinelConf{Addrs: []string{"a:1"}}}, "Lock.Redis.Sentinel.MasterName"},
		{RedisConf{Host: "h:1", Sentinel: SentinelConf{MasterName: "m", Addrs: []string{"a:1"}}}, "Lock.Redis.Host"},
		{RedisConf{Type: "cluster", Sentinel: SentinelConf{MasterName: "m", Addrs: []string{"a:1"}}}, "Lock.Redis.Type"},
		{RedisConf{Sentinel: SentinelConf{MasterName: "m", Addrs: []string{" "}}}, "Lock.Redis.Sentinel.Addrs[0]"},
		{RedisConf{Host: "h:1", Replicas: -1}, "Lock.Redis.Replicas"},
		{RedisConf{Host: "h:1", ReplicaTimeout: -time.Second}, "Lock.Redis.ReplicaTimeout"},
		// No WAIT is sent without Replicas: a ReplicaTimeout of its own would be ignored.
		{RedisConf{Host: "h:1", ReplicaTimeout: time.Second}, "Lock.Redis.ReplicaTimeout"},
	} {
		err := LockConf{Redis: tt.redis}.Validate()
		if !errors.Is(err, flightlock.ErrConfig) || !strings.Contains(err.Error(), tt.field+":") {
			t.Errorf("%+v: %v, want an error naming %s", tt.redis, err, tt.field)
		}
	}
}
