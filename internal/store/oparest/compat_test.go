package oparest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/opal-go/opal-client/internal/store"
	st "github.com/opal-go/opal-client/internal/store/storetest"
	"github.com/opal-go/opal-client/internal/testutil"
)

// startRealOPA runs `opa run --server` with args on a free loopback port and
// returns its URL once /health answers (polled, with a deadline).
func startRealOPA(t *testing.T, args ...string) string {
	t.Helper()
	bin := testutil.OPABinary(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin, append([]string{"run", "--server", "--addr", addr, "--log-level", "error"}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	base := "http://" + addr
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond) // polls the process start only
	defer tick.Stop()
	for {
		resp, err := http.Get(base + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return base
			}
		}
		select {
		case <-deadline.C:
			t.Fatalf("opa run did not start: %v", err)
		case <-tick.C:
		}
	}
}

func isCompile(err error) bool { var e *store.CompileError; return errors.As(err, &e) }

// TestV0Compatible_PreCompile: against `opa run --v0-compatible`, a bundle
// mixing v0 modules and rego.v1 modules passes the local pre-compile and
// loads when the store is v0-compatible (OPAL_OPA_V0_COMPAT); without it the
// v0 module is refused before any write.
func TestV0Compatible_PreCompile(t *testing.T) {
	base := startRealOPA(t, "--v0-compatible")
	v0 := "package app.rbac\n\ndefault allow = false\n\nallow { input.user == \"alice\" }\n"
	v1 := "package app.other\n\nimport rego.v1\n\nok if input.user in {\"alice\"}\n"
	b := st.Full("h1", map[string]string{"rbac/rbac.rego": v0, "other/other.rego": v1}, nil)
	ctx := context.Background()

	s, err := New(Options{URL: base})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ApplyPolicy(ctx, b); !isCompile(err) {
		t.Fatalf("v1 store: err = %v, want a compile error", err)
	}
	o := st.OPA{T: t, Base: base}
	if got := o.Get("/v1/policies"); strings.Contains(got, "rbac.rego") {
		t.Fatalf("refused bundle written: %s", got)
	}

	s, err = New(Options{URL: base, V0Compatible: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ApplyPolicy(ctx, b); err != nil {
		t.Fatal(err)
	}
	if _, body := o.Do("POST", "/v1/data/app/rbac/allow", `{"input":{"user":"alice"}}`); body != `{"result":true}` {
		t.Fatalf("v0 decision: %s", body)
	}
	if _, body := o.Do("POST", "/v1/data/app/other/ok", `{"input":{"user":"alice"}}`); body != `{"result":true}` {
		t.Fatalf("rego.v1 decision: %s", body)
	}
}

// TestMutualTLS: with the client certificate, key and CA the store reaches
// an OPA that requires a client certificate signed by that CA; without them
// it does not.
func TestMutualTLS(t *testing.T) {
	files := testutil.GenerateTLS(t)
	pem, err := os.ReadFile(files.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	cert, err := tls.LoadX509KeyPair(files.ServerCert, files.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			w.Write([]byte("{}"))
			return
		}
		w.WriteHeader(404)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	srv.StartTLS()
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	cases := []struct {
		name string
		opts Options
		ok   bool
	}{
		{"client_cert_accepted", Options{TLSClientCert: files.ClientCert, TLSClientKey: files.ClientKey, TLSCA: files.CA}, true},
		{"ca_only_refused_by_server", Options{TLSCA: files.CA}, false},
		{"no_tls_files_refused", Options{}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.opts
			o.URL, o.Attempts = srv.URL, 1
			s, err := New(o)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Health(ctx); (err == nil) != tc.ok {
				t.Fatalf("Health = %v, want ok=%v", err, tc.ok)
			}
		})
	}
	t.Run("bad_ca_file_refused", func(t *testing.T) {
		_, err := New(Options{URL: srv.URL, TLSCA: files.ClientKey})
		var te *TLSError
		if !errors.As(err, &te) {
			t.Fatalf("err = %v, want *TLSError", err)
		}
	})
}
