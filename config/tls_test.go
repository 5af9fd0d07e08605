package config

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/opal-go/opal-client/internal/testutil"
)

// tlsServer is an OPAL-server stand-in over TLS with a certificate signed
// by ca: GET / answers 200, /ws upgrades to a WebSocket.
func tlsServer(t *testing.T, ca *testutil.CA) *httptest.Server {
	up := websocket.Upgrader{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ws" {
			if c, err := up.Upgrade(w, r, nil); err == nil {
				c.Close()
			}
			return
		}
		w.Write([]byte("ok"))
	}))
	srv.TLS = ca.ServerTLS(t)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes are the point
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// httpsGet and wssDial use tc as the agent does: the HTTP transport and the
// WebSocket dialer (nil tc = Go's defaults, the system roots).
func httpsGet(srv *httptest.Server, tc *tls.Config) error {
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: 10 * time.Second}
	resp, err := c.Get(srv.URL + "/")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return errors.New(resp.Status)
	}
	return nil
}

func wssDial(srv *httptest.Server, tc *tls.Config) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := websocket.Dialer{TLSClientConfig: tc}
	conn, resp, err := d.DialContext(ctx, "wss"+strings.TrimPrefix(srv.URL, "https")+"/ws", nil)
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	if err != nil {
		return err
	}
	return conn.Close()
}

// OPAL_CLIENT_SELF_SIGNED_CERTIFICATES_ALLOWED + OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE
// mean what they mean in the Python client, for HTTPS and WSS alike.
func TestServerTLSConfig(t *testing.T) {
	ca := testutil.NewCA(t)
	srv := tlsServer(t, ca)
	otherCA := testutil.NewCA(t)
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	os.WriteFile(notPEM, []byte("not a certificate"), 0o600)
	cases := []struct {
		name    string
		env     map[string]string
		trusted bool   // the handshake succeeds
		errHas  string // ServerTLSConfig fails naming the variable, with this reason
	}{
		// Mutation caught: RootCAs left out (the system roots do not know the CA).
		{"trusted_ca", map[string]string{"OPAL_CLIENT_SELF_SIGNED_CERTIFICATES_ALLOWED": "true", "OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE": ca.CertFile}, true, ""},
		{"default_roots_refuse_private_ca", nil, false, ""},
		// Mutation caught: the ALLOWED gate removed (Python ignores the file then).
		{"ca_file_ignored_without_allowed", map[string]string{"OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE": ca.CertFile}, false, ""},
		{"allowed_without_ca_file_changes_nothing", map[string]string{"OPAL_CLIENT_SELF_SIGNED_CERTIFICATES_ALLOWED": "true"}, false, ""},
		{"other_ca_refused", map[string]string{"OPAL_CLIENT_SELF_SIGNED_CERTIFICATES_ALLOWED": "true", "OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE": otherCA.CertFile}, false, ""},
		// Mutation caught: the read error dropped (the empty pool is then reported as "no PEM").
		{"ca_file_missing_stops", map[string]string{"OPAL_CLIENT_SELF_SIGNED_CERTIFICATES_ALLOWED": "true", "OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE": filepath.Join(dir, "missing.pem")}, false, "no such file"},
		{"ca_file_not_pem_stops", map[string]string{"OPAL_CLIENT_SELF_SIGNED_CERTIFICATES_ALLOWED": "true", "OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE": notPEM}, false, "no PEM certificate"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := load(t, tc.env)
			if err != nil {
				t.Fatal(err)
			}
			tcfg, err := c.ServerTLSConfig()
			if tc.errHas != "" {
				var ce *Error
				if !errors.As(err, &ce) || ce.Var != "OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE" || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("err = %v, want an *Error for OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE with %q", err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for proto, try := range map[string]func(*httptest.Server, *tls.Config) error{"https": httpsGet, "wss": wssDial} {
				err := try(srv, tcfg)
				if tc.trusted && err != nil {
					t.Errorf("%s: %v", proto, err)
				}
				if !tc.trusted && (err == nil || !strings.Contains(err.Error(), "certificate")) {
					t.Errorf("%s: err = %v, want a certificate error", proto, err)
				}
			}
		})
	}
}
