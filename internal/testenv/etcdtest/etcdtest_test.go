package etcdtest

import (
	"context"
	"crypto/tls"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// One member answers puts and gets on its client port, and its data survives a SIGKILL and a
// restart (fsync on: the write was acknowledged, so it is on disk).
func TestStartKillRestart(t *testing.T) {
	c := Start(t)
	if len(c.Members) != 1 || c.Members[0].Pid() == 0 {
		t.Fatalf("members %v", c.Members)
	}
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	m := c.Members[0]
	m.Kill()
	if m.Pid() != 0 {
		t.Fatal("Pid after Kill")
	}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	if _, err := cli.Get(short, "k"); err == nil {
		t.Fatal("a killed member answered")
	}
	cancelShort()
	m.Restart()
	resp, err := cli.Get(ctx, "k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("after restart: %v %v", resp, err)
	}
}

// Three members elect one leader; killing it elects another among the survivors, and the
// killed member rejoins after a restart.
func TestClusterLeaderKill(t *testing.T) {
	c := StartCluster(t, 3)
	leader := c.Leader(5 * time.Second)
	if len(c.Followers(leader)) != 2 {
		t.Fatalf("followers of %s: %v", leader, c.Followers(leader))
	}
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "1"); err != nil {
		t.Fatal(err)
	}
	leader.Kill()
	next := c.Leader(10 * time.Second)
	if next == leader {
		t.Fatal("the killed member is still the leader")
	}
	if _, err := cli.Put(ctx, "k", "2"); err != nil {
		t.Fatalf("put after the leader was killed: %v", err)
	}
	leader.Restart()
	c.WaitReady(10 * time.Second)
	resp, err := cli.Get(ctx, "k")
	if err != nil || string(resp.Kvs[0].Value) != "2" {
		t.Fatalf("get: %v %v", resp, err)
	}
}

// WithClientTLS: the member answers on an https:// URL the client that presents the generated
// client certificate, and its readiness checks (Start, Leader, Restart) work over TLS. It
// refuses a client that trusts its CA but presents no certificate, one whose certificate
// another CA signed, and a plain-HTTP client on the same port: TLS and client-certificate
// authentication are really on.
func TestClientTLS(t *testing.T) {
	c := Start(t, WithClientTLS())
	if c.TLS == nil {
		t.Fatal("Cluster.TLS is nil WithClientTLS")
	}
	for _, f := range []string{c.TLS.CAFile, c.TLS.ClientCertFile, c.TLS.ClientKeyFile, c.TLS.ServerCertFile, c.TLS.ServerKeyFile} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("TLS file: %v", err)
		}
	}
	m := c.Members[0]
	if !strings.HasPrefix(m.ClientURL, "https://127.0.0.1:") || !strings.HasPrefix(m.PeerURL, "http://") {
		t.Fatalf("client URL %s, peer URL %s: want https:// for clients, http:// between members", m.ClientURL, m.PeerURL)
	}
	if leader := c.Leader(5 * time.Second); leader != m {
		t.Fatalf("leader %v, want %v", leader, m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cli := c.Client(t)
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("put with the client certificate: %v", err)
	}

	refused := func(what string, endpoint string, tlsConfig *tls.Config) {
		t.Helper()
		other, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: time.Second, Logger: zap.NewNop(), TLS: tlsConfig})
		if err != nil {
			t.Fatalf("client with %s: %v", what, err)
		}
		defer other.Close()
		short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
		defer cancelShort()
		if _, err := other.Put(short, "k", what); err == nil {
			t.Errorf("a client with %s wrote to a member started WithClientTLS", what)
		}
	}
	noCert := c.TLS.ClientConfig(t)
	noCert.Certificates = nil
	refused("no client certificate", m.ClientURL, noCert)
	foreign := NewTLSFiles(t).ClientConfig(t) // a certificate of another CA ...
	foreign.RootCAs = c.TLS.ClientConfig(t).RootCAs
	refused("a client certificate of another CA", m.ClientURL, foreign) // ... that trusts the member
	refused("plain HTTP", strings.Replace(m.ClientURL, "https://", "http://", 1), nil)

	m.Kill()
	m.Restart() // waits for the member's status, over TLS
	resp, err := cli.Get(ctx, "k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("after a restart over TLS: %v %v", resp, err)
	}
}
