package config

import (
	"os"
	"strings"
	"testing"
)

// The docs' variable tables are the settings table rendered: a row added,
// changed or removed in table.go fails here until `go run ./config/gendoc`
// rewrites docs/configuration.md.
func TestDocTableMatchesDocs(t *testing.T) {
	b, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	want, err := ReplaceDocTable(string(b))
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != want {
		t.Fatal("docs/configuration.md's settings table differs from config/table.go: run `go run ./config/gendoc`")
	}
	// The markers are what the generator needs; a doc without them is an error.
	if _, err := ReplaceDocTable("no markers"); err == nil {
		t.Error("ReplaceDocTable accepted a doc without markers")
	}
}

// Rules every row keeps, so one row is all a variable needs.
func TestSettingsTable(t *testing.T) {
	secs := map[string]bool{}
	for _, s := range sections {
		secs[s.id] = true
	}
	names := map[string]bool{}
	for _, s := range settings {
		if names[s.name] {
			t.Errorf("%s: listed twice", s.name)
		}
		names[s.name] = true
		if !secs[s.section] {
			t.Errorf("%s: unknown section %q", s.name, s.section)
		}
		if (s.origin == pythonNotRead) != (s.parse == nil) {
			t.Errorf("%s: a row is read (parse) exactly when it is not marked pythonNotRead", s.name)
		}
		if (s.origin == pythonNotRead) != (s.section == "notread") || (s.origin == python && s.show == nil && s.name != "OPAL_DATA_STORE_CONN_RETRY") {
			t.Errorf("%s: the not-read rows, and only they, are in the last section; a read row is in Masked", s.name)
		}
		if s.origin == pythonNotRead && (s.doc == "" || s.show != nil) {
			t.Errorf("%s: a row not read says what happens instead and is not in Masked", s.name)
		}
		if s.secret && s.show == nil && s.parse != nil {
			t.Errorf("%s: a secret read row must be masked, not hidden", s.name)
		}
		if s.def == "" {
			t.Errorf("%s: no default in the docs", s.name)
		}
	}
	// The three retry variables of the upstream change are ours in the docs.
	doc := DocTable()
	for _, n := range []string{"OPAL_POLICY_UPDATER_MAX_RETRY_AFTER", "OPAL_POLICY_UPDATER_RESCHEDULE_ON_RETRYABLE", "OPAL_POLICY_UPDATER_MAX_DEFERRED_ROUNDS"} {
		if !strings.Contains(doc, "| `"+n+"` **(ours)** |") {
			t.Errorf("%s is not marked (ours) in the docs", n)
		}
	}
}

