package config

import (
	"math"
	"net/url"
	"strings"
	"time"
)

// origin says where a variable comes from, for the docs and the warnings.
type origin int

const (
	// python is a Python client variable, read with the same meaning.
	python origin = iota
	// ours is this agent's own variable (marked "(ours)" in the docs).
	ours
	// pythonNotRead is a Python client variable this agent does not read;
	// its doc line says what happens instead, and setting it is warned about.
	pythonNotRead
)

// setting is one row of the settings table: everything about one variable.
type setting struct {
	name    string // the full variable name
	section string // the docs section (one of sections)
	def     string // the default as the docs show it (markdown)
	doc     string // the docs' line: what it does, or what happens instead (markdown)
	origin  origin
	secret  bool // Masked shows *** when set
	// parse reads the raw value (nil when unset) into c; nil for the rows
	// that are not read. Rows parse in table order, so a row may use the
	// fields of the rows above it.
	parse func(p *parser, v *string, c *Config)
	// show is the row's value in Masked (redacted where it may hold a
	// secret); nil keeps the row out of Masked (an alias).
	show func(c *Config) any
}

// The docs sections, in order: id, title, the paragraph under the title.
var sections = []struct{ id, title, intro string }{
	{"server", "Server and pub/sub", ""},
	{"tls", "TLS to the OPAL server", "As in the Python client, a private CA is trusted only when both variables are set: " +
		"`OPAL_CLIENT_SELF_SIGNED_CERTIFICATES_ALLOWED=true` and `OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE`. The CA file then " +
		"**replaces** the system roots (Python's `ssl.create_default_context(cafile=...)` does the same) for every request " +
		"to the OPAL server (bundle fetch, data sources config, callbacks), every data source fetch and the pub/sub " +
		"WebSocket (`wss://`); the host name is still verified. It does not apply to the policy store (OPA)."},
	{"policy", "Policy updater", ""},
	{"data", "Data updater", ""},
	{"store", "Policy store", ""},
	{"offline", "Offline mode", "See [offline.md](offline.md). Offline mode needs the embedded OPA; with `OPAL_INLINE_OPA_ENABLED=false`\n" +
		"it is ignored with a warning (as in the Python client)."},
	{"api", "Client API and logging", ""},
	{"notread", "Python client variables this agent does not read", "Setting one of these logs a warning at start " +
		"(`<name> is a Python client setting this agent does not read: <what happens instead>`). Any other `OPAL_` " +
		"variable that no row names is warned about as `<name> is not a setting`, with the nearest known name when one is close."},
}

