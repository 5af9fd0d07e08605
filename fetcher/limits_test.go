package fetcher

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// stallServer sends the status line and headers (and, when partial is set,
// a part of the body), then stalls until the client goes away. started
// receives one value per request once the stall begins.
func stallServer(t *testing.T, partial bool) (string, chan struct{}) {
	t.Helper()
	started := make(chan struct{}, 10)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if partial {
			w.Header().Set("Content-Length", "100000")
			w.WriteHeader(200)
			_, _ = w.Write([]byte(`{"manifest":[`))
			w.(http.Flusher).Flush()
		}
		started <- struct{}{}
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(func() { close(release); srv.Close() })
	return srv.URL, started
}

// The attempt timeout covers headers and body: a stall is a retryable
// timeout, not a hang. Mutation caught: drop the AfterFunc that cancels the
// attempt (the fetch then hangs and the 20 s guard fails it).
func TestTimeout_Stalls(t *testing.T) {
	for _, tc := range []struct {
		name    string
		partial bool
	}{{"F1_stalled_body_is_timeout", true}, {"F1_stalled_headers_is_timeout", false}} {
		t.Run(tc.name, func(t *testing.T) {
			url, started := stallServer(t, tc.partial)
			r := newRig(t, url, func(o *Options) { o.Retry.Attempts = 2 })
			done := make(chan error, 1)
			go func() { _, err := r.f.Fetch(context.Background(), Request{}); done <- err }()
			for i := 0; i < 2; i++ { // each attempt: wait for the stall, then let the timeout fire
				select {
				case <-started:
				case <-time.After(3 * time.Second):
					t.Fatal("request never reached the server")
				}
				r.mock.Add(10 * time.Second)
			}
			var err error
			select {
			case err = <-done:
			case <-time.After(3 * time.Second):
				t.Fatal("fetch hangs on a stalled answer")
			}
			var re *RetryableError
			if !errors.As(err, &re) || !re.Exhausted || !errors.Is(err, ErrAttemptTimeout) {
				t.Fatalf("err = %v, want exhausted timeout", err)
			}
			if len(r.tries) != 2 || r.tries[0].Class != ClassTimeout || r.tries[0].Duration != 10*time.Second {
				t.Errorf("tries = %+v", r.tries)
			}
		})
	}
}

// A body over the limit is refused as non-retryable, after one request,
// without being read whole.
func TestBodyLimit(t *testing.T) {
	const limit = 1024
	cases := []struct {
		name    string
		handler http.HandlerFunc
	}{
		// Mutation caught: drop the Content-Length check (the body is then
		// never sent in full, so reading it fails instead: retryable).
		{"F1_declared_too_large_not_read", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "1000000")
			w.WriteHeader(200)
			_, _ = w.Write([]byte(strings.Repeat(" ", limit)))
		}},
		// An endless chunked body: reading it whole would never end.
		// Mutation caught: "int64(len(body)) > f.o.MaxBodyBytes" -> "false".
		{"F1_streamed_too_large_refused", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(200)
			chunk := []byte(strings.Repeat(" ", 512))
			for r.Context().Err() == nil {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := &countingHandler{h: tc.handler}
			srv := httptest.NewServer(s)
			t.Cleanup(srv.Close)
			r := newRig(t, srv.URL, func(o *Options) { o.MaxBodyBytes = limit })
			_, err := fetch(t, r, Request{})
			var nre *NonRetryableError
			if !errors.As(err, &nre) || !errors.Is(err, ErrBodyTooLarge) {
				t.Fatalf("err = %v, want non-retryable ErrBodyTooLarge", err)
			}
			if len(r.tries) != 1 {
				t.Errorf("attempts = %d, want 1", len(r.tries))
			}
		})
	}
	t.Run("F1_body_at_limit_accepted", func(t *testing.T) {
		_, url := serve(t, ok())
		r := newRig(t, url, func(o *Options) { o.MaxBodyBytes = int64(len(okBundle)) })
		if _, err := fetch(t, r, Request{}); err != nil {
			t.Fatal(err)
		}
	})
}

type countingHandler struct{ h http.HandlerFunc }

func (c *countingHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) { c.h(w, r) }
