// Package fetcher fetches policy bundles from an OPAL server (protocol §4) and
// owns the retry policy of one fetch (rules F1-F11 of the design): it
// classifies each answer, honours Retry-After within a cap, backs off as
// configured, and bounds the whole fetch so it never holds the update queue
// for long. Time and randomness are injected.
//
// The same classified retry loop serves any HTTP GET through Fetcher.Do, so
// data-source fetches share the classification, waits, bound, timeouts, size
// limit and logging of policy fetches.
package fetcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/benbjohnson/clock"

	redactpkg "github.com/opal-go/opal-client/internal/redact"

	"github.com/opal-go/opal-client/config"
)

// Defaults for the zero values of Options.
const (
	DefaultAttemptTimeout = 30 * time.Second
	DefaultMaxBodyBytes   = 100 << 20
)

// Attempt classes (Attempt.Class).
const (
	ClassSuccess         = "success"
	ClassRetryable       = "retryable"        // 503, 429 or another unexpected status
	ClassNonRetryable    = "non_retryable"    // 409, 404, body too large, unbuildable request
	ClassConnectionError = "connection_error" // no answer: refused, reset, DNS...
	ClassTimeout         = "timeout"          // the attempt's timeout ran out (headers or body)
	ClassInvalidBody     = "invalid_body"     // a 2xx whose body does not decode (truncated)
	ClassCancelled       = "cancelled"        // the caller's context ended
)

// ErrBodyTooLarge is wrapped by the *NonRetryableError of a body over the
// size limit.
var ErrBodyTooLarge = errors.New("response body exceeds the size limit")

// ErrAttemptTimeout is wrapped by the *RetryableError of an attempt that ran
// out of time, whether waiting for headers or reading the body.
var ErrAttemptTimeout = errors.New("attempt timed out")

// Options configure a Fetcher. Zero values take the defaults noted.
type Options struct {
	ServerURL string // e.g. http://localhost:7002
	Token     string // Bearer token; "" sends no Authorization header
	ScopeID   string // "" or "default" uses GET /policy, anything else /scopes/{id}/policy
	// Retry is the configured backoff (F5); zero value: config.DefaultPolicyUpdaterConnRetry().
	Retry config.ConnRetryOptions
	// MaxRetryAfter caps each honoured Retry-After (F4) and sets the floor of
	// the whole-fetch bound (F7). 0 honours no hint.
	MaxRetryAfter time.Duration
	// AttemptTimeout limits one attempt, body included; 0 means 30 s.
	AttemptTimeout time.Duration
	// MaxBodyBytes refuses larger bodies (non-retryable); 0 means 100 MiB.
	MaxBodyBytes int64
	// HTTPClient sends the requests; nil means a plain http.Client. Its own
	// Timeout, if any, runs on real time; leave it 0 and use AttemptTimeout.
	HTTPClient *http.Client
	Clock      clock.Clock    // nil means the real clock
	Rand       func() float64 // uniform [0,1) for random_exponential; nil means math/rand/v2
	Logger     *slog.Logger   // nil discards
	OnAttempt  func(Attempt)  // called after every attempt (F10)
	OnRetry    func(Retry)    // called before every wait (F10)
	// NoHintJitter honours a Retry-After hint exactly. By default the capped
	// hint h is a floor and the wait is drawn uniformly from
	// [h, h+min(h, MaxRetryAfter-h)]: never earlier than the server asked,
	// never over the cap, and a fleet told the same Retry-After does not
	// come back in the same instant.
	NoHintJitter bool
}

// PolicyOptions returns the Options that c's OPAL_ variables set for policy
// fetches (server, token, scope, retry policy, hint cap, attempt timeout,
// size limit). The caller adds the clock, random source, client, logger
// and hooks.
func PolicyOptions(c *config.Config) Options {
	return Options{
		ServerURL:      c.ServerURL,
		Token:          c.ClientToken,
		ScopeID:        c.ScopeID,
		Retry:          c.PolicyUpdaterConnRetry,
		MaxRetryAfter:  c.PolicyUpdaterMaxRetryAfter,
		AttemptTimeout: c.PolicyFetchAttemptTimeout,
		MaxBodyBytes:   c.PolicyBundleMaxBytes,
	}
}

