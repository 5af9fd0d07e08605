package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// InlineOPAConfig is OPAL_INLINE_OPA_CONFIG: the Python client's inline OPA
// options (opal_client/engine/options.py), which it maps to `opa run
// --server` flags; here they configure the embedded OPA the same way.
type InlineOPAConfig struct {
	// Addr is the REST API's address: host:port, :port, or http:// or
	// https:// in front (https serves TLS). Default 127.0.0.1:8181.
	Addr string
	// Authentication is off, token or tls (--authentication).
	Authentication string
	// Authorization is off or basic (--authorization): basic evaluates
	// data.system.authz.allow on every request.
	Authorization string
	// ConfigFile is an OPA configuration file (--config-file).
	ConfigFile string
	// TLSCertFile and TLSPrivateKeyFile are the server's certificate and key
	// (--tls-cert-file, --tls-private-key-file); TLSCACertFile the CA that
	// signs client certificates (--tls-ca-cert-file).
	TLSCertFile, TLSPrivateKeyFile, TLSCACertFile string
	// TLSCertRefreshPeriod, if > 0, re-reads the certificate files that
	// often (--tls-cert-refresh-period); 0 re-reads them when they change.
	TLSCertRefreshPeriod time.Duration
	// LogLevel is info, debug or error (--log-level).
	LogLevel string
	// Files are policies and data loaded at start (opa run's paths), e.g.
	// the system.authz policy; bundles never delete or overwrite them.
	Files []string
	// V0Compatible runs OPA as --v0-compatible (also when
	// OPAL_OPA_V0_COMPAT is true).
	V0Compatible bool
}

// Accepted values of the inline OPA keys, shared by the errors and the docs.
var (
	inlineOPAKeys = []string{"addr", "authentication", "authorization", "config_file", "files", "log_level",
		"tls_ca_cert_file", "tls_cert_file", "tls_cert_refresh_period", "tls_private_key_file", "v0_compatible"}
	authenticationSchemes = []string{"off", "token", "tls"}
	authorizationSchemes  = []string{"off", "basic"}
	inlineOPALogLevels    = []string{"info", "debug", "error"}
	// InlineOPALogFormats are the values of OPAL_INLINE_OPA_LOG_FORMAT.
	InlineOPALogFormats = []string{"none", "minimal", "http", "full"}
)

const acceptInlineOPA = `a JSON object with the keys addr, authentication, authorization, config_file, files, log_level, tls_ca_cert_file, tls_cert_file, tls_cert_refresh_period, tls_private_key_file, v0_compatible`

// InlineOPAError is a refused OPAL_INLINE_OPA_CONFIG: Key names the key (""
// when the value is not a JSON object at all).
type InlineOPAError struct {
	Key    string
	Reason string
}

func (e *InlineOPAError) Error() string {
	if e.Key == "" {
		return e.Reason
	}
	return fmt.Sprintf("key %q: %s", e.Key, e.Reason)
}

// DefaultInlineOPAConfig is the configuration when OPAL_INLINE_OPA_CONFIG is
// unset: at DefaultInlineOPAAddr, everything else off. An empty
// Authentication or Authorization means off, an empty LogLevel info.
func DefaultInlineOPAConfig() InlineOPAConfig {
	return InlineOPAConfig{Addr: DefaultInlineOPAAddr}
}

// ParseInlineOPAConfig parses OPAL_INLINE_OPA_CONFIG strictly: an unknown
// key, a value of the wrong type or out of its set, a file that does not
// exist, or a combination OPA cannot serve is an *InlineOPAError naming the
// key. Nothing is ignored. "" is the default configuration.
func ParseInlineOPAConfig(s string) (InlineOPAConfig, error) {
	c := DefaultInlineOPAConfig()
	if strings.TrimSpace(s) == "" {
		return c, nil
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(s), &raw); err != nil || raw == nil {
		return c, &InlineOPAError{Reason: "not a JSON object"}
	}
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		// The guard of the strict parse: a key we do not know is refused,
		// never dropped (mutation: "unknown inline OPA key refused").
		if !contains(inlineOPAKeys, k) {
			return c, &InlineOPAError{Key: k, Reason: "unknown key; known keys: " + strings.Join(inlineOPAKeys, ", ")}
		}
		if err := c.set(k, raw[k]); err != nil {
			return c, err
		}
	}
	return c, c.check()
}

// set decodes one key's value.
func (c *InlineOPAConfig) set(k string, v json.RawMessage) error {
	str := func(dst *string, allowed []string) error {
		if err := strictJSON(v, dst); err != nil {
			return &InlineOPAError{Key: k, Reason: "not a string"}
		}
		if allowed != nil && !contains(allowed, *dst) {
			return &InlineOPAError{Key: k, Reason: fmt.Sprintf("%q is not one of %s", *dst, strings.Join(allowed, ", "))}
		}
		return nil
	}
	switch k {
	case "addr":
		if err := str(&c.Addr, nil); err != nil {
			return err
		}
		if err := checkAddr(c.Addr); err != nil {
			return &InlineOPAError{Key: k, Reason: err.Error()}
		}
	case "authentication":
		return str(&c.Authentication, authenticationSchemes)
	case "authorization":
		return str(&c.Authorization, authorizationSchemes)
	case "log_level":
		return str(&c.LogLevel, inlineOPALogLevels)
	case "config_file":
		return fileKey(k, v, &c.ConfigFile)
	case "tls_cert_file":
		return fileKey(k, v, &c.TLSCertFile)
	case "tls_private_key_file":
		return fileKey(k, v, &c.TLSPrivateKeyFile)
	case "tls_ca_cert_file":
		return fileKey(k, v, &c.TLSCACertFile)
	case "tls_cert_refresh_period":
		var p string
		if err := str(&p, nil); err != nil {
			return err
		}
		d, err := time.ParseDuration(p)
		if err != nil || d <= 0 {
			return &InlineOPAError{Key: k, Reason: fmt.Sprintf("%q is not a duration > 0 such as 30s or 5m", p)}
		}
		c.TLSCertRefreshPeriod = d
	case "files":
		if err := strictJSON(v, &c.Files); err != nil {
			return &InlineOPAError{Key: k, Reason: "not a list of paths"}
		}
		for _, f := range c.Files {
			if err := checkLoadPath(f); err != nil {
				return &InlineOPAError{Key: k, Reason: err.Error()}
			}
		}
	case "v0_compatible":
		if err := strictJSON(v, &c.V0Compatible); err != nil {
			return &InlineOPAError{Key: k, Reason: "not true or false"}
		}
	}
	return nil
}

