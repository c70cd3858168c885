package middleware

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/middleware/rules"
)

// fields returns the Field of each problem, failing the test on one that is not a *ConfigError
// wrapping flightlock.ErrConfig.
func fields(t *testing.T, ps []error) []string {
	t.Helper()
	var out []string
	for _, p := range ps {
		var ce *ConfigError
		if !errors.As(p, &ce) || !errors.Is(p, flightlock.ErrConfig) {
			t.Fatalf("problem %v (%T) is not a *ConfigError wrapping ErrConfig", p, p)
		}
		out = append(out, ce.Field)
	}
	return out
}

func TestProblemsListsEveryBadField(t *testing.T) {
	good := Rule{Method: "POST", Path: "/api/order/create", Key: "order:{body.uid}", OnBusy: "reject"}
	c := LockConf{
		TTL:          -time.Second,
		OnStoreError: "maybe",
		Retry:        RetryConf{Backoff: "fibonacci", Min: -1},
		Rules: []Rule{
			good,
			{Path: "/a", Key: "a:{uid}", OnBusy: "queue"},
			{Method: "post", Path: "/b", Key: "b:{userId"},
			good, // the route of Rules[0] again
			{Path: "/c", Key: "c:{uid}", OnBusy: "Wait"},
			{Path: "/a", Key: "a:{uid}"}, // Rules[1] was refused: /a is free
			{RPC: "pkg.Svc.Do", Key: "x:{id}"},
		},
	}
	got := fields(t, c.Problems())
	want := []string{
		"Lock.TTL", "Lock.OnStoreError", "Lock.Retry.Backoff", "Lock.Retry.Min",
		"Lock.Rules[1].OnBusy", "Lock.Rules[2].Key", "Lock.Rules[3].Path", "Lock.Rules[6].RPC",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Problems fields = %q, want %q", got, want)
	}
	if err, first := c.Validate(), c.Problems()[0]; err == nil || err.Error() != first.Error() {
		t.Fatalf("Validate = %v, want the first problem %v", err, first)
	}
}

// A rule's store checks read the store sections as the file gives them, even beside bad
// scalars: a store given only with bad settings is still named, and its limits still apply.
func TestProblemsOfRulesBesideBadScalarsReadTheStoreSections(t *testing.T) {
	c := LockConf{
		Retry:     RetryConf{Backoff: "fibonacci"},
		Redis:     RedisConf{Host: "127.0.0.1:6379"},
		Etcd:      EtcdConf{Hosts: []string{"127.0.0.1:2379"}, LeaseMargin: 500 * time.Millisecond},
		Zookeeper: ZookeeperConf{Hosts: []string{"127.0.0.1:2181", " "}, SessionTimeout: 30 * time.Second},
		Rules: []Rule{
			{Path: "/a", Key: "a:{uid}", Store: "zookeeper", TTL: 25 * time.Second}, // over 2/3 of the session
			{Path: "/b", Key: "b:{uid}", Store: "etcd", TTL: 1500 * time.Millisecond},
			{Path: "/c", Key: "c:{uid}", Store: "zookeeper", TTL: 10 * time.Second},
			{Path: "/d", Key: "d:{uid}", Store: "redis", TTL: 1500 * time.Millisecond},
		},
	}
	got := fields(t, c.Problems())
	want := []string{"Lock.Etcd.LeaseMargin", "Lock.Zookeeper.Hosts[1]", "Lock.Retry.Backoff",
		"Lock.Rules[0].TTL", "Lock.Rules[1].TTL"}
	if !slices.Equal(got, want) {
		t.Fatalf("Problems fields = %q, want %q (%v)", got, want, c.Problems())
	}
}

func TestProblemsOfRulesWithGoodScalars(t *testing.T) {
	c := LockConf{Rules: []Rule{
		{Path: "/a", Key: "a:{uid}", OnBusy: "later"},
		{Name: "WalletLock", Key: "w:{uid}"},
		{Name: "WalletLock", Key: "w:{uid}"},
	}}
	got := fields(t, c.Problems())
	if want := []string{"Lock.Rules[0].OnBusy", "Lock.Rules[2].Name"}; !slices.Equal(got, want) {
		t.Fatalf("Problems fields = %q, want %q", got, want)
	}
	var ce *ConfigError
	if err := c.Validate(); !errors.As(err, &ce) || ce.Field != "Lock.Rules[0].OnBusy" {
		t.Fatalf("Validate = %v, want the ConfigError of Lock.Rules[0].OnBusy", err)
	}
}

func TestProblemsOfAGoodConfig(t *testing.T) {
	c := LockConf{Rules: []Rule{{Method: "post", Path: "/api/order/create", Key: "order:{body.uid}"}}}
	if ps := c.Problems(); len(ps) != 0 || c.Validate() != nil {
		t.Fatalf("Problems = %v, Validate = %v, want none", ps, c.Validate())
	}
	if len(c.Rules[0].OnBusy) != 0 {
		t.Fatal("Problems changed the caller's rules")
	}
}

func TestTemplateRefs(t *testing.T) {
	refs, err := rules.TemplateRefs("order:{body.uid}+idem:{uid}:{header.Idempotency-Key}")
	if want := []string{"body.uid", "uid", "header.Idempotency-Key"}; err != nil || !slices.Equal(refs, want) {
		t.Fatalf("TemplateRefs = %q, %v; want %q", refs, err, want)
	}
	if _, err := rules.TemplateRefs("order:{uid"); err == nil {
		t.Fatal("TemplateRefs of an unclosed brace: no error")
	}
}
