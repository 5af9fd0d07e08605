package agent

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opal-go/opal-client/config"
	"github.com/opal-go/opal-client/internal/testutil"
)

// serveTLS moves s to a TLS listener whose certificate ca signed; the
// plain listener is closed.
func serveTLS(t *testing.T, s *testServer, ca *testutil.CA) {
	plain := s.srv
	t.Cleanup(plain.Close)
	s.srv = httptest.NewUnstartedServer(plain.Config.Handler)
	s.srv.TLS = ca.ServerTLS(t)
	s.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are not news
	s.srv.StartTLS()
}

// With the Python client's TLS variables the agent trusts a private CA for
// the bundle fetch (HTTPS) and the pub/sub socket (WSS).
// Mutations caught: withServerTLS not setting the transport's or the
// dialer's TLSClientConfig.
func TestE2E_ServerTLSTrustedCA(t *testing.T) {
	ca := testutil.NewCA(t)
	srv := newTestServer(t, exampleFiles(t))
	serveTLS(t, srv, ca)
	h := start(t, srv, map[string]string{
		"OPAL_CLIENT_SELF_SIGNED_CERTIFICATES_ALLOWED": "true",
		"OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE":      ca.CertFile,
	})
	h.waitEvents("handshake", 1)
	// The first transaction, not a later success: a refused handshake fails it at once.
	if tx := h.tx(); !tx.Success || tx.ID != srv.head() {
		t.Fatalf("first transaction %+v, want a success at the head %s", tx, srv.head())
	}
	if got := h.metric("opal_client_pubsub_connected", nil); got != 1 {
		t.Fatalf("opal_client_pubsub_connected = %v over wss, want 1", got)
	}
	if !h.decide("alice", "write") {
		t.Fatal("no decision from the policy fetched over HTTPS")
	}
}

// A trusted CA file that cannot be read stops the start, naming the variable.
func TestServerTLSUnreadableCAStopsStart(t *testing.T) {
	cfg, err := config.LoadFrom(func(k string) (string, bool) {
		v, ok := map[string]string{
			"OPAL_CLIENT_SELF_SIGNED_CERTIFICATES_ALLOWED": "true",
			"OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE":      filepath.Join(t.TempDir(), "missing.pem"),
		}[k]
		return v, ok
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg.ClientAPIServerPort, cfg.InlineOPAConfig.Addr = 0, "127.0.0.1:0"
	a, err := New(context.Background(), Options{Config: cfg})
	var ce *config.Error
	if !errors.As(err, &ce) || ce.Var != "OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE" {
		if a != nil {
			a.release()
		}
		t.Fatalf("New: err = %v, want a *config.Error for OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE", err)
	}
}

// The data updater's requests go through the same TLS settings: the data
// sources config and a data source, both over HTTPS with the private CA.
func TestE2E_ServerTLSDataFetch(t *testing.T) {
	ca := testutil.NewCA(t)
	srv := newDataServer(t, `{"dave":{"roles":["viewer"]}}`)
	serveTLS(t, srv.testServer, ca)
	h := startData(t, srv, map[string]string{
		"OPAL_CLIENT_SELF_SIGNED_CERTIFICATES_ALLOWED": "true",
		"OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE":      ca.CertFile,
	})
	h.loaded()
	if got := h.accounts(); !strings.Contains(got, `"dave"`) {
		t.Fatalf("data.accounts = %s, want the source's accounts", got)
	}
}
