package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
)

// TestRun_SIGTERMExitsZero sends the process a real SIGTERM while `run` waits
// on an unreachable server; it must shut down and exit 0 promptly.
func TestRun_SIGTERMExitsZero(t *testing.T) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	env := map[string]string{
		"OPAL_SERVER_URL":        "http://127.0.0.1:1",
		"OPAL_INLINE_OPA_CONFIG": `{"addr":"127.0.0.1:0"}`,
	}
	var stderr bytes.Buffer
	e := cmdEnv{lookup: func(k string) (string, bool) { v, ok := env[k]; return v, ok },
		stdout: &bytes.Buffer{}, stderr: &stderr, clock: clock.New()}
	env["OPAL_CLIENT_API_SERVER_PORT"] = freePort(t)
	done := make(chan int, 1)
	go func() { done <- runRun(ctx, e) }()
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	dl, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d; stderr:\n%s", code, stderr.String())
		}
	case <-dl.Done():
		t.Fatal("run did not stop after SIGTERM")
	}
}

func TestPrintConfig_MasksSecrets(t *testing.T) {
	env := map[string]string{"OPAL_CLIENT_TOKEN": "s3cret", "OPAL_POLICY_STORE_AUTH_TOKEN": "t0ken"}
	var out bytes.Buffer
	code := runPrintConfig(context.Background(), cmdEnv{lookup: func(k string) (string, bool) { v, ok := env[k]; return v, ok },
		stdout: &out, stderr: &bytes.Buffer{}})
	if code != 0 || strings.Contains(out.String(), "s3cret") || strings.Contains(out.String(), "t0ken") {
		t.Fatalf("exit %d, output leaks a secret:\n%s", code, out.String())
	}
	var m map[string]any
	if err := json.Unmarshal(out.Bytes(), &m); err != nil || m["OPAL_CLIENT_TOKEN"] != "***" || m["OPAL_SERVER_URL"] == nil {
		t.Fatalf("output %v (%v)", m, err)
	}
	bad := map[string]string{"OPAL_CLIENT_API_SERVER_PORT": "x"}
	if code := runPrintConfig(context.Background(), cmdEnv{lookup: func(k string) (string, bool) { v, ok := bad[k]; return v, ok },
		stdout: &out, stderr: &bytes.Buffer{}}); code != exitUsage {
		t.Fatalf("bad config: exit %d", code)
	}
}

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	version = "v9.9.9"
	defer func() { version = "" }()
	if code := runVersion(context.Background(), cmdEnv{stdout: &out}); code != 0 || !strings.HasPrefix(out.String(), "opal-client v9.9.9 ") {
		t.Fatalf("exit %d, %q", code, out.String())
	}
}

func freePort(t *testing.T) string {
	l, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, p, _ := net.SplitHostPort(l.Addr().String())
	return p
}

// At start, `run` warns once about each variable that does nothing, naming
// the one probably meant; a trusted CA file it cannot read stops it.
func TestRun_WarnsAboutVariablesNothingReads(t *testing.T) {
	cases := []struct {
		name     string
		env      map[string]string
		code     int
		contains []string
	}{
		{"typo_and_python_setting_warned", map[string]string{
			"OPAL_POLICY_SUBSCRIPTION_DIR": "x", "OPAL_WAIT_ON_SERVER_LOAD": "true",
			// unreachable CA path: start stops right after the warnings
			"OPAL_CLIENT_SELF_SIGNED_CERTIFICATES_ALLOWED": "true", "OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE": "/nonexistent/ca.pem",
		}, exitUsage, []string{
			`level=WARN msg="OPAL_POLICY_SUBSCRIPTION_DIR is not a setting; did you mean OPAL_POLICY_SUBSCRIPTION_DIRS?" variable=OPAL_POLICY_SUBSCRIPTION_DIR`,
			`level=WARN msg="OPAL_WAIT_ON_SERVER_LOAD is a Python client setting this agent does not read: `,
			`error="invalid OPAL_CLIENT_SSL_CONTEXT_TRUSTED_CA_FILE=`,
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var environ []string
			for k, v := range tc.env {
				environ = append(environ, k+"="+v)
			}
			var stderr bytes.Buffer
			e := cmdEnv{lookup: func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok },
				environ: func() []string { return environ }, stdout: &bytes.Buffer{}, stderr: &stderr, clock: clock.New()}
			if code := runRun(context.Background(), e); code != tc.code {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, tc.code, stderr.String())
			}
			for _, want := range tc.contains {
				if n := strings.Count(stderr.String(), want); n != 1 {
					t.Errorf("stderr has %q %d times, want once:\n%s", want, n, stderr.String())
				}
			}
		})
	}
}

// print-config shows the same warnings as run, on stderr, and still prints.
func TestPrintConfig_Warns(t *testing.T) {
	env := map[string]string{"OPAL_LOG_LEVL": "DEBUG"}
	var out, stderr bytes.Buffer
	code := runPrintConfig(context.Background(), cmdEnv{lookup: func(k string) (string, bool) { v, ok := env[k]; return v, ok },
		environ: func() []string { return []string{"OPAL_LOG_LEVL=DEBUG"} }, stdout: &out, stderr: &stderr})
	if code != 0 || !strings.Contains(stderr.String(), "warning: OPAL_LOG_LEVL is not a setting; did you mean OPAL_LOG_LEVEL?") || out.Len() == 0 {
		t.Fatalf("exit %d, stderr %q, stdout %d bytes", code, stderr.String(), out.Len())
	}
}
