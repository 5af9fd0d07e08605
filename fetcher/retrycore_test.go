package fetcher

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/opal-go/opal-client/config"
)

// attemptTimes are the mock-clock offsets of each attempt of a fetch whose
// rig advanced the clock by every wait (attempts answering at once).
func (r *rig) attemptTimes() []time.Duration {
	out := []time.Duration{0}
	var at time.Duration
	for _, w := range r.waits() {
		at += w
		out = append(out, at)
	}
	return out
}

// The retry core (F4, F7, F9): a floor under every wait, a cap on one
// fetch's attempts, a bound that counts the attempts' own time, and a
// rate-limited failure WARNING.
func TestRetryCore(t *testing.T) {
	t.Run("zero_wait_config_at_most_30_requests_in_3s", func(t *testing.T) {
		var zero config.ConnRetryOptions
		if err := zero.Decode(`{"wait_strategy":"fixed","wait_time":0,"attempts":5000}`); err != nil {
			t.Fatal(err)
		}
		s, url := serve(t, answer{503, nil, ""})
		r := newRig(t, url, func(o *Options) { o.Retry = zero })
		_, err := fetch(t, r, Request{})
		var re *RetryableError
		if !errors.As(err, &re) || !re.Exhausted {
			t.Fatalf("err = %v, want exhausted", err)
		}
		in3s := 0
		for _, at := range r.attemptTimes() {
			if at <= 3*time.Second {
				in3s++
			}
		}
		// Mutations: the config not bounded (5000 attempts, 31 in 3 s).
		if in3s > 30 || s.count() != config.MaxAttempts {
			t.Fatalf("%d requests in 3 s, %d in all; want at most 30 and %d", in3s, s.count(), config.MaxAttempts)
		}
		if !strings.Contains(r.logs.String(), "retry configuration out of bounds") {
			t.Errorf("no start-up warning:\n%s", r.logs)
		}
	})
	t.Run("zero_draw_waits_the_floor", func(t *testing.T) {
		_, url := serve(t, answer{503, nil, ""})
		r := newRig(t, url, func(o *Options) {
			o.Retry = config.ConnRetryOptions{WaitStrategy: config.WaitRandomExponential, WaitTime: time.Second, MaxWait: 10 * time.Second, Attempts: 5}
			o.Rand = func() float64 { return 0 }
		})
		_, _ = fetch(t, r, Request{})
		// Mutation: the loop's floor dropped (random_exponential draws 0 s).
		for i, w := range r.waits() {
			if w < config.MinWait {
				t.Fatalf("wait %d is %v, under the %v floor", i+1, w, config.MinWait)
			}
		}
	})
	t.Run("request_attempts_capped", func(t *testing.T) {
		s, url := serve(t, answer{500, nil, ""})
		r := newRig(t, url, func(o *Options) { o.Retry.WaitTime = config.MinWait })
		_, _ = fetch(t, r, Request{Attempts: 1000})
		if s.count() != config.MaxAttempts {
			t.Fatalf("%d requests, want the cap %d", s.count(), config.MaxAttempts)
		}
	})
	t.Run("stalled_body_released_within_bound_plus_one_timeout", func(t *testing.T) {
		// Virtual time and an in-memory transport: every step is exact.
		synctest.Test(t, func(t *testing.T) {
			const timeout = 30 * time.Second
			var tries []Attempt
			f := New(Options{
				ServerURL:      "http://opal-server:7002",
				Retry:          config.ConnRetryOptions{WaitStrategy: config.WaitFixed, WaitTime: time.Second, Attempts: 5},
				MaxRetryAfter:  60 * time.Second,
				AttemptTimeout: timeout,
				HTTPClient:     &http.Client{Transport: stallBody{}},
				Logger:         slog.New(slog.DiscardHandler),
				OnAttempt:      func(a Attempt) { tries = append(tries, a) },
			})
			res, err := f.Fetch(context.Background(), Request{})
			bound := f.Bound() + timeout // 60 s + 30 s
			// Attempts start at 0, 31 and 62 s; the third one's timeout is
			// cut to the 90 s deadline.
			want := []time.Duration{timeout, timeout, bound - 62*time.Second}
			// Mutations: the attempts' time not counted (5 x 30 s + 4 s =
			// 154 s); an attempt's timeout not clamped to the deadline (the
			// third attempt runs 30 s and the fetch ends at 92 s).
			if res.Elapsed > bound || res.Attempts != 3 || !errors.Is(err, ErrAttemptTimeout) {
				t.Fatalf("fetch held the queue %v in %d attempts (bound B + one timeout = %v, 3 attempts), err %v",
					res.Elapsed, res.Attempts, bound, err)
			}
			for i, a := range tries {
				if a.Timeout != want[i] {
					t.Errorf("attempt %d: timeout %v, want %v", a.N, a.Timeout, want[i])
				}
			}
		})
	})
	t.Run("warning_rate_limited", func(t *testing.T) {
		answers := []answer{{503, nil, ""}, {503, nil, ""}, {503, nil, ""}, {503, nil, ""}, ok(), {503, nil, ""}}
		_, url := serve(t, answers...)
		r := newRig(t, url, func(o *Options) { o.Retry.Attempts = 1 })
		step := func(d time.Duration) { r.mock.Add(d); _, _ = fetch(t, r, Request{}) }
		step(0)
		step(time.Minute)
		step(time.Minute)
		// Mutation "quiet := false": one WARNING per fetch (3 here).
		if got := r.warnings(); got != 1 {
			t.Fatalf("after 3 failures in 2 min: %d warnings, want 1:\n%s", got, r.logs)
		}
		step(4 * time.Minute) // past DefaultWarnEvery: warns, counting the two it stood for
		if got := r.warnings(); got != 2 || !strings.Contains(r.logs.String(), "failures_since_last_warning=2") {
			t.Fatalf("after 6 min: %d warnings, want 2 with the count:\n%s", got, r.logs)
		}
		step(time.Second) // success
		step(time.Second) // a failure right after a success warns at once
		// Mutation: a success keeps the rate limit.
		if got := r.warnings(); got != 3 {
			t.Fatalf("failure after a success: %d warnings, want 3:\n%s", got, r.logs)
		}
	})
}

// stallBody answers every request with headers and a body that never
// arrives: its read blocks until the request is cancelled.
type stallBody struct{}

func (stallBody) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}},
		ContentLength: 100000, Body: stalledReader{req.Context()}, Request: req}, nil
}

type stalledReader struct{ ctx context.Context }

func (r stalledReader) Read([]byte) (int, error) {
	<-r.ctx.Done()
	return 0, context.Cause(r.ctx)
}

func (stalledReader) Close() error { return nil }
