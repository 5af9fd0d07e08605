package fetcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
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
		// Mutation caught: the body cut at the limit as if it ended there
		// (ErrBodyTooLarge -> io.EOF). (Dropping the check altogether makes
		// the decoder spin on empty reads: a hang, not a test failure.)
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

// endless is an unending chunked body: head, then fill repeated forever. It
// counts the bytes read from it.
type endless struct {
	head, fill string
	read       int64
}

func (e *endless) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		off := e.read + int64(n)
		if off < int64(len(e.head)) {
			n += copy(p[n:], e.head[off:])
			continue
		}
		i := (off - int64(len(e.head))) % int64(len(e.fill))
		n += copy(p[n:], e.fill[i:])
	}
	e.read += int64(n)
	return n, nil
}

func (e *endless) Close() error { return nil }

// bodyTransport answers every request 200 with a chunked body (no
// Content-Length), in memory.
type bodyTransport struct{ body io.ReadCloser }

func (b bodyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, ContentLength: -1, Header: http.Header{}, Body: b.body, Request: r}, nil
}

// F1: a chunked body over OPAL_POLICY_BUNDLE_MAX_BYTES is refused with the
// typed ErrBodyTooLarge after at most limit+1 bytes were read, whatever it
// holds and whether it is decoded as it streams (Fetch) or read whole (Do).
// End to end: the cap is limitedBody's, whose guard (and mutation) is
// TestLimitedBodyReadsAtMostLimitPlusOne.
func TestBodyLimit_ChunkedReadsAtMostLimit(t *testing.T) {
	const limit = 64 << 10
	bodies := []struct{ name, head, fill string }{
		{"F1_endless_manifest_refused", `{"manifest":[`, `"rbac/rbac.rego",`},
		{"F1_one_module_over_limit_refused", `{"manifest":[],"hash":"h","data_modules":[{"path":".","data":"`, `xxxxxxxxxxxxxxxx`},
		{"F1_trailing_space_over_limit_refused", okBundle, " "},
	}
	for _, via := range []string{"Fetch", "Do"} {
		for _, tc := range bodies {
			t.Run(via+"/"+tc.name, func(t *testing.T) {
				body := &endless{head: tc.head, fill: tc.fill}
				r := newRig(t, "http://opal.invalid", func(o *Options) {
					o.MaxBodyBytes = limit
					o.HTTPClient = &http.Client{Transport: bodyTransport{body}}
				})
				var err error
				if via == "Fetch" {
					_, err = fetch(t, r, Request{})
				} else {
					_, err = r.f.Do(context.Background(), func(ctx context.Context) (*http.Request, error) {
						return http.NewRequestWithContext(ctx, http.MethodGet, "http://opal.invalid/data", nil)
					}, func([]byte) error { return nil })
				}
				var nre *NonRetryableError
				if !errors.As(err, &nre) || !errors.Is(err, ErrBodyTooLarge) {
					t.Fatalf("err = %v, want non-retryable ErrBodyTooLarge", err)
				}
				if body.read > limit+1 {
					t.Errorf("read %d bytes of the body, want at most limit+1 = %d", body.read, limit+1)
				}
				if len(r.tries) != 1 {
					t.Errorf("attempts = %d, want 1", len(r.tries))
				}
			})
		}
	}
}

// failingBody yields head, then fails with err: a connection lost mid-body.
type failingBody struct {
	head string
	err  error
}

func (b *failingBody) Read(p []byte) (int, error) {
	if b.head == "" {
		return 0, b.err
	}
	n := copy(p, b.head)
	b.head = b.head[n:]
	return n, nil
}

func (b *failingBody) Close() error { return nil }

type failingTransport struct{ head string }

func (f failingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, ContentLength: -1, Header: http.Header{},
		Body: &failingBody{head: f.head, err: errConnReset}, Request: r}, nil
}

var errConnReset = errors.New("read: connection reset by peer")

// F1: a body cut by the transport is a connection error (retryable, the
// transport's error kept), not an undecodable body, whether the bundle is
// decoded as it streams or read whole. Mutation caught: the read error of
// limitedBody not kept ("if err != nil && err != io.EOF {" -> "if false {").
func TestF1_BodyCutIsConnectionError(t *testing.T) {
	for _, via := range []string{"Fetch", "Do"} {
		t.Run(via+"/F1_reset_mid_body_is_connection_error", func(t *testing.T) {
			r := newRig(t, "http://opal.invalid", func(o *Options) {
				o.Retry.Attempts = 1
				o.HTTPClient = &http.Client{Transport: failingTransport{head: okBundle[:40]}}
			})
			var err error
			if via == "Fetch" {
				_, err = fetch(t, r, Request{})
			} else {
				_, err = r.f.Do(context.Background(), func(ctx context.Context) (*http.Request, error) {
					return http.NewRequestWithContext(ctx, http.MethodGet, "http://opal.invalid/data", nil)
				}, func([]byte) error { return nil })
			}
			var re *RetryableError
			if !errors.As(err, &re) || !errors.Is(err, errConnReset) {
				t.Fatalf("err = %v, want a retryable error wrapping the reset", err)
			}
			if len(r.tries) != 1 || r.tries[0].Class != ClassConnectionError {
				t.Errorf("tries = %+v, want one connection_error", r.tries)
			}
		})
	}
}

