package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
)

// ServerTLSConfig is the TLS configuration of every connection to the OPAL
// server and the data sources (HTTPS and the pub/sub WSS), with the Python
// client's meaning (opal_common.security.sslcontext): only when
// OPAL_CLIENT_SELF_SIGNED_CERTIFICATES_ALLOWED is true and
// OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE is set, the CA file's certificates
// are the only trusted roots (as ssl.create_default_context(cafile=...));
// host names are still verified. Otherwise it returns nil: Go's defaults.
//
// It reads the file, so call it once at start. A file that cannot be read,
// or holds no PEM certificate, is an *Error naming the variable; Python
// silently keeps the system roots there, which would hide the mistake until
// the first handshake fails.
func (c *Config) ServerTLSConfig() (*tls.Config, error) {
	if !c.ClientSelfSignedCertificatesAllowed || c.ClientSSLContextTrustedCAFile == "" {
		return nil, nil
	}
	const name, accepted = "OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE", "a readable PEM file of CA certificates"
	path := expandHome(c.ClientSSLContextTrustedCAFile)
	pem, err := os.ReadFile(path)
	if err == nil && len(pem) == 0 {
		err = errors.New("empty file")
	}
	if err != nil {
		return nil, newError(name, c.ClientSSLContextTrustedCAFile, accepted, err.Error(), false)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, newError(name, c.ClientSSLContextTrustedCAFile, accepted, "no PEM certificate found", false)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// expandHome expands a leading "~/" (os.path.expanduser's common case).
func expandHome(p string) string {
	if rest, ok := strings.CutPrefix(p, "~/"); ok {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, rest)
		}
	}
	return p
}
