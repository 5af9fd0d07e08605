package fetcher

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/opal-go/opal-client/config"
)

const testToken = "s3cr3t-token-value"

const okBundle = `{"manifest":["rbac/rbac.rego","rbac/data.json"],"hash":"2222","old_hash":null,
 "data_modules":[{"path":"rbac","data":"{\"roles\":{\"admin\":[\"read\"]}}"}],
 "policy_modules":[{"path":"rbac/rbac.rego","package_name":"app.rbac","rego":"package app.rbac\n"}],
 "deleted_files":null}`

// answer is one scripted server response.
type answer struct {
	status int
	header map[string]string
	body   string
}

func ok() answer { return answer{status: 200, body: okBundle} }

// script answers the i-th request with answers[i], repeating the last one.
type script struct {
	mu      sync.Mutex
	answers []answer
	reqs    []*http.Request
}

func (s *script) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	i := min(len(s.reqs), len(s.answers)-1)
	s.reqs = append(s.reqs, r)
	a := s.answers[i]
	s.mu.Unlock()
	for k, v := range a.header {
		w.Header().Set(k, v)
	}
	w.WriteHeader(a.status)
	_, _ = w.Write([]byte(a.body))
}

func (s *script) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reqs)
}

// rig is a fetcher on a mock clock whose OnRetry hook records each wait and
// advances the clock by it, so retries run with no real sleeping.
type rig struct {
	f       *Fetcher
	mock    *clock.Mock
	retries []Retry
	tries   []Attempt
	logs    *bytes.Buffer
}

func (r *rig) waits() []time.Duration {
	var out []time.Duration
	for _, x := range r.retries {
		out = append(out, x.Wait)
	}
	return out
}

// newRig builds a fetcher for url with fixed 1 s x 3 attempts, a 60 s hint
// cap, the identity-free random draw 1 (upper bound) unless edit changes o.
func newRig(t *testing.T, url string, edit func(*Options)) *rig {
	t.Helper()
	r := &rig{mock: clock.NewMock(), logs: &bytes.Buffer{}}
	r.mock.Set(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	o := Options{
		ServerURL:      url,
		Token:          testToken,
		Retry:          config.ConnRetryOptions{WaitStrategy: config.WaitFixed, WaitTime: time.Second, Attempts: 3},
		MaxRetryAfter:  60 * time.Second,
		AttemptTimeout: 10 * time.Second,
		Clock:          r.mock,
		Rand:           func() float64 { return 0.5 },
		NoHintJitter:   true, // exact waits; TestF4_HintJitter covers the spread
		Logger:         slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if edit != nil {
		edit(&o)
	}
	o.OnAttempt = func(a Attempt) { r.tries = append(r.tries, a) }
	o.OnRetry = func(x Retry) {
		r.retries = append(r.retries, x)
		r.mock.Add(x.Wait)
	}
	r.f = New(o)
	return r
}

func serve(t *testing.T, answers ...answer) (*script, string) {
	t.Helper()
	s := &script{answers: answers}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return s, srv.URL
}

func (r *rig) warnings() int { return strings.Count(r.logs.String(), "level=WARN") }

func fetch(t *testing.T, r *rig, req Request) (*Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // a hang fails, not blocks
	defer cancel()
	res, err := r.f.Fetch(ctx, req)
	if res == nil {
		t.Fatal("Result is nil")
	}
	return res, err
}

func secs(s ...float64) []time.Duration {
	var out []time.Duration
	for _, x := range s {
		out = append(out, time.Duration(x*float64(time.Second)))
	}
	return out
}
