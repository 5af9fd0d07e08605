// Package config reads the agent's environment: the variables of the Python
// OPAL client (same names, defaults and syntax, protocol §7) plus the few
// this agent adds. Load reads the process environment; LoadFrom takes any
// lookup function, for tests and embedding programs.
//
// Every variable is one row of the settings table (table.go): its name,
// default, parser, whether it is a secret, its doc line and its origin
// (Python, ours, or a Python variable not read). Parsing, Masked
// (print-config), Variables, the warnings about unknown variables
// (UnknownVariables) and the table in docs/configuration.md all come from
// it. To add a variable, add its Config field and one row, then run
// `go run ./config/gendoc`; TestDocTableMatchesDocs fails until the docs
// agree.
//
// Syntax: bools are true/false/1/0 in any case; lists are ','-separated with
// items trimmed and surrounding quotes removed (OPAL_POLICY_SUBSCRIPTION_DIRS
// is ':'-separated); durations are seconds (float unless noted); JSON models
// take the model defaults for keys left out. An empty variable counts as unset,
// except OPAL_CLIENT_TOKEN, where empty means "send no token".
package config

import (
	"io"
	"log/slog"
	"os"
	"time"
)

// Prefix is the prefix of the variables (UVICORN_PORT, which the Python
// image reads, is the one exception); only prefixed names are checked for
// typos.
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
	// DefaultDataFetchConcurrency is how many data entries are fetched at once.
	DefaultDataFetchConcurrency = 8
	// DefaultStoreBackupPath and DefaultStoreBackupInterval are the Python
	// client's (and internal/backup's) defaults.
	// DefaultStatisticsAddClientChannel is the Python client's
	// STATISTICS_ADD_CLIENT_CHANNEL.
	DefaultStatisticsAddClientChannel = "__opal_stats_add"
	DefaultStoreBackupPath            = "/opal/backup/opa.json"
	DefaultStoreBackupInterval        = 60 * time.Second
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
	DataFetchConcurrency        int              // OPAL_DATA_UPDATER_FETCH_CONCURRENCY (ours), or OPAL_FETCHING_WORKER_COUNT

	KeepAliveInterval     time.Duration // OPAL_KEEP_ALIVE_INTERVAL (whole seconds, 0 = off)
	PubSubMaxMessageBytes int64         // OPAL_PUBSUB_MAX_MESSAGE_BYTES (ours)
	ScopeID               string        // OPAL_SCOPE_ID

	PolicyStoreType                string           // OPAL_POLICY_STORE_TYPE (only OPA)
	PolicyStoreURL                 string           // OPAL_POLICY_STORE_URL
	PolicyStoreAuthType            string           // OPAL_POLICY_STORE_AUTH_TYPE: none or token
	PolicyStoreAuthToken           string           // OPAL_POLICY_STORE_AUTH_TOKEN; secret
	PolicyStoreConnRetry           ConnRetryOptions // OPAL_POLICY_STORE_CONN_RETRY
	PolicyStorePolicyPathsToIgnore []string         // OPAL_POLICY_STORE_POLICY_PATHS_TO_IGNORE

	InlineOPAEnabled            bool            // OPAL_INLINE_OPA_ENABLED
	InlineOPAConfig             InlineOPAConfig // OPAL_INLINE_OPA_CONFIG (inlineopa.go)
	InlineOPALogFormat          string          // OPAL_INLINE_OPA_LOG_FORMAT: none, minimal, http, full
	OPAV0Compat                 bool            // OPAL_OPA_V0_COMPAT: OPA as --v0-compatible (default true)
	PolicyStoreTLSClientCert    string          // OPAL_POLICY_STORE_TLS_CLIENT_CERT: file
	PolicyStoreTLSClientKey     string          // OPAL_POLICY_STORE_TLS_CLIENT_KEY: file
	PolicyStoreTLSCA            string          // OPAL_POLICY_STORE_TLS_CA: file
	OPAHealthCheckPolicyEnabled bool            // OPAL_OPA_HEALTH_CHECK_POLICY_ENABLED

	// Client API authentication, as the Python client's JWTVerifier: with a
	// public key the connectivity routes need a JWT (internal/api/auth.go).
	AuthPublicKey       string // OPAL_AUTH_PUBLIC_KEY: the key, or a path to it; "" = off
	AuthPublicKeyFormat string // OPAL_AUTH_PUBLIC_KEY_FORMAT: ssh (default), pem or der
	AuthJWTAlgorithm    string // OPAL_AUTH_JWT_ALGORITHM, default RS256
	AuthJWTAudience     string // OPAL_AUTH_JWT_AUDIENCE
	AuthJWTIssuer       string // OPAL_AUTH_JWT_ISSUER

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

	// Statistics (opal-protocol §2.3): announce this client on the server's
	// statistics channel after each subscribe, as the Python client does.
	StatisticsEnabled          bool   // OPAL_STATISTICS_ENABLED
	StatisticsAddClientChannel string // OPAL_STATISTICS_ADD_CLIENT_CHANNEL
	ClientStatID               string // OPAL_OPAL_CLIENT_STAT_ID (the Python name, doubled prefix included); empty: a random CLIENT_<hex> per process

	// Fleet safety (ours): reconnect and resync spread, burst coalescing.
	PubSubReconnectSpread         time.Duration // OPAL_PUBSUB_RECONNECT_SPREAD (ours)
	PubSubReconnectMaxWait        time.Duration // OPAL_PUBSUB_RECONNECT_MAX_WAIT (ours)
	ResyncSpread                  time.Duration // OPAL_RESYNC_SPREAD (ours, 0 = off)
	PolicyUpdaterMinFetchInterval time.Duration // OPAL_POLICY_UPDATER_MIN_INTERVAL (ours, 0 = off)

	// UvicornPort is UVICORN_PORT, the Python image's API port; 0 when unset.
	// When set, ClientAPIServerPort is this.
	UvicornPort int

	LogLevel            string // OPAL_LOG_LEVEL, upper case
	LogSerialize        bool   // OPAL_LOG_SERIALIZE: JSON logs
	LogFormatIncludePID bool   // OPAL_LOG_FORMAT_INCLUDE_PID

	// TLS to the OPAL server (ServerTLSConfig).
	ClientSelfSignedCertificatesAllowed bool   // OPAL_CLIENT_SELF_SIGNED_CERTIFICATES_ALLOWED
	ClientSSLContextTrustedCAFile       string // OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE

	warnings []Warning // settings accepted without effect
}