// settings is the one list of variables. From it come parsing (LoadFrom),
// Masked (print-config), Variables, the unknown-variable warnings and the
// table in docs/configuration.md (DocTable; a test compares the two).
//
// To add a variable: add the Config field, then one row here, in the
// section it belongs to and below the rows its parse reads; then run
// `go run ./config/gendoc` to rewrite the docs table. A Python client
// variable that is not read yet gets a pythonNotRead row (no parse, no
// show) saying what happens instead; reading it later turns that row into a
// python row with parse and show.
var settings = []setting{
	// Server and pub/sub.
	{name: "OPAL_SERVER_URL", section: "server", def: "`http://localhost:7002`",
		doc:   "must be an absolute URL; a trailing `/` is removed",
		parse: func(p *parser, v *string, c *Config) { c.ServerURL = p.url(v, DefaultServerURL) },
		show:  func(c *Config) any { return redactURL(c.ServerURL) }},
	{name: "OPAL_SERVER_WS_URL", section: "server", def: "derived",
		doc: "`OPAL_SERVER_URL` with `http` -> `ws`, `https` -> `wss`",
		parse: func(p *parser, v *string, c *Config) {
			c.ServerWSURL = wsURL(c.ServerURL)
			if get(v, "") != "" {
				c.ServerWSURL = p.url(v, "")
			}
		},
		show: func(c *Config) any { return redactURL(c.ServerWSURL) }},
	{name: "OPAL_SERVER_PUBSUB_URL", section: "server", def: "derived",
		doc: "`OPAL_SERVER_WS_URL` + `/ws`",
		parse: func(p *parser, v *string, c *Config) {
			c.ServerPubSubURL = c.ServerWSURL + "/ws"
			if get(v, "") != "" {
				c.ServerPubSubURL = p.url(v, "")
			}
		},
		show: func(c *Config) any { return redactURL(c.ServerPubSubURL) }},
	{name: "OPAL_CLIENT_TOKEN", section: "server", def: "`THIS_IS_A_DEV_SECRET`", secret: true,
		doc: "Bearer token for the WebSocket and server HTTP calls; never logged. Empty means \"send no token\".",
		parse: func(p *parser, v *string, c *Config) {
			c.ClientToken = DefaultClientToken
			if v != nil { // empty is "no token", not the default
				c.ClientToken = strings.TrimSpace(*v)
			}
		},
		show: func(c *Config) any { return c.ClientToken }},
	{name: "OPAL_SCOPE_ID", section: "server", def: "`default`",
		doc:   "anything else uses `/scopes/{id}/policy`, topics `<scope>:policy:.` and `<scope>:data:<topic>`",
		parse: func(p *parser, v *string, c *Config) { c.ScopeID = get(v, DefaultScopeID) },
		show:  func(c *Config) any { return c.ScopeID }},
	{name: "OPAL_KEEP_ALIVE_INTERVAL", section: "server", def: "`0`",
		doc: "whole seconds between RPC `_ping_`s; 0 = off",
		parse: func(p *parser, v *string, c *Config) {
			c.KeepAliveInterval = time.Duration(p.integer(v, 0, 0, math.MaxInt32)) * time.Second
		},
		show: func(c *Config) any { return int(c.KeepAliveInterval / time.Second) }},
	{name: "OPAL_PUBSUB_MAX_MESSAGE_BYTES", section: "server", def: "`67108864` (64 MiB)", origin: ours,
		doc: "read limit of one WebSocket message, >= 1",
		parse: func(p *parser, v *string, c *Config) {
			c.PubSubMaxMessageBytes = p.integer(v, DefaultPubSubMaxMessageBytes, 1, math.MaxInt64)
		},
		show: func(c *Config) any { return c.PubSubMaxMessageBytes }},
	{name: "OPAL_PUBSUB_RECONNECT_SPREAD", section: "server", def: "`15`", origin: ours,
		doc: "seconds > 0: the first reconnect after an established connection ends waits uniformly in [0.1 s, this]; " +
			"later failures grow from it ([outages.md](outages.md)). The Python client reconnects at once",
		parse: func(p *parser, v *string, c *Config) { c.PubSubReconnectSpread = p.duration(v, 15*time.Second, true) },
		show:  func(c *Config) any { return c.PubSubReconnectSpread.Seconds() }},
	{name: "OPAL_PUBSUB_RECONNECT_MAX_WAIT", section: "server", def: "`55`", origin: ours,
		doc:   "seconds > 0: cap of every wait between connection attempts, so an agent is back at most this long after the server",
		parse: func(p *parser, v *string, c *Config) { c.PubSubReconnectMaxWait = p.duration(v, 55*time.Second, true) },
		show:  func(c *Config) any { return c.PubSubReconnectMaxWait.Seconds() }},
	{name: "OPAL_RESYNC_SPREAD", section: "server", def: "`55`", origin: ours,
		doc: "seconds >= 0: an agent that holds a policy runs a reconnect's resync (full policy update, base data reload) " +
			"at a random moment of [loss + RECONNECT_SPREAD, + this]; at once without a policy, or with `0`",
		parse: func(p *parser, v *string, c *Config) { c.ResyncSpread = p.duration(v, 55*time.Second, false) },
		show:  func(c *Config) any { return c.ResyncSpread.Seconds() }},

	{name: "OPAL_STATISTICS_ENABLED", section: "server", def: "`false`",
		doc: "bool: after every subscribe, publish `{\"topics\":[...],\"client_id\":...,\"rpc_id\":<this connection's channel id>}` " +
			"to the statistics channel, so an OPAL server with statistics on lists this client. Python publishes once per socket " +
			"(it has two); this agent has one socket and publishes once with all its topics. A publish the server does not answer " +
			"within 30 s is logged and the connection kept (Python waits without a bound)",
		parse: func(p *parser, v *string, c *Config) { c.StatisticsEnabled = p.boolean(v, false) },
		show:  func(c *Config) any { return c.StatisticsEnabled }},
	{name: "OPAL_STATISTICS_ADD_CLIENT_CHANNEL", section: "server", def: "`__opal_stats_add`", doc: "the topic published to",
		parse: func(p *parser, v *string, c *Config) {
			c.StatisticsAddClientChannel = get(v, DefaultStatisticsAddClientChannel)
		},
		show: func(c *Config) any { return c.StatisticsAddClientChannel }},
	{name: "OPAL_OPAL_CLIENT_STAT_ID", section: "server", def: "`CLIENT_<32 random hex>`",
		doc:   "the `client_id` announced (the Python name, prefix doubled); the default is drawn once per process, so reconnects keep it",
		parse: func(p *parser, v *string, c *Config) { c.ClientStatID = get(v, "") },
		show:  func(c *Config) any { return c.ClientStatID }},

	// TLS to the OPAL server.
	{name: "OPAL_CLIENT_SELF_SIGNED_CERTIFICATES_ALLOWED", section: "tls", def: "`false`",
		doc: "bool: trust the CA of `OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE`; alone it changes nothing (a warning says so)",
		parse: func(p *parser, v *string, c *Config) {
			c.ClientSelfSignedCertificatesAllowed = p.boolean(v, false)
		},
		show: func(c *Config) any { return c.ClientSelfSignedCertificatesAllowed }},
	{name: "OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE", section: "tls", def: "unset",
		doc: "path of a PEM file of CA certificates (`~` expanded); read at start, and a file that cannot be read or " +
			"holds no certificate stops the agent naming this variable (Python silently falls back to the system roots). " +
			"Ignored, with a warning, unless `..._SELF_SIGNED_CERTIFICATES_ALLOWED=true`.",
		parse: func(p *parser, v *string, c *Config) {
			c.ClientSSLContextTrustedCAFile = get(v, "")
			switch {
			case c.ClientSSLContextTrustedCAFile != "" && !c.ClientSelfSignedCertificatesAllowed:
				p.warn(p.name + " is ignored: OPAL_CLIENT_SELF_SIGNED_CERTIFICATES_ALLOWED is not true (as in the Python client)")
			case c.ClientSSLContextTrustedCAFile == "" && c.ClientSelfSignedCertificatesAllowed:
				p.warn("OPAL_CLIENT_SELF_SIGNED_CERTIFICATES_ALLOWED has no effect without " + p.name + " (as in the Python client)")
			}
		},
		show: func(c *Config) any { return c.ClientSSLContextTrustedCAFile }},

	// Policy updater.
	{name: "OPAL_POLICY_UPDATER_ENABLED", section: "policy", def: "`true`", doc: "bool",
		parse: func(p *parser, v *string, c *Config) { c.PolicyUpdaterEnabled = p.boolean(v, true) },
		show:  func(c *Config) any { return c.PolicyUpdaterEnabled }},
	{name: "OPAL_POLICY_SUBSCRIPTION_DIRS", section: "policy", def: "`.`", doc: "`:`-separated dir list",
		parse: func(p *parser, v *string, c *Config) {
			// Empty items stay: pathlib reads "" as ".", so "a::b" subscribes to everything, as in Python.
			c.PolicySubscriptionDirs = NormalizeDirs(strings.Split(get(v, "."), ":"))
		},
		show: func(c *Config) any { return strings.Join(c.PolicySubscriptionDirs, ":") }},
	{name: "OPAL_POLICY_UPDATER_CONN_RETRY", section: "policy",
		def: "`{\"wait_strategy\":\"random_exponential\",\"max_wait\":10,\"attempts\":5,\"wait_time\":1}`",
		doc: "backoff of one bundle fetch (F5); no wait below 100 ms and at most 20 attempts (raised/lowered with a WARNING at start, F4)",
		parse: func(p *parser, v *string, c *Config) {
			c.PolicyUpdaterConnRetry = p.retry(v, DefaultPolicyUpdaterConnRetry())
		},
		show: func(c *Config) any { return c.PolicyUpdaterConnRetry.String() }},
	{name: "OPAL_POLICY_UPDATER_MAX_RETRY_AFTER", section: "policy", def: "`60`", origin: ours,
		doc: "from the reviewed upstream retry change, not in the Python client's master. Seconds >= 0. Caps each honoured " +
			"`Retry-After` (F4; the hint is a floor, the wait is drawn from [hint, min(2 x hint, this)] so a fleet does not " +
			"return in lockstep); the whole-fetch bound is `max(this, CONN_RETRY worst case)` (F7); ceilings the deferred " +
			"re-fetch (D2, D3). `0` honours no server hint; it does not disable retries.",
		parse: func(p *parser, v *string, c *Config) {
			c.PolicyUpdaterMaxRetryAfter = p.duration(v, 60*time.Second, false)
		},
		show: func(c *Config) any { return c.PolicyUpdaterMaxRetryAfter.Seconds() }},
	{name: "OPAL_POLICY_UPDATER_RESCHEDULE_ON_RETRYABLE", section: "policy", def: "`true`", origin: ours,
		doc: "from the reviewed upstream retry change, not in the Python client's master. Bool; `false` disables all deferred re-fetches (D8)",
		parse: func(p *parser, v *string, c *Config) {
			c.PolicyUpdaterRescheduleOnRetryable = p.boolean(v, true)
		},
		show: func(c *Config) any { return c.PolicyUpdaterRescheduleOnRetryable }},
	{name: "OPAL_POLICY_UPDATER_MAX_DEFERRED_ROUNDS", section: "policy", def: "`20`", origin: ours,
		doc: "from the reviewed upstream retry change, not in the Python client's master. Whole number >= 0: escalation rounds before the flat cadence (D3)",
		parse: func(p *parser, v *string, c *Config) {
			c.PolicyUpdaterMaxDeferredRounds = int(p.integer(v, 20, 0, math.MaxInt32))
		},
		show: func(c *Config) any { return c.PolicyUpdaterMaxDeferredRounds }},
	{name: "OPAL_POLICY_BUNDLE_MAX_BYTES", section: "policy", def: "`104857600` (100 MiB)", origin: ours,
		doc: "a larger bundle is refused unread (by `Content-Length`) or as soon as the limit is passed; non-retryable",
		parse: func(p *parser, v *string, c *Config) {
			c.PolicyBundleMaxBytes = p.integer(v, DefaultPolicyBundleMaxBytes, 1, math.MaxInt64)
		},
		show: func(c *Config) any { return c.PolicyBundleMaxBytes }},
	{name: "OPAL_POLICY_FETCH_ATTEMPT_TIMEOUT", section: "policy", def: "`30`", origin: ours,
		doc: "seconds > 0 for one attempt, **body included**: a server that sends headers and stalls is a (retryable) timeout; " +
			"the whole fetch ends within the F7 bound plus one such timeout",
		parse: func(p *parser, v *string, c *Config) {
			c.PolicyFetchAttemptTimeout = p.duration(v, 30*time.Second, true)
		},
		show: func(c *Config) any { return c.PolicyFetchAttemptTimeout.Seconds() }},
	{name: "OPAL_POLICY_UPDATER_MIN_INTERVAL", section: "policy", def: "`0.5`", origin: ours,
		doc: "seconds >= 0 between the starts of two policy fetches: a notification burst is coalesced into the waiting " +
			"request (the first after a quiet period is fetched at once, the last always applied); `0` fetches back to back",
		parse: func(p *parser, v *string, c *Config) {
			c.PolicyUpdaterMinFetchInterval = p.duration(v, 500*time.Millisecond, false)
		},
		show: func(c *Config) any { return c.PolicyUpdaterMinFetchInterval.Seconds() }},

	// Data updater.
	{name: "OPAL_DATA_UPDATER_ENABLED", section: "data", def: "`true`", doc: "bool",
		parse: func(p *parser, v *string, c *Config) { c.DataUpdaterEnabled = p.boolean(v, true) },
		show:  func(c *Config) any { return c.DataUpdaterEnabled }},
	{name: "OPAL_DATA_TOPICS", section: "data", def: "`policy_data`", doc: "list",
		parse: func(p *parser, v *string, c *Config) { c.DataTopics = list(get(v, "policy_data"), ",") },
		show:  func(c *Config) any { return strings.Join(c.DataTopics, ",") }},
	{name: "OPAL_DEFAULT_DATA_SOURCES_CONFIG_URL", section: "data", def: "`{SERVER_URL}/data/config`",
		doc: "scoped: `{SERVER_URL}/scopes/{scope}/data`",
		parse: func(p *parser, v *string, c *Config) {
			if c.ScopeID == DefaultScopeID {
				c.DefaultDataSourcesConfigURL = c.ServerURL + "/data/config"
			} else {
				c.DefaultDataSourcesConfigURL = c.ServerURL + "/scopes/" + url.PathEscape(c.ScopeID) + "/data"
			}
			if get(v, "") != "" {
				c.DefaultDataSourcesConfigURL = p.url(v, c.DefaultDataSourcesConfigURL)
			}
		},
		show: func(c *Config) any { return redactURL(c.DefaultDataSourcesConfigURL) }},
	{name: "OPAL_DATA_UPDATER_CONN_RETRY", section: "data", def: "as the policy default", doc: "JSON model",
		parse: func(p *parser, v *string, c *Config) {
			c.DataUpdaterConnRetry = p.retry(v, DefaultPolicyUpdaterConnRetry())
		},
		show: func(c *Config) any { return c.DataUpdaterConnRetry.String() }},
	{name: "OPAL_DATA_STORE_CONN_RETRY", section: "data", def: "unset",
		doc: "deprecated; when set it overrides `OPAL_DATA_UPDATER_CONN_RETRY` (as in Python)",
		parse: func(p *parser, v *string, c *Config) {
			if get(v, "") != "" { // deprecated, but still wins (as in Python)
				c.DataUpdaterConnRetry = p.retry(v, c.DataUpdaterConnRetry)
			}
		}}, // no show: Masked lists the effective OPAL_DATA_UPDATER_CONN_RETRY
	{name: "OPAL_SPLIT_ROOT_DATA", section: "data", def: "`false`", doc: "bool",
		parse: func(p *parser, v *string, c *Config) { c.SplitRootData = p.boolean(v, false) },
		show:  func(c *Config) any { return c.SplitRootData }},
	{name: "OPAL_SHOULD_REPORT_ON_DATA_UPDATES", section: "data", def: "`false`", doc: "bool",
		parse: func(p *parser, v *string, c *Config) { c.ShouldReportOnDataUpdates = p.boolean(v, false) },
		show:  func(c *Config) any { return c.ShouldReportOnDataUpdates }},
	{name: "OPAL_DEFAULT_UPDATE_CALLBACKS", section: "data", def: "`{\"callbacks\":[\"{SERVER_URL}/data/callback_report\"]}`",
		doc: "the Python model; `[url, config]` entries keep their URL. A plain `,`-list of URLs is accepted too.",
		parse: func(p *parser, v *string, c *Config) {
			c.DefaultUpdateCallbacks = p.callbacks(v, []string{c.ServerURL + "/data/callback_report"})
		},
		show: func(c *Config) any { return strings.Join(redactURLs(c.DefaultUpdateCallbacks), ",") }},
	{name: "OPAL_FETCHING_CALLBACK_TIMEOUT", section: "data", def: "`10`", doc: "seconds > 0, whole data fetch",
		parse: func(p *parser, v *string, c *Config) {
			c.FetchingCallbackTimeout = p.duration(v, 10*time.Second, true)
		},
		show: func(c *Config) any { return c.FetchingCallbackTimeout.Seconds() }},
	{name: "OPAL_HTTP_FETCHER_TIMEOUT", section: "data", def: "`5`", doc: "seconds > 0, one data-source attempt",
		parse: func(p *parser, v *string, c *Config) { c.HTTPFetcherTimeout = p.duration(v, 5*time.Second, true) },
		show:  func(c *Config) any { return c.HTTPFetcherTimeout.Seconds() }},
	{name: "OPAL_DATA_UPDATER_FETCH_CONCURRENCY", section: "data", def: "`8`", origin: ours,
		doc: "1-1024: data entries fetched at once (a bounded worker pool); the store writes stay one at a time, in admission order",
		parse: func(p *parser, v *string, c *Config) {
			c.DataFetchConcurrency = int(p.integer(v, DefaultDataFetchConcurrency, 1, 1024))
		},
		show: func(c *Config) any { return c.DataFetchConcurrency }},
	{name: "OPAL_FETCHING_WORKER_COUNT", section: "data", def: "`6` (Python)",
		doc: "1-1024: the Python client's fetcher worker count, read as `OPAL_DATA_UPDATER_FETCH_CONCURRENCY` when that is " +
			"unset (so an unset pair means 8 here, 6 in Python)",
		parse: func(p *parser, v *string, c *Config) {
			if get(v, "") != "" && !p.isSet("OPAL_DATA_UPDATER_FETCH_CONCURRENCY") {
				c.DataFetchConcurrency = int(p.integer(v, DefaultDataFetchConcurrency, 1, 1024))
			}
		},
		show: func(c *Config) any { return c.DataFetchConcurrency }},

	// Policy store.
	{name: "OPAL_POLICY_STORE_TYPE", section: "store", def: "`OPA`",
		doc: "only `OPA`; `CEDAR` and `MOCK` are refused as not supported",
		parse: func(p *parser, v *string, c *Config) {
			c.PolicyStoreType = strings.ToUpper(get(v, "OPA"))
			if c.PolicyStoreType != "OPA" {
				p.fail(c.PolicyStoreType, "OPA", notSupported(c.PolicyStoreType, "CEDAR", "MOCK"))
			}
		},
		show: func(c *Config) any { return c.PolicyStoreType }},
	{name: "OPAL_POLICY_STORE_URL", section: "store", def: "`http://localhost:8181`", doc: "`/v1` is appended",
		parse: func(p *parser, v *string, c *Config) { c.PolicyStoreURL = p.url(v, DefaultPolicyStoreURL) },
		show:  func(c *Config) any { return redactURL(c.PolicyStoreURL) }},
	{name: "OPAL_POLICY_STORE_AUTH_TYPE", section: "store", def: "`none`",
		doc: "`none` or `token` (any case); `oauth` and `tls` are refused as not supported",
		parse: func(p *parser, v *string, c *Config) {
			c.PolicyStoreAuthType = strings.ToLower(get(v, "none"))
			if c.PolicyStoreAuthType != "none" && c.PolicyStoreAuthType != "token" {
				p.fail(c.PolicyStoreAuthType, "none or token", notSupported(c.PolicyStoreAuthType, "oauth", "tls"))
			}
		},
		show: func(c *Config) any { return c.PolicyStoreAuthType }},
	{name: "OPAL_POLICY_STORE_AUTH_TOKEN", section: "store", def: "unset", secret: true,
		doc: "required with `token`; never logged",
		parse: func(p *parser, v *string, c *Config) {
			c.PolicyStoreAuthToken = get(v, "")
			if c.PolicyStoreAuthType == "token" && c.PolicyStoreAuthToken == "" {
				p.failSecret("", "a non-empty token when OPAL_POLICY_STORE_AUTH_TYPE=token", "")
			}
		},
		show: func(c *Config) any { return c.PolicyStoreAuthToken }},
	{name: "OPAL_POLICY_STORE_CONN_RETRY", section: "store", def: "`{}` = fixed 2 s x 2", doc: "JSON model, OPA writes",
		parse: func(p *parser, v *string, c *Config) { c.PolicyStoreConnRetry = p.retry(v, DefaultConnRetryOptions()) },
		show:  func(c *Config) any { return c.PolicyStoreConnRetry.String() }},
	{name: "OPAL_POLICY_STORE_POLICY_PATHS_TO_IGNORE", section: "store", def: "empty", doc: "list of globs",
		parse: func(p *parser, v *string, c *Config) { c.PolicyStorePolicyPathsToIgnore = list(get(v, ""), ",") },
		show:  func(c *Config) any { return strings.Join(c.PolicyStorePolicyPathsToIgnore, ",") }},
	{name: "OPAL_INLINE_OPA_ENABLED", section: "store", def: "`true`", doc: "bool: embedded OPA",
		parse: func(p *parser, v *string, c *Config) { c.InlineOPAEnabled = p.boolean(v, true) },
		show:  func(c *Config) any { return c.InlineOPAEnabled }},
	{name: "OPAL_INLINE_OPA_CONFIG", section: "store", def: "`{\"addr\":\"127.0.0.1:8181\"}`",
		doc: "JSON object, the Python client's inline OPA options; every key below. An unknown key, a bad value or a " +
			"missing file stops the agent (exit 1) naming the key. See [Inline OPA](#inline-opa-opal_inline_opa_config)",
		parse: func(p *parser, v *string, c *Config) { c.InlineOPAConfig = p.inlineOPA(v) },
		show:  func(c *Config) any { return c.InlineOPAConfig.String() }},
	{name: "OPAL_INLINE_OPA_LOG_FORMAT", section: "store", def: "`none`",
		doc: "`none`, `minimal`, `http` or `full` (any case): how OPA's own logs reach the agent's log (below)",
		parse: func(p *parser, v *string, c *Config) {
			c.InlineOPALogFormat = strings.ToLower(get(v, "none"))
			if !contains(InlineOPALogFormats, c.InlineOPALogFormat) {
				p.fail(c.InlineOPALogFormat, strings.Join(InlineOPALogFormats, ", "), "")
			}
		},
		show: func(c *Config) any { return c.InlineOPALogFormat }},
	{name: "OPAL_OPA_V0_COMPAT", section: "store", def: "`true`",
		doc: "bool, as in the Python client: OPA runs as `opa run --v0-compatible` (Rego v0 modules load; a module with " +
			"`import rego.v1` is v1). Applies to both stores: the external store pre-compiles bundles the same way. `false` = " +
			"Rego v1. Note: under the default a v1 module **without** `import rego.v1` (`allow if ...`) does not parse, " +
			"exactly as under `opa run --v0-compatible`: add the import or set `false`",
		parse: func(p *parser, v *string, c *Config) { c.OPAV0Compat = p.boolean(v, true) },
		show:  func(c *Config) any { return c.OPAV0Compat }},
	{name: "OPAL_POLICY_STORE_TLS_CLIENT_CERT", section: "store", def: "unset",
		doc:   "external OPA: PEM client certificate file (mTLS); with `_KEY`",
		parse: func(p *parser, v *string, c *Config) { c.PolicyStoreTLSClientCert = get(v, "") },
		show:  func(c *Config) any { return c.PolicyStoreTLSClientCert }},
	{name: "OPAL_POLICY_STORE_TLS_CLIENT_KEY", section: "store", def: "unset",
		doc:   "external OPA: PEM private key file of the client certificate",
		parse: func(p *parser, v *string, c *Config) { c.PolicyStoreTLSClientKey = get(v, "") },
		show:  func(c *Config) any { return c.PolicyStoreTLSClientKey }},
	{name: "OPAL_POLICY_STORE_TLS_CA", section: "store", def: "unset",
		doc: "external OPA: PEM file of the CA(s) that sign OPA's certificate (default: the system roots). A missing or " +
			"unreadable file, or a certificate without its key, stops the agent",
		parse: func(p *parser, v *string, c *Config) {
			c.PolicyStoreTLSCA = get(v, "")
			if name, err := checkTLSFiles(c.PolicyStoreTLSClientCert, c.PolicyStoreTLSClientKey, c.PolicyStoreTLSCA); err != nil {
				p.name = Prefix + name
				p.fail("", "a readable file; the client certificate and key together", err.Error())
			}
		},
		show: func(c *Config) any { return c.PolicyStoreTLSCA }},
	{name: "OPAL_OPA_HEALTH_CHECK_POLICY_ENABLED", section: "store", def: "`false`", doc: "bool",
		parse: func(p *parser, v *string, c *Config) { c.OPAHealthCheckPolicyEnabled = p.boolean(v, false) },
		show:  func(c *Config) any { return c.OPAHealthCheckPolicyEnabled }},

	// Offline mode.
	{name: "OPAL_OFFLINE_MODE_ENABLED", section: "offline", def: "`false`",
		doc:   "bool: restore the store from the backup at startup, back it up after each transaction",
		parse: func(p *parser, v *string, c *Config) { c.OfflineModeEnabled = p.boolean(v, false) },
		show:  func(c *Config) any { return c.OfflineModeEnabled }},
	{name: "OPAL_STORE_BACKUP_PATH", section: "offline", def: "`/opal/backup/opa.json`",
		doc:   "the backup file (0600; its directory is created 0700); one agent per file",
		parse: func(p *parser, v *string, c *Config) { c.StoreBackupPath = get(v, DefaultStoreBackupPath) },
		show:  func(c *Config) any { return c.StoreBackupPath }},
	{name: "OPAL_STORE_BACKUP_INTERVAL", section: "offline", def: "`60`",
		doc: "seconds > 0: at most one backup per interval (plus one at clean shutdown). Python takes whole seconds; we accept a fraction.",
		parse: func(p *parser, v *string, c *Config) {
			c.StoreBackupInterval = p.duration(v, DefaultStoreBackupInterval, true)
		},
		show: func(c *Config) any { return c.StoreBackupInterval.Seconds() }},
	{name: "OPAL_DEFAULT_OPAL_SERVER_CONNECTIVITY_DISABLED", section: "offline", def: "`false`",
		doc: "bool: with offline mode and a backup **restored**, do not connect to the server until " +
			"`POST /opal-server/connectivity/enable`. Without a valid backup the agent connects anyway (it would otherwise stay empty).",
		parse: func(p *parser, v *string, c *Config) { c.DefaultOPALServerConnectivityDisabled = p.boolean(v, false) },
		show:  func(c *Config) any { return c.DefaultOPALServerConnectivityDisabled }},
	{name: "OPAL_POLICY_MAX_AGE", section: "offline", def: "`0` (off)", origin: ours,
		doc: "seconds >= 0: `/ready` answers 503 once the policy has been behind (the `opal_client_policy_staleness_seconds` " +
			"gauge) for longer. Off by default: during a server outage every sidecar of a fleet crosses the limit at about " +
			"the same time and turns unready at once. See [offline.md](offline.md#staleness-as-a-choice-opal_policy_max_age).",
		parse: func(p *parser, v *string, c *Config) { c.PolicyMaxAge = p.duration(v, 0, false) },
		show:  func(c *Config) any { return c.PolicyMaxAge.Seconds() }},

	// Client API and logging.
	{name: "OPAL_CLIENT_API_SERVER_HOST", section: "api", def: "`127.0.0.1`", doc: "",
		parse: func(p *parser, v *string, c *Config) { c.ClientAPIServerHost = get(v, "127.0.0.1") },
		show:  func(c *Config) any { return c.ClientAPIServerHost }},
	{name: "OPAL_CLIENT_API_SERVER_PORT", section: "api", def: "`7000`", doc: "1-65535; `UVICORN_PORT` wins when set",
		parse: func(p *parser, v *string, c *Config) {
			c.ClientAPIServerPort = int(p.integer(v, 7000, 1, 65535))
		},
		show: func(c *Config) any { return c.ClientAPIServerPort }},
	{name: "UVICORN_PORT", section: "api", def: "unset",
		doc: "1-65535: the client API port, as in the Python image, whose start script binds the API to " +
			"`0.0.0.0:$UVICORN_PORT` and never reads `OPAL_CLIENT_API_SERVER_PORT`. So when set it wins over " +
			"`OPAL_CLIENT_API_SERVER_PORT` (a warning names both when they differ). It does not change the host.",
		parse: func(p *parser, v *string, c *Config) {
			c.UvicornPort = int(p.integer(v, 0, 1, 65535))
			if c.UvicornPort == 0 {
				return
			}
			if p.isSet("OPAL_CLIENT_API_SERVER_PORT") && c.ClientAPIServerPort != c.UvicornPort {
				p.warn("OPAL_CLIENT_API_SERVER_PORT is overridden by UVICORN_PORT (as in the Python image)")
			}
			c.ClientAPIServerPort = c.UvicornPort
		},
		show: func(c *Config) any { return c.UvicornPort }},
	{name: "OPAL_AUTH_PUBLIC_KEY", section: "api", def: "unset",
		doc: "the key, or a path to a file holding it. Set: the three `/opal-server/connectivity` routes need " +
			"`Authorization: Bearer <JWT>` verified as the Python client verifies it (signature, `aud`, `iss`, `exp`/`nbf`/`iat`, " +
			"a UUID `sub`, `peer_type` `listener`), else 401. **Unset: those routes are open to anyone who reaches the port** " +
			"(the image listens on 0.0.0.0). Health, ready, metrics and the two triggers are always open, as in the Python " +
			"client. A key we cannot parse stops the agent (Python logs it and runs unauthenticated)",
		parse: func(p *parser, v *string, c *Config) { c.AuthPublicKey = get(v, "") },
		show:  func(c *Config) any { return c.AuthPublicKey }},
	{name: "OPAL_AUTH_PUBLIC_KEY_FORMAT", section: "api", def: "`ssh`",
		doc: "`ssh` (one `ssh-rsa`/`ssh-ed25519`/`ecdsa-sha2-nistp*` line), `pem` (inline newlines may be written as `_`) or `der`",
		parse: func(p *parser, v *string, c *Config) {
			c.AuthPublicKeyFormat = strings.ToLower(get(v, "ssh"))
			if f := c.AuthPublicKeyFormat; f != "ssh" && f != "pem" && f != "der" {
				p.fail(f, "ssh, pem or der", "")
			}
		},
		show: func(c *Config) any { return c.AuthPublicKeyFormat }},
	{name: "OPAL_AUTH_JWT_ALGORITHM", section: "api", def: "`RS256`",
		doc:   "`RS256`/`384`/`512`, `PS256`/`384`/`512`, `ES256`/`384`/`512`, `EdDSA`; the key must fit it. `HS*` is refused (it needs a shared secret, not a public key)",
		parse: func(p *parser, v *string, c *Config) { c.AuthJWTAlgorithm = get(v, "RS256") },
		show:  func(c *Config) any { return c.AuthJWTAlgorithm }},
	{name: "OPAL_AUTH_JWT_AUDIENCE", section: "api", def: "`https://api.opal.ac/v1/`", doc: "must be in the token's `aud`",
		parse: func(p *parser, v *string, c *Config) { c.AuthJWTAudience = get(v, "https://api.opal.ac/v1/") },
		show:  func(c *Config) any { return c.AuthJWTAudience }},
	{name: "OPAL_AUTH_JWT_ISSUER", section: "api", def: "`https://opal.ac/`", doc: "must equal the token's `iss`",
		parse: func(p *parser, v *string, c *Config) { c.AuthJWTIssuer = get(v, "https://opal.ac/") },
		show:  func(c *Config) any { return c.AuthJWTIssuer }},
	{name: "OPAL_LOG_LEVEL", section: "api", def: "`INFO`",
		doc: "`TRACE`/`DEBUG` -> debug, `INFO`/`SUCCESS` -> info, `WARNING`/`WARN` -> warn, `ERROR`/`CRITICAL` -> error; any case",
		parse: func(p *parser, v *string, c *Config) {
			c.LogLevel = strings.ToUpper(get(v, "INFO"))
			if _, ok := slogLevels[c.LogLevel]; !ok {
				p.fail(c.LogLevel, "TRACE, DEBUG, INFO, SUCCESS, WARNING, ERROR or CRITICAL", "")
			}
		},
		show: func(c *Config) any { return c.LogLevel }},
	{name: "OPAL_LOG_SERIALIZE", section: "api", def: "`false`", doc: "bool: JSON log lines",
		parse: func(p *parser, v *string, c *Config) { c.LogSerialize = p.boolean(v, false) },
		show:  func(c *Config) any { return c.LogSerialize }},
	{name: "OPAL_LOG_FORMAT_INCLUDE_PID", section: "api", def: "`false`", doc: "bool: a `pid` attribute on every line",
		parse: func(p *parser, v *string, c *Config) { c.LogFormatIncludePID = p.boolean(v, false) },
		show:  func(c *Config) any { return c.LogFormatIncludePID }},

	// Python client variables this agent does not read (docs: what happens
	// instead). Only OPAL_ names are warned about.
	notRead("OPAL_POLICY_STORE_AUTH_OAUTH_SERVER", "unset", "`OPAL_POLICY_STORE_AUTH_TYPE=oauth` is refused at start; no OAuth token is fetched"),
	notRead("OPAL_POLICY_STORE_AUTH_OAUTH_CLIENT_ID", "unset", "as `OPAL_POLICY_STORE_AUTH_OAUTH_SERVER`"),
	notRead("OPAL_POLICY_STORE_AUTH_OAUTH_CLIENT_SECRET", "unset", "as `OPAL_POLICY_STORE_AUTH_OAUTH_SERVER`"),
	notRead("OPAL_EXCLUDE_POLICY_STORE_SECRETS", "`false`", "there is no `/policy-store/config` route; `print-config` always masks the secrets"),
	notRead("OPAL_INLINE_OPA_EXEC_PATH", "`/opal/opa` in the image", "OPA is embedded in the binary; no executable is run"),
	notRead("OPAL_INLINE_CEDAR_ENABLED", "`true`", "Cedar is not supported (`OPAL_POLICY_STORE_TYPE=CEDAR` is refused at start)"),
	notRead("OPAL_INLINE_CEDAR_CONFIG", "`{}`", "as `OPAL_INLINE_CEDAR_ENABLED`"),
	notRead("OPAL_INLINE_CEDAR_LOG_FORMAT", "`none`", "as `OPAL_INLINE_CEDAR_ENABLED`"),
	notRead("OPAL_INLINE_CEDAR_EXEC_PATH", "unset", "as `OPAL_INLINE_CEDAR_ENABLED`"),
	notRead("OPAL_CLIENT_API_SERVER_WORKER_COUNT", "`1`", "one process serves the client API (Python supports only 1 too)"),
	notRead("OPAL_WAIT_ON_SERVER_LOAD", "`false`", "the agent does not poll `/loadlimit`; it connects at once and backs off on errors"),
	notRead("OPAL_DEFAULT_DATA_URL", "`http://localhost:8000/policy-config`", "nothing: the data sources come from `OPAL_DEFAULT_DATA_SOURCES_CONFIG_URL` (the Python client does not use it either)"),
	notRead("OPAL_DEFAULT_UPDATE_CALLBACK_CONFIG", "POST, JSON", "callback reports are always POSTed as JSON, the Python default"),
	notRead("OPAL_OPA_HEALTH_CHECK_TRANSACTION_LOG_PATH", "`system/opal/transactions`", "nothing: declared but unused in the Python client too"),
	notRead("OPAL_ALLOWED_ORIGINS", "`*`", "the client API sends no CORS headers"),
	notRead("OPAL_LOG_FORMAT", "loguru format", "log lines are slog text, or JSON with `OPAL_LOG_SERIALIZE`"),
	notRead("OPAL_LOG_TRACEBACK", "`true`", "errors are logged as one line, without a traceback"),
	notRead("OPAL_LOG_DIAGNOSE", "`true`", "as `OPAL_LOG_TRACEBACK`"),
	notRead("OPAL_LOG_COLORIZE", "`true`", "log lines are never coloured"),
	notRead("OPAL_LOG_SHOW_CODE_LINE", "`true`", "log lines carry no code location"),
	notRead("OPAL_LOG_MODULE_EXCLUDE_LIST", "`[\"uvicorn\"]`", "no per-module filtering: one logger at `OPAL_LOG_LEVEL`"),
	notRead("OPAL_LOG_MODULE_INCLUDE_LIST", "`[\"uvicorn.protocols.http\"]`", "as `OPAL_LOG_MODULE_EXCLUDE_LIST`"),
	notRead("OPAL_LOG_PATCH_UVICORN_LOGS", "`true`", "there is no uvicorn; the client API logs through the agent's logger"),
	notRead("OPAL_LOG_TO_FILE", "`false`", "logs go to stderr only; let the container runtime collect them"),
	notRead("OPAL_LOG_FILE_PATH", "`opal_{time}.log`", "as `OPAL_LOG_TO_FILE`"),
	notRead("OPAL_LOG_FILE_ROTATION", "`250 MB`", "as `OPAL_LOG_TO_FILE`"),
	notRead("OPAL_LOG_FILE_RETENTION", "`10 days`", "as `OPAL_LOG_TO_FILE`"),
	notRead("OPAL_LOG_FILE_COMPRESSION", "unset", "as `OPAL_LOG_TO_FILE`"),
	notRead("OPAL_LOG_FILE_SERIALIZE", "`true`", "as `OPAL_LOG_TO_FILE`"),
	notRead("OPAL_LOG_FILE_LEVEL", "`INFO`", "as `OPAL_LOG_TO_FILE`"),
	notRead("OPAL_STATISTICS_REMOVE_CLIENT_CHANNEL", "`__opal_stats_rm`", "nothing is published on removal: the server drops a client from its statistics when its socket closes"),
	notRead("OPAL_FETCH_PROVIDER_MODULES", "`[\"opal_common.fetcher.providers\"]`", "only the built-in HTTP fetcher; Python fetch-provider modules cannot be loaded"),
	notRead("OPAL_FETCHING_ENQUEUE_TIMEOUT", "`10`", "there is no bounded fetch queue to wait on"),
	notRead("OPAL_HTTP_FETCHER_PROVIDER_CLIENT", "`aiohttp`", "one HTTP client, Go's net/http"),
	notRead("OPAL_MTLS_CLIENT_CERT", "unset", "no client certificate is sent to the OPAL server (mutual TLS is not supported)"),
	notRead("OPAL_MTLS_CLIENT_KEY", "unset", "as `OPAL_MTLS_CLIENT_CERT`"),
	notRead("OPAL_MTLS_CA_CERT", "unset", "as `OPAL_MTLS_CLIENT_CERT`; use `OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE` for a private CA"),
	notRead("OPAL_ENABLE_METRICS", "`false`", "Prometheus metrics are always served at `/metrics` on the client API"),
	notRead("OPAL_ENABLE_DATADOG_APM", "`false`", "no Datadog tracing"),
	notRead("OPAL_POLICY_REPO_POLICY_EXTENSIONS", "`[\".rego\"]`", "a server setting: the agent loads the bundle's modules as the server sent them"),
	notRead("OPAL_GIT_SSH_KEY_FILE", "`~/.ssh/opal_repo_ssh_key`", "a server setting: the agent never runs git"),
	notRead("OPAL_AUTH_TYPE", "unset", "OAuth2 (`oauth2`) is not supported: the agent sends `OPAL_CLIENT_TOKEN` as it is and validates no OAuth2 token"),
	notRead("OPAL_OAUTH2_CLIENT_ID", "unset", "as `OPAL_AUTH_TYPE`"),
	notRead("OPAL_OAUTH2_CLIENT_SECRET", "unset", "as `OPAL_AUTH_TYPE`"),
	notRead("OPAL_OAUTH2_TOKEN_URL", "unset", "as `OPAL_AUTH_TYPE`"),
	notRead("OPAL_OAUTH2_INTROSPECT_URL", "unset", "as `OPAL_AUTH_TYPE`"),
	notRead("OPAL_OAUTH2_OPENID_CONFIGURATION_URL", "unset", "as `OPAL_AUTH_TYPE`"),
	notRead("OPAL_OAUTH2_TOKEN_VERIFY_CACHE_MAXSIZE", "`100`", "as `OPAL_AUTH_TYPE`"),
	notRead("OPAL_OAUTH2_TOKEN_VERIFY_CACHE_TTL", "`300`", "as `OPAL_AUTH_TYPE`"),
	notRead("OPAL_OAUTH2_EXP_MARGIN", "`300`", "as `OPAL_AUTH_TYPE`"),
	notRead("OPAL_OAUTH2_EXACT_MATCH_CLAIMS", "unset", "as `OPAL_AUTH_TYPE`"),
	notRead("OPAL_OAUTH2_REQUIRED_CLAIMS", "unset", "as `OPAL_AUTH_TYPE`"),
	notRead("OPAL_OAUTH2_JWT_ALGORITHM", "`RS256`", "as `OPAL_AUTH_TYPE`"),
	notRead("OPAL_OAUTH2_JWT_AUDIENCE", "unset", "as `OPAL_AUTH_TYPE`"),
	notRead("OPAL_OAUTH2_JWT_ISSUER", "unset", "as `OPAL_AUTH_TYPE`"),
	notRead("OPAL_OAUTH2_JWK_CACHE_MAXSIZE", "`100`", "as `OPAL_AUTH_TYPE`"),
	notRead("OPAL_OAUTH2_JWK_CACHE_TTL", "`604800`", "as `OPAL_AUTH_TYPE`"),
	notRead("UVICORN_NUM_WORKERS", "`1` in the image", "one process serves the client API (not warned about: the chart always sets it to 1)"),
}

// notRead is a row for a Python client variable this agent does not read;
// instead says what happens instead (docs and warning).
func notRead(name, def, instead string) setting {
	return setting{name: name, section: "notread", def: def, doc: instead, origin: pythonNotRead}
}
