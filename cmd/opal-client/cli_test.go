package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/opal-go/opal-client/internal/devserver"
	"github.com/opal-go/opal-client/internal/testutil"
)

// TestDispatch_HelpOnStdout: asking for help is not an error (stdout, exit
// 0); a missing or unknown command is (stderr, exit 1).
func TestDispatch_HelpOnStdout(t *testing.T) {
	cases := []struct {
		name       string
		args       []string
		code       int
		onStdout   bool
		errMention string
	}{
		{"help_word", []string{"help"}, exitOK, true, ""},
		{"dash_h", []string{"-h"}, exitOK, true, ""},
		{"double_dash_help", []string{"--help"}, exitOK, true, ""},
		{"no_command", nil, exitUsage, false, ""},
		{"unknown_command", []string{"serve"}, exitUsage, false, `unknown command "serve"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := dispatch(context.Background(), cmdEnv{args: tc.args, stdout: &out, stderr: &errb})
			usageOn, other := &errb, &out
			if tc.onStdout {
				usageOn, other = &out, &errb
			}
			if code != tc.code || !strings.HasPrefix(strings.TrimPrefix(usageOn.String(), "opal-client: unknown command \"serve\"\n\n"), "usage: opal-client") ||
				other.Len() != 0 || !strings.Contains(errb.String(), tc.errMention) {
				t.Fatalf("exit %d\nstdout %q\nstderr %q", code, out.String(), errb.String())
			}
			for _, cmd := range []string{"run", "fetch", "print-config", "version", "SIGHUP"} {
				if !strings.Contains(usageOn.String(), cmd) {
					t.Errorf("usage does not mention %s", cmd)
				}
			}
		})
	}
}

// TestShutdownSignals: SIGINT, SIGTERM and SIGHUP all run the orderly
// shutdown. Mutation: drop syscall.SIGHUP from shutdownSignals (the real
// signal in TestRun_SIGHUPShutsDownLikeSIGTERM would then kill the test
// binary, which the mutation check cannot pin on a test).
func TestShutdownSignals(t *testing.T) {
	for _, tc := range []struct {
		name string
		sig  os.Signal
	}{{"SIGINT", os.Interrupt}, {"SIGTERM", syscall.SIGTERM}, {"SIGHUP", syscall.SIGHUP}} {
		t.Run(tc.name, func(t *testing.T) {
			if !slices.Contains(shutdownSignals, tc.sig) {
				t.Fatalf("%s does not run the orderly shutdown: %v", tc.name, shutdownSignals)
			}
		})
	}
}

// TestRun_SIGHUPShutsDownLikeSIGTERM: with main's signal set, a real SIGHUP
// ends `run` through its orderly shutdown with exit 0. Without SIGHUP in
// shutdownSignals the signal's default action kills the test binary.
// Mutation: drop syscall.SIGHUP from shutdownSignals.
func TestRun_SIGHUPShutsDownLikeSIGTERM(t *testing.T) {
	ctx, stop := signal.NotifyContext(context.Background(), shutdownSignals...)
	defer stop()
	env := map[string]string{
		"OPAL_SERVER_URL":             "http://127.0.0.1:1",
		"OPAL_INLINE_OPA_CONFIG":      `{"addr":"127.0.0.1:0"}`,
		"OPAL_CLIENT_API_SERVER_PORT": freePort(t),
	}
	stderr := syncWriter{started: make(chan struct{})}
	e := cmdEnv{lookup: func(k string) (string, bool) { v, ok := env[k]; return v, ok },
		stdout: io.Discard, stderr: &stderr, clock: clock.New()}
	done := make(chan int, 1)
	go func() { done <- runRun(ctx, e) }()
	dl := time.NewTimer(30 * time.Second)
	defer dl.Stop()
	select {
	case <-stderr.started:
	case code := <-done:
		t.Fatalf("run ended (exit %d) before starting; stderr:\n%s", code, stderr.String())
	case <-dl.C:
		t.Fatalf("run did not start; stderr:\n%s", stderr.String())
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 || !strings.Contains(stderr.String(), "shutting down") || !strings.Contains(stderr.String(), "stopped") {
			t.Fatalf("exit %d; stderr:\n%s", code, stderr.String())
		}
	case <-dl.C:
		t.Fatal("run did not stop after SIGHUP")
	}
}

// TestBinary_HelpAndSIGHUP runs the built binary: --help is usage on stdout
// with exit 0, and SIGHUP during `run` (policy loaded from the dev server,
// offline mode on) is the orderly shutdown: exit 0, the shutdown log lines,
// and a backup that holds the policy.
func TestBinary_HelpAndSIGHUP(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)

	t.Run("help_exit_0_on_stdout", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var out, errb bytes.Buffer
		cmd := exec.CommandContext(ctx, bin, "--help")
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil || !strings.HasPrefix(out.String(), "usage: opal-client") || errb.Len() != 0 {
			t.Fatalf("err %v\nstdout %q\nstderr %q", err, out.String(), errb.String())
		}
	})

	t.Run("sighup_orderly_shutdown", func(t *testing.T) {
		srv := devserver.New(devserver.Options{PolicyDir: filepath.Join("..", "..", "examples", "policy"),
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		hs := httptest.NewServer(srv)
		defer hs.Close()
		defer srv.Close()
		backupPath := filepath.Join(t.TempDir(), "opa.json")

		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, "run")
		cmd.Env = append(os.Environ(),
			"OPAL_SERVER_URL="+hs.URL,
			"OPAL_CLIENT_TOKEN=",
			"OPAL_DATA_UPDATER_ENABLED=false",
			"OPAL_INLINE_OPA_CONFIG={\"addr\":\"127.0.0.1:0\"}",
			"OPAL_CLIENT_API_SERVER_PORT="+freePort(t),
			"OPAL_OFFLINE_MODE_ENABLED=true",
			"OPAL_STORE_BACKUP_PATH="+backupPath,
		)
		pr, pw := io.Pipe()
		cmd.Stderr = pw
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var log syncWriter
		lines := make(chan string, 100)
		go func() {
			sc := bufio.NewScanner(pr)
			for sc.Scan() {
				log.Write([]byte(sc.Text() + "\n"))
				select {
				case lines <- sc.Text():
				default:
				}
			}
		}()
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait(); pw.Close() }()

		for loaded := false; !loaded; {
			select {
			case l := <-lines:
				loaded = strings.Contains(l, "policy updated")
			case err := <-exited:
				t.Fatalf("exited before loading a policy: %v\n%s", err, log.String())
			case <-ctx.Done():
				t.Fatalf("no policy loaded in time\n%s", log.String())
			}
		}
		if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-exited:
			if err != nil {
				t.Fatalf("after SIGHUP: %v (want exit 0)\n%s", err, log.String())
			}
		case <-ctx.Done():
			t.Fatalf("no exit after SIGHUP\n%s", log.String())
		}
		for _, want := range []string{"shutting down", "stopped"} {
			if !strings.Contains(log.String(), want) {
				t.Errorf("log lacks %q:\n%s", want, log.String())
			}
		}
		b, err := os.ReadFile(backupPath)
		if err != nil || !json.Valid(bytes.TrimSpace(b)) || !bytes.Contains(b, []byte("rbac")) {
			t.Fatalf("backup after SIGHUP: %v\n%.300s", err, b)
		}
	})
}

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// buildBinary builds cmd/opal-client once per test binary, with the flags
// `make build` uses (CGO_ENABLED=0).
func buildBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "opal-client-bin")
		if err != nil {
			buildErr = err
			return
		}
		builtBin = filepath.Join(dir, "opal-client")
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", builtBin, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = errors.New(err.Error() + ": " + string(out))
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin // TestMain removes its directory
}

func TestMain(m *testing.M) {
	code := m.Run()
	if builtBin != "" {
		os.RemoveAll(filepath.Dir(builtBin))
	}
	os.Exit(code)
}

// syncWriter is a testutil.SyncBuffer that also signals the agent's start.
type syncWriter struct {
	testutil.SyncBuffer
	// started, when set, is closed once "opal-client starting" is written:
	// the agent's Run has begun, so a signal now meets its orderly shutdown
	// rather than the start-up's cancellation.
	started     chan struct{}
	startedOnce sync.Once
}

func (w *syncWriter) Write(p []byte) (int, error) {
	if w.started != nil && bytes.Contains(p, []byte("opal-client starting")) {
		w.startedOnce.Do(func() { close(w.started) })
	}
	return w.SyncBuffer.Write(p)
}
