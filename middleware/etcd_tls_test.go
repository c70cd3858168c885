package middleware

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/etcdstore"
	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	"github.com/zeromicro/go-zero/rest"
)

// The tests of this file run Lock.Etcd's TLS fields (CertFile, CertKeyFile, CACertFile,
// InsecureSkipVerify) against a real etcd that serves its clients over TLS only and requires
// a client certificate (etcdtest.WithClientTLS); the certificates are generated per test.

// tlsEtcdConf is etcdConf with the TLS cluster ec's client certificate, its key and its CA.
func tlsEtcdConf(ec *etcdtest.Cluster, rules ...Rule) LockConf {
	c := etcdConf(ec, rules...)
	c.Etcd.CertFile, c.Etcd.CertKeyFile, c.Etcd.CACertFile = ec.TLS.ClientCertFile, ec.TLS.ClientKeyFile, ec.TLS.CAFile
	return c
}

// bareHosts strips the https:// of ec's client URLs: the host:port form that a zrpc service's
// Etcd section uses, where TLS comes from the certificate fields alone.
func bareHosts(ec *etcdtest.Cluster) []string {
	hosts := ec.Endpoints()
	for i, h := range hosts {
		hosts[i] = strings.TrimPrefix(h, "https://")
	}
	return hosts
}

// postAsync posts to url and sends the status code on the returned channel (0 on a transport
// error, which the test reports).
func postAsync(t *testing.T, url string) <-chan int {
	codes := make(chan int, 1)
	go func() {
		resp, err := http.Post(url, "application/json", http.NoBody)
		if err != nil {
			t.Errorf("POST %s: %v", url, err)
			codes <- 0
			return
		}
		_ = resp.Body.Close()
		codes <- resp.StatusCode
	}()
	return codes
}

