// Package config reads the agent's OPAL_ environment: the variables of the
// Python OPAL client (same names, defaults and syntax, protocol §7) plus the
// few this agent adds. Load reads the process environment through envconfig;
// LoadFrom takes any lookup function, for tests and embedding programs.
//
// Syntax: bools are true/false/1/0 in any case; lists are ','-separated with
// items trimmed and surrounding quotes removed (OPAL_POLICY_SUBSCRIPTION_DIRS
// is ':'-separated); durations are seconds (float unless noted); JSON models
// take the model defaults for keys left out. An empty variable counts as unset,
// except OPAL_CLIENT_TOKEN, where empty means "send no token".
package config

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/url"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kelseyhightower/envconfig"
)

// Prefix is the prefix of every variable.
const Prefix = "OPAL_"

// Defaults that differ from a plain zero value.
const (
	DefaultServerURL             = "http://localhost:7002"
	DefaultClientToken           = "THIS_IS_A_DEV_SECRET"
	DefaultScopeID               = "default"
	DefaultPolicyStoreURL        = "http://localhost:8181"
	DefaultInlineOPAAddr         = "127.0.0.1:8181"
	DefaultPolicyBundleMaxBytes  = 100 << 20
	DefaultPubSubMaxMessageBytes = 64 << 20
	DefaultDataFetchConcurrency  = 8 // data entries fetched at once
	// DefaultStoreBackupPath and DefaultStoreBackupInterval are the Python
	// client's (and internal/backup's) defaults.
	DefaultStoreBackupPath     = "/opal/backup/opa.json"
	DefaultStoreBackupInterval = 60 * time.Second
)

// Config is the parsed environment. Load and LoadFrom fill every field,
// defaults and derived values included.
type Config struct {
	ServerURL       string // OPAL_SERVER_URL
	ServerWSURL     string // OPAL_SERVER_WS_URL, derived from ServerURL (http->ws, https->wss)
	ServerPubSubURL string // OPAL_SERVER_PUBSUB_URL, derived: ServerWSURL + "/ws"
	ClientToken     string // OPAL_CLIENT_TOKEN; secret

	PolicyUpdaterEnabled   bool     // OPAL_POLICY_UPDATER_ENABLED
	PolicySubscriptionDirs []string // OPAL_POLICY_SUBSCRIPTION_DIRS, normalised, non-overlapping, sorted (§3.1)
	// PolicyUpdaterConnRetry is OPAL_POLICY_UPDATER_CONN_RETRY, the bundle fetch's backoff.
	PolicyUpdaterConnRetry             ConnRetryOptions
	PolicyUpdaterMaxRetryAfter         time.Duration // OPAL_POLICY_UPDATER_MAX_RETRY_AFTER (F4, F7, D2)
	PolicyUpdaterRescheduleOnRetryable bool          // OPAL_POLICY_UPDATER_RESCHEDULE_ON_RETRYABLE (D8)
	PolicyUpdaterMaxDeferredRounds     int           // OPAL_POLICY_UPDATER_MAX_DEFERRED_ROUNDS (D3)
	PolicyBundleMaxBytes               int64         // OPAL_POLICY_BUNDLE_MAX_BYTES (ours)
	PolicyFetchAttemptTimeout          time.Duration // OPAL_POLICY_FETCH_ATTEMPT_TIMEOUT (ours)

	DataUpdaterEnabled          bool             // OPAL_DATA_UPDATER_ENABLED
	DataTopics                  []string         // OPAL_DATA_TOPICS
	DefaultDataSourcesConfigURL string           // OPAL_DEFAULT_DATA_SOURCES_CONFIG_URL, derived
	DataUpdaterConnRetry        ConnRetryOptions // OPAL_DATA_UPDATER_CONN_RETRY, or the deprecated OPAL_DATA_STORE_CONN_RETRY
	SplitRootData               bool             // OPAL_SPLIT_ROOT_DATA
	ShouldReportOnDataUpdates   bool             // OPAL_SHOULD_REPORT_ON_DATA_UPDATES
	DefaultUpdateCallbacks      []string         // OPAL_DEFAULT_UPDATE_CALLBACKS (callback URLs)
	FetchingCallbackTimeout     time.Duration    // OPAL_FETCHING_CALLBACK_TIMEOUT
	HTTPFetcherTimeout          time.Duration    // OPAL_HTTP_FETCHER_TIMEOUT

	KeepAliveInterval     time.Duration // OPAL_KEEP_ALIVE_INTERVAL (whole seconds, 0 = off)
	PubSubMaxMessageBytes int64         // OPAL_PUBSUB_MAX_MESSAGE_BYTES (ours)
	DataFetchConcurrency  int           // OPAL_DATA_UPDATER_FETCH_CONCURRENCY (ours)
	ScopeID               string        // OPAL_SCOPE_ID

	PolicyStoreType                string           // OPAL_POLICY_STORE_TYPE (only OPA)
	PolicyStoreURL                 string           // OPAL_POLICY_STORE_URL
	PolicyStoreAuthType            string           // OPAL_POLICY_STORE_AUTH_TYPE: none or token
	PolicyStoreAuthToken           string           // OPAL_POLICY_STORE_AUTH_TOKEN; secret
	PolicyStoreConnRetry           ConnRetryOptions // OPAL_POLICY_STORE_CONN_RETRY
	PolicyStorePolicyPathsToIgnore []string         // OPAL_POLICY_STORE_POLICY_PATHS_TO_IGNORE

	InlineOPAEnabled            bool            // OPAL_INLINE_OPA_ENABLED
	InlineOPAConfig             InlineOPAConfig // OPAL_INLINE_OPA_CONFIG
	OPAHealthCheckPolicyEnabled bool            // OPAL_OPA_HEALTH_CHECK_POLICY_ENABLED

	// Offline mode (docs/offline.md); embedded OPA only.
	OfflineModeEnabled  bool          // OPAL_OFFLINE_MODE_ENABLED
	StoreBackupPath     string        // OPAL_STORE_BACKUP_PATH
	StoreBackupInterval time.Duration // OPAL_STORE_BACKUP_INTERVAL (seconds > 0)
	// DefaultOPALServerConnectivityDisabled is
	// OPAL_DEFAULT_OPAL_SERVER_CONNECTIVITY_DISABLED: with offline mode and a
	// restored backup, do not connect until enabled through the client API.
	DefaultOPALServerConnectivityDisabled bool
	// PolicyMaxAge is OPAL_POLICY_MAX_AGE (ours): how long the policy may be
	// behind (the staleness gauge) before /ready answers 503; 0 = off.
	PolicyMaxAge time.Duration

	ClientAPIServerHost string // OPAL_CLIENT_API_SERVER_HOST
	ClientAPIServerPort int    // OPAL_CLIENT_API_SERVER_PORT

	LogLevel            string // OPAL_LOG_LEVEL, upper case
	LogSerialize        bool   // OPAL_LOG_SERIALIZE: JSON logs
	LogFormatIncludePID bool   // OPAL_LOG_FORMAT_INCLUDE_PID
}

