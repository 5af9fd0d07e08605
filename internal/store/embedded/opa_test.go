package embedded

import (
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/opal-go/opal-client/config"
	"github.com/opal-go/opal-client/internal/backup"
	"github.com/opal-go/opal-client/internal/store"
	st "github.com/opal-go/opal-client/internal/store/storetest"
	"github.com/opal-go/opal-client/internal/testutil"
)

const authzRego = `package system.authz

import rego.v1

default allow := false

allow if input.identity == "s3cret"
`

// jsonLines decodes each line of a JSON log that decodes.
func jsonLines(b *testutil.SyncBuffer) []map[string]any {
	var out []map[string]any
	for _, l := range strings.Split(b.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// startOPA starts the store with opts (an ephemeral port unless set).
func startOPA(t *testing.T, opts Options) *Store {
	t.Helper()
	if opts.Addr == "" && opts.OPA.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	return s
}

func do(t *testing.T, c *http.Client, method, url, token, body string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// TestInlineOPA_TokenAuthnBasicAuthz: with authentication token,
// authorization basic and the authz policy in files, OPA refuses the
// unauthenticated decision and data write, and answers the token holder.
func TestInlineOPA_TokenAuthnBasicAuthz(t *testing.T) {
	s := startOPA(t, Options{OPA: config.InlineOPAConfig{Authentication: "token", Authorization: "basic",
		Files: []string{writeFile(t, "authz.rego", authzRego)}}})
	if err := s.ApplyPolicy(context.Background(), st.Full("h1", map[string]string{"rbac/rbac.rego": rbacV1}, nil)); err != nil {
		t.Fatal(err)
	}
	base := "http://" + s.Addr()
	c := http.DefaultClient
	cases := []struct {
		name, method, path, token, body string
		want                            int
	}{
		{"unauthenticated_decision_refused", "POST", "/v1/data/app/rbac/allow", "", `{"input":{"user":"alice"}}`, 401},
		{"unauthenticated_data_write_refused", "PUT", "/v1/data/pwned", "", `{}`, 401},
		{"wrong_token_refused", "POST", "/v1/data/app/rbac/allow", "guess", `{"input":{"user":"alice"}}`, 401},
		{"token_holder_answered", "POST", "/v1/data/app/rbac/allow", "s3cret", `{"input":{"user":"alice"}}`, 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, body := do(t, c, tc.method, base+tc.path, tc.token, tc.body)
			if code != tc.want {
				t.Fatalf("%s %s = %d %s, want %d", tc.method, tc.path, code, body, tc.want)
			}
			if tc.want == 200 && !strings.Contains(body, `"result":true`) {
				t.Fatalf("decision %s", body)
			}
		})
	}
}

// TestInlineOPA_FilesSurviveBundles: what the configured files load is
// never deleted nor overwritten by a bundle.
func TestInlineOPA_FilesSurviveBundles(t *testing.T) {
	pol := writeFile(t, "extra.rego", "package files.extra\n\nx := data.users.alice\n")
	data := writeFile(t, "data.json", `{"users":{"alice":"admin"}}`)
	s := startOPA(t, Options{OPA: config.InlineOPAConfig{Files: []string{pol, data}}})
	o := st.OPA{T: t, Base: "http://" + s.Addr()}
	ctx := context.Background()
	if err := s.ApplyPolicy(ctx, st.Full("h1", map[string]string{"rbac/rbac.rego": rbacV1}, nil)); err != nil {
		t.Fatal(err)
	}
	if got := o.Get("/v1/data/files/extra/x"); got != `{"result":"admin"}` {
		t.Fatalf("file policy after a full bundle: %s", got)
	}
	err := s.ApplyPolicy(ctx, st.Full("h2", map[string]string{"rbac/rbac.rego": rbacV1}, map[string]string{".": `{"users":{"alice":"nobody"}}`}))
	var de *store.DataError
	if !errors.As(err, &de) {
		t.Fatalf("bundle overwriting file data: err = %v, want *store.DataError", err)
	}
	if got := o.Get("/v1/data/users/alice"); got != `{"result":"admin"}` {
		t.Fatalf("file data after refused bundle: %s", got)
	}
	// A restore keeps what the files say.
	exp, err := s.Export(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := exp.Policies[pol]; ok {
		t.Fatal("the file policy is in the backup")
	}
	if err := s.Import(ctx, &backup.State{Hash: "h9", Policies: exp.Policies, Data: []byte(`{"users":{"alice":"old"}}`)}); err != nil {
		t.Fatal(err)
	}
	if got := o.Get("/v1/data/users/alice"); got != `{"result":"admin"}` {
		t.Fatalf("file data after import: %s", got)
	}
}

// TestPluginStatus_NotReadyUntilPolicy: OPA's /health?plugins answers 500
// until a policy is loaded (or restored), 200 after.
func TestPluginStatus_NotReadyUntilPolicy(t *testing.T) {
	for _, load := range []string{"bundle", "backup"} {
		t.Run("ready_after_"+load, func(t *testing.T) {
			s := startOPA(t, Options{})
			o := st.OPA{T: t, Base: "http://" + s.Addr()}
			if code, body := o.Do("GET", "/health?plugins", ""); code != 500 {
				t.Fatalf("before any policy: %d %s, want 500", code, body)
			}
			ctx := context.Background()
			var err error
			if load == "bundle" {
				err = s.ApplyPolicy(ctx, st.Full("h1", map[string]string{"rbac/rbac.rego": rbacV1}, nil))
			} else {
				err = s.Import(ctx, &backup.State{Hash: "h1", Policies: map[string]string{"rbac/rbac.rego": rbacV1}, Data: []byte(`{}`)})
			}
			if err != nil {
				t.Fatal(err)
			}
			if code, body := o.Do("GET", "/health?plugins", ""); code != 200 {
				t.Fatalf("after the policy: %d %s, want 200", code, body)
			}
		})
	}
}

// TestV0Compatible: under --v0-compatible a v0 policy loads and a bundle
// mixing v0 files and rego.v1 files loads as opa run loads it; without it
// the v0 policy is refused.
func TestV0Compatible(t *testing.T) {
	v0 := "package app.rbac\n\ndefault allow = false\n\nallow { input.user == \"alice\" }\n"
	v1 := "package app.other\n\nimport rego.v1\n\nok if input.user in {\"alice\"}\n"
	b := st.Full("h1", map[string]string{"rbac/rbac.rego": v0, "other/other.rego": v1}, nil)
	t.Run("v0_and_rego_v1_load", func(t *testing.T) {
		s := startOPA(t, Options{V0Compatible: true})
		if err := s.ApplyPolicy(context.Background(), b); err != nil {
			t.Fatal(err)
		}
		o := st.OPA{T: t, Base: "http://" + s.Addr()}
		if got := decide(t, o, "alice"); got != `{"result":true}` {
			t.Fatalf("v0 decision %s", got)
		}
		if _, body := o.Do("POST", "/v1/data/app/other/ok", `{"input":{"user":"alice"}}`); body != `{"result":true}` {
			t.Fatalf("rego.v1 decision %s", body)
		}
	})
	t.Run("v0_refused_in_v1", func(t *testing.T) {
		s := startOPA(t, Options{})
		if err := s.ApplyPolicy(context.Background(), b); !isCompile(err) {
			t.Fatalf("err = %v, want a compile error", err)
		}
	})
}

// TestConsoleDecisionLogs: decision_logs.console logs every decision, with
// its decision_id, through the agent's handler.
func TestConsoleDecisionLogs(t *testing.T) {
	var buf testutil.SyncBuffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cfg := writeFile(t, "opa.yaml", "decision_logs:\n  console: true\n")
	s := startOPA(t, Options{OPA: config.InlineOPAConfig{ConfigFile: cfg}, Logger: log})
	if err := s.ApplyPolicy(context.Background(), st.Full("h1", map[string]string{"rbac/rbac.rego": rbacV1}, nil)); err != nil {
		t.Fatal(err)
	}
	o := st.OPA{T: t, Base: "http://" + s.Addr()}
	var ids []string
	for _, u := range []string{"alice", "bob"} {
		_, body := o.Do("POST", "/v1/data/app/rbac/allow", `{"input":{"user":"`+u+`"}}`)
		var r struct {
			ID string `json:"decision_id"`
		}
		if json.Unmarshal([]byte(body), &r); r.ID == "" {
			t.Fatalf("no decision_id in %s", body)
		}
		ids = append(ids, r.ID)
	}
	logged := map[string]bool{}
	for _, l := range jsonLines(&buf) {
		if l["msg"] == "Decision Log" {
			id, _ := l["decision_id"].(string)
			logged[id] = true
		}
	}
	for _, id := range ids {
		if !logged[id] {
			t.Fatalf("decision %s not logged; logs: %v", id, jsonLines(&buf))
		}
	}
}

// TestDecisionLogsToService: decision logs sent to a service reach it.
func TestDecisionLogsToService(t *testing.T) {
	got := make(chan string, 16)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var rd io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				w.WriteHeader(400)
				return
			}
			rd = zr
		}
		b, _ := io.ReadAll(rd)
		got <- r.URL.Path + " " + string(b)
	}))
	defer collector.Close()
	cfg := writeFile(t, "opa.yaml", "services:\n  collector:\n    url: "+collector.URL+"\n"+
		"decision_logs:\n  service: collector\n")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := New(ctx, Options{Addr: "127.0.0.1:0", OPA: config.InlineOPAConfig{ConfigFile: cfg}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ApplyPolicy(context.Background(), st.Full("h1", map[string]string{"rbac/rbac.rego": rbacV1}, nil)); err != nil {
		t.Fatal(err)
	}
	o := st.OPA{T: t, Base: "http://" + s.Addr()}
	_, body := o.Do("POST", "/v1/data/app/rbac/allow", `{"input":{"user":"alice"}}`)
	var r struct {
		ID string `json:"decision_id"`
	}
	_ = json.Unmarshal([]byte(body), &r)
	// Stopping flushes what the periodic upload has not sent yet.
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for {
		select {
		case b := <-got:
			if strings.HasPrefix(b, "/logs ") && strings.Contains(b, r.ID) {
				return
			}
		case <-deadline.C:
			t.Fatalf("the collector never received decision %q", r.ID)
		}
	}
}

// TestOPAConfigFileRefused: a configuration file enabling what OPAL owns,
// or with a key OPA does not know, stops the start naming it.
func TestOPAConfigFileRefused(t *testing.T) {
	cases := []struct{ name, yaml, key string }{
		// Refused with the reason, not as an unknown key.
		{"bundles_refused", "bundles:\n  authz:\n    resource: x\n", `"bundles" is refused: OPAL owns the policy`},
		{"discovery_refused", "discovery:\n  resource: x\n", `"discovery" is refused: OPAL owns the policy`},
		{"unknown_key_refused", "decision_log:\n  console: true\n", "decision_log"},
		{"bad_plugin_config_refused", "decision_logs:\n  service: nowhere\n", "config_file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			s, err := New(ctx, Options{Addr: "127.0.0.1:0", OPA: config.InlineOPAConfig{ConfigFile: writeFile(t, "opa.yaml", tc.yaml)}})
			if err == nil {
				_ = s.Shutdown(ctx)
				t.Fatal("started")
			}
			var ce *OPAConfigError
			if !errors.As(err, &ce) || ce.Key != "config_file" || !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("err = %v, want *OPAConfigError naming %s", err, tc.key)
			}
		})
	}
}

