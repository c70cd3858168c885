// Package etcdconf is the Etcd section of a go-zero service's Lock configuration: an etcd
// cluster for the locks, as go-zero's discov.EtcdConf, and how to open the store on it
// (lockstore.Driver), apart from etcdstore so that the store alone does not link go-zero.
package etcdconf

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/logutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap/zapcore"

	"github.com/flightlock/flightlock/etcdstore"
	"github.com/flightlock/flightlock/lockstore"
)

// Conf is go-zero's discov.EtcdConf, with its names and meanings, so that a zrpc service's
// Etcd section can be copied under Lock: with another Key (docs/configuration.md). The lock of a
// rendered key is the etcd key Key + Lock.Prefix + rendered key; Key (default "flightlock/") is
// never a service's discovery Key, which zrpc clients would dial as server addresses. ID is not
// a field. DialTimeout (default 5s) bounds each dial; LeaseMargin (default 1s, whole seconds)
// is how much longer than a lock's TTL its etcd lease lasts.
type Conf struct {
	Hosts              []string      `json:",optional"`
	Key                string        `json:",default=flightlock/"`
	User               string        `json:",optional"`
	Pass               string        `json:",optional"`
	CertFile           string        `json:",optional"`
	CertKeyFile        string        `json:",optional"`
	CACertFile         string        `json:",optional"`
	InsecureSkipVerify bool          `json:",optional"`
	DialTimeout        time.Duration `json:",default=5s"`
	LeaseMargin        time.Duration `json:",default=1s"`
}

// Name implements lockstore.Driver.
func (e Conf) Name() string { return "etcd" }

// Configured reports whether e names an etcd cluster.
func (e Conf) Configured() bool { return len(e.Hosts) > 0 }

// KeyPrefix is Key + prefix, the prefix of the locks and stored responses for every user of
// the etcd keys (the store, the inspector, the CLI).
func (e Conf) KeyPrefix(prefix string) string { return e.Key + prefix }

// Store builds the etcd client (Client) and the store that e describes, as New does; close
// closes the store and then the client, and a lock still held then runs out with its lease.
func (e Conf) Store() (store *etcdstore.Store, close func() error, err error) {
	cli, err := e.Client()
	if err != nil {
		return nil, nil, err
	}
	s, err := etcdstore.New(cli, etcdstore.WithLeaseMargin(e.LeaseMargin))
	if err != nil {
		_ = cli.Close()
		return nil, nil, err
	}
	return s, func() error { return errors.Join(s.Close(), cli.Close()) }, nil
}

// Open implements lockstore.Driver: Store, described for keys under KeyPrefix(prefix).
func (e Conf) Open(prefix string) (*lockstore.Backend, error) {
	s, closeStore, err := e.Store()
	if err != nil {
		return nil, err
	}
	b := s.Describe(e.KeyPrefix(prefix))
	b.Close = closeStore
	return b, nil
}

// Validate implements lockstore.Driver: the settings of e when it names a cluster.
func (e Conf) Validate(section, prefix string) []error {
	if !e.Configured() {
		if e.User != "" || e.Pass != "" || e.CertFile != "" || e.CertKeyFile != "" || e.CACertFile != "" {
			return []error{lockstore.FieldError(section+".Hosts", "is empty, but the Etcd section sets other fields: an etcd store with no hosts")}
		}
		return nil
	}
	ps := lockstore.HostErrors(section+".Hosts", e.Hosts)
	if first, _, _ := strings.Cut(e.KeyPrefix(prefix), "/"); strings.HasSuffix(first, ".rpc") {
		ps = append(ps, lockstore.FieldError(section+".Key", "%q puts the locks under %q, a zrpc service's discovery key by goctl's naming: "+
			"its clients would dial every lock as a server address; keep the locks under a name of their own, "+
			"such as the default \"flightlock/\"", e.Key, first+"/"))
	}
	if (e.User == "") != (e.Pass == "") {
		ps = append(ps, lockstore.FieldError(section+".Pass", "and User must be set together (go-zero's HasAccount)"))
	}
	tls := []string{e.CertFile, e.CertKeyFile, e.CACertFile}
	if n := len(tls) - len(slices.DeleteFunc(tls, func(s string) bool { return s == "" })); n > 0 && n < 3 {
		ps = append(ps, lockstore.FieldError(section+".CertFile", "CertFile, CertKeyFile and CACertFile must be set together (go-zero's HasTLS)"))
	}
	if e.DialTimeout < 0 {
		ps = append(ps, lockstore.FieldError(section+".DialTimeout", "must not be negative, got %v", e.DialTimeout))
	}
	if e.LeaseMargin < time.Second || e.LeaseMargin%time.Second != 0 {
		ps = append(ps, lockstore.FieldError(section+".LeaseMargin", "must be whole seconds, at least 1s, got %v", e.LeaseMargin))
	}
	return ps
}

