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
