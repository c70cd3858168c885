package middleware

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/lockstore/embedded"
	"github.com/flightlock/flightlock/middleware/rules"
	"github.com/zeromicro/go-zero/core/conf"
	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/core/logx/logtest"
	zeroredis "github.com/zeromicro/go-zero/core/stores/redis"
	"github.com/zeromicro/go-zero/rest"
)

// An empty Lock: section loaded by go-zero and a LockConf built in Go get the same settings,
// from one source, the tags, and where the core has a default of the same meaning,
// the tag equals it. A bare "Lock:" is YAML null, which go-zero's loader refuses as a type
// mismatch: "Lock: {}" is the empty section.
func TestDefaultsHaveOneSource(t *testing.T) {
	var loaded struct{ Lock LockConf }
	if err := conf.LoadFromYamlBytes([]byte("Lock: {}\n"), &loaded); err != nil {
		t.Fatalf("load: %v", err)
	}
	fromYAML, fromGo := loaded.Lock.Normalized(), LockConf{}.Normalized() // what New builds from
	if !reflect.DeepEqual(fromYAML, fromGo) {
		t.Fatalf("defaults differ:\nloaded   %+v\nbuilt in Go %+v", fromYAML, fromGo)
	}
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"Prefix", fromGo.Prefix, flightlock.DefaultPrefix},
		{"TTL", fromGo.TTL, flightlock.DefaultTTL},
		{"MaxHold", fromGo.MaxHold, flightlock.DefaultMaxHold},
		{"Wait", fromGo.Wait, flightlock.DefaultWait},
		{"Retry.Backoff", fromGo.Retry.Backoff, rules.BackoffExponential}, // flightlock.DefaultRetry is ExponentialRetry
		{"Retry.Min", fromGo.Retry.Min, flightlock.DefaultRetryMin},
		{"Retry.Max", fromGo.Retry.Max, flightlock.DefaultRetryMax},
		{"Retry.Attempts", fromGo.Retry.Attempts, 0},                   // the core's retry has no cap
		{"OnStoreError", fromGo.OnStoreError, rules.StoreErrorsClosed}, // the core fails closed unless WithFailOpen
		{"Redis.Type", fromGo.Redis.Type, zeroredis.NodeType},          // go-zero's
		{"Redis.Protocol", fromGo.Redis.Protocol, 3},                   // go-zero's
		{"Redis.PingTimeout", fromGo.Redis.PingTimeout, time.Second},   // go-zero's
	} {
		if c.got != c.want {
			t.Errorf("default %s = %v, want %v", c.name, c.got, c.want)
		}
	}

	// A rule's OnBusy: the same whether loaded or built in Go (WithHTTPRule, Route). It is
	// "reject", while the core's default mode is flightlock.Wait (DESIGN.md names wait as the
	// default): kept as it is, on purpose, for the behaviour existing configs rely on.
	var withRule struct{ Lock LockConf }
	if err := conf.LoadFromYamlBytes([]byte("Lock:\n  Rules:\n    - Path: /a/:x\n      Key: \"a:{x}\"\n"), &withRule); err != nil {
		t.Fatalf("load: %v", err)
	}
	loadedRule := withRule.Lock.Normalized().Rules[0]
	goRule := Rule{Path: "/a/:x", Key: "a:{x}"}.Normalized()
	if loadedRule.OnBusy != rules.OnBusyWait || goRule.OnBusy != rules.OnBusyWait {
		t.Errorf("rule OnBusy defaults: loaded %q, built in Go %q; want %q", loadedRule.OnBusy, goRule.OnBusy, rules.OnBusyWait)
	}

	// The Locker New builds gets them: a lock is "lock:" + key, with a 10s TTL, both ways.
	for _, c := range []LockConf{loaded.Lock, {}} {
		tr := newTestRedis(t)
		m, err := New(c, WithStore(tr.store))
		if err != nil {
			t.Fatal(err)
		}
		lease, err := m.Locker().TryLock(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		if got := tr.mr.TTL(flightlock.DefaultPrefix + "k"); got != flightlock.DefaultTTL {
			t.Errorf("lock %q has TTL %v, want %v", flightlock.DefaultPrefix+"k", got, flightlock.DefaultTTL)
		}
		_ = lease.Release(context.Background())
		_ = m.Close()
	}
}

// NonBlock and PingTimeout mean what they mean in go-zero: NonBlock false pings Redis in New,
// which fails when no answer comes within PingTimeout; NonBlock true (the loader's default)
// starts without a round trip.
func TestRedisNonBlockPings(t *testing.T) {
	refused := closedAddr(t)
	silent := silentAddr(t)
	load := func(yaml string) LockConf {
		t.Helper()
		var c struct{ Lock LockConf }
		if err := conf.LoadFromYamlBytes([]byte(yaml), &c); err != nil {
			t.Fatalf("load %q: %v", yaml, err)
		}
		return c.Lock
	}

	// The loader's default: no ping, New succeeds with nobody listening.
	m, err := New(load("Lock:\n  Redis:\n    Host: " + refused + "\n"))
	if err != nil {
		t.Fatalf("NonBlock by default: %v", err)
	}
	_ = m.Close()

	for _, tt := range []struct {
		name string
		conf LockConf
	}{
		{"refused", load("Lock:\n  Redis:\n    Host: " + refused + "\n    NonBlock: false\n    PingTimeout: 300ms\n")},
		{"silent", load("Lock:\n  Redis:\n    Host: " + silent + "\n    NonBlock: false\n    PingTimeout: 150ms\n")},
		// Built in Go, NonBlock is false unless set, as in go-zero's RedisConf.
		{"built in Go", LockConf{Redis: RedisConf{Host: silent, PingTimeout: 150 * time.Millisecond}}},
	} {
		start := time.Now()
		m, err := New(tt.conf)
		if err == nil {
			_ = m.Close()
			t.Errorf("%s: New succeeded, want a connect error", tt.name)
			continue
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("%s: New took %v, want about PingTimeout", tt.name, took)
		}
		if !strings.HasPrefix(err.Error(), "Lock.Redis: ") || !strings.Contains(err.Error(), "connect") {
			t.Errorf("%s: %v, want a connect error naming Lock.Redis", tt.name, err)
		}
	}

	mr := miniredis.RunT(t)
	m, err = New(LockConf{Redis: RedisConf{Host: mr.Addr(), Protocol: 2}})
	if err != nil {
		t.Fatalf("NonBlock false on a live Redis: %v", err)
	}
	_ = m.Close()
}

