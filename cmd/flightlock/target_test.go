package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestResolveTarget(t *testing.T) {
	t.Setenv("FLIGHTLOCK_TEST_HOST", "10.0.0.9:6379")
	cases := []struct {
		name, file, content string
		o                   options
		host, prefix, typ   string // want
		err                 string // want an error containing this instead
	}{
		{name: "top-level Lock with defaults", file: "a.yaml", content: "Name: x\nLock:\n  Redis: {Host: 'r:1'}\n",
			host: "r:1", prefix: "lock:", typ: "node"},
		{name: "keys in any case, env expanded", file: "a.yaml",
			content: "lock:\n  redis: {host: '${FLIGHTLOCK_TEST_HOST}', type: Cluster}\n  prefix: 'l:'\n",
			host:    "10.0.0.9:6379", prefix: "l:", typ: "cluster"},
		{name: "several sections on one Redis", file: "a.yaml",
			content: "Order:\n  Lock: {Redis: {Host: 'r:1'}}\nBalance:\n  Lock: {Redis: {Host: 'r:1'}}\n",
			host:    "r:1", prefix: "lock:", typ: "node"},
		{name: "several sections on different Redis", file: "a.yaml",
			content: "Order:\n  Lock: {Redis: {Host: 'r:1'}}\nBalance:\n  Lock: {Redis: {Host: 'r:2'}}\n",
			err:     "choose one with -lock"},
		{name: "-lock chooses", file: "a.yaml", o: options{section: "balance.lock"},
			content: "Order:\n  Lock: {Redis: {Host: 'r:1'}}\nBalance:\n  Lock: {Redis: {Host: 'r:2'}, Prefix: 'b:'}\n",
			host:    "r:2", prefix: "b:", typ: "node"},
		{name: "-lock names no section", file: "a.yaml", o: options{section: "Nope.Lock"},
			content: "Order:\n  Lock: {Redis: {Host: 'r:1'}}\n", err: "has no Lock section Nope.Lock; it has Order.Lock"},
		{name: "Lock without Redis: embedded", file: "a.yaml",
			content: "Redis: {Host: 'shared:6379'}\nOrder:\n  Lock: {Rules: []}\n",
			err:     "pass -addr shared:6379"},
		{name: "Lock without any store names both", file: "a.yaml",
			content: "Order:\n  Lock: {Rules: []}\n",
			err:     "Order.Lock names no store, neither Redis.Host (or Sentinel) nor Etcd.Hosts nor Zookeeper.Hosts"},
		{name: "Lock on etcd read in Redis lacks a Redis only", file: "a.yaml", o: options{store: "redis"},
			content: "Order:\n  Lock: {Etcd: {Hosts: ['e:1']}}\n",
			err:     "Order.Lock.Redis has no Host: that service"},
		{name: "Lock without Redis, -addr given", file: "a.yaml", o: options{addr: "x:2"},
			content: "Order:\n  Lock: {Prefix: 'o:'}\n", host: "x:2", prefix: "o:", typ: "node"},
		{name: "flags override the file", file: "a.yaml", o: options{addr: "x:3", prefix: "p:", typ: "CLUSTER"},
			content: "Lock: {Redis: {Host: 'r:1'}}\n", host: "x:3", prefix: "p:", typ: "cluster"},
		{name: "no Lock section", file: "a.yaml", content: "Name: x\n", err: "has no Lock section"},
		{name: "bad YAML", file: "a.yaml", content: "Lock: [\n", err: "a.yaml"},
		{name: "JSON", file: "a.json", content: `{"Lock": {"Redis": {"Host": "j:1"}}}`, host: "j:1", prefix: "lock:", typ: "node"},
		{name: "TOML", file: "a.toml", content: "[Lock]\n", err: "only YAML and JSON"},
		{name: "bad type", file: "a.yaml", content: "Lock: {Redis: {Host: 'r:1', Type: sentinel}}\n", err: "Lock.Redis.Type: must be one of node, cluster"},
		{name: "no file", o: options{addr: "a:1"}, host: "a:1", prefix: "lock:", typ: "node"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := c.o
			if c.file != "" {
				o.file = writeFile(t, c.file, c.content)
			}
			got, err := resolveTarget(o)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want one containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.redis.Host != c.host || got.prefix != c.prefix || got.redis.Type != c.typ {
				t.Errorf("host %q prefix %q type %q, want %q %q %q", got.redis.Host, got.prefix, got.redis.Type, c.host, c.prefix, c.typ)
			}
		})
	}
}

// closedAddr returns a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close() // nothing listens here now
	return addr
}

func TestUsageErrors(t *testing.T) {
	closed := closedAddr(t)

	cases := []struct {
		args []string
		code int
		msg  string
	}{
		{nil, exitUsage, "no command"},
		{[]string{"-addr", "a:1", "frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{[]string{"-addr", "a:1", "show"}, exitUsage, "show takes one KEY"},
		{[]string{"-addr", "a:1", "ls", "a*", "b*"}, exitUsage, "ls takes at most one pattern"},
		{[]string{"ls"}, exitUsage, "-f etc/service.yaml or -addr"},
		{[]string{"-addr", "a:1", "-o", "xml", "ls"}, exitUsage, "-o must be table or json"},
		{[]string{"-addr", "a:1", "show", ""}, exitUsage, "empty key"},
		{[]string{"-nope", "ls"}, exitUsage, "flag provided but not defined"},
		{[]string{"-addr", closed, "-timeout", "1s", "ls"}, exitError, "cannot reach Redis at " + closed},
		{[]string{"-f", "/nonexistent/x.yaml", "ls"}, exitError, "no such file"},
	}
	for _, c := range cases {
		code, _, errs := cli(t, nil, c.args...)
		if code != c.code || !strings.Contains(errs, c.msg) {
			t.Errorf("flightlock %q: exit %d, stderr %q; want exit %d and %q", c.args, code, errs, c.code, c.msg)
		}
	}
}

// TestOddKeysAreQuoted: keys come from requests; in a table they are quoted when they hold
// control characters (a terminal escape must not repaint the screen) or spaces.
func TestOddKeysAreQuoted(t *testing.T) {
	var b strings.Builder
	locks := []lockInfo{{Key: "order:\x1b[2Jx y", Owner: "0123456789abcdef", Fence: 1, Own: true, TTLMillis: 5, Host: "h\x07"}}
	if err := lockTable(&b, locks); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(b.String(), "\x1b\x07") || !strings.Contains(b.String(), `"order:\x1b[2Jx y"`) ||
		!strings.Contains(b.String(), `host="h\a"`) {
		t.Errorf("table:\n%s", b.String())
	}
}