// Attempt is the outcome of one request.
type Attempt struct {
	N             int // 1-based
	Status        int // HTTP status, 0 when none was received
	Class         string
	Err           error // nil on success
	Duration      time.Duration
	RetryAfter    time.Duration // the parsed Retry-After, valid when HasRetryAfter
	HasRetryAfter bool
}

// Retry describes one wait between attempts: after attempt Attempt failed
// with Outcome, the fetch waits Wait before attempt Attempt+1.
type Retry struct {
	Attempt int
	Outcome Attempt
	Wait    time.Duration
}

// Fetcher fetches with one set of Options. It is safe for concurrent use.
type Fetcher struct {
	o      Options
	client *http.Client
	clock  clock.Clock
	rand   func() float64
	log    *slog.Logger
}

// New returns a Fetcher, filling the defaults of o.
func New(o Options) *Fetcher {
	f := &Fetcher{o: o, client: o.HTTPClient, clock: o.Clock, rand: o.Rand, log: o.Logger}
	if f.o.Retry == (config.ConnRetryOptions{}) {
		f.o.Retry = config.DefaultPolicyUpdaterConnRetry()
	}
	if f.o.AttemptTimeout <= 0 {
		f.o.AttemptTimeout = DefaultAttemptTimeout
	}
	if f.o.MaxBodyBytes <= 0 {
		f.o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if f.o.MaxRetryAfter < 0 {
		f.o.MaxRetryAfter = 0
	}
	if f.client == nil {
		f.client = &http.Client{}
	}
	if f.clock == nil {
		f.clock = clock.New()
	}
	if f.rand == nil {
		f.rand = rand.Float64
	}
	if f.log == nil {
		f.log = slog.New(slog.DiscardHandler)
	}
	return f
}

// Bound is the most one fetch may spend waiting between attempts (F7):
// max(MaxRetryAfter, Retry.WorstCaseTotalWait()). The operator's own backoff
// always fits; only server hints are cut short.
func (f *Fetcher) Bound() time.Duration {
	return max(f.o.MaxRetryAfter, f.o.Retry.WorstCaseTotalWait())
}

// Fetch fetches the policy bundle r names (protocol §4.1) with the full retry
// policy. The Result is never nil; Result.Bundle is set on success. Errors:
// *RetryableError with Exhausted set (F8), *NonRetryableError or
// *BundlePathNotFound, or the context's error, wrapped.
func (f *Fetcher) Fetch(ctx context.Context, r Request) (*Result, error) {
	var bundle *PolicyBundle
	res, err := f.do(ctx, r.Attempts, func(ctx context.Context) (*http.Request, error) {
		return f.policyRequest(ctx, r)
	}, func(body []byte) error {
		b, err := DecodeBundle(body)
		bundle = b
		return err
	})
	if err == nil {
		res.Bundle = bundle
	}
	return res, err
}

// policyRequest builds GET {server}/policy (or the scoped endpoint) with one
// path= per directory and base_hash only when known.
func (f *Fetcher) policyRequest(ctx context.Context, r Request) (*http.Request, error) {
	u := strings.TrimRight(f.o.ServerURL, "/")
	if f.o.ScopeID != "" && f.o.ScopeID != config.DefaultScopeID {
		u += "/scopes/" + url.PathEscape(f.o.ScopeID) + "/policy"
	} else {
		u += "/policy"
	}
	q := url.Values{}
	for _, p := range r.Paths {
		q.Add("path", p)
	}
	if r.BaseHash != "" {
		q.Set("base_hash", r.BaseHash)
	}
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	if f.o.Token != "" {
		req.Header.Set("Authorization", "Bearer "+f.o.Token)
	}
	req.Header.Set("Content-Type", "text/plain") // as the Python client sends it
	return req, nil
}

// Do runs one classified, retried fetch (F1-F10). newRequest builds each
// attempt's request on the context it is given (which carries the attempt's
// timeout); decode receives the body of a 2xx answer, and an error from it
// makes the attempt retryable (a truncated or garbled transfer). The Result
// is never nil; its Bundle is left nil. Errors are as for Fetch; an error
// from newRequest is non-retryable.
func (f *Fetcher) Do(ctx context.Context, newRequest func(context.Context) (*http.Request, error), decode func([]byte) error) (*Result, error) {
	return f.do(ctx, 0, newRequest, decode)
}

// do is Do with the number of attempts overridden when attempts > 0.
func (f *Fetcher) do(ctx context.Context, attempts int, newRequest func(context.Context) (*http.Request, error), decode func([]byte) error) (*Result, error) {
	start := f.clock.Now()
	res := &Result{}
	bound := f.Bound()
	if attempts <= 0 {
		attempts = max(f.o.Retry.Attempts, 1)
	}
	var waited time.Duration
	var hint time.Duration
	var hasHint bool
	for n := 1; ; n++ {
		a := f.attempt(ctx, n, newRequest, decode)
		res.Attempts = n
		res.LastStatus = a.Status
		res.Elapsed = f.clock.Since(start)
		f.log.Debug("fetch attempt", "attempt", n, "status", a.Status, "class", a.Class, "duration", a.Duration, "error", errText(a.Err))
		if f.o.OnAttempt != nil {
			f.o.OnAttempt(a)
		}
		if a.HasRetryAfter {
			hint, hasHint = a.RetryAfter, true
		}
		switch a.Class {
		case ClassSuccess:
			return res, nil
		case ClassCancelled:
			return res, fmt.Errorf("fetch cancelled at attempt %d: %w", n, a.Err)
		case ClassNonRetryable:
			f.warn(a, res)
			return res, a.Err
		}
		// F4: the longer of the capped hint and the configured backoff.
		wait := f.o.Retry.Wait(n, f.rand)
		if a.HasRetryAfter {
			wait = max(wait, f.hintWait(min(a.RetryAfter, f.o.MaxRetryAfter)))
		}
		// F7/F8: stop after the last attempt, or before a wait that would
		// take the waits of this fetch past the bound.
		if n >= attempts || wait > bound-waited {
			return res, f.exhausted(a, res, hint, hasHint)
		}
		waited += wait
		// The timer exists before OnRetry runs, so a hook that advances a
		// mock clock by Wait always releases it.
		t := f.clock.Timer(wait)
		if f.o.OnRetry != nil {
			f.o.OnRetry(Retry{Attempt: n, Outcome: a, Wait: wait})
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			res.Elapsed = f.clock.Since(start)
			return res, fmt.Errorf("fetch cancelled waiting after attempt %d: %w", n, ctx.Err())
		}
	}
}

// hintWait spreads a capped hint h upwards (see Options.NoHintJitter).
func (f *Fetcher) hintWait(h time.Duration) time.Duration {
	if f.o.NoHintJitter || h <= 0 {
		return h
	}
	spread := min(h, f.o.MaxRetryAfter-h)
	// A broken source must not go below the hint nor past the cap; NaN
	// fails every comparison and min/max pass it through, so test it first.
	r := f.rand()
	if !(r >= 0) {
		r = 0
	}
	r = min(r, 1)
	return h + time.Duration(r*float64(spread))
}

func (f *Fetcher) exhausted(a Attempt, res *Result, hint time.Duration, hasHint bool) error {
	var e *RetryableError
	if !errors.As(a.Err, &e) {
		e = &RetryableError{Status: a.Status, Err: a.Err}
	}
	out := *e
	out.Exhausted = true
	out.RetryAfter, out.HasRetryAfter = hint, hasHint
	f.warn(a, res)
	return &out
}

// warn is the one WARNING of a failed fetch (F9).
func (f *Fetcher) warn(a Attempt, res *Result) {
	class := a.Class
	switch class {
	case ClassTimeout, ClassInvalidBody:
		class = ClassRetryable
	}
	f.log.Warn("fetch failed", "class", class, "attempts", res.Attempts, "elapsed", res.Elapsed, "status", a.Status, "error", errText(a.Err))
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// attempt sends one request and classifies the answer (F1, F2).
func (f *Fetcher) attempt(ctx context.Context, n int, newRequest func(context.Context) (*http.Request, error), decode func([]byte) error) (a Attempt) {
	a.N = n
	start := f.clock.Now()
	defer func() { a.Duration = f.clock.Since(start) }()

	// The timeout runs on the injected clock and covers the body: cancelling
	// the request's context aborts a stalled read. (A context deadline would
	// be read by the dialer as a wall-clock time, wrong under a mock clock.)
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	timer := f.clock.AfterFunc(f.o.AttemptTimeout, func() { cancel(ErrAttemptTimeout) })
	defer timer.Stop()

	transportErr := func(status int, err error) Attempt {
		switch {
		case ctx.Err() != nil:
			a.Class, a.Err = ClassCancelled, ctx.Err()
		case errors.Is(context.Cause(actx), ErrAttemptTimeout):
			a.Class = ClassTimeout
			a.Err = &RetryableError{Status: status, Message: fmt.Sprintf("no complete answer within %s", f.o.AttemptTimeout), Err: ErrAttemptTimeout}
		default:
			a.Class = ClassConnectionError
			a.Err = &RetryableError{Status: status, Message: "connection error", Err: redact(err)}
		}
		return a
	}

	req, err := newRequest(actx)
	if err != nil {
		a.Class, a.Err = ClassNonRetryable, &NonRetryableError{Message: "cannot build request", Err: redact(err)}
		return a
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return transportErr(0, err)
	}
	defer resp.Body.Close()
	a.Status = resp.StatusCode

	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		body, err := f.readBody(resp)
		switch {
		case errors.Is(err, ErrBodyTooLarge):
			a.Class = ClassNonRetryable
			a.Err = &NonRetryableError{Status: resp.StatusCode, Message: fmt.Sprintf("body over %d bytes", f.o.MaxBodyBytes), Err: ErrBodyTooLarge}
			return a
		case err != nil:
			return transportErr(resp.StatusCode, err)
		}
		if err := decode(body); err != nil {
			a.Class = ClassInvalidBody
			a.Err = &RetryableError{Status: resp.StatusCode, Message: "undecodable body", Err: err}
			return a
		}
		a.Class = ClassSuccess
		return a
	}

	msg := serverMessage(resp.Body)
	if ctx.Err() != nil {
		a.Class, a.Err = ClassCancelled, ctx.Err()
		return a
	}
	switch resp.StatusCode {
	case http.StatusServiceUnavailable, http.StatusTooManyRequests:
		a.RetryAfter, a.HasRetryAfter = ParseRetryAfter(resp.Header.Get("Retry-After"), f.clock.Now())
		a.Class = ClassRetryable
		a.Err = &RetryableError{Status: resp.StatusCode, RetryAfter: a.RetryAfter, HasRetryAfter: a.HasRetryAfter, Message: msg}
	case http.StatusConflict:
		a.Class = ClassNonRetryable
		a.Err = &NonRetryableError{Status: resp.StatusCode, Message: msg}
	case http.StatusNotFound:
		a.Class = ClassNonRetryable
		a.Err = &BundlePathNotFound{NonRetryableError{Status: resp.StatusCode, Message: msg}}
	default:
		a.Class = ClassRetryable
		a.Err = &RetryableError{Status: resp.StatusCode, Message: msg}
	}
	return a
}

// readBody reads a 2xx body up to the limit without holding more than
// limit+1 bytes; a declared or actual size over it is ErrBodyTooLarge.
func (f *Fetcher) readBody(resp *http.Response) ([]byte, error) {
	if resp.ContentLength > f.o.MaxBodyBytes {
		return nil, ErrBodyTooLarge
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, f.o.MaxBodyBytes+1))
	if int64(len(body)) > f.o.MaxBodyBytes {
		return nil, ErrBodyTooLarge
	}
	return body, err
}

