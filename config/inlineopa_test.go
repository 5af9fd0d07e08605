package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestInlineOPAConfig: every key of the Python client's inline OPA options
// is read with its meaning; anything else stops the agent naming the key.
func TestInlineOPAConfig(t *testing.T) {
	dir := t.TempDir()
	file := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg, cert, key, ca, rego := file("opa.yaml"), file("c.pem"), file("k.pem"), file("ca.pem"), file("authz.rego")
	q := func(s string) string { return `"` + s + `"` }

	t.Run("every_key_read", func(t *testing.T) {
		c, err := ParseInlineOPAConfig(`{"addr":"https://127.0.0.1:9181","authentication":"tls","authorization":"basic",` +
			`"config_file":` + q(cfg) + `,"tls_cert_file":` + q(cert) + `,"tls_private_key_file":` + q(key) +
			`,"tls_ca_cert_file":` + q(ca) + `,"tls_cert_refresh_period":"5m","log_level":"debug","files":[` + q(rego) +
			`,"system.x:` + cfg + `"],"v0_compatible":true}`)
		if err != nil {
			t.Fatal(err)
		}
		want := InlineOPAConfig{Addr: "https://127.0.0.1:9181", Authentication: "tls", Authorization: "basic", ConfigFile: cfg,
			TLSCertFile: cert, TLSPrivateKeyFile: key, TLSCACertFile: ca, TLSCertRefreshPeriod: 5 * time.Minute, LogLevel: "debug",
			Files: []string{rego, "system.x:" + cfg}, V0Compatible: true}
		if c.String() != want.String() {
			t.Fatalf("got %s\nwant %s", c, want)
		}
	})
	t.Run("default_when_unset", func(t *testing.T) {
		c, err := ParseInlineOPAConfig("")
		if err != nil || c.String() != DefaultInlineOPAConfig().String() {
			t.Fatalf("%v %v", c, err)
		}
	})

	refused := []struct{ name, value, key string }{
		{"unknown_key_refused", `{"authentification":"token"}`, "authentification"},
		{"not_an_object", `["addr"]`, ""},
		{"bad_authentication", `{"authentication":"oauth"}`, "authentication"},
		{"bad_authorization", `{"authorization":"rbac"}`, "authorization"},
		{"bad_log_level", `{"log_level":"warn"}`, "log_level"},
		{"addr_not_host_port", `{"addr":"nope"}`, "addr"},
		{"addr_bad_scheme", `{"addr":"unix:///tmp/s"}`, "addr"},
		{"addr_not_string", `{"addr":8181}`, "addr"},
		{"null_value", `{"authorization":null}`, "authorization"},
		{"missing_config_file", `{"config_file":"/nonexistent/opa.yaml"}`, "config_file"},
		{"config_file_is_dir", `{"config_file":` + q(dir) + `}`, "config_file"},
		{"missing_policy_file", `{"files":["/nonexistent/authz.rego"]}`, "files"},
		{"files_not_list", `{"files":` + q(rego) + `}`, "files"},
		{"bad_refresh_period", `{"tls_cert_refresh_period":"often"}`, "tls_cert_refresh_period"},
		{"v0_compatible_not_bool", `{"v0_compatible":"yes"}`, "v0_compatible"},
		{"cert_without_key", `{"tls_cert_file":` + q(cert) + `}`, "tls_private_key_file"},
		{"https_without_cert", `{"addr":"https://127.0.0.1:8181"}`, "addr"},
		{"tls_auth_without_ca", `{"authentication":"tls","authorization":"basic","tls_cert_file":` + q(cert) + `,"tls_private_key_file":` + q(key) + `}`, "authentication"},
		{"token_without_authorization", `{"authentication":"token"}`, "authentication"},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, map[string]string{"OPAL_INLINE_OPA_CONFIG": tc.value})
			var ie *InlineOPAError
			if !errors.As(err, &ie) || ie.Key != tc.key {
				t.Fatalf("err = %v, want an *InlineOPAError for key %q", err, tc.key)
			}
			var ce *Error
			if !errors.As(err, &ce) || ce.Var != "OPAL_INLINE_OPA_CONFIG" || (tc.key != "" && !strings.Contains(err.Error(), tc.key)) {
				t.Fatalf("err = %v, want the variable and the key named", err)
			}
		})
	}
}

// TestOPAV0CompatAndLogFormat: the Python client's defaults.
func TestOPAV0CompatAndLogFormat(t *testing.T) {
	c, err := load(t, map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	if !c.OPAV0Compat || c.InlineOPALogFormat != "none" {
		t.Fatalf("OPAV0Compat=%v InlineOPALogFormat=%q, want true and none", c.OPAV0Compat, c.InlineOPALogFormat)
	}
	if _, err := load(t, map[string]string{"OPAL_INLINE_OPA_LOG_FORMAT": "pretty"}); err == nil {
		t.Fatal("log format pretty accepted")
	}
	if c, err := load(t, map[string]string{"OPAL_INLINE_OPA_LOG_FORMAT": "HTTP", "OPAL_OPA_V0_COMPAT": "false"}); err != nil || c.InlineOPALogFormat != "http" || c.OPAV0Compat {
		t.Fatalf("%+v %v", c, err)
	}
}

// TestPolicyStoreTLSFiles: the external store's client TLS files must exist,
// and the certificate and key go together.
func TestPolicyStoreTLSFiles(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.pem")
	if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		env  map[string]string
		bad  string
	}{
		{"all_set", map[string]string{"OPAL_POLICY_STORE_TLS_CLIENT_CERT": p, "OPAL_POLICY_STORE_TLS_CLIENT_KEY": p, "OPAL_POLICY_STORE_TLS_CA": p}, ""},
		{"missing_ca_refused", map[string]string{"OPAL_POLICY_STORE_TLS_CA": p + ".nope"}, "OPAL_POLICY_STORE_TLS_CA"},
		{"cert_without_key_refused", map[string]string{"OPAL_POLICY_STORE_TLS_CLIENT_CERT": p}, "OPAL_POLICY_STORE_TLS_CLIENT_KEY"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := load(t, tc.env)
			var ce *Error
			switch {
			case tc.bad == "" && (err != nil || c.PolicyStoreTLSCA != p):
				t.Fatalf("%v", err)
			case tc.bad != "" && (!errors.As(err, &ce) || ce.Var != tc.bad):
				t.Fatalf("err = %v, want %s named", err, tc.bad)
			}
		})
	}
}
