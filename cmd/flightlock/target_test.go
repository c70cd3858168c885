package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
)

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
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

// A flag that only some commands read is refused on the others, naming the flag and the
// commands it is for: -yes on ls, or -limit on watch, would otherwise do nothing, silently.
// On its own commands it is taken (the command then fails only to reach the store).
func TestFlagsOfOtherCommandsAreRefused(t *testing.T) {
	closed := closedAddr(t)
	cases := []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"-addr", "a:1", "-yes", "ls"}, exitUsage, "-yes is unlock's: ls ignores it"},
		{[]string{"-addr", "a:1", "-limit", "5", "show", "k"}, exitUsage, "-limit is ls's: show ignores it"},
		{[]string{"-addr", "a:1", "show", "k", "-shadow"}, exitUsage, "-shadow is ls's and watch's: show ignores it"},
		{[]string{"-addr", "a:1", "-for", "1s", "ls"}, exitUsage, "-for is watch's: ls ignores it"},
		{[]string{"-addr", "a:1", "-interval", "1s", "unlock", "k"}, exitUsage, "-interval is watch's: unlock ignores it"},
		{[]string{"-addr", closed, "-timeout", "1s", "-yes", "unlock", "k"}, exitError, "cannot reach"},
		{[]string{"-addr", closed, "-timeout", "1s", "-limit", "3", "-shadow", "ls"}, exitError, "cannot reach"},
		{[]string{"-addr", closed, "-timeout", "1s", "-interval", "1s", "-for", "1s", "-shadow", "watch"}, exitError, "cannot reach"},
	}
	for _, c := range cases {
		code, _, errs := cli(t, nil, c.args...)
		if code != c.code || !strings.Contains(errs, c.msg) {
			t.Errorf("flightlock %q: exit %d, stderr %q; want exit %d and %q", c.args, code, errs, c.code, c.msg)
		}
	}
}

// A flag of one store is refused when the locks are read in another, and -lock without the
// file it picks a section of, as usage errors (exit 2): each would otherwise be dropped, and
// the command read the locks somewhere the operator did not mean.
func TestFlagsOfAnotherStoreAreRefused(t *testing.T) {
	redisFile := writeFile(t, "svc.yaml", "Lock:\n  Redis:\n    Host: a:1\n")
	cases := []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"-addr", "a:1", "-etcd-key", "x/", "ls"}, exitUsage, "-etcd-key is etcd's"},
		{[]string{"-f", redisFile, "-etcd-key", "x/", "ls"}, exitUsage, "-etcd-key is etcd's"},
		{[]string{"-addr", "a:1", "-zookeeper-root", "/x", "ls"}, exitUsage, "-zookeeper-root is ZooKeeper's"},
		{[]string{"-etcd", "a:1", "-zookeeper-root", "/x", "ls"}, exitUsage, "-zookeeper-root is ZooKeeper's"},
		{[]string{"-zookeeper", "a:1", "-etcd-key", "x/", "ls"}, exitUsage, "-etcd-key is etcd's"},
		{[]string{"-addr", "a:1", "-lock", "Order.Lock", "ls"}, exitUsage, "-lock picks a Lock section of the -f file"},
	}
	for _, c := range cases {
		code, _, errs := cli(t, nil, c.args...)
		if code != c.code || !strings.Contains(errs, c.msg) {
			t.Errorf("flightlock %q: exit %d, stderr %q; want exit %d and %q", c.args, code, errs, c.code, c.msg)
		}
	}
}

