package main

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opal-go/opal-client/internal/devserver"
	"github.com/opal-go/opal-client/internal/testutil"
)

// The inline OPA as a new user meets it: the built binary, started with
// the Python client's settings, against the dev server on loopback.

const (
	// v0Policy is Rego v0, as a repository written for the Python client
	// (OPAL_OPA_V0_COMPAT=true) holds it.
	v0Policy  = "package app.rbac\n\ndefault allow = false\n\nallow { input.user == \"alice\" }\n"
	authzFile = "package system.authz\n\nimport rego.v1\n\ndefault allow := false\n\nallow if input.identity == \"s3cret\"\n"
)

type agentProc struct {
	cmd    *exec.Cmd
	stderr *testutil.SyncBuffer
	done   chan error
	api    string // client API base URL
	opa    string // OPA base URL
}

// buildAgent builds the binary once per test into t.TempDir().
func buildAgent(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "opal-client")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// policyServer serves dir's policy as an OPAL server would.
func policyServer(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, c := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(c), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ds := devserver.New(devserver.Options{PolicyDir: dir})
	srv := httptest.NewServer(ds)
	t.Cleanup(func() { srv.Close(); ds.Close() })
	return srv.URL
}

func startAgent(t *testing.T, bin string, env map[string]string) *agentProc {
	t.Helper()
	apiPort, opaPort := freePort(t), freePort(t)
	for opaPort == apiPort { // both released before the agent binds them
		opaPort = freePort(t)
	}
	p := &agentProc{stderr: &testutil.SyncBuffer{}, done: make(chan error, 1),
		api: "http://127.0.0.1:" + apiPort, opa: "http://127.0.0.1:" + opaPort}
	base := map[string]string{
		"OPAL_CLIENT_API_SERVER_PORT": apiPort,
		"OPAL_DATA_UPDATER_ENABLED":   "false",
		"OPAL_LOG_SERIALIZE":          "true",
	}
	for k, v := range env {
		base[k] = strings.ReplaceAll(v, "OPA_PORT", opaPort)
	}
	p.cmd = exec.Command(bin, "run")
	for k, v := range base {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	p.cmd.Stderr = p.stderr
	p.cmd.Stdout = io.Discard
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		p.done <- nil
	})
	return p
}

// waitReady polls the client API's /ready while the process starts.
func (p *agentProc) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.NewTimer(60 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond) // polls the process start only
	defer tick.Stop()
	for {
		if resp, err := http.Get(p.api + "/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("agent exited (%v):\n%s", err, p.stderr.String())
		case <-deadline.C:
			t.Fatalf("agent not ready:\n%s", p.stderr.String())
		case <-tick.C:
		}
	}
}

// stop sends SIGTERM and waits for the exit.
func (p *agentProc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, p.stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("agent did not stop after SIGTERM")
	}
}

