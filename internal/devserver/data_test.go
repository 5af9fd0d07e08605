package devserver

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/opal-go/opal-client/internal/pubsub"
)

const deadline = 10 * time.Second

func dataSetup(t *testing.T, o Options) (*Server, *httptest.Server) {
	t.Helper()
	dir := t.TempDir()
	write(t, dir, "accounts.json", `{"dave":{"roles":["viewer"]}}`)
	write(t, dir, "org/teams.json", `{"n":1.50}`)
	write(t, dir, "notes.txt", "not a source")
	o.DataDir = dir
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s := New(o)
	hs := httptest.NewServer(s)
	t.Cleanup(func() { s.Close(); hs.Close() })
	return s, hs
}

func post(t *testing.T, url, token, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestData_6_3_DataDir pins the data sources of -data-dir: each *.json file
// is served, and /data/config lists one PUT entry per file at its path.
func TestData_6_3_DataDir(t *testing.T) {
	s, hs := dataSetup(t, Options{Token: "tok"})
	host := hs.Listener.Addr().String()
	// guards mutation "\"dst_path\": \"/\" + f" (the .json suffix kept in the path)
	t.Run("6_3_config_lists_each_file", func(t *testing.T) {
		st, _, b := get(t, hs.URL+"/data/config", "tok")
		want := `{"entries":[` +
			`{"config":null,"data":null,"dst_path":"/accounts","save_method":"PUT","topics":["policy_data"],"url":"http://` + host + `/data-sources/accounts.json"},` +
			`{"config":null,"data":null,"dst_path":"/org/teams","save_method":"PUT","topics":["policy_data"],"url":"http://` + host + `/data-sources/org/teams.json"}]}`
		if st != 200 || string(b) != want {
			t.Fatalf("%d %s\nwant %s", st, b, want)
		}
	})
	cases := []struct {
		name, path string
		status     int
		body       string
	}{
		// Data sources are open: the client never sends its token to them (§6.4).
		{"6_4_file_served_without_token", "/data-sources/accounts.json", 200, `{"dave":{"roles":["viewer"]}}`},
		{"6_4_nested_file_bytes_as_is", "/data-sources/org/teams.json", 200, `{"n":1.50}`},
		{"not_json_is_404", "/data-sources/notes.txt", 404, ""},
		{"missing_is_404", "/data-sources/nope.json", 404, ""},
		{"escape_is_404", "/data-sources/..%2f..%2fetc.json", 404, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st, h, b := get(t, hs.URL+c.path, "")
			if st != c.status || (c.body != "" && string(b) != c.body) {
				t.Fatalf("%d %s, want %d %s", st, b, c.status, c.body)
			}
			if st == 200 && h.Get("Content-Type") != "application/json" {
				t.Fatalf("content type %q", h.Get("Content-Type"))
			}
		})
	}
	t.Run("script_applies_to_data_sources", func(t *testing.T) {
		s.Script("/data-sources/accounts.json", Answer{Status: 429, Header: http.Header{"Retry-After": {"1"}}})
		st, h, _ := get(t, hs.URL+"/data-sources/accounts.json", "")
		if st != 429 || h.Get("Retry-After") != "1" {
			t.Fatalf("%d %v", st, h)
		}
		if st, _, _ := get(t, hs.URL+"/data-sources/accounts.json", ""); st != 200 {
			t.Fatalf("after the script: %d", st)
		}
	})
}

func TestExpandTopic_6_1(t *testing.T) {
	if got := mustJSON(ExpandTopic("policy_data/users/keys")); got != `["policy_data","policy_data/users","policy_data/users/keys"]` {
		t.Fatal(got)
	}
	if got := mustJSON(ExpandTopic("policy_data")); got != `["policy_data"]` {
		t.Fatal(got)
	}
}

// subscriber connects the real pub/sub client to hs and returns the notifies
// it receives.
func subscriber(t *testing.T, hs *httptest.Server, token string, topics ...string) <-chan note {
	t.Helper()
	got, _ := subscribe(t, hs, token, topics...)
	return got
}

// subscriberConnects is a subscriber that reports each later (re)connect.
func subscriberConnects(t *testing.T, hs *httptest.Server, token string, topics ...string) <-chan struct{} {
	t.Helper()
	_, connected := subscribe(t, hs, token, topics...)
	return connected
}

