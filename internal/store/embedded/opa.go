package embedded

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"

	"github.com/open-policy-agent/opa/v1/logging"
	"github.com/open-policy-agent/opa/v1/runtime"
	"github.com/open-policy-agent/opa/v1/server"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/util"
)

// OPAConfigError is an inline OPA configuration the embedded OPA cannot run:
// Key names the OPAL_INLINE_OPA_CONFIG key (config_file for a key of the
// OPA configuration file, which Detail names).
type OPAConfigError struct {
	Key    string
	Detail string
	Err    error
}

func (e *OPAConfigError) Error() string {
	s := "inline OPA " + e.Key
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *OPAConfigError) Unwrap() error { return e.Err }

// Top-level keys of an OPA configuration file. OPAL owns the policy, so
// the bundle and discovery plugins (which would load, replace or delete it
// behind the agent's back) are refused, and so is the disk storage: the
// agent's state is in memory, persisted by its backup.
var (
	opaConfigRefused = map[string]string{
		"bundle":    "OPAL owns the policy: a bundle plugin would replace what the agent loads",
		"bundles":   "OPAL owns the policy: a bundle plugin would replace what the agent loads",
		"discovery": "OPAL owns the policy: discovery would load bundles behind the agent",
		"storage":   "the embedded OPA keeps its state in memory; the agent's backup (OPAL_OFFLINE_MODE_ENABLED) persists it",
	}
	opaConfigKeys = []string{"caching", "decision_logs", "default_authorization_decision", "default_decision",
		"distributed_tracing", "keys", "labels", "nd_builtin_cache", "persistence_directory", "plugins", "server",
		"services", "status"}
)

// checkOPAConfigFile refuses an OPA configuration file the embedded OPA
// cannot honour: one that does not parse, enables what OPAL owns, or holds
// a key OPA does not know (opa run only warns; here nothing is dropped).
func checkOPAConfigFile(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return &OPAConfigError{Key: "config_file", Err: err}
	}
	var top map[string]json.RawMessage
	if err := util.Unmarshal(raw, &top); err != nil {
		return &OPAConfigError{Key: "config_file", Detail: path + " is not a YAML or JSON object", Err: err}
	}
	keys := make([]string, 0, len(top))
	for k := range top {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		// The guard that keeps the bundle and discovery plugins off
		// (mutation: "OPA config enabling bundles refused").
		if why, ok := opaConfigRefused[k]; ok {
			return &OPAConfigError{Key: "config_file", Detail: fmt.Sprintf("%s: key %q is refused: %s", path, k, why)}
		}
		if !contains(opaConfigKeys, k) {
			return &OPAConfigError{Key: "config_file", Detail: fmt.Sprintf("%s: unknown key %q; known keys: %s", path, k, strings.Join(opaConfigKeys, ", "))}
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// runtimeParams maps the inline OPA options onto OPA's runtime parameters
// as `opa run --server` maps its flags (cmd/run.go's initRuntime).
func runtimeParams(opts Options, log *slog.Logger) (runtime.Params, error) {
	c := opts.OPA
	p := runtime.NewParams()
	addr := opts.Addr
	if addr == "" {
		addr = c.Addr
	}
	if addr == "" {
		addr = DefaultAddr
	}
	p.Addrs = &[]string{addr}
	p.AddrSetByUser = true
	p.Output = io.Discard
	p.GracefulShutdownPeriod = 10 // opa run's default --shutdown-grace-period
	p.V0Compatible = opts.V0Compatible || c.V0Compatible
	p.ConfigFile = c.ConfigFile
	p.Paths = append([]string(nil), c.Files...)
	if c.ConfigFile != "" {
		if err := checkOPAConfigFile(c.ConfigFile); err != nil {
			return p, err
		}
	}

	switch c.Authentication {
	case "", "off":
		p.Authentication = server.AuthenticationOff
	case "token":
		p.Authentication = server.AuthenticationToken
	case "tls":
		p.Authentication = server.AuthenticationTLS
	default:
		return p, &OPAConfigError{Key: "authentication", Detail: fmt.Sprintf("%q is not off, token or tls", c.Authentication)}
	}
	switch c.Authorization {
	case "", "off":
		p.Authorization = server.AuthorizationOff
	case "basic":
		p.Authorization = server.AuthorizationBasic
	default:
		return p, &OPAConfigError{Key: "authorization", Detail: fmt.Sprintf("%q is not off or basic", c.Authorization)}
	}

	if (c.TLSCertFile == "") != (c.TLSPrivateKeyFile == "") {
		return p, &OPAConfigError{Key: "tls_cert_file", Detail: "tls_cert_file and tls_private_key_file go together"}
	}
	if c.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSPrivateKeyFile)
		if err != nil {
			return p, &OPAConfigError{Key: "tls_cert_file", Err: err}
		}
		p.Certificate = &cert
		p.CertificateFile, p.CertificateKeyFile = c.TLSCertFile, c.TLSPrivateKeyFile
		p.CertificateRefresh = c.TLSCertRefreshPeriod
	}
	if c.TLSCACertFile != "" {
		pem, err := os.ReadFile(c.TLSCACertFile)
		if err != nil {
			return p, &OPAConfigError{Key: "tls_ca_cert_file", Err: err}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return p, &OPAConfigError{Key: "tls_ca_cert_file", Detail: c.TLSCACertFile + " holds no PEM certificate"}
		}
		p.CertPool, p.CertPoolFile = pool, c.TLSCACertFile
	}

	level := logging.Info
	switch c.LogLevel {
	case "", "info":
	case "debug":
		level = logging.Debug
	case "error":
		level = logging.Error
	default:
		return p, &OPAConfigError{Key: "log_level", Detail: fmt.Sprintf("%q is not info, debug or error", c.LogLevel)}
	}
	format := opts.LogFormat
	if format == "" {
		format = LogFormatNone
	}
	switch format {
	case LogFormatNone, LogFormatMinimal, LogFormatHTTP, LogFormatFull:
	default:
		return p, &OPAConfigError{Key: "log format", Detail: fmt.Sprintf("%q is not none, minimal, http or full", format)}
	}
	// Level and Format also set OPA's global fallback logger; the records
	// themselves go through the agent's handler.
	p.Logging = runtime.LoggingConfig{Level: levelName(level), RequestLevel: "info", Format: "json"}
	p.Logger = newOPALogger(log, format, level, false)
	p.ConsoleLogger = newOPALogger(log, format, logging.Info, true)
	return p, nil
}

