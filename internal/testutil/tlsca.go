package testutil

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

// CA is a certificate authority generated for one test: a private CA the
// way an on-prem OPAL server (or an OPA behind mTLS) would use one.
type CA struct {
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	serial int64
	// CertFile is the CA certificate as a PEM file in the test's temp dir.
	CertFile string
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func writePEM(t testing.TB, path, typ string, der []byte) string {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// NewCA generates a CA valid for an hour around now.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	file := writePEM(t, filepath.Join(t.TempDir(), "ca.pem"), "CERTIFICATE", der)
	return &CA{cert: cert, key: key, serial: 1, CertFile: file}
}

// leaf signs a certificate for 127.0.0.1, ::1 and localhost (what httptest
// servers and loopback listeners answer on) with the given usage.
func (ca *CA) leaf(t testing.TB, name string, usage x509.ExtKeyUsage) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key := newKey(t)
	ca.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return der, key
}

// ServerTLS is a server configuration whose certificate the CA signed.
func (ca *CA) ServerTLS(t testing.TB) *tls.Config {
	t.Helper()
	der, key := ca.leaf(t, "opal server", x509.ExtKeyUsageServerAuth)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
}

// TLSFiles are PEM files of a CA generated for one test, with a server
// certificate and a client certificate it signed.
type TLSFiles struct {
	CA, ServerCert, ServerKey, ClientCert, ClientKey string
}

// GenerateTLS writes a fresh CA, server and client certificate into
// t.TempDir(), for the programs (OPA, the agent) that read TLS files.
func GenerateTLS(t testing.TB) TLSFiles {
	t.Helper()
	ca := NewCA(t)
	dir := t.TempDir()
	pair := func(name string, usage x509.ExtKeyUsage) (string, string) {
		der, key := ca.leaf(t, name, usage)
		kd, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return writePEM(t, filepath.Join(dir, name+".pem"), "CERTIFICATE", der),
			writePEM(t, filepath.Join(dir, name+"-key.pem"), "EC PRIVATE KEY", kd)
	}
	f := TLSFiles{CA: ca.CertFile}
	f.ServerCert, f.ServerKey = pair("server", x509.ExtKeyUsageServerAuth)
	f.ClientCert, f.ClientKey = pair("client", x509.ExtKeyUsageClientAuth)
	return f
}