// maxMessageBytes bounds how much of an error body is read for its message.
const maxMessageBytes = 4 << 10

// serverMessage extracts a short message from an error body: FastAPI's
// {"detail": ...} when it is JSON, else the text's first line, shortened.
func serverMessage(r io.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(r, maxMessageBytes))
	var j struct {
		Detail any `json:"detail"`
	}
	if json.Unmarshal(b, &j) == nil && j.Detail != nil {
		if s, ok := j.Detail.(string); ok {
			return shorten(s)
		}
		if d, err := json.Marshal(j.Detail); err == nil {
			return shorten(string(d))
		}
	}
	s := strings.TrimSpace(string(b))
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		s = s[:i]
	}
	return shorten(s)
}

func shorten(s string) string {
	const maxLen = 200
	s = strings.ToValidUTF8(s, "?")
	if len(s) > maxLen {
		s = strings.ToValidUTF8(s[:maxLen], "") + "..."
	}
	return s
}

// redact hides the secrets of the URL in a transport error (user info,
// query values, fragment: internal/redact): a redirect may put a token there
// (protocol §6.3), and a data source's URL may carry one.
func redact(err error) error {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return err
	}
	r := redactpkg.URL(ue.URL)
	if r == ue.URL {
		return err
	}
	c := *ue
	c.URL = r
	return &c
}