// A Middleware whose Lock.Etcd names a TLS cluster with CertFile, CertKeyFile and CACertFile
// locks through it, as two processes (two Middlewares, each with its own client; one on the
// https:// URLs, the other on bare host:port as a zrpc section writes them): a held lock is
// its etcd key, read back with a TLS client, and is gone once the handler returns; in reject
// mode the other process's request on the same key is answered 409 while it is held; in wait
// mode it waits in etcd (its waiter mark appears) and runs after the holder, with a larger
// fence. The same section without the certificate fields is refused at start-up: the
// server's TLS and client-certificate check are what the fields get through.
func TestEtcdTLSLocks(t *testing.T) {
	ec := etcdtest.Start(t, etcdtest.WithClientTLS())
	cli := ec.Client(t) // TLS, with the cluster's client certificate
	rules := []Rule{
		{Method: http.MethodPost, Path: "/tls/reject/:id", Key: "tlsr:{id}", OnBusy: "reject"},
		{Method: http.MethodPost, Path: "/tls/wait/:id", Key: "tlsw:{id}", OnBusy: "wait", Wait: 8 * time.Second},
	}
	m1, err := New(tlsEtcdConf(ec, rules...))
	if err != nil {
		t.Fatalf("New on the https:// endpoints: %v", err)
	}
	defer m1.Close()
	c2 := tlsEtcdConf(ec, rules...)
	c2.Etcd.Hosts = bareHosts(ec)
	m2, err := New(c2)
	if err != nil {
		t.Fatalf("New on host:port endpoints: %v", err)
	}
	defer m2.Close()

	// Every handler of both processes counts itself in and out, so an overlap on one key
	// shows as two inside; the first request of each key blocks until the test lets it go.
	var inside atomic.Int32
	var overlapped atomic.Bool
	type entry struct {
		fence      int64
		heldInEtcd bool
	}
	entered := map[string]chan entry{"tlsr:1": make(chan entry, 2), "tlsw:1": make(chan entry, 2)}
	finish := map[string]chan struct{}{"tlsr:1": make(chan struct{}), "tlsw:1": make(chan struct{})}
	handler := func(w http.ResponseWriter, r *http.Request) {
		if inside.Add(1) > 1 {
			overlapped.Store(true)
		}
		defer inside.Add(-1)
		l := flightlock.FromContext(r.Context())
		key := strings.TrimPrefix(l.Key(), "flightlock/lock:")
		entered[key] <- entry{fence: l.Fence(), heldInEtcd: etcdExists(t, cli, l.Key())}
		<-finish[key]
		_, _ = fmt.Fprint(w, l.Fence())
	}
	routes := []rest.Route{
		{Method: http.MethodPost, Path: "/tls/reject/:id", Handler: handler},
		{Method: http.MethodPost, Path: "/tls/wait/:id", Handler: handler},
	}
	base1, base2 := startREST(t, m1, routes...), startREST(t, m2, routes...)

	t.Run("reject", func(t *testing.T) {
		first := postAsync(t, base1+"/tls/reject/1")
		held := <-entered["tlsr:1"]
		if !held.heldInEtcd || held.fence <= 0 {
			t.Fatalf("in the handler: lock in etcd %v, fence %d; want the key flightlock/lock:tlsr:1 and a fence", held.heldInEtcd, held.fence)
		}
		code, h, _ := post(t, base2+"/tls/reject/1")
		if ra, err := strconv.Atoi(h.Get("Retry-After")); code != http.StatusConflict || err != nil || ra < 1 {
			t.Fatalf("the other process while the key is held: %d, Retry-After %q; want 409 with a Retry-After", code, h.Get("Retry-After"))
		}
		close(finish["tlsr:1"])
		if code := <-first; code != http.StatusOK {
			t.Fatalf("the holder: %d, want 200", code)
		}
		if etcdExists(t, cli, "flightlock/lock:tlsr:1") {
			t.Fatal("the lock is still in etcd after its handler returned")
		}
	})

	t.Run("wait", func(t *testing.T) {
		first := postAsync(t, base1+"/tls/wait/1")
		held := <-entered["tlsw:1"]
		if !held.heldInEtcd {
			t.Fatal("the holder's lock flightlock/lock:tlsw:1 is not in etcd")
		}
		second := postAsync(t, base2+"/tls/wait/1")
		// The other process waits through etcd: its refused acquisition sets the key's waiter
		// mark, over the same TLS connection.
		waitFor(t, 5*time.Second, "the second request's waiter mark in etcd", func() bool {
			return etcdExists(t, cli, etcdstore.WaiterKey("flightlock/lock:tlsw:1"))
		})
		select {
		case e := <-entered["tlsw:1"]:
			t.Fatalf("the second request ran while the first held the key (fence %d)", e.fence)
		default:
		}
		close(finish["tlsw:1"]) // both requests return once in their handler
		if code := <-first; code != http.StatusOK {
			t.Fatalf("the holder: %d, want 200", code)
		}
		next := <-entered["tlsw:1"]
		if code := <-second; code != http.StatusOK {
			t.Fatalf("the waiter: %d, want 200 after the holder", code)
		}
		if !next.heldInEtcd || next.fence <= held.fence {
			t.Fatalf("the waiter's grant: in etcd %v, fence %d; want the key and a fence above the holder's %d", next.heldInEtcd, next.fence, held.fence)
		}
		if etcdExists(t, cli, "flightlock/lock:tlsw:1") {
			t.Fatal("the lock is still in etcd after both handlers returned")
		}
	})
	if overlapped.Load() {
		t.Fatal("two handlers ran at once: a key was held twice")
	}

	t.Run("without the certificate fields", func(t *testing.T) {
		c := etcdConf(ec) // the same https:// hosts, no CertFile, CertKeyFile, CACertFile
		c.Etcd.DialTimeout = 2 * time.Second
		m, err := New(c)
		if err == nil {
			_ = m.Close()
			t.Fatal("New without the certificate fields reached a cluster that requires a client certificate")
		}
		if !strings.Contains(err.Error(), "Lock.Etcd") {
			t.Fatalf("New without the certificate fields: %v; want an error naming Lock.Etcd", err)
		}
	})
}

