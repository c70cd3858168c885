package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// certValidity is how long the generated certificates last: long enough for any test, short
// enough that a file left behind by a crashed run is useless soon after.
const certValidity = time.Hour

// TLSFiles are the PEM files of one certificate authority and the two certificates it signed,
// written into a test's temporary directory by NewTLSFiles.
type TLSFiles struct {
	CAFile         string // the CA's certificate: what clients and members trust
	ServerCertFile string // the members' certificate, for 127.0.0.1 (IP SAN)
	ServerKeyFile  string // its private key
	ClientCertFile string // a client certificate that members started with these files accept
	ClientKeyFile  string // its private key
}

// NewTLSFiles generates, with the standard library only, a fresh CA and a server and a client
// certificate signed by it (ECDSA P-256, valid for an hour), and writes them into a directory
// of tb's, removed when tb ends. Each call makes an unrelated CA: a test that needs a CA which
// did not sign a cluster's certificates calls it again.
func NewTLSFiles(tb testing.TB) TLSFiles {
	tb.Helper()
	dir := tb.TempDir()
	notBefore := time.Now().Add(-time.Minute) // tolerates a little clock skew between processes
	notAfter := notBefore.Add(certValidity)

	caKey := newKey(tb)
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(tb),
		Subject:               pkix.Name{CommonName: "etcdtest CA"},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		tb.Fatalf("etcdtest: create the CA certificate: %v", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		tb.Fatalf("etcdtest: parse the CA certificate: %v", err)
	}

	f := TLSFiles{
		CAFile:         filepath.Join(dir, "ca.pem"),
		ServerCertFile: filepath.Join(dir, "server.pem"),
		ServerKeyFile:  filepath.Join(dir, "server-key.pem"),
		ClientCertFile: filepath.Join(dir, "client.pem"),
		ClientKeyFile:  filepath.Join(dir, "client-key.pem"),
	}
	writePEM(tb, f.CAFile, "CERTIFICATE", caDER)
	// The server certificate also allows client authentication: etcd 3.4's HTTP gateway dials
	// its own gRPC port presenting the member's certificate, which --client-cert-auth checks
	// like any other client's (etcd's security guide asks for both usages).
	issue(tb, ca, caKey, &x509.Certificate{
		SerialNumber: serial(tb),
		Subject:      pkix.Name{CommonName: "etcdtest member"},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}, f.ServerCertFile, f.ServerKeyFile)
	issue(tb, ca, caKey, &x509.Certificate{
		SerialNumber: serial(tb),
		Subject:      pkix.Name{CommonName: "etcdtest client"},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, f.ClientCertFile, f.ClientKeyFile)
	return f
}

// ClientConfig returns the TLS configuration of a client that trusts f's CA and presents f's
// client certificate.
func (f TLSFiles) ClientConfig(tb testing.TB) *tls.Config {
	tb.Helper()
	cert, err := tls.LoadX509KeyPair(f.ClientCertFile, f.ClientKeyFile)
	if err != nil {
		tb.Fatalf("etcdtest: load the client certificate: %v", err)
	}
	ca, err := os.ReadFile(f.CAFile)
	if err != nil {
		tb.Fatalf("etcdtest: read the CA: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		tb.Fatalf("etcdtest: %s holds no PEM certificate", f.CAFile)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, RootCAs: pool}
}

// issue signs tmpl with the CA and writes the certificate and a fresh key for it.
func issue(tb testing.TB, ca *x509.Certificate, caKey *ecdsa.PrivateKey, tmpl *x509.Certificate, certFile, keyFile string) {
	tb.Helper()
	key := newKey(tb)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		tb.Fatalf("etcdtest: sign %s: %v", tmpl.Subject.CommonName, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatalf("etcdtest: encode the key of %s: %v", tmpl.Subject.CommonName, err)
	}
	writePEM(tb, certFile, "CERTIFICATE", der)
	writePEM(tb, keyFile, "PRIVATE KEY", keyDER)
}

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("etcdtest: generate a key: %v", err)
	}
	return key
}

// serial is a random 128-bit serial number: certificates of one CA must not share one.
func serial(tb testing.TB) *big.Int {
	tb.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		tb.Fatalf("etcdtest: serial number: %v", err)
	}
	return n
}

// writePEM writes one PEM block, readable by the owner only (etcd and the client read keys).
func writePEM(tb testing.TB, file, blockType string, der []byte) {
	tb.Helper()
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der}), 0o600); err != nil {
		tb.Fatalf("etcdtest: write %s: %v", file, err)
	}
}