// Check implements lockstore.Driver: a lock TTL must be whole seconds, at least 1s.
func (e Conf) Check(section string, u lockstore.Use) error {
	switch {
	case !e.Configured():
		return lockstore.FieldError(u.Field+".Store", "is etcd, but %s.Hosts is empty: an etcd store with no hosts", section)
	case u.TTLField == "" || u.TTL >= time.Second && u.TTL%time.Second == 0:
		return nil
	}
	return lockstore.FieldError(u.TTLField, "%v is not a whole number of seconds, at least 1s: %s etcd, whose leases last whole seconds "+
		"(nothing is rounded)", u.TTL, u.On())
}

// Client is the etcd client of e, built as go-zero's discov does (DialClient, AddTLS); it fails
// when no member answers within DialTimeout (0 means 5s). The caller closes it.
func (e Conf) Client() (*clientv3.Client, error) {
	hosts := lockstore.TrimHosts(e.Hosts)
	if len(hosts) == 0 {
		return nil, lockstore.FieldError("Lock.Etcd.Hosts", "is empty: list the etcd members to connect to")
	}
	cfg := clientv3.Config{
		Endpoints:           hosts,
		AutoSyncInterval:    time.Minute,
		DialTimeout:         cmp.Or(e.DialTimeout, 5*time.Second), // go-zero's
		RejectOldCluster:    true,
		PermitWithoutStream: true,
		// Pings find a member cut off with its connections open, which would otherwise keep a
		// share of the calls; 6s is the first whole second above etcd's default minimum.
		DialKeepAliveTime:    6 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
	}
	// Error level: etcd's retry interceptor warns of every call whose context ended (each lock
	// wait a request gives up), and the store returns those errors.
	var err error
	if cfg.Logger, err = logutil.CreateDefaultZapLogger(zapcore.ErrorLevel); err != nil {
		return nil, err
	}
	if e.User != "" && e.Pass != "" {
		cfg.Username, cfg.Password = e.User, e.Pass
	}
	if e.CertFile != "" && e.CertKeyFile != "" && e.CACertFile != "" {
		cert, err := tls.LoadX509KeyPair(e.CertFile, e.CertKeyFile)
		if err != nil {
			return nil, fmt.Errorf("flightlock: Etcd.CertFile and CertKeyFile: %w", err)
		}
		ca, err := os.ReadFile(e.CACertFile)
		if err != nil {
			return nil, fmt.Errorf("flightlock: Etcd.CACertFile: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca) {
			return nil, fmt.Errorf("flightlock: Etcd.CACertFile %s holds no PEM certificate", e.CACertFile)
		}
		cfg.TLS = &tls.Config{
			MinVersion:         tls.VersionTLS12,
			Certificates:       []tls.Certificate{cert},
			RootCAs:            pool,
			InsecureSkipVerify: e.InsecureSkipVerify, //nolint:gosec // go-zero's InsecureSkipVerify, off by default
		}
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		// The client reports only a failed handshake's timeout: the first member tells why.
		if cause := tlsHandshakeError(hosts[0], cfg.TLS, min(cfg.DialTimeout, 2*time.Second)); cause != nil {
			return nil, fmt.Errorf("flightlock: etcd connect error, hosts %v: %w (TLS with %s: %v)", hosts, err, hosts[0], cause)
		}
		return nil, fmt.Errorf("flightlock: etcd connect error, hosts %v: %w", hosts, err)
	}
	return cli, nil
}

// tlsHandshakeError runs the TLS handshake with the etcd endpoint host within d as the client
// would, and reads once, so that a client certificate refused after it (TLS 1.3) shows too; nil
// when no error came in time, or when conf is nil (no TLS).
func tlsHandshakeError(host string, conf *tls.Config, d time.Duration) error {
	addr := host
	if u, err := url.Parse(host); err == nil && u.Host != "" {
		addr = u.Host
	}
	name, _, err := net.SplitHostPort(addr)
	if err != nil || conf == nil {
		return nil
	}
	c := conf.Clone()
	c.ServerName, c.NextProtos = cmp.Or(c.ServerName, name), []string{"h2"}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: d}, "tcp", addr, c)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(d))
	var ne net.Error // a read that times out: a member that accepted, waiting for the client
	if _, err := conn.Read(make([]byte, 1)); err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
		return err
	}
	return nil
}
