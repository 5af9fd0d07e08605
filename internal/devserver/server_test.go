package devserver

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/opal-go/opal-client/fetcher"
)

func write(t *testing.T, dir, rel, content string) {
	t.Helper()
	p := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func setup(t *testing.T, o Options) (*Server, *httptest.Server, string) {
	t.Helper()
	dir := t.TempDir()
	write(t, dir, "rbac/rbac.rego", "package app.rbac\n\ndefault allow := false\n")
	write(t, dir, "rbac/data.json", `{"roles":{"admin":["read"]}}`)
	write(t, dir, "data.json", `{"root":true}`)
	write(t, dir, "README.md", "ignored")
	o.PolicyDir = dir
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s := New(o)
	hs := httptest.NewServer(s)
	t.Cleanup(func() { s.Close(); hs.Close() })
	return s, hs, dir
}

func get(t *testing.T, url, token string) (int, http.Header, []byte) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

func getBundle(t *testing.T, url string) *fetcher.PolicyBundle {
	t.Helper()
	st, h, b := get(t, url, "")
	if st != 200 || h.Get("Content-Type") != "application/json" {
		t.Fatalf("GET %s: %d %s %s", url, st, h.Get("Content-Type"), b)
	}
	pb, err := fetcher.DecodeBundle(b)
	if err != nil {
		t.Fatal(err)
	}
	return pb
}

var sha = regexp.MustCompile(`^[0-9a-f]{40}$`)

func TestProtocol_4_2_FullBundle(t *testing.T) {
	_, hs, _ := setup(t, Options{})
	b := getBundle(t, hs.URL+"/policy")
	if b.IsDelta() || !sha.MatchString(b.Hash) {
		t.Fatalf("want full bundle with a 40-hex hash, got old=%v hash=%q", b.OldHash, b.Hash)
	}
	if got, want := mustJSON(b.Manifest), `["data.json","rbac/data.json","rbac/rbac.rego"]`; got != want {
		t.Fatalf("manifest %s, want %s", got, want)
	}
	if got, want := mustJSON(b.DataModules), `[{"path":".","data":"{\"root\":true}"},{"path":"rbac","data":"{\"roles\":{\"admin\":[\"read\"]}}"}]`; got != want {
		t.Fatalf("data modules %s, want %s", got, want)
	}
	if len(b.PolicyModules) != 1 || b.PolicyModules[0].PackageName != "app.rbac" || b.PolicyModules[0].Path != "rbac/rbac.rego" {
		t.Fatalf("policy modules %+v", b.PolicyModules)
	}
	if b.DeletedFiles != nil {
		t.Fatal("full bundle with deleted_files")
	}
}

func mustJSON(v any) string { b, _ := json.Marshal(v); return string(b) }

func TestProtocol_4_1_Paths(t *testing.T) {
	_, hs, _ := setup(t, Options{})
	cases := []struct {
		name, query string
		status      int
		manifest    string
	}{
		{"4_1_path_filter", "?path=rbac", 200, `["rbac/data.json","rbac/rbac.rego"]`},
		{"4_1_leading_slash_stripped", "?path=/rbac", 200, `["rbac/data.json","rbac/rbac.rego"]`},
		{"4_1_repeated_paths", "?path=rbac&path=.", 200, `["data.json","rbac/data.json","rbac/rbac.rego"]`},
		// Mutation: `if !cur.dirs[d] {` -> `if false {`.
		{"4_1_unknown_path_404", "?path=rbac&path=nope", 404, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, _, body := get(t, hs.URL+"/policy"+tc.query, "")
			if st != tc.status {
				t.Fatalf("status %d, want %d: %s", st, tc.status, body)
			}
			if tc.manifest != "" {
				b, _ := fetcher.DecodeBundle(body)
				if got := mustJSON(b.Manifest); got != tc.manifest {
					t.Fatalf("manifest %s, want %s", got, tc.manifest)
				}
			}
		})
	}
}