// InlineOPAConfig is OPAL_INLINE_OPA_CONFIG: how the embedded OPA serves its
// REST API. Keys other than addr are ignored.
type InlineOPAConfig struct {
	Addr string `json:"addr"` // host:port; default 127.0.0.1:8181
}

// env lists every variable read. Load hands it to envconfig; LoadFrom fills it
// through the lookup function. A nil field is an unset variable.
type env struct {
	ServerURL       *string `envconfig:"OPAL_SERVER_URL"`
	ServerWSURL     *string `envconfig:"OPAL_SERVER_WS_URL"`
	ServerPubSubURL *string `envconfig:"OPAL_SERVER_PUBSUB_URL"`
	ClientToken     *string `envconfig:"OPAL_CLIENT_TOKEN"`

	PolicyUpdaterEnabled               *string `envconfig:"OPAL_POLICY_UPDATER_ENABLED"`
	PolicySubscriptionDirs             *string `envconfig:"OPAL_POLICY_SUBSCRIPTION_DIRS"`
	PolicyUpdaterConnRetry             *string `envconfig:"OPAL_POLICY_UPDATER_CONN_RETRY"`
	PolicyUpdaterMaxRetryAfter         *string `envconfig:"OPAL_POLICY_UPDATER_MAX_RETRY_AFTER"`
	PolicyUpdaterRescheduleOnRetryable *string `envconfig:"OPAL_POLICY_UPDATER_RESCHEDULE_ON_RETRYABLE"`
	PolicyUpdaterMaxDeferredRounds     *string `envconfig:"OPAL_POLICY_UPDATER_MAX_DEFERRED_ROUNDS"`
	PolicyBundleMaxBytes               *string `envconfig:"OPAL_POLICY_BUNDLE_MAX_BYTES"`
	PolicyFetchAttemptTimeout          *string `envconfig:"OPAL_POLICY_FETCH_ATTEMPT_TIMEOUT"`

	DataUpdaterEnabled          *string `envconfig:"OPAL_DATA_UPDATER_ENABLED"`
	DataTopics                  *string `envconfig:"OPAL_DATA_TOPICS"`
	DefaultDataSourcesConfigURL *string `envconfig:"OPAL_DEFAULT_DATA_SOURCES_CONFIG_URL"`
	DataUpdaterConnRetry        *string `envconfig:"OPAL_DATA_UPDATER_CONN_RETRY"`
	DataStoreConnRetry          *string `envconfig:"OPAL_DATA_STORE_CONN_RETRY"`
	SplitRootData               *string `envconfig:"OPAL_SPLIT_ROOT_DATA"`
	ShouldReportOnDataUpdates   *string `envconfig:"OPAL_SHOULD_REPORT_ON_DATA_UPDATES"`
	DefaultUpdateCallbacks      *string `envconfig:"OPAL_DEFAULT_UPDATE_CALLBACKS"`
	FetchingCallbackTimeout     *string `envconfig:"OPAL_FETCHING_CALLBACK_TIMEOUT"`
	HTTPFetcherTimeout          *string `envconfig:"OPAL_HTTP_FETCHER_TIMEOUT"`

	KeepAliveInterval     *string `envconfig:"OPAL_KEEP_ALIVE_INTERVAL"`
	PubSubMaxMessageBytes *string `envconfig:"OPAL_PUBSUB_MAX_MESSAGE_BYTES"`
	DataFetchConcurrency  *string `envconfig:"OPAL_DATA_UPDATER_FETCH_CONCURRENCY"`
	ScopeID               *string `envconfig:"OPAL_SCOPE_ID"`

	PolicyStoreType                *string `envconfig:"OPAL_POLICY_STORE_TYPE"`
	PolicyStoreURL                 *string `envconfig:"OPAL_POLICY_STORE_URL"`
	PolicyStoreAuthType            *string `envconfig:"OPAL_POLICY_STORE_AUTH_TYPE"`
	PolicyStoreAuthToken           *string `envconfig:"OPAL_POLICY_STORE_AUTH_TOKEN"`
	PolicyStoreConnRetry           *string `envconfig:"OPAL_POLICY_STORE_CONN_RETRY"`
	PolicyStorePolicyPathsToIgnore *string `envconfig:"OPAL_POLICY_STORE_POLICY_PATHS_TO_IGNORE"`

	InlineOPAEnabled            *string `envconfig:"OPAL_INLINE_OPA_ENABLED"`
	InlineOPAConfig             *string `envconfig:"OPAL_INLINE_OPA_CONFIG"`
	OPAHealthCheckPolicyEnabled *string `envconfig:"OPAL_OPA_HEALTH_CHECK_POLICY_ENABLED"`

	OfflineModeEnabled                    *string `envconfig:"OPAL_OFFLINE_MODE_ENABLED"`
	StoreBackupPath                       *string `envconfig:"OPAL_STORE_BACKUP_PATH"`
	StoreBackupInterval                   *string `envconfig:"OPAL_STORE_BACKUP_INTERVAL"`
	DefaultOPALServerConnectivityDisabled *string `envconfig:"OPAL_DEFAULT_OPAL_SERVER_CONNECTIVITY_DISABLED"`
	PolicyMaxAge                          *string `envconfig:"OPAL_POLICY_MAX_AGE"`

	ClientAPIServerHost *string `envconfig:"OPAL_CLIENT_API_SERVER_HOST"`
	ClientAPIServerPort *string `envconfig:"OPAL_CLIENT_API_SERVER_PORT"`

	LogLevel            *string `envconfig:"OPAL_LOG_LEVEL"`
	LogSerialize        *string `envconfig:"OPAL_LOG_SERIALIZE"`
	LogFormatIncludePID *string `envconfig:"OPAL_LOG_FORMAT_INCLUDE_PID"`
}