// Load reads the process environment.
func Load() (*Config, error) { return LoadFrom(os.LookupEnv) }

// LoadFrom reads the variables through lookup (os.LookupEnv's signature).
// Unprefixed names (SERVER_URL for OPAL_SERVER_URL) are never read: the
// agent must not pick up another program's settings.
func LoadFrom(lookup func(string) (string, bool)) (*Config, error) {
	p := &parser{raw: map[string]*string{}}
	for _, s := range settings {
		if s.parse == nil {
			continue
		}
		if v, ok := lookup(s.name); ok {
			p.raw[s.name] = &v
		}
	}
	c := &Config{}
	for _, s := range settings {
		if s.parse != nil {
			p.name = s.name
			s.parse(p, p.raw[s.name], c)
		}
	}
	if p.err != nil {
		return nil, p.err
	}
	c.warnings = p.warnings
	return c, nil
}

// Variables returns the name of every variable Load reads.
func Variables() []string {
	var out []string
	for _, s := range settings {
		if s.parse != nil {
			out = append(out, s.name)
		}
	}
	return out
}

// Warnings are the settings that were accepted but have no effect (e.g. a
// trusted CA file without OPAL_CLIENT_SELF_SIGNED_CERTIFICATES_ALLOWED), for
// the daemon to log once at start.
func (c *Config) Warnings() []Warning { return c.warnings }

// DefaultPolicyUpdaterConnRetry is OPAL_POLICY_UPDATER_CONN_RETRY's (and the
// data updater's) default: random_exponential, 1 s, 5 attempts, max_wait 10 s,
// so waits of up to 1, 2, 4 and 8 s and a 15 s worst case.
func DefaultPolicyUpdaterConnRetry() ConnRetryOptions {
	return ConnRetryOptions{WaitStrategy: WaitRandomExponential, WaitTime: time.Second, MaxWait: 10 * time.Second, Attempts: 5}
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