// TestStoreFlagMisusesAreUsageErrors: store flags that contradict each other or the -f file
// (a -lock section it lacks included), or that leave the store they choose without an
// address, are refused as usage errors (exit 2), as the flags of another command are; a file
// that names no store at all is the file's failure (exit 1).
func TestStoreFlagMisusesAreUsageErrors(t *testing.T) {
	redisFile := writeFile(t, "redis.yaml", "Lock:\n  Redis:\n    Host: a:1\n")
	etcdFile := writeFile(t, "etcd.yaml", "Lock:\n  Etcd:\n    Hosts: [e:1]\n")
	noStore := writeFile(t, "none.yaml", "Lock:\n  Prefix: 'o:'\n")
	cases := []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"-addr", "a:1", "-store", "etcd", "ls"}, exitUsage, "-addr, -type and -tls are Redis's"},
		{[]string{"-etcd", "e:1", "-type", "cluster", "ls"}, exitUsage, "-addr, -type and -tls are Redis's"},
		{[]string{"-etcd", "e:1", "-tls", "ls"}, exitUsage, "-addr, -type and -tls are Redis's"},
		{[]string{"-addr", "a:1", "-store", "zookeeper", "ls"}, exitUsage, "are Redis's or etcd's"},
		{[]string{"-zookeeper", "z:1", "-user", "u", "ls"}, exitUsage, "are Redis's or etcd's"},
		{[]string{"-zookeeper", "z:1", "-pass", "p", "ls"}, exitUsage, "are Redis's or etcd's"},
		{[]string{"-zookeeper", "z:1", "-tls", "ls"}, exitUsage, "are Redis's or etcd's"},
		{[]string{"-addr", "a:1", "-type", "sentinel", "ls"}, exitUsage, `Redis type must be node or cluster, got "sentinel"`},
		{[]string{"-f", redisFile, "-store", "etcd", "ls"}, exitUsage, "Lock.Etcd.Hosts is empty: pass -etcd host:port"},
		{[]string{"-f", redisFile, "-store", "zookeeper", "ls"}, exitUsage, "Lock.Zookeeper.Hosts is empty: pass -zookeeper host:port"},
		{[]string{"-f", etcdFile, "-store", "redis", "ls"}, exitUsage, "Lock.Redis has no Host"},
		{[]string{"-f", redisFile, "-lock", "Order.Lock", "ls"}, exitUsage, "has no Lock section Order.Lock; it has Lock"},
		{[]string{"-f", noStore, "ls"}, exitError, "names no store"},
	}
	for _, c := range cases {
		code, _, errs := cli(t, nil, c.args...)
		if code != c.code || !strings.Contains(errs, c.msg) {
			t.Errorf("flightlock %q: exit %d, stderr %q; want exit %d and %q", c.args, code, errs, c.code, c.msg)
		}
	}
}

// TestEtcdAccountFlagsComeInPairs: the etcd client sends an account only with both its user
// and its password, so -user without -pass (FLIGHTLOCK_REDIS_PASS is Redis's only), or -pass
// without -user, is a usage error naming the missing flag, where it would read the locks as no
// one; a flag that replaces one half of the file's account is taken.
func TestEtcdAccountFlagsComeInPairs(t *testing.T) {
	cases := []struct {
		args []string
		env  string // FLIGHTLOCK_REDIS_PASS
		msg  string
	}{
		{[]string{"-etcd", "e:1", "-timeout", "1s", "-user", "u", "ls"}, "", "-user without -pass"},
		{[]string{"-etcd", "e:1", "-timeout", "1s", "-pass", "secret", "ls"}, "", "-pass without -user"},
		{[]string{"-etcd", "e:1", "-timeout", "1s", "-user", "u", "ls"}, "secret", "-user without -pass"},
	}
	for _, c := range cases {
		t.Setenv("FLIGHTLOCK_REDIS_PASS", c.env)
		code, _, errs := cli(t, nil, c.args...)
		if code != exitUsage || !strings.Contains(errs, c.msg) || strings.Contains(errs, "secret") {
			t.Errorf("flightlock %q (FLIGHTLOCK_REDIS_PASS=%q): exit %d, stderr %q; want exit %d and %q, no password",
				c.args, c.env, code, errs, exitUsage, c.msg)
		}
	}

	file := writeFile(t, "etcd.yaml", "Lock:\n  Etcd: {Hosts: ['e:1'], User: u, Pass: p}\n")
	for _, c := range []struct {
		o          options
		user, pass string
	}{
		{options{file: file, user: "other"}, "other", "p"},
		{options{file: file, pass: "P"}, "u", "P"},
		{options{file: file, pass: "env", passFromEnv: true}, "u", "p"},
	} {
		got, err := resolveTarget(c.o)
		if err != nil || got.etcd.User != c.user || got.etcd.Pass != c.pass {
			t.Errorf("-user %q -pass %q over the file's account: user %q pass %q, %v; want %q %q",
				c.o.user, c.o.pass, got.etcd.User, got.etcd.Pass, err, c.user, c.pass)
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
	// Bytes that are no UTF-8 are quoted too: 0x9b starts an escape on some terminals, and
	// 0xff is the table writer's own escape, which would shift every column after it.
	for _, key := range []string{"order:\x9b2J", "order:\xff\xfe", "order:\xc2"} {
		b.Reset()
		if err := lockTable(&b, []lockInfo{{Key: key, Owner: "0123456789abcdef", Fence: 1, Own: true, TTLMillis: 5}}); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), strconv.Quote(key)) {
			t.Errorf("key %q not quoted:\n%q", key, b.String())
		}
	}
	// Cuts fall between characters: a long owner or value is never cut inside one.
	if got := short("abcdef€ghijkl"); got != "abcdef…" {
		t.Errorf("short owner cut inside a character: %q", got)
	}
	if got := truncate(strings.Repeat("\x80", 10), 4); got != "\x80…" {
		t.Errorf("truncate of bytes that are no UTF-8: %q, want one kept (a walk back of three at most)", got)
	}
}