// Load reads the process environment through envconfig.
func Load() (*Config, error) {
	var e env
	// An empty prefix and full names in the tags: with a prefix, envconfig
	// would also fall back to the unprefixed name (LOG_LEVEL for
	// OPAL_LOG_LEVEL), picking up other programs' settings.
	if err := envconfig.Process("", &e); err != nil {
		return nil, err
	}
	return parse(&e)
}

// LoadFrom reads the variables through lookup (os.LookupEnv's signature).
func LoadFrom(lookup func(string) (string, bool)) (*Config, error) {
	var e env
	v := reflect.ValueOf(&e).Elem()
	for i := 0; i < v.NumField(); i++ {
		if s, ok := lookup(v.Type().Field(i).Tag.Get("envconfig")); ok {
			v.Field(i).Set(reflect.ValueOf(&s))
		}
	}
	return parse(&e)
}

// Variables returns the name of every variable Load reads.
func Variables() []string {
	t := reflect.TypeOf(env{})
	out := make([]string, t.NumField())
	for i := range out {
		out[i] = t.Field(i).Tag.Get("envconfig")
	}
	return out
}

// Accepted-value phrases, shared by the error lines and the docs.
const (
	acceptBool      = "true, false, 1 or 0 (any case)"
	acceptSeconds   = "a number of seconds >= 0"
	acceptPositive  = "a number of seconds > 0"
	acceptRetry     = `a JSON object like {"wait_strategy":"fixed|exponential|random_exponential","wait_time":2,"attempts":2,"max_wait":10}`
	acceptCallbacks = `{"callbacks":["url", ...]} or a ','-separated list of URLs`
)