func request(t *testing.T, method, url, token, body string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBinary_InlineOPA runs the built binary with the Python client's
// inline OPA settings.
func TestBinary_InlineOPA(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildAgent(t)
	server := policyServer(t, map[string]string{"rbac/rbac.rego": v0Policy})
	const decision = "/v1/data/app/rbac/allow"
	const alice = `{"input":{"user":"alice"}}`

	t.Run("v0_policy_from_server_loads_with_no_setting", func(t *testing.T) {
		p := startAgent(t, bin, map[string]string{"OPAL_SERVER_URL": server,
			"OPAL_INLINE_OPA_CONFIG": `{"addr":"127.0.0.1:OPA_PORT"}`})
		p.waitReady(t)
		if code, body := request(t, "POST", p.opa+decision, "", alice); code != 200 || body != `{"result":true}` {
			t.Fatalf("decision: %d %s", code, body)
		}
		if code, _ := request(t, "GET", p.opa+"/health?plugins", "", ""); code != 200 {
			t.Fatalf("/health?plugins after the policy loaded: %d", code)
		}
		p.stop(t)
	})

	t.Run("token_authentication_basic_authorization", func(t *testing.T) {
		authz := writeTemp(t, "authz.rego", authzFile)
		p := startAgent(t, bin, map[string]string{"OPAL_SERVER_URL": server,
			"OPAL_INLINE_OPA_CONFIG": `{"addr":"127.0.0.1:OPA_PORT","authentication":"token","authorization":"basic","files":["` + authz + `"]}`})
		p.waitReady(t)
		cases := []struct {
			name, method, path, token, body string
			want                            int
		}{
			{"unauthenticated_decision_401", "POST", decision, "", alice, 401},
			{"unauthenticated_data_write_401", "PUT", "/v1/data/pwned", "", `{}`, 401},
			{"token_holder_answered", "POST", decision, "s3cret", alice, 200},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				code, body := request(t, tc.method, p.opa+tc.path, tc.token, tc.body)
				if code != tc.want || (code == 200 && body != `{"result":true}`) {
					t.Fatalf("%s %s: %d %s, want %d", tc.method, tc.path, code, body, tc.want)
				}
			})
		}
		p.stop(t)
	})

	t.Run("console_decision_logs_with_decision_id", func(t *testing.T) {
		cfg := writeTemp(t, "opa.yaml", "decision_logs:\n  console: true\n")
		p := startAgent(t, bin, map[string]string{"OPAL_SERVER_URL": server,
			"OPAL_INLINE_OPA_CONFIG": `{"addr":"127.0.0.1:OPA_PORT","config_file":"` + cfg + `"}`})
		p.waitReady(t)
		var ids []string
		for range 3 {
			_, body := request(t, "POST", p.opa+decision, "", alice)
			var r struct {
				ID string `json:"decision_id"`
			}
			if json.Unmarshal([]byte(body), &r); r.ID == "" {
				t.Fatalf("no decision_id: %s", body)
			}
			ids = append(ids, r.ID)
		}
		p.stop(t)
		logged := map[string]bool{}
		for _, line := range strings.Split(p.stderr.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "Decision Log" {
				id, _ := m["decision_id"].(string)
				logged[id] = true
			}
		}
		for _, id := range ids {
			if !logged[id] {
				t.Fatalf("decision %s not logged:\n%s", id, p.stderr.String())
			}
		}
	})

	t.Run("decision_logs_reach_a_service", func(t *testing.T) {
		got := make(chan string, 16)
		collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				w.WriteHeader(400)
				return
			}
			b, _ := io.ReadAll(zr)
			got <- r.URL.Path + " " + string(b)
		}))
		defer collector.Close()
		cfg := writeTemp(t, "opa.yaml", "services:\n  collector:\n    url: "+collector.URL+"\ndecision_logs:\n  service: collector\n")
		p := startAgent(t, bin, map[string]string{"OPAL_SERVER_URL": server,
			"OPAL_INLINE_OPA_CONFIG": `{"addr":"127.0.0.1:OPA_PORT","config_file":"` + cfg + `"}`})
		p.waitReady(t)
		_, body := request(t, "POST", p.opa+decision, "", alice)
		var r struct {
			ID string `json:"decision_id"`
		}
		_ = json.Unmarshal([]byte(body), &r)
		p.stop(t) // flushes the decision logger
		for {
			select {
			case b := <-got:
				if strings.HasPrefix(b, "/logs ") && strings.Contains(b, r.ID) {
					return
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("the collector never received decision %q:\n%s", r.ID, p.stderr.String())
			}
		}
	})

	t.Run("misspelt_key_stops_the_agent", func(t *testing.T) {
		p := startAgent(t, bin, map[string]string{"OPAL_SERVER_URL": server,
			"OPAL_INLINE_OPA_CONFIG": `{"addr":"127.0.0.1:OPA_PORT","authentification":"token"}`})
		select {
		case err := <-p.done:
			p.done <- err
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("exit = %v, want 1", err)
			}
			if !strings.Contains(p.stderr.String(), "authentification") {
				t.Fatalf("the error does not name the key:\n%s", p.stderr.String())
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the agent did not stop")
		}
	})
}
