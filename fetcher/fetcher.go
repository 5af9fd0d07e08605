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
	"sync"
	"time"

	"github.com/benbjohnson/clock"

	redactpkg "github.com/opal-go/opal-client/internal/redact"

	"github.com/opal-go/opal-client/config"
	"github.com/opal-go/opal-client/internal/backoff"
)

// Defaults for the zero values of Options.
const (
	DefaultAttemptTimeout = 30 * time.Second
	DefaultMaxBodyBytes   = 100 << 20
	DefaultWarnEvery      = 5 * time.Minute
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
	// WarnEvery rate-limits the WARNING of failed fetches (F9): after one,
	// later failures within WarnEvery log at DEBUG and are counted in the
	// next WARNING (failures_since_last_warning), so a long outage costs one
	// line per WarnEvery, not one per deferred round. 0 means
	// DefaultWarnEvery; negative warns for every failed fetch.
	WarnEvery time.Duration
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
	N        int // 1-based
	Status   int // HTTP status, 0 when none was received
	Class    string
	Err      error // nil on success
	Duration time.Duration
	// Timeout is the attempt's own timeout: the configured one, cut to the
	// fetch's deadline (F7), so the last attempt cannot end past it.
	Timeout       time.Duration
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

	wmu        sync.Mutex
	lastWarn   time.Time // zero: no WARNING since the last success
	suppressed int       // failed fetches logged at DEBUG since lastWarn
}

// New returns a Fetcher, filling the defaults of o.
func New(o Options) *Fetcher {
	f := &Fetcher{o: o, client: o.HTTPClient, clock: o.Clock, rand: o.Rand, log: o.Logger}
	if f.o.Retry == (config.ConnRetryOptions{}) {
		f.o.Retry = config.DefaultPolicyUpdaterConnRetry()
	}
	// F4: no wait below the floor, no fetch over the attempt cap, whatever
	// was configured; said once, at start.
	var changed []string
	f.o.Retry, changed = f.o.Retry.Bounded()
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
	if f.o.WarnEvery == 0 {
		f.o.WarnEvery = DefaultWarnEvery
	}
	for _, c := range changed {
		f.log.Warn("retry configuration out of bounds; adjusted", "change", c,
			"min_wait", config.MinWait, "max_attempts", config.MaxAttempts)
	}
	return f
}

// Bound is B of F7: max(MaxRetryAfter, Retry.WorstCaseTotalWait()). No
// wait starts that would end past B from the fetch's start, so a fetch,
// attempts included, ends within B plus one attempt's timeout. The
// operator's own backoff always fits when attempts answer at once; only
// server hints and slow attempts are cut short.
func (f *Fetcher) Bound() time.Duration {
	return max(f.o.MaxRetryAfter, f.o.Retry.WorstCaseTotalWait())
}