func levelName(l logging.Level) string {
	switch l {
	case logging.Debug:
		return "debug"
	case logging.Error:
		return "error"
	}
	return "info"
}

// newtimeError names the key behind an error of OPA's runtime: the files
// it loads, or the configuration file it reads.
func newtimeError(opts Options, err error) error {
	msg := err.Error()
	switch {
	case strings.HasPrefix(msg, "load error"):
		return &OPAConfigError{Key: "files", Err: err}
	case opts.OPA.ConfigFile != "" && strings.HasPrefix(msg, "config error"):
		return &OPAConfigError{Key: "config_file", Err: err}
	case strings.Contains(msg, "authz") || strings.HasPrefix(msg, "initialization error"):
		return &OPAConfigError{Key: "files", Err: err}
	}
	return &OPAConfigError{Key: "config", Err: err}
}

// startState reads what OPA holds before any bundle: the policies and data
// the configured files loaded. It returns ignore patterns matching exactly
// the file policies, and the data paths the files wrote (top-level keys,
// and the keys under data.system but the store's own).
func (s *Store) startState(ctx context.Context) ([]string, []string, error) {
	txn, err := s.opa.NewTransaction(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("embedded opa: %w", err)
	}
	defer s.opa.Abort(ctx, txn)
	ids, err := s.opa.ListPolicies(ctx, txn)
	if err != nil {
		return nil, nil, fmt.Errorf("embedded opa: %w", err)
	}
	var patterns []string
	for _, id := range ids {
		patterns = append(patterns, escapeGlob(id))
	}
	root, err := s.opa.Read(ctx, txn, storage.Path{})
	if err != nil {
		return nil, nil, fmt.Errorf("embedded opa: %w", err)
	}
	doc, _ := root.(map[string]any)
	var data []string
	for k, v := range doc {
		if k != "system" {
			data = append(data, k)
			continue
		}
		sys, _ := v.(map[string]any)
		for sk := range sys {
			if sk != "version" && sk != "opal" {
				data = append(data, "system/"+sk)
			}
		}
	}
	sort.Strings(data)
	return patterns, data, nil
}

// escapeGlob makes id a pattern that matches only itself.
func escapeGlob(id string) string {
	r := strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`)
	return r.Replace(id)
}

// errFileData refuses a bundle that would change data the configured files
// loaded.
func fileDataError(dir, path string) error {
	return errors.New("data at /" + path + " is loaded from OPAL_INLINE_OPA_CONFIG files; bundles may not change it (data module " + dir + ")")
}
