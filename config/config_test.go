package config

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

func load(t *testing.T, env map[string]string) (*Config, error) {
	t.Helper()
	return LoadFrom(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
}

func TestDefaults(t *testing.T) {
	c, err := load(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"ServerURL": "http://localhost:7002", "ServerWSURL": "ws://localhost:7002", "ServerPubSubURL": "ws://localhost:7002/ws",
		"ClientToken": DefaultClientToken, "PolicySubscriptionDirs": []string{"."},
		"PolicyUpdaterMaxRetryAfter": 60 * time.Second, "PolicyUpdaterRescheduleOnRetryable": true,
		"PolicyUpdaterMaxDeferredRounds": 20, "PolicyBundleMaxBytes": int64(100 << 20),
		"PolicyFetchAttemptTimeout": 30 * time.Second, "DataTopics": []string{"policy_data"},
		"DefaultDataSourcesConfigURL": "http://localhost:7002/data/config",
		"DefaultUpdateCallbacks":      []string{"http://localhost:7002/data/callback_report"},
		"FetchingCallbackTimeout":     10 * time.Second, "HTTPFetcherTimeout": 5 * time.Second,
		"PubSubMaxMessageBytes": int64(64 << 20), "ScopeID": "default", "PolicyStoreType": "OPA",
		"PolicyStoreURL": "http://localhost:8181", "PolicyStoreAuthType": "none",
		"PolicyStoreConnRetry":   ConnRetryOptions{WaitStrategy: "fixed", WaitTime: 2 * time.Second, Attempts: 2},
		"PolicyUpdaterConnRetry": ConnRetryOptions{WaitStrategy: "random_exponential", WaitTime: time.Second, MaxWait: 10 * time.Second, Attempts: 5},
		"InlineOPAEnabled":       true, "InlineOPAConfig": InlineOPAConfig{Addr: "127.0.0.1:8181"},
		"ClientAPIServerHost": "127.0.0.1", "ClientAPIServerPort": 7000, "LogLevel": "INFO",
		"PolicyUpdaterEnabled": true, "DataUpdaterEnabled": true, "KeepAliveInterval": time.Duration(0),
		"OfflineModeEnabled": false, "StoreBackupPath": "/opal/backup/opa.json", "StoreBackupInterval": 60 * time.Second,
		"DefaultOPALServerConnectivityDisabled": false, "PolicyMaxAge": time.Duration(0),
	}
	v := reflect.ValueOf(*c)
	for field, w := range want {
		if got := v.FieldByName(field).Interface(); !reflect.DeepEqual(got, w) {
			t.Errorf("%s = %#v, want %#v", field, got, w)
		}
	}
}

// Each case sets variables and checks one field.
func TestSyntax(t *testing.T) {
	cases := []struct {
		name  string
		env   map[string]string
		field string
		want  any
	}{
		{"bool_upper_TRUE", map[string]string{"OPAL_SPLIT_ROOT_DATA": "TRUE"}, "SplitRootData", true},
		{"bool_1", map[string]string{"OPAL_SPLIT_ROOT_DATA": "1"}, "SplitRootData", true},
		{"bool_False", map[string]string{"OPAL_POLICY_UPDATER_RESCHEDULE_ON_RETRYABLE": "False"}, "PolicyUpdaterRescheduleOnRetryable", false},
		{"bool_0", map[string]string{"OPAL_INLINE_OPA_ENABLED": "0"}, "InlineOPAEnabled", false},
		{"list_comma_trimmed_quoted", map[string]string{"OPAL_DATA_TOPICS": ` a , "b",'c' ,`}, "DataTopics", []string{"a", "b", "c"}},
		// §3.1 normalisation. Mutation caught: drop the ancestor reduction.
		{"dirs_dot_absorbs_relative", map[string]string{"OPAL_POLICY_SUBSCRIPTION_DIRS": "default:./rbac/:."}, "PolicySubscriptionDirs", []string{"."}},
		{"dirs_ancestor_absorbs_child", map[string]string{"OPAL_POLICY_SUBSCRIPTION_DIRS": "tenants/t1:tenants:other//x/"}, "PolicySubscriptionDirs", []string{"other/x", "tenants"}},
		{"dirs_sibling_prefix_kept", map[string]string{"OPAL_POLICY_SUBSCRIPTION_DIRS": "ab:a"}, "PolicySubscriptionDirs", []string{"a", "ab"}},
		{"dirs_dotdot_not_resolved", map[string]string{"OPAL_POLICY_SUBSCRIPTION_DIRS": "a/../b"}, "PolicySubscriptionDirs", []string{"a/../b"}},
		{"dirs_empty_item_is_dot", map[string]string{"OPAL_POLICY_SUBSCRIPTION_DIRS": "a::b"}, "PolicySubscriptionDirs", []string{"."}},
		{"ws_url_https", map[string]string{"OPAL_SERVER_URL": "https://http-gw:7002/"}, "ServerPubSubURL", "wss://http-gw:7002/ws"},
		{"ws_url_explicit", map[string]string{"OPAL_SERVER_PUBSUB_URL": "ws://x:1/pubsub"}, "ServerPubSubURL", "ws://x:1/pubsub"},
		{"scoped_data_config_url", map[string]string{"OPAL_SCOPE_ID": "t1"}, "DefaultDataSourcesConfigURL", "http://localhost:7002/scopes/t1/data"},
		{"max_retry_after_float", map[string]string{"OPAL_POLICY_UPDATER_MAX_RETRY_AFTER": "2.5"}, "PolicyUpdaterMaxRetryAfter", 2500 * time.Millisecond},
		{"max_retry_after_zero", map[string]string{"OPAL_POLICY_UPDATER_MAX_RETRY_AFTER": "0"}, "PolicyUpdaterMaxRetryAfter", time.Duration(0)},
		{"max_deferred_rounds_zero", map[string]string{"OPAL_POLICY_UPDATER_MAX_DEFERRED_ROUNDS": "0"}, "PolicyUpdaterMaxDeferredRounds", 0},
		{"empty_is_default", map[string]string{"OPAL_POLICY_UPDATER_MAX_DEFERRED_ROUNDS": " "}, "PolicyUpdaterMaxDeferredRounds", 20},
		{"empty_token_is_no_token", map[string]string{"OPAL_CLIENT_TOKEN": ""}, "ClientToken", ""},
		{"keep_alive_seconds", map[string]string{"OPAL_KEEP_ALIVE_INTERVAL": "15"}, "KeepAliveInterval", 15 * time.Second},
		// The Python worker count is read when ours is unset, and ours wins.
		// Mutations caught: the alias never read; the alias winning.
		{"fetch_concurrency_default", map[string]string{}, "DataFetchConcurrency", 8},
		{"fetch_concurrency_python_alias", map[string]string{"OPAL_FETCHING_WORKER_COUNT": "6"}, "DataFetchConcurrency", 6},
		{"fetch_concurrency_ours_wins", map[string]string{"OPAL_FETCHING_WORKER_COUNT": "6", "OPAL_DATA_UPDATER_FETCH_CONCURRENCY": "3"}, "DataFetchConcurrency", 3},
		{"data_store_conn_retry_overrides", map[string]string{"OPAL_DATA_UPDATER_CONN_RETRY": `{"attempts":3}`, "OPAL_DATA_STORE_CONN_RETRY": `{"attempts":7}`},
			"DataUpdaterConnRetry", ConnRetryOptions{WaitStrategy: "fixed", WaitTime: 2 * time.Second, Attempts: 7}},
		{"callbacks_model", map[string]string{"OPAL_DEFAULT_UPDATE_CALLBACKS": `{"callbacks":["http://a/cb",["http://b/cb",{"method":"post"}]]}`},
			"DefaultUpdateCallbacks", []string{"http://a/cb", "http://b/cb"}},
		{"inline_opa_addr", map[string]string{"OPAL_INLINE_OPA_CONFIG": `{"addr":"0.0.0.0:9181"}`}, "InlineOPAConfig", InlineOPAConfig{Addr: "0.0.0.0:9181"}},
		// Offline mode.
		{"offline_mode_enabled", map[string]string{"OPAL_OFFLINE_MODE_ENABLED": "true"}, "OfflineModeEnabled", true},
		{"store_backup_path", map[string]string{"OPAL_STORE_BACKUP_PATH": " /var/opal/b.json "}, "StoreBackupPath", "/var/opal/b.json"},
		{"store_backup_interval_float", map[string]string{"OPAL_STORE_BACKUP_INTERVAL": "0.5"}, "StoreBackupInterval", 500 * time.Millisecond},
		{"connectivity_disabled", map[string]string{"OPAL_DEFAULT_OPAL_SERVER_CONNECTIVITY_DISABLED": "1"}, "DefaultOPALServerConnectivityDisabled", true},
		{"policy_max_age_seconds", map[string]string{"OPAL_POLICY_MAX_AGE": "900"}, "PolicyMaxAge", 15 * time.Minute},
		{"policy_max_age_zero_is_off", map[string]string{"OPAL_POLICY_MAX_AGE": "0"}, "PolicyMaxAge", time.Duration(0)},
		{"auth_token", map[string]string{"OPAL_POLICY_STORE_AUTH_TYPE": "TOKEN", "OPAL_POLICY_STORE_AUTH_TOKEN": "x"}, "PolicyStoreAuthType", "token"},
		{"log_level_warning", map[string]string{"OPAL_LOG_LEVEL": "warning"}, "LogLevel", "WARNING"},
		// The Python image binds the API to UVICORN_PORT. Mutation caught: UVICORN_PORT not applied.
		{"uvicorn_port_wins", map[string]string{"OPAL_CLIENT_API_SERVER_PORT": "7100", "UVICORN_PORT": "7300"}, "ClientAPIServerPort", 7300},
		{"uvicorn_port_alone", map[string]string{"UVICORN_PORT": "7300"}, "ClientAPIServerPort", 7300},
		{"tls_allowed", map[string]string{"OPAL_CLIENT_SELF_SIGNED_CERTIFICATES_ALLOWED": "True"}, "ClientSelfSignedCertificatesAllowed", true},
		{"tls_ca_file", map[string]string{"OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE": " /etc/ca.pem "}, "ClientSSLContextTrustedCAFile", "/etc/ca.pem"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := load(t, tc.env)
			if err != nil {
				t.Fatal(err)
			}
			if got := reflect.ValueOf(*c).FieldByName(tc.field).Interface(); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("%s = %#v, want %#v", tc.field, got, tc.want)
			}
		})
	}
}