// Fetch fetches the policy bundle r names (protocol §4.1) with the full retry
// policy. The Result is never nil; Result.Bundle is set on success. Errors:
// *RetryableError with Exhausted set (F8), *NonRetryableError or
// *BundlePathNotFound, or the context's error, wrapped.
func (f *Fetcher) Fetch(ctx context.Context, r Request) (*Result, error) {
	var bundle *PolicyBundle
	// The bundle is decoded from the body as it arrives (see streamDecoder).
	stream := streamDecoder(func(body io.Reader) error {
		b, err := DecodeBundleFrom(body)
		bundle = b
		return err
	})
	res, err := f.do(ctx, r.Attempts, func(ctx context.Context) (*http.Request, error) {
		return f.policyRequest(context.WithValue(ctx, streamDecoderKey{}, stream), r)
	}, nil)
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
	attempts = min(attempts, config.MaxAttempts) // F4: Request.Attempts too
	// F7: the fetch, attempts included, ends by this deadline.
	deadline := start.Add(bound + f.o.AttemptTimeout)
	var waited time.Duration
	for n := 1; ; n++ {
		// Each attempt's timeout ends at the deadline at the latest.
		a := f.attempt(ctx, n, min(f.o.AttemptTimeout, deadline.Sub(f.clock.Now())), newRequest, decode)
		res.Attempts = n
		res.LastStatus = a.Status
		res.Elapsed = f.clock.Since(start)
		f.log.Debug("fetch attempt", "attempt", n, "status", a.Status, "class", a.Class, "duration", a.Duration, "error", errText(a.Err))
		if f.o.OnAttempt != nil {
			f.o.OnAttempt(a)
		}
		switch a.Class {
		case ClassSuccess:
			f.recovered()
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
		wait = max(wait, config.MinWait) // F4: a zero draw is no hot loop
		// F7/F8: stop after the last attempt, before a wait that would take
		// the waits of this fetch past the bound, or before one that would
		// end at the deadline: slow attempts cannot stretch the fetch past
		// B plus one attempt's timeout.
		elapsed := f.clock.Since(start)
		if n >= attempts || wait > bound-waited || elapsed+wait >= bound+f.o.AttemptTimeout {
			return res, f.exhausted(a, res)
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
	// backoff.Up: a broken source cannot go below the hint nor past the cap.
	return backoff.Up(h, f.o.MaxRetryAfter, f.rand())
}

// exhausted ends a fetch with its last answer's error, marked exhausted
// (F8). The hint it hands the scheduler (F7) is that answer's own: an
// earlier Retry-After has been waited out by the attempts after it, so a
// server that said "30" and then answered 503 without a hint is deferred
// by D2's rounds, not by the spent 30 s again.
func (f *Fetcher) exhausted(a Attempt, res *Result) error {
	var e *RetryableError
	if !errors.As(a.Err, &e) {
		e = &RetryableError{Status: a.Status, Err: a.Err}
	}
	out := *e
	out.Exhausted = true
	out.RetryAfter, out.HasRetryAfter = a.RetryAfter, a.HasRetryAfter
	f.warn(a, res)
	return &out
}

// warn is the one WARNING of a failed fetch (F9), rate-limited by
// WarnEvery: a failure within WarnEvery of the last WARNING logs at DEBUG
// and is counted in the next WARNING.
func (f *Fetcher) warn(a Attempt, res *Result) {
	class := a.Class
	switch class {
	case ClassTimeout, ClassInvalidBody:
		class = ClassRetryable
	}
	args := []any{"class", class, "attempts", res.Attempts, "elapsed", res.Elapsed, "status", a.Status, "error", errText(a.Err)}
	now := f.clock.Now()
	f.wmu.Lock()
	quiet := f.o.WarnEvery > 0 && !f.lastWarn.IsZero() && now.Sub(f.lastWarn) < f.o.WarnEvery
	var since int
	if quiet {
		f.suppressed++
	} else {
		since, f.suppressed, f.lastWarn = f.suppressed, 0, now
	}
	f.wmu.Unlock()
	if quiet {
		f.log.Debug("fetch failed", args...)
		return
	}
	if since > 0 {
		args = append(args, "failures_since_last_warning", since)
	}
	f.log.Warn("fetch failed", args...)
}

// recovered ends the rate limit of warn: the first failure after a success
// warns at once.
func (f *Fetcher) recovered() {
	f.wmu.Lock()
	f.lastWarn, f.suppressed = time.Time{}, 0
	f.wmu.Unlock()
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// attempt sends one request and classifies the answer (F1, F2).
func (f *Fetcher) attempt(ctx context.Context, n int, timeout time.Duration, newRequest func(context.Context) (*http.Request, error), decode func([]byte) error) (a Attempt) {
	a.N, a.Timeout = n, timeout
	start := f.clock.Now()
	defer func() { a.Duration = f.clock.Since(start) }()

	// The timeout runs on the injected clock and covers the body: cancelling
	// the request's context aborts a stalled read. (A context deadline would
	// be read by the dialer as a wall-clock time, wrong under a mock clock.)
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	timer := f.clock.AfterFunc(timeout, func() { cancel(ErrAttemptTimeout) })
	defer timer.Stop()

	transportErr := func(status int, err error) Attempt {
		switch {
		case ctx.Err() != nil:
			a.Class, a.Err = ClassCancelled, ctx.Err()
		case errors.Is(context.Cause(actx), ErrAttemptTimeout):
			a.Class = ClassTimeout
			a.Err = &RetryableError{Status: status, Message: fmt.Sprintf("no complete answer within %s", timeout), Err: ErrAttemptTimeout}
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
		body, derr := f.readBody(req, resp, decode)
		switch {
		case errors.Is(body.err, ErrBodyTooLarge):
			a.Class = ClassNonRetryable
			a.Err = &NonRetryableError{Status: resp.StatusCode, Message: fmt.Sprintf("body over %d bytes", f.o.MaxBodyBytes), Err: ErrBodyTooLarge}
			return a
		case body.err != nil:
			return transportErr(resp.StatusCode, body.err)
		}
		if derr != nil {
			a.Class = ClassInvalidBody
			a.Err = &RetryableError{Status: resp.StatusCode, Message: "undecodable body", Err: derr}
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

// streamDecoder decodes a 2xx body as it is read. Fetch puts one on its
// requests' context (streamDecoderKey) so a bundle is never held as raw text
// beside its decoded form; Do's decode funcs get the body whole instead.
type streamDecoder func(io.Reader) error

type streamDecoderKey struct{}

// readBody hands a 2xx body to the request's stream decoder, or reads it
// whole for decode, through a limitedBody: no more than MaxBodyBytes+1 bytes
// are ever read. A body of declared length (Content-Length, at most the
// limit) is streamed to the decoder, or read into one buffer of that size.
// A chunked body is first spooled whole in chunks that are never copied nor
// grown, so refusing one over the limit costs the limit and no more (a
// decoder's doubling buffer would cost up to twice that); the spool is then
// decoded, its chunks released as they are consumed. The returned
// limitedBody's err is the read's own failure (ErrBodyTooLarge, declared or
// met while reading, or the transport's error), which the caller classifies
// before the decoder's error.
func (f *Fetcher) readBody(req *http.Request, resp *http.Response, decode func([]byte) error) (*limitedBody, error) {
	body := &limitedBody{r: resp.Body, left: f.o.MaxBodyBytes}
	if resp.ContentLength > f.o.MaxBodyBytes {
		body.err = ErrBodyTooLarge
		return body, body.err
	}
	stream, streaming := req.Context().Value(streamDecoderKey{}).(streamDecoder)
	if resp.ContentLength >= 0 {
		if streaming {
			return body, stream(body)
		}
		b := make([]byte, resp.ContentLength)
		if _, err := io.ReadFull(body, b); err != nil {
			return body, err
		}
		return body, decode(b)
	}
	sp, err := readSpool(body, f.o.MaxBodyBytes+1)
	if err != nil {
		return body, err
	}
	if streaming {
		return body, stream(sp)
	}
	return body, decode(sp.bytes())
}

// spool is a body read whole in chunks; as an io.Reader it yields them in
// turn and drops each once consumed.
type spool struct {
	chunks [][]byte
	n      int
}

const (
	spoolFirstChunk = 32 << 10
	spoolMaxChunk   = 1 << 20
)

// readSpool reads r to its end in chunks of growing size (32 KiB doubling
// to 1 MiB), so a small body costs little and a large one at most 1 MiB
// more than its size; no chunk reaches past most bytes in all, so a body
// cut there costs most bytes.
func readSpool(r io.Reader, most int64) (*spool, error) {
	sp := &spool{}
	size := spoolFirstChunk
	for {
		c := make([]byte, max(min(int64(size), most-int64(sp.n)), 1))
		n, err := io.ReadFull(r, c)
		if n > 0 {
			sp.chunks = append(sp.chunks, c[:n])
			sp.n += n
		}
		switch err {
		case nil:
			size = min(2*size, spoolMaxChunk)
		case io.EOF, io.ErrUnexpectedEOF: // the end; r's own failures are in limitedBody.err
			return sp, nil
		default:
			return sp, err
		}
	}
}

func (sp *spool) Read(p []byte) (int, error) {
	for len(sp.chunks) > 0 && len(sp.chunks[0]) == 0 {
		sp.chunks[0] = nil
		sp.chunks = sp.chunks[1:]
	}
	if len(sp.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, sp.chunks[0])
	sp.chunks[0] = sp.chunks[0][n:]
	return n, nil
}

// bytes joins the chunks into one slice, dropping each as it is copied.
func (sp *spool) bytes() []byte {
	if len(sp.chunks) == 1 {
		return sp.chunks[0]
	}
	out := make([]byte, 0, sp.n)
	for i, c := range sp.chunks {
		out = append(out, c...)
		sp.chunks[i] = nil
	}
	return out
}

// limitedBody reads at most left bytes of r. Reading past them fails with
// ErrBodyTooLarge after at most one byte more; that error and any other
// failure of r (not io.EOF) stay in err and end every later read.
type limitedBody struct {
	r    io.Reader
	left int64
	err  error
}

func (l *limitedBody) Read(p []byte) (int, error) {
	if l.err != nil {
		return 0, l.err
	}
	// One byte more than allowed tells "over" from "at" the limit.
	if int64(len(p)) > l.left+1 {
		p = p[:l.left+1]
	}
	n, err := l.r.Read(p)
	if int64(n) > l.left {
		n, l.left, l.err = int(l.left), 0, ErrBodyTooLarge
		return n, l.err
	}
	l.left -= int64(n)
	if err != nil && err != io.EOF {
		l.err = err
	}
	return n, err
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
