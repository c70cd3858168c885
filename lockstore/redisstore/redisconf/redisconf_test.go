package redisconf

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/zeromicro/go-zero/core/conf"
	zeroredis "github.com/zeromicro/go-zero/core/stores/redis"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
)

// Lock.Redis is go-zero's redis.RedisConf field for field, with the same defaults, and the
// same YAML gives NewStore what go-zero's loader gives go-zero's own client. The only field
// left out is DisableIdentity (the store never sends CLIENT SETINFO); the only ones added are
// Lanes, Sentinel, Replicas and ReplicaTimeout. A field that a new go-zero adds fails this test
// until it is mirrored.
func TestRedisConfIsGoZeros(t *testing.T) {
	zt, ot := reflect.TypeFor[zeroredis.RedisConf](), reflect.TypeFor[Conf]()
	for i := range zt.NumField() {
		zf := zt.Field(i)
		if zf.Name == "DisableIdentity" {
			continue
		}
		of, ok := ot.FieldByName(zf.Name)
		switch {
		case !ok:
			t.Errorf("Lock.Redis has no %s, a field of go-zero's RedisConf", zf.Name)
		case of.Type != zf.Type:
			t.Errorf("Lock.Redis.%s is a %v, go-zero's a %v", zf.Name, of.Type, zf.Type)
		case tagDefault(of) != tagDefault(zf):
			t.Errorf("Lock.Redis.%s defaults to %q, go-zero's to %q", zf.Name, tagDefault(of), tagDefault(zf))
		}
	}
	for i := range ot.NumField() {
		// Lanes, and what go-zero's conf lacks for failover, are flightlock's own.
		if name := ot.Field(i).Name; name != "Lanes" && name != "Sentinel" && name != "Replicas" && name != "ReplicaTimeout" {
			if _, ok := zt.FieldByName(name); !ok {
				t.Errorf("Lock.Redis.%s is not a field of go-zero's RedisConf", name)
			}
		}
	}

	for _, yaml := range []string{
		"Host: 127.0.0.1:6379\n",
		"Host: a:1,b:2\nType: cluster\nUser: u\nPass: p\nTls: true\nNonBlock: false\nProtocol: 2\nMaintNotifications: auto\nPingTimeout: 250ms\n",
	} {
		var z zeroredis.RedisConf
		var o Conf
		if err := conf.LoadFromYamlBytes([]byte(yaml), &z); err != nil {
			t.Fatalf("load %q as go-zero's: %v", yaml, err)
		}
		if err := conf.LoadFromYamlBytes([]byte(yaml), &o); err != nil {
			t.Fatalf("load %q as Lock.Redis: %v", yaml, err)
		}
		o.ReplicaTimeout = 0 // flightlock's own, as Lanes, Sentinel and Replicas
		if got := fromGoZero(z); !reflect.DeepEqual(got, o) {
			t.Errorf("%q:\nNewStore gets %+v\nLock.Redis    %+v", yaml, got, o)
		}
	}
}

// tagDefault returns the default= of a field's json tag, or "".
func tagDefault(f reflect.StructField) string {
	for opt := range strings.SplitSeq(f.Tag.Get("json"), ",") {
		if v, ok := strings.CutPrefix(opt, "default="); ok {
			return v
		}
	}
	return ""
}

// With Sentinel set, Client finds the primary through the Sentinels and pings it there.
func TestClientFindsThePrimaryThroughSentinel(t *testing.T) {
	primary := redistest.Start(t)
	sentinel := redistest.StartSentinel(t, "locks", primary.Addr, time.Second)
	c := Conf{Type: zeroredis.NodeType, Protocol: 3, PingTimeout: 5 * time.Second,
		Sentinel: SentinelConf{MasterName: "locks", Addrs: []string{sentinel.Addr}}}
	client, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()
	if err := client.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := primary.Client().Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("the primary holds %q %v, want the value written through Sentinel", v, err)
	}
}