// F1: refusing a chunked body over the limit costs the limit, not the
// doubling growth of a buffer (io.ReadAll, or json.Decoder's buffer, grow by
// copying to twice the size, with the old copies alive until collected):
// the bytes allocated while refusing it stay within limit + 256 KiB, whether
// it is decoded as it streams (Fetch) or read whole (Do). Mutation caught:
// a chunked body streamed to the decoder unspooled
// ("if resp.ContentLength >= 0 {" -> "if streaming || resp.ContentLength >= 0 {").
func TestBodyLimit_RefusedChunkedAllocatesAtMostLimit(t *testing.T) {
	const limit = 8 << 20
	for _, via := range []string{"Fetch", "Do"} {
		t.Run(via+"/F1_refused_chunked_body_costs_the_limit", func(t *testing.T) {
			body := &endless{head: `{"manifest":[],"hash":"h","data_modules":[{"path":".","data":"`, fill: strings.Repeat("x", 4096)}
			r := newRig(t, "http://opal.invalid", func(o *Options) {
				o.MaxBodyBytes = limit
				o.HTTPClient = &http.Client{Transport: bodyTransport{body}}
			})
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			var err error
			if via == "Fetch" {
				_, err = r.f.Fetch(context.Background(), Request{})
			} else {
				_, err = r.f.Do(context.Background(), func(ctx context.Context) (*http.Request, error) {
					return http.NewRequestWithContext(ctx, http.MethodGet, "http://opal.invalid/data", nil)
				}, func([]byte) error { return nil })
			}
			runtime.ReadMemStats(&after)
			if !errors.Is(err, ErrBodyTooLarge) {
				t.Fatalf("err = %v, want ErrBodyTooLarge", err)
			}
			if got := after.TotalAlloc - before.TotalAlloc; got > limit+256<<10 {
				t.Errorf("refusing a body over %d bytes allocated %d bytes, want at most limit + 256 KiB", limit, got)
			}
		})
	}
}

// F1: a chunked body within the limit, spooled in several chunks, decodes
// exactly (Fetch streams the spool, Do gets it joined). Mutation caught:
// a consumed chunk not advanced ("sp.chunks[0] = sp.chunks[0][n:]" ->
// "_ = n").
func TestBodyLimit_ChunkedWithinLimitDecodes(t *testing.T) {
	var pm []string
	for i := range 3000 {
		pm = append(pm, fmt.Sprintf(`{"path":"p%04d.rego","package_name":"p","rego":"package p%04d\n"}`, i, i))
	}
	text := `{"manifest":[],"hash":"h","data_modules":[],"policy_modules":[` + strings.Join(pm, ",") + `]}`
	for _, via := range []string{"Fetch", "Do"} {
		t.Run(via+"/F1_chunked_body_within_limit_decodes", func(t *testing.T) {
			body := &endless{head: text, fill: " "}
			r := newRig(t, "http://opal.invalid", func(o *Options) {
				o.MaxBodyBytes = int64(len(text))
				o.HTTPClient = &http.Client{Transport: bodyTransport{&cutBody{body, len(text)}}}
			})
			if via == "Fetch" {
				res, err := fetch(t, r, Request{})
				if err != nil {
					t.Fatal(err)
				}
				if n := len(res.Bundle.PolicyModules); n != 3000 || res.Bundle.PolicyModules[2999].Path != "p2999.rego" {
					t.Fatalf("decoded %d modules", n)
				}
				return
			}
			var got []byte
			_, err := r.f.Do(context.Background(), func(ctx context.Context) (*http.Request, error) {
				return http.NewRequestWithContext(ctx, http.MethodGet, "http://opal.invalid/data", nil)
			}, func(b []byte) error { got = b; return nil })
			if err != nil || string(got) != text {
				t.Fatalf("err = %v, body of %d bytes, want the %d sent", err, len(got), len(text))
			}
		})
	}
}

// cutBody ends r after n bytes.
type cutBody struct {
	r *endless
	n int
}

func (c *cutBody) Read(p []byte) (int, error) {
	if int(c.r.read) >= c.n {
		return 0, io.EOF
	}
	if left := c.n - int(c.r.read); len(p) > left {
		p = p[:left]
	}
	return c.r.Read(p)
}

func (c *cutBody) Close() error { return nil }

// F1: limitedBody itself never takes more than limit+1 bytes from the body,
// whatever buffer its reader offers (io.ReadAll's, a decoder's), and says
// ErrBodyTooLarge past the limit, nil at it. Mutation caught:
// "p = p[:l.left+1]" -> "_ = p".
func TestLimitedBodyReadsAtMostLimitPlusOne(t *testing.T) {
	const limit = 1000
	for _, tc := range []struct {
		name    string
		size    int // body bytes; -1 is endless
		wantErr error
	}{
		{"F1_over_limit_big_buffer", -1, ErrBodyTooLarge},
		{"F1_at_limit_accepted", limit, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &endless{fill: "x"}
			var r io.Reader = src
			if tc.size >= 0 {
				r = &cutBody{src, tc.size}
			}
			l := &limitedBody{r: r, left: limit}
			_, err := io.ReadAll(l) // grows its buffer past the limit
			if !errors.Is(err, tc.wantErr) && err != tc.wantErr {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if src.read > limit+1 {
				t.Errorf("took %d bytes of the body, want at most %d", src.read, limit+1)
			}
		})
	}
}