// A CACertFile of another CA, unrelated to the members' certificates: New refuses the section
// within its DialTimeout, with an error that names Lock.Etcd and the hosts and says the time
// ran out, instead of hanging or starting a Middleware whose every lock would fail.
// InsecureSkipVerify, which the section documents as go-zero's (skip the verification of the
// members' certificates, with the three files set), makes the same wrong CA work, the client
// certificate still presented; without CACertFile the section is refused at start-up (go-zero's
// HasTLS needs all three).
//
// New's error does not name the certificate: EtcdConf.Client sets RejectOldCluster, as go-zero
// does, so clientv3.New asks each member for its version with Status, which etcd's retry
// interceptor retries until the DialTimeout and then answers with the context's error alone;
// the handshake error ("x509: certificate signed by unknown authority") reaches only the
// client's log.
func TestEtcdTLSWrongCA(t *testing.T) {
	ec := etcdtest.Start(t, etcdtest.WithClientTLS())
	unrelatedCA := etcdtest.NewTLSFiles(t).CAFile

	// The deadline is the test's bound, far above the 2s DialTimeout: New hanging past the
	// DialTimeout would exhaust it, which the checks below refuse.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	wrong := tlsEtcdConf(ec)
	wrong.Etcd.CACertFile, wrong.Etcd.DialTimeout = unrelatedCA, 2*time.Second
	m, err := New(wrong)
	switch {
	case err == nil:
		_ = m.Close()
		t.Fatal("New with a CA that did not sign the members' certificates succeeded")
	case ctx.Err() != nil:
		t.Fatalf("New with a wrong CA outlasted the test's deadline: %v", err)
	case !strings.Contains(err.Error(), "Lock.Etcd") || !strings.Contains(err.Error(), ec.Endpoints()[0]) ||
		!errors.Is(err, context.DeadlineExceeded):
		t.Fatalf("New with a wrong CA: %v; want an error naming Lock.Etcd and %s that wraps the DialTimeout's expiry", err, ec.Endpoints()[0])
	case !strings.Contains(err.Error(), "certificate"):
		// The etcd client alone reports only the timeout; the operator needs the cause.
		t.Fatalf("New with a wrong CA: %v; want the certificate error that caused it", err)
	}

	// A client certificate the members refuse (signed by another CA) is named too: TLS 1.3
	// reports it after the handshake, on the first read.
	foreign := tlsEtcdConf(ec)
	other := etcdtest.NewTLSFiles(t)
	foreign.Etcd.CertFile, foreign.Etcd.CertKeyFile, foreign.Etcd.DialTimeout = other.ClientCertFile, other.ClientKeyFile, 2*time.Second
	if m, err := New(foreign); err == nil {
		_ = m.Close()
		t.Fatal("New with a client certificate the members do not trust succeeded")
	} else if !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("New with a foreign client certificate: %v; want the certificate error that caused it", err)
	}

	// The same section with InsecureSkipVerify locks: the CA was the only thing wrong.
	skip := wrong
	skip.Etcd.InsecureSkipVerify = true
	ms, err := New(skip)
	if err != nil {
		t.Fatalf("New with InsecureSkipVerify and an unrelated CA: %v", err)
	}
	defer ms.Close()
	cli := ec.Client(t)
	l, err := ms.Locker().TryLock(ctx, "tlsca:1")
	if err != nil {
		t.Fatalf("lock with InsecureSkipVerify and an unrelated CA: %v; want the members' certificates unverified and the client's accepted", err)
	}
	if !etcdExists(t, cli, "flightlock/lock:tlsca:1") {
		t.Fatal("the lock taken with InsecureSkipVerify is not in etcd")
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if etcdExists(t, cli, "flightlock/lock:tlsca:1") {
		t.Fatal("the lock taken with InsecureSkipVerify is still in etcd after its release")
	}

	noCA := skip
	noCA.Etcd.CACertFile = ""
	var ce *ConfigError
	if m, err := New(noCA); !errors.As(err, &ce) || ce.Field != "Lock.Etcd.CertFile" {
		if err == nil {
			_ = m.Close()
		}
		t.Fatalf("New with InsecureSkipVerify and no CACertFile: %v; want the ConfigError of Lock.Etcd.CertFile", err)
	}
}
