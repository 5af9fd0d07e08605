package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/benbjohnson/clock"
)

const bundle = `{"manifest":["a.rego"],"hash":"h2","old_hash":"h1","data_modules":[{"path":".","data":"{}"}],
 "policy_modules":[{"path":"a.rego","package_name":"a","rego":"package a"}],
 "deleted_files":{"data_modules":["x"],"policy_modules":["b.rego","c.rego"]}}`

// scripted answers the n-th request (1-based) through answer.
type scripted struct {
	n      atomic.Int32
	answer func(n int, w http.ResponseWriter, r *http.Request)
}

func (s *scripted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.answer(int(s.n.Add(1)), w, r)
}

// inMemory serves requests straight from a handler: no sockets, so a
// synctest bubble can see every goroutine block durably.
type inMemory struct{ h http.Handler }

func (m inMemory) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	m.h.ServeHTTP(rec, r)
	return rec.Result(), nil
}

func runCmd(t *testing.T, e cmdEnv, env map[string]string, args ...string) (int, fetchSummary, string) {
	t.Helper()
	var out, errb bytes.Buffer
	e.args, e.stdout, e.stderr = append([]string{"fetch"}, args...), &out, &errb
	e.lookup = func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	if e.clock == nil {
		e.clock = clock.New()
	}
	code := dispatch(context.Background(), e)
	var sum fetchSummary
	if out.Len() > 0 {
		if err := json.Unmarshal(out.Bytes(), &sum); err != nil || strings.Count(out.String(), "\n") != 1 {
			t.Fatalf("stdout is not one JSON object: %q", out.String())
		}
	}
	return code, sum, errb.String()
}

// Done-when 1, end to end through a real socket and the real clock: two 503s
// with Retry-After: 1, then a bundle; about 1 s before each retry.
func TestFetchCmd_RecoversAfterRetryAfter(t *testing.T) {
	s := &scripted{answer: func(n int, w http.ResponseWriter, r *http.Request) {
		if r.URL.Query()["path"][0] != "rbac" || r.URL.Query().Get("base_hash") != "h1" {
			w.WriteHeader(400)
			return
		}
		if n <= 2 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(503)
			return
		}
		_, _ = w.Write([]byte(bundle))
	}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	code, sum, stderr := runCmd(t, cmdEnv{rand: func() float64 { return 0 }},
		map[string]string{"OPAL_SERVER_URL": srv.URL}, "--path", "rbac", "--base-hash", "h1")
	if code != exitOK || sum.Outcome != "success" || sum.Attempts != 3 || sum.Hash != "h2" || *sum.OldHash != "h1" ||
		sum.PolicyModules != 1 || sum.DataModules != 1 || sum.DeletedFiles != 3 || sum.LastStatus != 200 {
		t.Fatalf("exit %d summary %+v\n%s", code, sum, stderr)
	}
	if sum.ElapsedSeconds < 2 || sum.ElapsedSeconds > 4 {
		t.Errorf("elapsed %.2fs, want about 2 s (1 s before each retry)", sum.ElapsedSeconds)
	}
	if n := strings.Count(stderr, "retrying policy fetch"); n != 2 {
		t.Errorf("want 2 retry lines on stderr, got %d:\n%s", n, stderr)
	}
}

// Done-when 2: a 409 costs exactly one request and exits 2.
func TestFetchCmd_409ExitsTwo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &scripted{answer: func(int, http.ResponseWriter, *http.Request) {}}
		s.answer = func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(409) }
		code, sum, stderr := runCmd(t, cmdEnv{transport: inMemory{s}}, nil)
		if code != exitNonRetryable || s.n.Load() != 1 || sum.Outcome != "non_retryable" || sum.LastStatus != 409 {
			t.Fatalf("exit %d requests %d summary %+v\n%s", code, s.n.Load(), sum, stderr)
		}
		if strings.Count(stderr, "level=WARN") != 1 {
			t.Errorf("want one warning:\n%s", stderr)
		}
	})
}

// Done-when 3: with MAX_RETRY_AFTER=2 a hostile Retry-After: 99999 never
// makes the client wait more than max(2 s, its backoff), and the command
// exits 3 within the F7 bound (max(2 s, 15 s)). Virtual time: exact values.
func TestFetchCmd_HostileRetryAfterExitsThree(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &scripted{answer: func(_ int, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Retry-After", "99999")
			w.WriteHeader(503)
		}}
		// Draw 0.5 of the default backoff (1, 2, 4, 8 s): 0.5, 1, 2, 4 s.
		code, sum, stderr := runCmd(t, cmdEnv{transport: inMemory{s}, rand: func() float64 { return 0.5 }},
			map[string]string{"OPAL_POLICY_UPDATER_MAX_RETRY_AFTER": "2"})
		if code != exitExhausted || sum.Outcome != "exhausted" || sum.Attempts != 5 {
			t.Fatalf("exit %d summary %+v\n%s", code, sum, stderr)
		}
		for _, w := range []string{"wait=2s", "wait=2s", "wait=2s", "wait=4s"} {
			if !strings.Contains(stderr, w) {
				t.Errorf("stderr lacks %s:\n%s", w, stderr)
			}
		}
		if sum.ElapsedSeconds != 10 {
			t.Errorf("elapsed %v s, want 2+2+2+4 = 10", sum.ElapsedSeconds)
		}
	})
}

func TestFetchCmd_BadUsage(t *testing.T) {
	cases := []struct {
		name   string
		env    map[string]string
		args   []string
		stderr string
	}{
		{"bad_config_names_variable", map[string]string{"OPAL_POLICY_UPDATER_MAX_RETRY_AFTER": "-1", "OPAL_CLIENT_TOKEN": "tok-SECRET"}, nil,
			"OPAL_POLICY_UPDATER_MAX_RETRY_AFTER"},
		{"unknown_flag", nil, []string{"--nope"}, "flag provided but not defined"},
		{"stray_argument", nil, []string{"extra"}, "unexpected argument"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runCmd(t, cmdEnv{transport: inMemory{http.NotFoundHandler()}}, tc.env, tc.args...)
			if code != exitUsage || !strings.Contains(stderr, tc.stderr) || strings.Contains(stderr, "SECRET") {
				t.Errorf("exit %d stderr %q", code, stderr)
			}
		})
	}
	var errb bytes.Buffer
	if code := dispatch(context.Background(), cmdEnv{args: []string{"nope"}, stderr: &errb}); code != exitUsage {
		t.Errorf("unknown command: exit %d", code)
	}
}