// parser turns the raw strings into typed values, keeping the first error.
type parser struct {
	err error
}

func (p *parser) fail(name, value, accepted, reason string) {
	if p.err == nil {
		p.err = newError(name, value, accepted, reason, false)
	}
}

// failSecret is fail for a value that may hold a secret (a callback's
// headers): the line shows *** and only the reason.
func (p *parser) failSecret(name, value, accepted, reason string) {
	if p.err == nil {
		p.err = newError(name, value, accepted, reason, true)
	}
}

// get returns the value of a variable, or def when it is unset or empty.
func get(v *string, def string) string {
	if v == nil || strings.TrimSpace(*v) == "" {
		return def
	}
	return strings.TrimSpace(*v)
}

func (p *parser) boolean(name string, v *string, def bool) bool {
	s := get(v, "")
	if s == "" {
		return def
	}
	switch strings.ToLower(s) {
	case "true", "1":
		return true
	case "false", "0":
		return false
	}
	p.fail(name, s, acceptBool, "")
	return def
}

// duration parses float seconds; positive demands > 0 instead of >= 0.
func (p *parser) duration(name string, v *string, def time.Duration, positive bool) time.Duration {
	s := get(v, "")
	if s == "" {
		return def
	}
	accepted := acceptSeconds
	if positive {
		accepted = acceptPositive
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 || (positive && f == 0) {
		p.fail(name, s, accepted, "")
		return def
	}
	if f >= float64(maxDuration)/float64(time.Second) {
		p.fail(name, s, accepted, "too large")
		return def
	}
	return time.Duration(math.Round(f * float64(time.Second)))
}

// integer parses a whole number in [lo, hi].
func (p *parser) integer(name string, v *string, def, lo, hi int64) int64 {
	s := get(v, "")
	if s == "" {
		return def
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < lo || n > hi {
		p.fail(name, s, fmt.Sprintf("a whole number from %d to %d", lo, hi), "")
		return def
	}
	return n
}

func (p *parser) retry(name string, v *string, def ConnRetryOptions) ConnRetryOptions {
	s := get(v, "")
	if s == "" {
		return def
	}
	var o ConnRetryOptions
	if err := o.Decode(s); err != nil {
		p.fail(name, s, acceptRetry, err.Error())
		return def
	}
	return o
}

func (p *parser) url(name string, v *string, def string) string {
	s := get(v, def)
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" || u.Host == "" {
		p.fail(name, redactURL(s), "an absolute URL such as http://host:port", "")
		return def
	}
	return strings.TrimRight(s, "/")
}

// list splits on sep, trims items, drops surrounding quotes and empty items.
func list(s, sep string) []string {
	var out []string
	for _, item := range strings.Split(s, sep) {
		item = strings.TrimSpace(item)
		if len(item) >= 2 && (item[0] == '"' || item[0] == '\'') && item[len(item)-1] == item[0] {
			item = strings.TrimSpace(item[1 : len(item)-1])
		}
		if item != "" {
			out = append(out, item)
		}
	}
	return out
}

// DefaultPolicyUpdaterConnRetry is OPAL_POLICY_UPDATER_CONN_RETRY's (and the
// data updater's) default: random_exponential, 1 s, 5 attempts, max_wait 10 s,
// so waits of up to 1, 2, 4 and 8 s and a 15 s worst case.
func DefaultPolicyUpdaterConnRetry() ConnRetryOptions {
	return ConnRetryOptions{WaitStrategy: WaitRandomExponential, WaitTime: time.Second, MaxWait: 10 * time.Second, Attempts: 5}
}

func parse(e *env) (*Config, error) {
	p := &parser{}
	c := &Config{}

	c.ServerURL = p.url("SERVER_URL", e.ServerURL, DefaultServerURL)
	c.ServerWSURL = get(e.ServerWSURL, "")
	if c.ServerWSURL == "" {
		c.ServerWSURL = wsURL(c.ServerURL)
	} else {
		c.ServerWSURL = p.url("SERVER_WS_URL", e.ServerWSURL, "")
	}
	c.ServerPubSubURL = get(e.ServerPubSubURL, "")
	if c.ServerPubSubURL == "" {
		c.ServerPubSubURL = c.ServerWSURL + "/ws"
	} else {
		c.ServerPubSubURL = p.url("SERVER_PUBSUB_URL", e.ServerPubSubURL, "")
	}
	c.ClientToken = DefaultClientToken
	if e.ClientToken != nil {
		c.ClientToken = strings.TrimSpace(*e.ClientToken)
	}

	c.PolicyUpdaterEnabled = p.boolean("POLICY_UPDATER_ENABLED", e.PolicyUpdaterEnabled, true)
	// Empty items stay: pathlib reads "" as ".", so "a::b" subscribes to everything, as in Python.
	c.PolicySubscriptionDirs = NormalizeDirs(strings.Split(get(e.PolicySubscriptionDirs, "."), ":"))
	c.PolicyUpdaterConnRetry = p.retry("POLICY_UPDATER_CONN_RETRY", e.PolicyUpdaterConnRetry, DefaultPolicyUpdaterConnRetry())
	c.PolicyUpdaterMaxRetryAfter = p.duration("POLICY_UPDATER_MAX_RETRY_AFTER", e.PolicyUpdaterMaxRetryAfter, 60*time.Second, false)
	c.PolicyUpdaterRescheduleOnRetryable = p.boolean("POLICY_UPDATER_RESCHEDULE_ON_RETRYABLE", e.PolicyUpdaterRescheduleOnRetryable, true)
	c.PolicyUpdaterMaxDeferredRounds = int(p.integer("POLICY_UPDATER_MAX_DEFERRED_ROUNDS", e.PolicyUpdaterMaxDeferredRounds, 20, 0, math.MaxInt32))
	c.PolicyBundleMaxBytes = p.integer("POLICY_BUNDLE_MAX_BYTES", e.PolicyBundleMaxBytes, DefaultPolicyBundleMaxBytes, 1, math.MaxInt64)
	c.PolicyFetchAttemptTimeout = p.duration("POLICY_FETCH_ATTEMPT_TIMEOUT", e.PolicyFetchAttemptTimeout, 30*time.Second, true)

	c.DataUpdaterEnabled = p.boolean("DATA_UPDATER_ENABLED", e.DataUpdaterEnabled, true)
	c.DataTopics = list(get(e.DataTopics, "policy_data"), ",")
	c.ScopeID = get(e.ScopeID, DefaultScopeID)
	if c.ScopeID == DefaultScopeID {
		c.DefaultDataSourcesConfigURL = c.ServerURL + "/data/config"
	} else {
		c.DefaultDataSourcesConfigURL = c.ServerURL + "/scopes/" + url.PathEscape(c.ScopeID) + "/data"
	}
	if get(e.DefaultDataSourcesConfigURL, "") != "" {
		c.DefaultDataSourcesConfigURL = p.url("DEFAULT_DATA_SOURCES_CONFIG_URL", e.DefaultDataSourcesConfigURL, c.DefaultDataSourcesConfigURL)
	}
	c.DataUpdaterConnRetry = p.retry("DATA_UPDATER_CONN_RETRY", e.DataUpdaterConnRetry, DefaultPolicyUpdaterConnRetry())
	if get(e.DataStoreConnRetry, "") != "" { // deprecated, but still wins (as in Python)
		c.DataUpdaterConnRetry = p.retry("DATA_STORE_CONN_RETRY", e.DataStoreConnRetry, c.DataUpdaterConnRetry)
	}
	c.SplitRootData = p.boolean("SPLIT_ROOT_DATA", e.SplitRootData, false)
	c.ShouldReportOnDataUpdates = p.boolean("SHOULD_REPORT_ON_DATA_UPDATES", e.ShouldReportOnDataUpdates, false)
	c.DefaultUpdateCallbacks = p.callbacks("DEFAULT_UPDATE_CALLBACKS", e.DefaultUpdateCallbacks, []string{c.ServerURL + "/data/callback_report"})
	c.FetchingCallbackTimeout = p.duration("FETCHING_CALLBACK_TIMEOUT", e.FetchingCallbackTimeout, 10*time.Second, true)
	c.HTTPFetcherTimeout = p.duration("HTTP_FETCHER_TIMEOUT", e.HTTPFetcherTimeout, 5*time.Second, true)

	c.KeepAliveInterval = time.Duration(p.integer("KEEP_ALIVE_INTERVAL", e.KeepAliveInterval, 0, 0, math.MaxInt32)) * time.Second
	c.PubSubMaxMessageBytes = p.integer("PUBSUB_MAX_MESSAGE_BYTES", e.PubSubMaxMessageBytes, DefaultPubSubMaxMessageBytes, 1, math.MaxInt64)
	c.DataFetchConcurrency = int(p.integer("DATA_UPDATER_FETCH_CONCURRENCY", e.DataFetchConcurrency, DefaultDataFetchConcurrency, 1, 1024))

	c.PolicyStoreType = strings.ToUpper(get(e.PolicyStoreType, "OPA"))
	if c.PolicyStoreType != "OPA" {
		p.fail("POLICY_STORE_TYPE", c.PolicyStoreType, "OPA", notSupported(c.PolicyStoreType, "CEDAR", "MOCK"))
	}
	c.PolicyStoreURL = p.url("POLICY_STORE_URL", e.PolicyStoreURL, DefaultPolicyStoreURL)
	c.PolicyStoreAuthToken = get(e.PolicyStoreAuthToken, "")
	c.PolicyStoreAuthType = strings.ToLower(get(e.PolicyStoreAuthType, "none"))
	switch c.PolicyStoreAuthType {
	case "none":
	case "token":
		if c.PolicyStoreAuthToken == "" && p.err == nil {
			p.err = newError("POLICY_STORE_AUTH_TOKEN", "", "a non-empty token when OPAL_POLICY_STORE_AUTH_TYPE=token", "", true)
		}
	default:
		p.fail("POLICY_STORE_AUTH_TYPE", c.PolicyStoreAuthType, "none or token", notSupported(c.PolicyStoreAuthType, "oauth", "tls"))
	}
	c.PolicyStoreConnRetry = p.retry("POLICY_STORE_CONN_RETRY", e.PolicyStoreConnRetry, DefaultConnRetryOptions())
	c.PolicyStorePolicyPathsToIgnore = list(get(e.PolicyStorePolicyPathsToIgnore, ""), ",")

	c.InlineOPAEnabled = p.boolean("INLINE_OPA_ENABLED", e.InlineOPAEnabled, true)
	c.InlineOPAConfig = p.inlineOPA("INLINE_OPA_CONFIG", e.InlineOPAConfig)
	c.OPAHealthCheckPolicyEnabled = p.boolean("OPA_HEALTH_CHECK_POLICY_ENABLED", e.OPAHealthCheckPolicyEnabled, false)

	c.OfflineModeEnabled = p.boolean("OFFLINE_MODE_ENABLED", e.OfflineModeEnabled, false)
	c.StoreBackupPath = get(e.StoreBackupPath, DefaultStoreBackupPath)
	c.StoreBackupInterval = p.duration("STORE_BACKUP_INTERVAL", e.StoreBackupInterval, DefaultStoreBackupInterval, true)
	c.DefaultOPALServerConnectivityDisabled = p.boolean("DEFAULT_OPAL_SERVER_CONNECTIVITY_DISABLED", e.DefaultOPALServerConnectivityDisabled, false)
	c.PolicyMaxAge = p.duration("POLICY_MAX_AGE", e.PolicyMaxAge, 0, false)

	c.ClientAPIServerHost = get(e.ClientAPIServerHost, "127.0.0.1")
	c.ClientAPIServerPort = int(p.integer("CLIENT_API_SERVER_PORT", e.ClientAPIServerPort, 7000, 1, 65535))

	c.LogLevel = strings.ToUpper(get(e.LogLevel, "INFO"))
	if _, ok := slogLevels[c.LogLevel]; !ok {
		p.fail("LOG_LEVEL", c.LogLevel, "TRACE, DEBUG, INFO, SUCCESS, WARNING, ERROR or CRITICAL", "")
	}
	c.LogSerialize = p.boolean("LOG_SERIALIZE", e.LogSerialize, false)
	c.LogFormatIncludePID = p.boolean("LOG_FORMAT_INCLUDE_PID", e.LogFormatIncludePID, false)

	if p.err != nil {
		return nil, p.err
	}
	return c, nil
}

func notSupported(v string, known ...string) string {
	for _, k := range known {
		if strings.EqualFold(v, k) {
			return v + " is a Python client option this agent does not support"
		}
	}
	return ""
}

// callbacks reads the Python UpdateCallback model, {"callbacks":[url or
// [url, config], ...]}, keeping the URLs; a plain ','-list of URLs is
// accepted too.
func (p *parser) callbacks(name string, v *string, def []string) []string {
	s := get(v, "")
	if s == "" {
		return def
	}
	if !strings.HasPrefix(s, "{") {
		return list(s, ",")
	}
	var m struct {
		Callbacks []json.RawMessage `json:"callbacks"`
	}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		p.failSecret(name, s, acceptCallbacks, err.Error())
		return def
	}
	out := []string{}
	for _, raw := range m.Callbacks {
		var u string
		var pair []json.RawMessage
		if json.Unmarshal(raw, &u) != nil {
			if json.Unmarshal(raw, &pair) != nil || len(pair) == 0 || json.Unmarshal(pair[0], &u) != nil {
				p.failSecret(name, s, acceptCallbacks, "a callback is neither a URL nor [URL, config]")
				return def
			}
		}
		out = append(out, u)
	}
	return out
}