// A variable that nothing reads is named at start: an unknown OPAL_ name with
// the nearest known one, a Python client setting with what happens instead.
func TestUnknownVariables(t *testing.T) {
	cases := []struct {
		name    string
		environ []string
		want    []string // messages
	}{
		{"typo_suggests_nearest", []string{"OPAL_POLICY_SUBSCRIPTION_DIR=x"},
			[]string{"OPAL_POLICY_SUBSCRIPTION_DIR is not a setting; did you mean OPAL_POLICY_SUBSCRIPTION_DIRS?"}},
		{"typo_in_the_middle", []string{"OPAL_LOG_LEVLE=DEBUG"},
			[]string{"OPAL_LOG_LEVEL_is_suggested"}},
		// Mutation caught: the closeness threshold removed (any name would get a suggestion).
		{"far_name_no_suggestion", []string{"OPAL_BROADCAST_URI=redis://x"}, []string{"OPAL_BROADCAST_URI is not a setting"}},
		// Mutation caught: the pythonNotRead case removed.
		{"python_not_read_warned", []string{"OPAL_WAIT_ON_SERVER_LOAD=true"},
			[]string{"OPAL_WAIT_ON_SERVER_LOAD is a Python client setting this agent does not read: the agent does not poll `/loadlimit`; it connects at once and backs off on errors"}},
		{"python_not_read_as_other_resolved", []string{"OPAL_LOG_FILE_PATH=/x"},
			[]string{"OPAL_LOG_FILE_PATH is a Python client setting this agent does not read: logs go to stderr only; let the container runtime collect them"}},
		{"read_variables_silent", []string{"OPAL_SERVER_URL=http://x", "OPAL_CLIENT_SELF_SIGNED_CERTIFICATES_ALLOWED=true", "UVICORN_PORT=7000"}, nil},
		{"non_opal_names_ignored", []string{"UVICORN_NUM_WORKERS=1", "SERVER_URL=x", "PATH=/bin", "opal_log_level=x"}, nil},
		{"value_never_quoted", []string{"OPAL_CLIENT_TOKN=SECRET"}, []string{"OPAL_CLIENT_TOKN is not a setting; did you mean OPAL_CLIENT_TOKEN?"}},
		{"sorted_and_once", []string{"OPAL_ZZ=1", "OPAL_AA=1", "OPAL_ZZ=2"}, []string{"OPAL_AA is not a setting", "OPAL_ZZ is not a setting"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := UnknownVariables(tc.environ)
			if tc.name == "typo_in_the_middle" {
				if len(got) != 1 || got[0].Suggest != "OPAL_LOG_LEVEL" {
					t.Fatalf("got %+v, want a suggestion of OPAL_LOG_LEVEL", got)
				}
				return
			}
			var msgs []string
			for _, w := range got {
				msgs = append(msgs, w.Message)
				if strings.Contains(w.Message, "SECRET") || strings.ContainsAny(w.Message, "\n\r") {
					t.Errorf("bad warning line %q", w.Message)
				}
			}
			if strings.Join(msgs, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got %q, want %q", msgs, tc.want)
			}
		})
	}
}

// Edit distance, the basis of the suggestions.
func TestLevenshtein(t *testing.T) {
	cases := []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"abc", "abc", 0}, {"abc", "", 3}, {"DIR", "DIRS", 1},
		// Mutation caught: a matching byte costs 1 (every distance would grow).
		{"LEVLE", "LEVEL", 2}, {"kitten", "sitting", 3},
	}
	for _, tc := range cases {
		if got := levenshtein(tc.a, tc.b); got != tc.want {
			t.Errorf("levenshtein(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

// Settings accepted without effect are warned about once at start; the
// values they depend on are read as the Python client (or image) reads them.
func TestSettingWarnings(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		want []string // warning variables
		port int      // ClientAPIServerPort
	}{
		// Mutation caught: the ignored-CA-file case removed.
		{"ca_file_without_allowed", map[string]string{"OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE": "/ca.pem"}, []string{"OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE"}, 7000},
		{"allowed_without_ca_file", map[string]string{"OPAL_CLIENT_SELF_SIGNED_CERTIFICATES_ALLOWED": "true"}, []string{"OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE"}, 7000},
		{"both_tls_set_silent", map[string]string{"OPAL_CLIENT_SELF_SIGNED_CERTIFICATES_ALLOWED": "1", "OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE": "/ca.pem"}, nil, 7000},
		// Mutation caught: the override warning removed.
		{"uvicorn_port_overrides_api_port", map[string]string{"OPAL_CLIENT_API_SERVER_PORT": "7100", "UVICORN_PORT": "7200"}, []string{"UVICORN_PORT"}, 7200},
		{"uvicorn_port_equal_silent", map[string]string{"OPAL_CLIENT_API_SERVER_PORT": "7200", "UVICORN_PORT": "7200"}, nil, 7200},
		{"defaults_silent", nil, nil, 7000},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := load(t, tc.env)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, w := range c.Warnings() {
				got = append(got, w.Var)
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("warnings %v (%+v), want %v", got, c.Warnings(), tc.want)
			}
			if c.ClientAPIServerPort != tc.port {
				t.Errorf("ClientAPIServerPort = %d, want %d", c.ClientAPIServerPort, tc.port)
			}
		})
	}
}