// subscribe runs a pub/sub client until the test ends and waits for its
// first connect.
func subscribe(t *testing.T, hs *httptest.Server, token string, topics ...string) (<-chan note, <-chan struct{}) {
	t.Helper()
	got := make(chan note, 16)
	connected := make(chan struct{}, 4)
	c := pubsub.New(pubsub.Options{
		URL:       "ws" + strings.TrimPrefix(hs.URL, "http") + "/ws",
		Token:     token,
		Topics:    topics,
		OnConnect: func() { connected <- struct{}{} },
		OnNotify: func(topic string, data json.RawMessage) {
			got <- note{topic, string(data)}
		},
		Rand: func() float64 { return 0 },
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, connected, "connect")
	return got, connected
}

type note struct{ Topic, Data string }

// waitFor receives from ch within the deadline.
func waitFor[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	select {
	case v := <-ch:
		return v
	case <-ctx.Done():
		t.Fatalf("no %s in time", what)
		var zero T
		return zero
	}
}

// TestAdminDataUpdate pins POST /admin/data-update: token-protected, the
// update published to its entries' expanded topics (§6.1) with the entries'
// topics rewritten, a bad body refused with 400.
func TestAdminDataUpdate(t *testing.T) {
	_, hs := dataSetup(t, Options{Token: "tok"})
	got := subscriber(t, hs, "tok", "policy_data", "policy_data/users")
	update := `{"id":"u1","reason":"r","entries":[` +
		`{"url":"","topics":["policy_data/users"],"dst_path":"/users","save_method":"PATCH","data":[{"op":"add","path":"/bob","value":1.50}]},` +
		`{"url":"","dst_path":"/x","data":{"a":1}}]}`
	t.Run("admin_without_token_401", func(t *testing.T) {
		// guards mutation "if !s.authorized(r) {" -> "if false {" in handleAdminDataUpdate
		if st, _ := post(t, hs.URL+"/admin/data-update", "", update); st != 401 {
			t.Fatalf("status %d", st)
		}
		if st, _ := post(t, hs.URL+"/admin/publish", "nope", `{"topics":["policy_data"],"data":1}`); st != 401 {
			t.Fatalf("publish status %d", st)
		}
	})
	t.Run("6_1_published_to_expanded_topics", func(t *testing.T) {
		st, body := post(t, hs.URL+"/admin/data-update", "tok", update)
		// guards mutations "entry[\"topics\"] = expanded" -> "_ = expanded" and ExpandTopic giving suffixes
		if st != 200 || body != `{"delivered":2,"topics":["policy_data","policy_data/users"]}` {
			t.Fatalf("%d %s", st, body)
		}
		wantData := `{"entries":[` +
			`{"data":[{"op":"add","path":"/bob","value":1.50}],"dst_path":"/users","save_method":"PATCH","topics":["policy_data","policy_data/users"],"url":""},` +
			`{"data":{"a":1},"dst_path":"/x","topics":["policy_data"],"url":""}],"id":"u1","reason":"r"}`
		seen := map[string]bool{}
		for range 2 {
			m := waitFor(t, got, "notify")
			seen[m.Topic] = true
			if m.Data != wantData {
				t.Fatalf("notify data %s\nwant %s", m.Data, wantData)
			}
		}
		if !seen["policy_data"] || !seen["policy_data/users"] {
			t.Fatalf("topics %v", seen)
		}
	})
	t.Run("bad_body_400", func(t *testing.T) {
		for _, b := range []string{`[]`, `{"entries":{}}`, `{"entries":[1]}`, `{"entries":[{"topics":"x"}]}`, `{"entries":[]} {}`, `{`} {
			if st, _ := post(t, hs.URL+"/admin/data-update", "tok", b); st != 400 {
				t.Fatalf("%s: status %d", b, st)
			}
		}
	})
	t.Run("publish_verbatim", func(t *testing.T) {
		st, body := post(t, hs.URL+"/admin/publish", "tok", `{"topics":["policy_data","other"],"data":{"k":[1,2]}}`)
		if st != 200 || body != `{"delivered":1,"topics":["policy_data","other"]}` {
			t.Fatalf("%d %s", st, body)
		}
		if m := waitFor(t, got, "notify"); m.Topic != "policy_data" || m.Data != `{"k":[1,2]}` {
			t.Fatalf("%s %s", m.Topic, m.Data)
		}
	})
}