// TestOPAServesMetricsAndTLS: /metrics on the OPA address (as opa run),
// and https:// with a client certificate (authentication tls).
func TestOPAServesMetricsAndTLS(t *testing.T) {
	files := testutil.GenerateTLS(t)
	authz := writeFile(t, "authz.rego", "package system.authz\n\nimport rego.v1\n\ndefault allow := false\n\nallow if input.client_certificates[0].Subject.CommonName == \"client\"\n")
	s := startOPA(t, Options{Addr: "https://127.0.0.1:0", OPA: config.InlineOPAConfig{
		Authentication: "tls", Authorization: "basic", TLSCertFile: files.ServerCert, TLSPrivateKeyFile: files.ServerKey,
		TLSCACertFile: files.CA, Files: []string{authz}}})
	pem, _ := os.ReadFile(files.CA)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	cert, err := tls.LoadX509KeyPair(files.ClientCert, files.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	withCert := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}}
	withoutCert := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	base := "https://" + s.Addr()
	if code, _ := do(t, withCert, "GET", base+"/v1/data", "", ""); code != 200 {
		t.Fatalf("client certificate holder: %d", code)
	}
	if code, body := do(t, withCert, "GET", base+"/metrics", "", ""); code != 200 || !strings.Contains(body, "http_request_duration_seconds") {
		t.Fatalf("/metrics: %d %.200s", code, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/data", nil)
	if resp, err := withoutCert.Do(req); err == nil {
		resp.Body.Close()
		if resp.StatusCode != 401 {
			t.Fatalf("without a client certificate: %d", resp.StatusCode)
		}
	}
}

// TestOPALogger: OPA's records through the agent's handler, shaped by
// OPAL_INLINE_OPA_LOG_FORMAT.
func TestOPALogger(t *testing.T) {
	fields := map[string]any{"req_method": "GET", "req_path": "/v1/data", "resp_status": 200, "client_addr": "x"}
	cases := []struct {
		format    string
		console   bool
		wantMsg   bool
		wantAttrs []string
		dropAttrs []string
	}{
		{LogFormatNone, false, false, nil, nil},
		{LogFormatMinimal, false, true, nil, []string{"req_method"}},
		{LogFormatHTTP, false, true, []string{"req_method", "req_path", "resp_status"}, []string{"client_addr"}},
		{LogFormatFull, false, true, []string{"req_method", "client_addr"}, nil},
		{LogFormatNone, true, true, []string{"req_method", "client_addr"}, nil}, // console decision logs: whole
	}
	for _, tc := range cases {
		name := tc.format
		if tc.console {
			name += "_console"
		}
		t.Run(name, func(t *testing.T) {
			var buf testutil.SyncBuffer
			l := newOPALogger(slog.New(slog.NewJSONHandler(&buf, nil)), tc.format, 2, tc.console)
			l.WithFields(fields).Info("Sent %s.", "response")
			lines := jsonLines(&buf)
			if !tc.wantMsg {
				if len(lines) != 0 {
					t.Fatalf("logged %v", lines)
				}
				return
			}
			if len(lines) != 1 || lines[0]["msg"] != "Sent response." {
				t.Fatalf("logged %v", lines)
			}
			for _, a := range tc.wantAttrs {
				if _, ok := lines[0][a]; !ok {
					t.Fatalf("%s missing in %v", a, lines[0])
				}
			}
			for _, a := range tc.dropAttrs {
				if _, ok := lines[0][a]; ok {
					t.Fatalf("%s kept in %v", a, lines[0])
				}
			}
		})
	}
	t.Run("errors_pass_with_none", func(t *testing.T) {
		var buf testutil.SyncBuffer
		newOPALogger(slog.New(slog.NewJSONHandler(&buf, nil)), LogFormatNone, 2, false).Error("Listener failed.")
		if len(jsonLines(&buf)) != 1 {
			t.Fatal("OPA error dropped")
		}
	})
}

// TestAddrInUse: an address OPA cannot bind stops the start naming addr.
func TestAddrInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := New(ctx, Options{Addr: ln.Addr().String()})
	if err == nil {
		_ = s.Shutdown(ctx)
		t.Fatal("started on an address in use")
	}
	var ce *OPAConfigError
	if !errors.As(err, &ce) || ce.Key != "addr" {
		t.Fatalf("err = %v, want *OPAConfigError for addr", err)
	}
}