func TestProtocol_4_3_Delta(t *testing.T) {
	s, hs, dir := setup(t, Options{})
	h1 := s.Hash()
	write(t, dir, "rbac/rbac.rego", "package app.rbac\n\ndefault allow := true\n")
	write(t, dir, "extra/x.rego", "package x\n")
	os.Remove(filepath.Join(dir, "rbac/data.json"))
	if changed, err := s.Rescan(); err != nil || !changed {
		t.Fatalf("Rescan = %v, %v", changed, err)
	}
	h2 := s.Hash()
	t.Run("4_3_delta_from_known_hash", func(t *testing.T) {
		b := getBundle(t, hs.URL+"/policy?base_hash="+h1)
		if !b.IsDelta() || *b.OldHash != h1 || b.Hash != h2 {
			t.Fatalf("old=%v hash=%s", b.OldHash, b.Hash)
		}
		if got, want := mustJSON(b.PolicyModules), `[{"path":"extra/x.rego","package_name":"x","rego":"package x\n"},{"path":"rbac/rbac.rego","package_name":"app.rbac","rego":"package app.rbac\n\ndefault allow := true\n"}]`; got != want {
			t.Fatalf("policy modules %s", got)
		}
		// Mutation: `if old, ok := base.files[p]; ok && old == c {` -> `if false {`.
		if len(b.DataModules) != 0 {
			t.Fatalf("unchanged data sent in delta: %+v", b.DataModules)
		}
		if got, want := mustJSON(b.DeletedFiles), `{"data_modules":["rbac"],"policy_modules":[]}`; got != want {
			t.Fatalf("deleted_files %s, want %s", got, want)
		}
	})
	t.Run("4_3_unknown_hash_is_full", func(t *testing.T) {
		b := getBundle(t, hs.URL+"/policy?base_hash="+"0123456789012345678901234567890123456789")
		if b.IsDelta() || len(b.Manifest) != 3 {
			t.Fatalf("want full bundle, got %+v", b)
		}
	})
	t.Run("4_3_head_hash_is_empty_delta", func(t *testing.T) {
		b := getBundle(t, hs.URL+"/policy?base_hash="+h2)
		if !b.IsDelta() || len(b.PolicyModules)+len(b.DataModules) != 0 || b.DeletedFiles != nil {
			t.Fatalf("want empty delta, got %+v", b)
		}
	})
	t.Run("3_2_changed_directories", func(t *testing.T) {
		if got, want := mustJSON(changedDirs(s.snaps[h1], s.snaps[h2])), `[".","extra","rbac"]`; got != want {
			t.Fatalf("changed %s, want %s", got, want)
		}
	})
}

func TestToken(t *testing.T) {
	_, hs, _ := setup(t, Options{Token: "tok"})
	cases := []struct {
		name, path, token string
		status            int
	}{
		// Mutation: `return s.o.Token == "" || r.Header.Get("Authorization") == "Bearer "+s.o.Token` -> `return true`.
		{"4_1_policy_without_token_401", "/policy", "", 401},
		{"4_1_policy_wrong_token_401", "/policy", "nope", 401},
		{"4_1_policy_with_token", "/policy", "tok", 200},
		{"6_3_data_config_without_token_401", "/data/config", "", 401},
		{"2_1_ws_without_token_403", "/ws", "", 403},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if st, _, _ := get(t, hs.URL+tc.path, tc.token); st != tc.status {
				t.Fatalf("status %d, want %d", st, tc.status)
			}
		})
	}
}

func TestDataConfig_6_3(t *testing.T) {
	_, hs, _ := setup(t, Options{})
	_, _, b := get(t, hs.URL+"/data/config", "")
	want := `{"entries":[{"config":null,"data":null,"dst_path":"","save_method":"PUT","topics":["policy_data"],"url":"http://` + hs.Listener.Addr().String() + `/policy-data"}]}`
	if string(b) != want {
		t.Fatalf("got %s\nwant %s", b, want)
	}
	if _, _, b := get(t, hs.URL+"/policy-data", ""); string(b) != `{}` {
		t.Fatalf("policy-data %s", b)
	}
}

func TestScript(t *testing.T) {
	s, hs, _ := setup(t, Options{})
	ra := http.Header{"Retry-After": {"30"}}
	s.ScriptPolicy(Answer{Status: 503, Header: ra}, Answer{Status: 503, Header: ra}, Answer{Status: 503, Header: ra}, Answer{Status: 409})
	var got []int
	for range 5 {
		st, h, _ := get(t, hs.URL+"/policy", "")
		if st == 503 && h.Get("Retry-After") != "30" {
			t.Fatal("Retry-After missing")
		}
		got = append(got, st)
	}
	if mustJSON(got) != `[503,503,503,409,200]` {
		t.Fatalf("statuses %v", got)
	}
	recs := s.Requests()
	if len(recs) != 5 || recs[4].Status != 200 || recs[0].Status != 503 || recs[0].Path != "/policy" {
		t.Fatalf("records %+v", recs)
	}
	t.Run("truncated_body", func(t *testing.T) {
		s.Script("/policy", Answer{Status: 200, Body: `{"manifest":[`, Truncate: true})
		resp, err := http.Get(hs.URL + "/policy")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if _, err := io.ReadAll(resp.Body); err == nil {
			t.Fatal("truncated body read without error")
		}
	})
}