func (p *parser) inlineOPA(name string, v *string) InlineOPAConfig {
	c := InlineOPAConfig{Addr: DefaultInlineOPAAddr}
	s := get(v, "")
	if s == "" {
		return c
	}
	const accepted = `a JSON object like {"addr":"127.0.0.1:8181"}`
	var raw struct {
		Addr *string `json:"addr"`
	}
	if err := json.Unmarshal([]byte(s), &raw); err != nil {
		p.fail(name, s, accepted, err.Error())
		return c
	}
	if raw.Addr != nil {
		if _, _, err := net.SplitHostPort(*raw.Addr); err != nil {
			p.fail(name, s, accepted, "addr is not host:port")
			return c
		}
		c.Addr = *raw.Addr
	}
	return c
}

// wsURL derives the WebSocket URL from the server URL (§2.1). Only the scheme
// is rewritten: Python replaces the substrings anywhere, which would also
// mangle a host such as "http-gw".
func wsURL(server string) string {
	switch {
	case strings.HasPrefix(server, "https"):
		return "wss" + strings.TrimPrefix(server, "https")
	case strings.HasPrefix(server, "http"):
		return "ws" + strings.TrimPrefix(server, "http")
	}
	return server
}

// NormalizeDirs normalises subscription directories like Python's pathlib
// (trailing and repeated '/' removed, "./x" -> "x", "" -> "."; ".." is kept)
// and drops every entry that another entry contains ("." contains every
// relative path), as §3.1 describes. The result is sorted and duplicate-free.
func NormalizeDirs(dirs []string) []string {
	set := map[string]bool{}
	for _, d := range dirs {
		set[normalizeDir(strings.TrimSpace(d))] = true
	}
	var out []string
	for d := range set {
		covered := false
		for other := range set {
			if other != d && isAncestor(other, d) {
				covered = true
				break
			}
		}
		if !covered {
			out = append(out, d)
		}
	}
	sort.Strings(out)
	return out
}