// A bad value stops startup with one line naming the variable and what it
// accepts, never the token.
func TestBadValues(t *testing.T) {
	cases := []struct {
		name, key, value, accepted string
	}{
		{"bool_yes", "OPAL_POLICY_UPDATER_RESCHEDULE_ON_RETRYABLE", "yes", "true, false, 1 or 0"},
		// Mutation caught: "f < 0" check removed.
		{"max_retry_after_negative", "OPAL_POLICY_UPDATER_MAX_RETRY_AFTER", "-1", ">= 0"},
		{"max_retry_after_nan", "OPAL_POLICY_UPDATER_MAX_RETRY_AFTER", "nan", ">= 0"},
		{"max_retry_after_inf", "OPAL_POLICY_UPDATER_MAX_RETRY_AFTER", "inf", ">= 0"},
		{"max_retry_after_huge", "OPAL_POLICY_UPDATER_MAX_RETRY_AFTER", "1e300", ">= 0"},
		// Mutation caught: lo bound 0 -> MinInt32 for deferred rounds.
		{"deferred_rounds_negative", "OPAL_POLICY_UPDATER_MAX_DEFERRED_ROUNDS", "-1", "whole number from 0"},
		{"deferred_rounds_float", "OPAL_POLICY_UPDATER_MAX_DEFERRED_ROUNDS", "2.5", "whole number from 0"},
		{"attempt_timeout_zero", "OPAL_POLICY_FETCH_ATTEMPT_TIMEOUT", "0", "> 0"},
		{"bundle_max_bytes_zero", "OPAL_POLICY_BUNDLE_MAX_BYTES", "0", "whole number from 1"},
		{"conn_retry_not_json", "OPAL_POLICY_UPDATER_CONN_RETRY", "{attempts:3", "JSON object"},
		{"conn_retry_bad_strategy", "OPAL_POLICY_UPDATER_CONN_RETRY", `{"wait_strategy":"linear"}`, "JSON object"},
		{"conn_retry_zero_attempts", "OPAL_POLICY_UPDATER_CONN_RETRY", `{"attempts":0}`, "JSON object"},
		{"conn_retry_negative_wait", "OPAL_POLICY_STORE_CONN_RETRY", `{"wait_time":-1}`, "JSON object"},
		// Only one JSON object. Mutation caught: the '{' check dropped.
		{"conn_retry_null", "OPAL_POLICY_UPDATER_CONN_RETRY", "null", "JSON object"},
		// Mutation caught: json.Unmarshal -> a Decoder (reads the first value only).
		{"conn_retry_trailing_text", "OPAL_DATA_UPDATER_CONN_RETRY", `{"attempts":3} x`, "JSON object"},
		{"conn_retry_two_objects", "OPAL_POLICY_STORE_CONN_RETRY", `{"attempts":3}{"attempts":4}`, "JSON object"},
		{"server_url_relative", "OPAL_SERVER_URL", "localhost:7002", "absolute URL"},
		{"auth_oauth_not_supported", "OPAL_POLICY_STORE_AUTH_TYPE", "oauth", "none or token"},
		{"auth_tls_not_supported", "OPAL_POLICY_STORE_AUTH_TYPE", "tls", "none or token"},
		{"store_type_cedar", "OPAL_POLICY_STORE_TYPE", "CEDAR", "OPA"},
		{"port_out_of_range", "OPAL_CLIENT_API_SERVER_PORT", "70000", "1 to 65535"},
		{"uvicorn_port_not_a_number", "UVICORN_PORT", "http", "1 to 65535"},
		{"tls_allowed_yes", "OPAL_CLIENT_SELF_SIGNED_CERTIFICATES_ALLOWED", "yes", "true, false, 1 or 0"},
		{"log_level_unknown", "OPAL_LOG_LEVEL", "LOUD", "INFO"},
		{"inline_opa_addr", "OPAL_INLINE_OPA_CONFIG", `{"addr":"nope"}`, "addr"},
		// Mutation caught: STORE_BACKUP_INTERVAL parsed with positive=false (0 would back up on every transaction).
		{"store_backup_interval_zero", "OPAL_STORE_BACKUP_INTERVAL", "0", "> 0"},
		{"offline_mode_yes", "OPAL_OFFLINE_MODE_ENABLED", "yes", "true, false, 1 or 0"},
		{"policy_max_age_negative", "OPAL_POLICY_MAX_AGE", "-5", ">= 0"},
		// A bad value never shows a secret. A callback's config may
		// hold headers. Mutation caught: failSecret -> fail in callbacks.
		{"secret_callback_headers_not_shown", "OPAL_DEFAULT_UPDATE_CALLBACKS",
			`{"callbacks":[["http://cb",{"headers":{"Authorization":"Bearer SECRET"}}],5]}`, "callbacks"},
		{"secret_callbacks_json_error_not_shown", "OPAL_DEFAULT_UPDATE_CALLBACKS",
			`{"callbacks":[["http://cb",{"headers":{"Authorization":"Bearer SECRET"}}]}`, "callbacks"},
		// Mutation caught: p.url quoting s instead of redactURL(s).
		{"secret_url_userinfo_not_shown", "OPAL_SERVER_URL", "http://user:SECRET@host:port/", "absolute URL"},
		// Mutation caught: the '@' cut of redactRawURL dropped.
		{"secret_opaque_userinfo_not_shown", "OPAL_SERVER_URL", "user:SECRET@host:7002", "absolute URL"},
		// Mutation caught: the '?' cut of redactRawURL dropped.
		{"secret_url_query_not_shown", "OPAL_POLICY_STORE_URL", "http://host:port/?token=SECRET", "absolute URL"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, map[string]string{tc.key: tc.value, "OPAL_CLIENT_TOKEN": "tok-SECRET"})
			var ce *Error
			if !errors.As(err, &ce) || ce.Var != tc.key {
				t.Fatalf("err = %v, want *Error for %s", err, tc.key)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.key) || !strings.Contains(msg, tc.accepted) || strings.ContainsAny(msg, "\n\r") || strings.Contains(msg, "SECRET") {
				t.Errorf("bad error line: %s", msg)
			}
		})
	}
	t.Run("token_required_and_masked", func(t *testing.T) {
		_, err := load(t, map[string]string{"OPAL_POLICY_STORE_AUTH_TYPE": "token"})
		var ce *Error
		if !errors.As(err, &ce) || ce.Var != "OPAL_POLICY_STORE_AUTH_TOKEN" {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestTopics(t *testing.T) {
	c, _ := load(t, map[string]string{"OPAL_POLICY_SUBSCRIPTION_DIRS": "b:a", "OPAL_DATA_TOPICS": "x,y"})
	if got := c.PolicyTopics(); !reflect.DeepEqual(got, []string{"policy:a", "policy:b"}) {
		t.Errorf("PolicyTopics = %v", got)
	}
	if got := c.DataTopicNames(); !reflect.DeepEqual(got, []string{"x", "y"}) {
		t.Errorf("DataTopicNames = %v", got)
	}
	c, _ = load(t, map[string]string{"OPAL_SCOPE_ID": "t1", "OPAL_POLICY_SUBSCRIPTION_DIRS": "a", "OPAL_DATA_TOPICS": "x"})
	if got := c.PolicyTopics(); !reflect.DeepEqual(got, []string{"t1:policy:."}) {
		t.Errorf("scoped PolicyTopics = %v", got)
	}
	if got := c.DataTopicNames(); !reflect.DeepEqual(got, []string{"t1:data:x"}) {
		t.Errorf("scoped DataTopicNames = %v", got)
	}
}

func TestMaskedAndLogger(t *testing.T) {
	c, _ := load(t, map[string]string{"OPAL_CLIENT_TOKEN": "tok-SECRET", "OPAL_POLICY_STORE_AUTH_TYPE": "token",
		"OPAL_POLICY_STORE_AUTH_TOKEN": "store-SECRET", "OPAL_LOG_SERIALIZE": "true", "OPAL_LOG_LEVEL": "DEBUG"})
	m := c.Masked()
	if len(m) != len(Variables())-1 { // every variable but the deprecated alias
		t.Errorf("Masked has %d keys, Variables %d", len(m), len(Variables()))
	}
	var buf bytes.Buffer
	for k, v := range m {
		buf.WriteString(k)
		buf.WriteString(strings.TrimSpace(strings.ReplaceAll(reflect.ValueOf(v).String(), "\n", "")))
	}
	if strings.Contains(buf.String(), "SECRET") || m["OPAL_CLIENT_TOKEN"] != "***" {
		t.Errorf("Masked leaks a secret: %v", m)
	}
	var out bytes.Buffer
	c.Logger(&out).Debug("hello")
	if !strings.HasPrefix(out.String(), `{"time"`) {
		t.Errorf("LOG_SERIALIZE=true DEBUG: got %q", out.String())
	}
}

// Masked shows the URLs without user info, query values or
// fragments, and keeps the rest readable.
func TestMaskedRedactsURLs(t *testing.T) {
	c, err := load(t, map[string]string{
		"OPAL_SERVER_URL":                      "https://tok-SECRET@srv:7002",
		"OPAL_DEFAULT_DATA_SOURCES_CONFIG_URL": "http://cfg/data?token=SECRET&scope=a",
		"OPAL_DEFAULT_UPDATE_CALLBACKS":        "http://u:SECRET@cb/report,http://cb2/r#SECRET",
		"OPAL_POLICY_STORE_URL":                "http://opa:8181/?x=1;t=SECRET",
	})
	if err != nil {
		t.Fatal(err)
	}
	m := c.Masked()
	cases := []struct{ name, key, want string }{
		// Mutation caught: Masked showing c.ServerURL unredacted.
		{"server_url_user", "OPAL_SERVER_URL", "https://xxxxx@srv:7002"},
		{"derived_pubsub_url_user", "OPAL_SERVER_PUBSUB_URL", "wss://xxxxx@srv:7002/ws"},
		// Mutation caught: query values kept.
		{"query_values", "OPAL_DEFAULT_DATA_SOURCES_CONFIG_URL", "http://cfg/data?scope=xxxxx&token=xxxxx"},
		// Mutation caught: Masked joining the callbacks unredacted; fragment kept.
		{"callbacks", "OPAL_DEFAULT_UPDATE_CALLBACKS", "http://xxxxx@cb/report,http://cb2/r#xxxxx"},
		{"malformed_query_hidden", "OPAL_POLICY_STORE_URL", "http://opa:8181/?xxxxx"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := m[tc.key]; got != tc.want {
				t.Errorf("%s = %v, want %s", tc.key, got, tc.want)
			}
		})
	}
}

// Load (the process environment) and LoadFrom agree; unprefixed names are never read.
func TestLoadMatchesLoadFrom(t *testing.T) {
	env := map[string]string{"OPAL_SERVER_URL": "http://srv:1", "OPAL_POLICY_UPDATER_MAX_DEFERRED_ROUNDS": "3", "OPAL_DATA_TOPICS": "a,b"}
	for k, v := range env {
		t.Setenv(k, v)
	}
	t.Setenv("SERVER_URL", "http://unprefixed:9") // must not be read
	a, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadFrom(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Errorf("Load = %+v\nLoadFrom = %+v", a, b)
	}
}

// F5: the configured backoff after the n-th failure.
func TestF5_Wait(t *testing.T) {
	exp := ConnRetryOptions{WaitStrategy: WaitExponential, WaitTime: time.Second, MaxWait: 10 * time.Second, Attempts: 10}
	cases := []struct {
		name string
		o    ConnRetryOptions
		n    int
		rnd  float64
		want time.Duration
	}{
		{"F5_fixed", ConnRetryOptions{WaitStrategy: WaitFixed, WaitTime: 2 * time.Second}, 4, 0, 2 * time.Second},
		// Mutation caught: doubling removed from step.
		{"F5_exponential_doubles", exp, 3, 0, 4 * time.Second},
		// Mutation caught: the final MaxWait cap removed.
		{"F5_exponential_capped", exp, 5, 0, 10 * time.Second},
		{"F5_exponential_huge_n_saturates", ConnRetryOptions{WaitStrategy: WaitExponential, WaitTime: time.Second}, 1 << 30, 0, maxDuration},
		{"F5_random_exponential_draw", exp.with(WaitRandomExponential), 3, 0.5, 2 * time.Second},
		{"F5_random_exponential_bad_draw", exp.with(WaitRandomExponential), 3, math.NaN(), 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.o.Wait(tc.n, func() float64 { return tc.rnd }); got != tc.want {
				t.Errorf("Wait(%d) = %v, want %v", tc.n, got, tc.want)
			}
		})
	}
}

func (o ConnRetryOptions) with(strategy string) ConnRetryOptions { o.WaitStrategy = strategy; return o }

// F6: the exact sum of the attempts-1 waits, saturating, fast.
func TestF6_WorstCaseTotalWait(t *testing.T) {
	cases := []struct {
		name string
		json string
		want time.Duration
	}{
		// Mutation caught: "gaps := o.Attempts - 1" -> "gaps := o.Attempts" (gives 25 s).
		{"F6_defaults_15s", `{"wait_strategy":"random_exponential","max_wait":10,"attempts":5,"wait_time":1}`, 15 * time.Second},
		// Mutation caught: coarse attempts*max_wait estimate (saturated, not 15 s).
		{"F6_exponential_no_max_wait_15s", `{"wait_strategy":"exponential","wait_time":1,"attempts":5}`, 15 * time.Second},
		// Mutation caught: fixed uses attempts instead of gaps (1.0 s).
		{"F6_fixed_0.2x5", `{"wait_time":0.2,"attempts":5}`, 800 * time.Millisecond},
		{"F6_model_default_2s", `{}`, 2 * time.Second},
		{"F6_one_attempt_no_wait", `{"attempts":1}`, 0},
		// 1+2+4+8 then 2995 waits of 10 s. Mutation caught: drop the saturation
		// break's MaxWait branch (the doubling would then pass max_wait).
		{"F6_3000_attempts_exact", `{"wait_strategy":"exponential","wait_time":1,"max_wait":10,"attempts":3000}`, 29965 * time.Second},
		{"F6_1e9_attempts_unbounded_saturates", `{"wait_strategy":"exponential","wait_time":1,"attempts":1000000000}`, maxDuration},
		{"F6_1e9_attempts_fixed", `{"wait_time":1,"attempts":1000000000}`, 999999999 * time.Second},
		{"F6_1e9_attempts_zero_wait", `{"wait_strategy":"exponential","wait_time":0,"attempts":1000000000}`, 0},
		{"F6_1e9_attempts_capped", `{"wait_strategy":"random_exponential","wait_time":1,"max_wait":10,"attempts":1000000000}`, maxDuration},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var o ConnRetryOptions
			if err := o.Decode(tc.json); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			got := o.WorstCaseTotalWait()
			if got != tc.want {
				t.Errorf("WorstCaseTotalWait = %v, want %v", got, tc.want)
			}
			if took := time.Since(start); took > time.Second {
				t.Errorf("took %v", took)
			}
		})
	}
}

// ConnRetryOptions JSON: missing keys take the model defaults.
func TestConnRetryOptions_ModelDefaults(t *testing.T) {
	var o ConnRetryOptions
	if err := o.Decode(`{"attempts":10}`); err != nil {
		t.Fatal(err)
	}
	if want := (ConnRetryOptions{WaitStrategy: WaitFixed, WaitTime: 2 * time.Second, Attempts: 10}); o != want {
		t.Errorf("got %+v, want %+v", o, want)
	}
	if err := o.Decode(`{"max_wait":1e300}`); err != nil || o.MaxWait != maxDuration {
		t.Errorf("huge max_wait: %+v %v", o, err)
	}
	if err := o.Decode("\n {\"attempts\":3} \n"); err != nil || o.Attempts != 3 {
		t.Errorf("surrounding white space: %+v %v", o, err)
	}
}