// check refuses the combinations OPA cannot serve, or serves in a way that
// protects nothing.
func (c *InlineOPAConfig) check() error {
	if (c.TLSCertFile == "") != (c.TLSPrivateKeyFile == "") {
		k := "tls_private_key_file"
		if c.TLSCertFile == "" {
			k = "tls_cert_file"
		}
		return &InlineOPAError{Key: k, Reason: "tls_cert_file and tls_private_key_file go together"}
	}
	if strings.HasPrefix(c.Addr, "https://") && c.TLSCertFile == "" {
		return &InlineOPAError{Key: "addr", Reason: "https:// needs tls_cert_file and tls_private_key_file"}
	}
	if c.Authentication == "tls" && (c.TLSCACertFile == "" || c.TLSCertFile == "") {
		return &InlineOPAError{Key: "authentication", Reason: "tls needs tls_ca_cert_file (the client CA) and a server certificate (tls_cert_file, tls_private_key_file)"}
	}
	// opa run only logs an error here; a sidecar that believes it is
	// protected while it is not is worse than one that does not start.
	if c.Authentication != "" && c.Authentication != "off" && c.Authorization != "basic" {
		return &InlineOPAError{Key: "authentication", Reason: c.Authentication + " without authorization=basic authenticates but lets every caller through"}
	}
	return nil
}

// String is the configuration as JSON, in the keys of OPAL_INLINE_OPA_CONFIG.
func (c InlineOPAConfig) String() string {
	m := map[string]any{"addr": c.Addr, "v0_compatible": c.V0Compatible}
	opt := map[string]string{"authentication": c.Authentication, "authorization": c.Authorization,
		"log_level": c.LogLevel, "config_file": c.ConfigFile, "tls_cert_file": c.TLSCertFile,
		"tls_private_key_file": c.TLSPrivateKeyFile, "tls_ca_cert_file": c.TLSCACertFile}
	for k, v := range opt {
		if v != "" {
			m[k] = v
		}
	}
	if c.TLSCertRefreshPeriod > 0 {
		m["tls_cert_refresh_period"] = c.TLSCertRefreshPeriod.String()
	}
	if len(c.Files) > 0 {
		m["files"] = c.Files
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// strictJSON decodes v into dst; null is refused (it would leave the default
// silently).
func strictJSON(v json.RawMessage, dst any) error {
	if bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
		return fmt.Errorf("null")
	}
	return json.Unmarshal(v, dst)
}

func fileKey(k string, v json.RawMessage, dst *string) error {
	if err := strictJSON(v, dst); err != nil || *dst == "" {
		return &InlineOPAError{Key: k, Reason: "not a file path"}
	}
	if err := checkFile(*dst); err != nil {
		return &InlineOPAError{Key: k, Reason: err.Error()}
	}
	return nil
}

// checkFile refuses a path that is not a readable regular file.
func checkFile(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", p)
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	return f.Close()
}

// checkLoadPath accepts what opa run loads: a file or a directory, maybe
// with a "<dotted.path>:" prefix for data.
func checkLoadPath(p string) error {
	if p == "" {
		return fmt.Errorf("empty path")
	}
	if _, err := os.Stat(p); err == nil {
		return nil
	}
	if i := strings.Index(p, ":"); i > 0 && !strings.Contains(p[:i], "/") {
		if _, err := os.Stat(p[i+1:]); err == nil {
			return nil
		}
	}
	_, err := os.Stat(p)
	return err
}

// checkAddr accepts host:port or :port, optionally behind http:// or https://.
func checkAddr(a string) error {
	hp := a
	if i := strings.Index(a, "://"); i >= 0 {
		if s := a[:i]; s != "http" && s != "https" {
			return fmt.Errorf("scheme %q is not http or https", s)
		}
		hp = a[i+3:]
	}
	_, port, err := net.SplitHostPort(hp)
	if err != nil {
		return fmt.Errorf("%q is not [http[s]://]host:port", a)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port %q is not 0 to 65535", port)
	}
	return nil
}

// checkTLSFiles checks the external store's client TLS files: each must be
// a readable file, and the certificate and key go together.
func checkTLSFiles(cert, key, ca string) (string, error) {
	for _, f := range []struct{ name, path string }{
		{"POLICY_STORE_TLS_CLIENT_CERT", cert}, {"POLICY_STORE_TLS_CLIENT_KEY", key}, {"POLICY_STORE_TLS_CA", ca},
	} {
		if f.path == "" {
			continue
		}
		if err := checkFile(f.path); err != nil {
			return f.name, err
		}
	}
	if (cert == "") != (key == "") {
		if cert == "" {
			return "POLICY_STORE_TLS_CLIENT_CERT", fmt.Errorf("the client certificate and key go together")
		}
		return "POLICY_STORE_TLS_CLIENT_KEY", fmt.Errorf("the client certificate and key go together")
	}
	return "", nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