func normalizeDir(d string) string {
	abs := strings.HasPrefix(d, "/")
	var parts []string
	for _, part := range strings.Split(d, "/") {
		if part != "" && part != "." {
			parts = append(parts, part)
		}
	}
	s := strings.Join(parts, "/")
	switch {
	case abs:
		return "/" + s
	case s == "":
		return "."
	}
	return s
}

// isAncestor reports whether a contains b (both normalised).
func isAncestor(a, b string) bool {
	if a == "." {
		return !strings.HasPrefix(b, "/")
	}
	if a == "/" {
		return strings.HasPrefix(b, "/")
	}
	return strings.HasPrefix(b, a+"/")
}

// PolicyTopics are the pub/sub topics of the policy updater (§3.1):
// "policy:<dir>" per subscription dir, or only "<scope>:policy:." when scoped.
func (c *Config) PolicyTopics() []string {
	if c.ScopeID != DefaultScopeID {
		return []string{c.ScopeID + ":policy:."}
	}
	out := make([]string, len(c.PolicySubscriptionDirs))
	for i, d := range c.PolicySubscriptionDirs {
		out[i] = "policy:" + d
	}
	return out
}

// DataTopicNames are the pub/sub topics of the data updater (§6.1): DataTopics,
// or "<scope>:data:<topic>" each when scoped.
func (c *Config) DataTopicNames() []string {
	out := make([]string, len(c.DataTopics))
	for i, t := range c.DataTopics {
		if c.ScopeID != DefaultScopeID {
			t = c.ScopeID + ":data:" + t
		}
		out[i] = t
	}
	return out
}

