package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
)

// The CLI has no TLS flags of its own for etcd: TLS comes from the file's Etcd.CertFile,
// CertKeyFile and CACertFile, through the service's own client (EtcdConf.Client). ls reads the
// locks of an etcd that serves its clients over TLS only and requires a client certificate;
// the same file without the certificate fields cannot reach it (exit 1, within -timeout) and
// names them.
func TestEtcdTLSList(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.WithClientTLS())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lease, err := etcdLocker(t, c).Lock(ctx, "order:tls") // a store on the cluster's TLS client
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lease.Release(ctx) }()

	file := writeFile(t, "svc.yaml", fmt.Sprintf(`Name: svc
Lock:
  Etcd:
    Hosts: [%q]
    CertFile: %q
    CertKeyFile: %q
    CACertFile: %q
  Rules: []
`, c.Endpoints()[0], c.TLS.ClientCertFile, c.TLS.ClientKeyFile, c.TLS.CAFile))
	code, out, errs := cli(t, nil, "-f", file, "-timeout", "5s", "ls", "-o", "json")
	if code != exitOK {
		t.Fatalf("ls over TLS: exit %d: %s", code, errs)
	}
	var locks []lockInfo
	if err := json.Unmarshal([]byte(out), &locks); err != nil {
		t.Fatalf("ls -o json: %v\n%s", err, out)
	}
	if len(locks) != 1 || locks[0].Key != "order:tls" || locks[0].Store != storeEtcd || locks[0].Fence != lease.Fence() {
		t.Fatalf("ls over TLS: %+v; want order:tls in etcd with the lease's fence %d", locks, lease.Fence())
	}

	plain := writeFile(t, "plain.yaml", fmt.Sprintf("Name: svc\nLock:\n  Etcd: {Hosts: [%q]}\n  Rules: []\n", c.Endpoints()[0]))
	want := "For an etcd that serves TLS, give the file's Etcd.CertFile, CertKeyFile and CACertFile"
	if code, out, errs := cli(t, nil, "-f", plain, "-timeout", "3s", "ls"); code != exitError || !strings.Contains(errs, want) {
		t.Fatalf("ls without the certificate fields: exit %d, want %d (refused by the server) and %q\n%s%s", code, exitError, want, out, errs)
	}
}