// TestRedisAccountErrorsSayWhatToGive: a Redis that wants a password, asked without one or
// with a wrong one, fails every command with a message that names the flags and the setting
// that give it, exit 1.
func TestRedisAccountErrorsSayWhatToGive(t *testing.T) {
	t.Setenv("FLIGHTLOCK_REDIS_PASS", "")
	srv := redistest.Start(t)
	if err := srv.Client().ConfigSet(context.Background(), "requirepass", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"-addr", srv.Addr, "ls"},
		{"-addr", srv.Addr, "show", "order:1"},
		{"-addr", srv.Addr, "-pass", "wrong", "ls"},
	} {
		code, _, errs := cli(t, nil, args...)
		if code != exitError || !strings.Contains(errs, "Redis refused the account: give its password with -pass") {
			t.Errorf("flightlock %q: exit %d, stderr %q; want exit 1 and what to give", args, code, errs)
		}
	}
	if code, out, errs := cli(t, nil, "-addr", srv.Addr, "-pass", "s3cret", "ls"); code != exitOK {
		t.Errorf("with the password: exit %d: %s%s", code, out, errs)
	}
}

// TestRedisFlagOnAnotherServerSaysSo: -addr given the port of a server that is not Redis (it
// closes the connection, as etcd and ZooKeeper do on Redis's bytes) fails with a message that
// names the other stores' flags, exit 1.
func TestRedisFlagOnAnotherServerSaysSo(t *testing.T) {
	addr := fakeServer(t, false)
	code, _, errs := cli(t, nil, "-addr", addr, "-timeout", "2s", "ls")
	if code != exitError || !strings.Contains(errs, "is "+addr+" a Redis server? -etcd names etcd members, -zookeeper ZooKeeper servers") {
		t.Errorf("-addr on a server that closes the connection: exit %d, stderr %q", code, errs)
	}
}

// TestTLSToAPlainRedisSaysSo: -tls against a Redis that serves plain TCP waits out -timeout
// (the TLS handshake is never answered); the message says that TLS may be the cause.
func TestTLSToAPlainRedisSaysSo(t *testing.T) {
	srv := redistest.Start(t)
	code, _, errs := cli(t, nil, "-addr", srv.Addr, "-tls", "-timeout", "1s", "ls")
	if code != exitError || !strings.Contains(errs, "with TLS on (-tls, or the file's Redis.Tls): does "+srv.Addr+" serve TLS? leave it off for a plain one") {
		t.Errorf("-tls on a plain Redis: exit %d, stderr %q", code, errs)
	}
}

// TestEtcdAndZookeeperFlagsOnAWrongServerSaySo: -etcd or -zookeeper given an address where
// nothing listens, or the port of a server that never answers as etcd or ZooKeeper does (here
// one that accepts and stays silent, as a Redis does to their bytes), fails within -timeout
// with what to check, not only the timeout, exit 1.
func TestEtcdAndZookeeperFlagsOnAWrongServerSaySo(t *testing.T) {
	silent, closed := fakeServer(t, true), closedAddr(t)
	for _, c := range []struct {
		flag, addr, want string
	}{
		{"-etcd", closed, "nothing accepts connections at " + closed + ": is the etcd member up, and is this its client address (-etcd, or the file's Etcd.Hosts)?"},
		{"-etcd", silent, silent + " accepts connections but did not answer as etcd: is it an etcd member's client address (2379 by default, not the peer port 2380)? " +
			"For an etcd that serves TLS, give the file's Etcd.CertFile, CertKeyFile and CACertFile"},
		{"-zookeeper", closed, "nothing accepts connections at " + closed + ": is the ZooKeeper server up, and is this its client address (-zookeeper, or the file's Zookeeper.Hosts)?"},
		{"-zookeeper", silent, silent + " accepts connections but did not answer as ZooKeeper: is it a ZooKeeper server's client address (2181 by default)?"},
	} {
		code, out, errs := cli(t, nil, c.flag, c.addr, "-timeout", "1s", "ls")
		if code != exitError || !strings.Contains(errs, c.want) {
			t.Errorf("%s %s (%s): exit %d\n%s%s\nwant exit 1 and %q", c.flag, c.addr, map[bool]string{true: "closed", false: "silent"}[c.addr == closed], code, out, errs, c.want)
		}
	}
}

// fakeServer listens on a loopback port until the test ends and returns its address. It
// closes each connection at once, or, when silent, holds it open unanswered until the test
// ends.
func fakeServer(t *testing.T, silent bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				_ = c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if silent {
				held = append(held, c)
			} else {
				_ = c.Close()
			}
		}
	}()
	return ln.Addr().String()
}