// Tls means what it means in go-zero: the connection is encrypted and the server's
// certificate is not verified, so a Redis section that works for a service's go-zero Redis
// client works for its locks too. (A client that verified the certificate would fail every
// lock against such a server.)
func TestRedisTlsAsGoZero(t *testing.T) {
	mr := miniredis.NewMiniRedis()
	if err := mr.StartTLS(&tls.Config{Certificates: []tls.Certificate{selfSigned(t)}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mr.Close)

	// go-zero's own client, from the same section.
	yaml := "Host: " + mr.Addr() + "\nTls: true\nNonBlock: false\nProtocol: 2\n"
	var z zeroredis.RedisConf
	if err := conf.LoadFromYamlBytes([]byte(yaml), &z); err != nil {
		t.Fatal(err)
	}
	if _, err := zeroredis.NewRedis(z); err != nil {
		t.Fatalf("go-zero's client: %v", err)
	}

	var c struct{ Lock LockConf }
	if err := conf.LoadFromYamlBytes([]byte("Lock:\n  Redis:\n    "+strings.ReplaceAll(strings.TrimSpace(yaml), "\n", "\n    ")+"\n"), &c); err != nil {
		t.Fatal(err)
	}
	m, err := New(c.Lock)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer m.Close()
	lease, err := m.Locker().TryLock(context.Background(), "tls")
	if err != nil {
		t.Fatalf("lock over TLS: %v", err)
	}
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Without a Redis host, the embedded store is never chosen silently: in go-zero's pre and pro
// modes New refuses it, naming Lock.Redis.Host; otherwise it is logged at error level.
func TestEmbeddedNeverSilent(t *testing.T) {
	// A goctl-generated YAML has no Mode: go-zero then runs the service in pro mode.
	var svc struct {
		rest.RestConf
		Lock LockConf
	}
	if err := conf.LoadFromYamlBytes([]byte("Name: order-api\nHost: 0.0.0.0\nPort: 8888\n"), &svc); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{svc.Mode, "pre", "PRO"} {
		m, err := New(svc.Lock, WithServiceMode(mode))
		if err == nil {
			_ = m.Close()
			t.Errorf("mode %s: New chose the embedded store", mode)
			continue
		}
		if !strings.HasPrefix(err.Error(), "Lock.Redis.Host: ") || !errors.Is(err, flightlock.ErrConfig) {
			t.Errorf("mode %s: %v, want an ErrConfig naming Lock.Redis.Host", mode, err)
		}
		// A YAML without Mode is in pro mode: the refusal says how a development service runs.
		if mode == svc.Mode && !strings.Contains(err.Error(), "set Mode: dev") {
			t.Errorf("mode %s (the YAML's default): %v, want it to say how to run in development", mode, err)
		}
	}
	if _, err := New(LockConf{}, WithServiceMode("prod")); err == nil ||
		!strings.HasPrefix(err.Error(), "WithServiceMode: ") || !errors.Is(err, flightlock.ErrConfig) {
		t.Errorf("mode prod: %v, want an ErrConfig naming WithServiceMode", err)
	}

	// In pro mode, per-process locks are still possible on purpose, and a host is enough.
	store, err := embedded.New()
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	mr := miniredis.RunT(t)
	for name, c := range map[string]struct {
		conf LockConf
		opts []Option
	}{
		"WithStore": {LockConf{}, []Option{WithStore(store)}},
		"host":      {LockConf{Redis: RedisConf{Host: mr.Addr(), NonBlock: true}}, nil},
	} {
		m, err := New(c.conf, append(c.opts, WithServiceMode("pro"))...)
		if err != nil {
			t.Errorf("pro mode with %s: %v", name, err)
			continue
		}
		_ = m.Close()
	}

	// In the other modes, and when the mode is not given, the embedded store runs, logged as
	// an error.
	logx.SetLevel(logx.InfoLevel) // TestMain disabled the logs
	t.Cleanup(logx.Disable)
	for _, opts := range [][]Option{{WithServiceMode("dev")}, {WithServiceMode("test")}, nil} {
		logs := logtest.NewCollector(t)
		m, err := New(LockConf{Rules: []Rule{{Method: http.MethodPost, Path: "/a/:x", Key: "a:{x}"}}}, opts...)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		_ = m.Close()
		if out := logs.String(); !strings.Contains(out, `"level":"error"`) || !strings.Contains(out, "Lock.Redis.Host is not set") {
			t.Errorf("options %d: the embedded store was logged as %q, want an error", len(opts), out)
		}
	}
}

// closedAddr returns a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// silentAddr returns a loopback address that accepts connections and never answers.
func silentAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				_ = c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
	})
	return ln.Addr().String()
}

// selfSigned returns a certificate for 127.0.0.1 that no authority signed.
func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "redis"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