// Masked returns the configuration keyed by variable name, with the secrets
// (ClientToken, PolicyStoreAuthToken) replaced by "***" when set and the
// URLs' user info, query values and fragments by "xxxxx".
func (c *Config) Masked() map[string]any {
	return map[string]any{
		"OPAL_SERVER_URL":                                redactURL(c.ServerURL),
		"OPAL_SERVER_WS_URL":                             redactURL(c.ServerWSURL),
		"OPAL_SERVER_PUBSUB_URL":                         redactURL(c.ServerPubSubURL),
		"OPAL_CLIENT_TOKEN":                              mask(c.ClientToken),
		"OPAL_POLICY_UPDATER_ENABLED":                    c.PolicyUpdaterEnabled,
		"OPAL_POLICY_SUBSCRIPTION_DIRS":                  strings.Join(c.PolicySubscriptionDirs, ":"),
		"OPAL_POLICY_UPDATER_CONN_RETRY":                 c.PolicyUpdaterConnRetry.String(),
		"OPAL_POLICY_UPDATER_MAX_RETRY_AFTER":            c.PolicyUpdaterMaxRetryAfter.Seconds(),
		"OPAL_POLICY_UPDATER_RESCHEDULE_ON_RETRYABLE":    c.PolicyUpdaterRescheduleOnRetryable,
		"OPAL_POLICY_UPDATER_MAX_DEFERRED_ROUNDS":        c.PolicyUpdaterMaxDeferredRounds,
		"OPAL_POLICY_BUNDLE_MAX_BYTES":                   c.PolicyBundleMaxBytes,
		"OPAL_POLICY_FETCH_ATTEMPT_TIMEOUT":              c.PolicyFetchAttemptTimeout.Seconds(),
		"OPAL_DATA_UPDATER_ENABLED":                      c.DataUpdaterEnabled,
		"OPAL_DATA_TOPICS":                               strings.Join(c.DataTopics, ","),
		"OPAL_DEFAULT_DATA_SOURCES_CONFIG_URL":           redactURL(c.DefaultDataSourcesConfigURL),
		"OPAL_DATA_UPDATER_CONN_RETRY":                   c.DataUpdaterConnRetry.String(),
		"OPAL_SPLIT_ROOT_DATA":                           c.SplitRootData,
		"OPAL_SHOULD_REPORT_ON_DATA_UPDATES":             c.ShouldReportOnDataUpdates,
		"OPAL_DEFAULT_UPDATE_CALLBACKS":                  strings.Join(redactURLs(c.DefaultUpdateCallbacks), ","),
		"OPAL_FETCHING_CALLBACK_TIMEOUT":                 c.FetchingCallbackTimeout.Seconds(),
		"OPAL_HTTP_FETCHER_TIMEOUT":                      c.HTTPFetcherTimeout.Seconds(),
		"OPAL_KEEP_ALIVE_INTERVAL":                       int(c.KeepAliveInterval / time.Second),
		"OPAL_PUBSUB_MAX_MESSAGE_BYTES":                  c.PubSubMaxMessageBytes,
		"OPAL_DATA_UPDATER_FETCH_CONCURRENCY":            c.DataFetchConcurrency,
		"OPAL_SCOPE_ID":                                  c.ScopeID,
		"OPAL_POLICY_STORE_TYPE":                         c.PolicyStoreType,
		"OPAL_POLICY_STORE_URL":                          redactURL(c.PolicyStoreURL),
		"OPAL_POLICY_STORE_AUTH_TYPE":                    c.PolicyStoreAuthType,
		"OPAL_POLICY_STORE_AUTH_TOKEN":                   mask(c.PolicyStoreAuthToken),
		"OPAL_POLICY_STORE_CONN_RETRY":                   c.PolicyStoreConnRetry.String(),
		"OPAL_POLICY_STORE_POLICY_PATHS_TO_IGNORE":       strings.Join(c.PolicyStorePolicyPathsToIgnore, ","),
		"OPAL_INLINE_OPA_ENABLED":                        c.InlineOPAEnabled,
		"OPAL_INLINE_OPA_CONFIG":                         fmt.Sprintf(`{"addr":%q}`, c.InlineOPAConfig.Addr),
		"OPAL_OPA_HEALTH_CHECK_POLICY_ENABLED":           c.OPAHealthCheckPolicyEnabled,
		"OPAL_OFFLINE_MODE_ENABLED":                      c.OfflineModeEnabled,
		"OPAL_STORE_BACKUP_PATH":                         c.StoreBackupPath,
		"OPAL_STORE_BACKUP_INTERVAL":                     c.StoreBackupInterval.Seconds(),
		"OPAL_DEFAULT_OPAL_SERVER_CONNECTIVITY_DISABLED": c.DefaultOPALServerConnectivityDisabled,
		"OPAL_POLICY_MAX_AGE":                            c.PolicyMaxAge.Seconds(),
		"OPAL_CLIENT_API_SERVER_HOST":                    c.ClientAPIServerHost,
		"OPAL_CLIENT_API_SERVER_PORT":                    c.ClientAPIServerPort,
		"OPAL_LOG_LEVEL":                                 c.LogLevel,
		"OPAL_LOG_SERIALIZE":                             c.LogSerialize,
		"OPAL_LOG_FORMAT_INCLUDE_PID":                    c.LogFormatIncludePID,
	}
}

// slogLevels maps the Python client's (loguru's) level names onto slog.
var slogLevels = map[string]slog.Level{
	"TRACE": slog.LevelDebug, "DEBUG": slog.LevelDebug,
	"INFO": slog.LevelInfo, "SUCCESS": slog.LevelInfo,
	"WARNING": slog.LevelWarn, "WARN": slog.LevelWarn,
	"ERROR": slog.LevelError, "CRITICAL": slog.LevelError,
}

// Level is the slog level of LogLevel.
func (c *Config) Level() slog.Level { return slogLevels[c.LogLevel] }

// Logger returns a logger writing to w at LogLevel: JSON when LogSerialize,
// text otherwise, with a pid attribute when LogFormatIncludePID.
func (c *Config) Logger(w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: c.Level()}
	var h slog.Handler
	if c.LogSerialize {
		h = slog.NewJSONHandler(w, opts)
	} else {
		h = slog.NewTextHandler(w, opts)
	}
	l := slog.New(h)
	if c.LogFormatIncludePID {
		l = l.With("pid", os.Getpid())
	}
	return l
}

var _ envconfig.Decoder = (*ConnRetryOptions)(nil) // usable as an envconfig field type by embedders
