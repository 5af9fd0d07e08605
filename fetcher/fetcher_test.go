package fetcher

import (
	"context"
	"errors"
	"math"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/opal-go/opal-client/config"
)

// The behaviour table of the reviewed upstream retry change (F1, F2, F4, F8): the server always gives
// the same answer; the fetch uses fixed 1 s x 3 attempts and a 60 s cap.
func TestF1_Classification(t *testing.T) {
	ra := func(v string) map[string]string { return map[string]string{"Retry-After": v} }
	cases := []struct {
		name      string
		answer    answer
		refused   bool
		requests  int
		waits     []time.Duration
		wantClass string
		nonRetry  bool
		notFound  bool
		status    int
		hint      time.Duration // exhausted error's hint; -1 = none
		msg       string
	}{
		// Mutation caught: drop the Retry-After parse for 503 -> waits 1 s.
		{name: "F1_503_retry_after_30", answer: answer{503, ra("30"), `{"detail":"clone in progress"}`},
			requests: 3, waits: secs(30, 30), wantClass: ClassRetryable, status: 503, hint: 30 * time.Second, msg: "clone in progress"},
		{name: "F1_503_retry_after_5", answer: answer{503, ra("5"), `{"detail":"clone unavailable"}`},
			requests: 3, waits: secs(5, 5), wantClass: ClassRetryable, status: 503, hint: 5 * time.Second},
		{name: "F1_503_without_retry_after", answer: answer{503, nil, ""},
			requests: 3, waits: secs(1, 1), wantClass: ClassRetryable, status: 503, hint: -1},
		// Mutation caught: 429 not in the hinted case.
		{name: "F1_429_retry_after_2", answer: answer{429, ra("2"), "slow down"},
			requests: 3, waits: secs(2, 2), wantClass: ClassRetryable, status: 429, hint: 2 * time.Second},
		// Mutation caught: 409 treated as retryable (3 requests).
		{name: "F1_409_one_request", answer: answer{409, nil, `{"detail":"branch unresolved"}`},
			requests: 1, wantClass: ClassNonRetryable, nonRetry: true, status: 409, msg: "branch unresolved"},
		// Mutation caught: 404 case removed (becomes retryable).
		{name: "F1_404_one_request", answer: answer{404, nil, `{"detail":"requested paths not found: x"}`},
			requests: 1, wantClass: ClassNonRetryable, nonRetry: true, notFound: true, status: 404},
		{name: "F1_500_retried", answer: answer{500, nil, "Internal Server Error"},
			requests: 3, waits: secs(1, 1), wantClass: ClassRetryable, status: 500, hint: -1},
		// A 502's Retry-After is not honoured: only 503 and 429 carry hints.
		{name: "F1_502_retried", answer: answer{502, ra("30"), "<html>Bad Gateway</html>"},
			requests: 3, waits: secs(1, 1), wantClass: ClassRetryable, status: 502, hint: -1, msg: "<html>Bad Gateway</html>"},
		{name: "F1_connection_refused", refused: true,
			requests: 0, waits: secs(1, 1), wantClass: ClassConnectionError, status: 0, hint: -1},
		// F4+F7: the hostile hint is capped at 60 s; the second 60 s wait
		// would pass the 60 s bound, so the fetch ends after 2 attempts.
		{name: "F4_hostile_retry_after_99999", answer: answer{503, ra("99999"), ""},
			requests: 2, waits: secs(60), wantClass: ClassRetryable, status: 503, hint: 99999 * time.Second},
		{name: "F2_non_json_error_body", answer: answer{503, nil, "<html>\n<h1>Service Unavailable</h1></html>"},
			requests: 3, waits: secs(1, 1), wantClass: ClassRetryable, status: 503, hint: -1, msg: "<html>"},
		{name: "F2_binary_error_body", answer: answer{503, nil, "\xff\xfe\x00garbage"},
			requests: 3, waits: secs(1, 1), wantClass: ClassRetryable, status: 503, hint: -1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, url := serve(t, tc.answer)
			if tc.refused {
				srv := httptest.NewServer(nil)
				url = srv.URL
				srv.Close()
			}
			r := newRig(t, url, nil)
			res, err := fetch(t, r, Request{Paths: []string{"."}})
			if !tc.refused && s.count() != tc.requests {
				t.Errorf("requests = %d, want %d", s.count(), tc.requests)
			}
			if !reflect.DeepEqual(r.waits(), tc.waits) {
				t.Errorf("waits = %v, want %v", r.waits(), tc.waits)
			}
			if last := r.tries[len(r.tries)-1]; last.Class != tc.wantClass {
				t.Errorf("last class = %q, want %q", last.Class, tc.wantClass)
			}
			if res.LastStatus != tc.status {
				t.Errorf("LastStatus = %d, want %d", res.LastStatus, tc.status)
			}
			if strings.Contains(err.Error(), testToken) {
				t.Errorf("error text leaks the token: %v", err)
			}
			if tc.msg != "" && !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not carry the server's message %q", err, tc.msg)
			}
			var nre *NonRetryableError
			var nf *BundlePathNotFound
			var re *RetryableError
			if got := errors.As(err, &nre); got != tc.nonRetry {
				t.Fatalf("errors.As(NonRetryableError) = %v, want %v (err %v)", got, tc.nonRetry, err)
			}
			if got := errors.As(err, &nf); got != tc.notFound {
				t.Fatalf("errors.As(BundlePathNotFound) = %v, want %v", got, tc.notFound)
			}
			if tc.nonRetry {
				if nre.Status != tc.status {
					t.Errorf("status = %d, want %d", nre.Status, tc.status)
				}
				return
			}
			if !errors.As(err, &re) || !re.Exhausted || re.Status != tc.status {
				t.Fatalf("err = %#v, want exhausted RetryableError with status %d", err, tc.status)
			}
			if tc.hint < 0 && re.HasRetryAfter || tc.hint >= 0 && (!re.HasRetryAfter || re.RetryAfter != tc.hint) {
				t.Errorf("hint = %v/%v, want %v", re.RetryAfter, re.HasRetryAfter, tc.hint)
			}
		})
	}
}

// F4: wait = max(hint capped at MaxRetryAfter, configured backoff).
func TestF4_Wait(t *testing.T) {
	ra := func(v string) answer { return answer{503, map[string]string{"Retry-After": v}, ""} }
	cases := []struct {
		name   string
		answer answer
		edit   func(*Options)
		waits  []time.Duration
	}{
		// Mutation caught: "min(a.RetryAfter, f.o.MaxRetryAfter)" -> "a.RetryAfter".
		{"F4_hint_capped_at_max", ra("20"), func(o *Options) { o.MaxRetryAfter = 3 * time.Second; o.Retry.WaitTime = 0 },
			secs(3)},
		// Mutation caught: max(...) -> hint only.
		{"F4_backoff_wins_when_longer", ra("1"), func(o *Options) { o.Retry.WaitTime = 4 * time.Second },
			secs(4, 4)},
		// Mutation caught: max(...) -> backoff only.
		{"F4_hint_wins_when_longer", ra("7"), nil, secs(7, 7)},
		// MAX_RETRY_AFTER=0 honours no hint and still retries.
		{"F4_max_retry_after_zero_ignores_hint", ra("30"), func(o *Options) { o.MaxRetryAfter = 0 }, secs(1, 1)},
		{"F4_retry_after_zero_is_backoff", ra("0"), nil, secs(1, 1)},
		{"F4_random_exponential_draw", answer{503, nil, ""}, func(o *Options) {
			o.Retry = config.ConnRetryOptions{WaitStrategy: config.WaitRandomExponential, WaitTime: 2 * time.Second, MaxWait: 10 * time.Second, Attempts: 3}
		}, secs(1, 2)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, url := serve(t, tc.answer)
			r := newRig(t, url, tc.edit)
			_, err := fetch(t, r, Request{})
			var re *RetryableError
			if !errors.As(err, &re) {
				t.Fatalf("err = %v", err)
			}
			if !reflect.DeepEqual(r.waits(), tc.waits) {
				t.Errorf("waits = %v, want %v", r.waits(), tc.waits)
			}
		})
	}
}

// F7: the waits of one fetch add up to at most max(MaxRetryAfter, worst case).
func TestF7_Bound(t *testing.T) {
	fixed := func(wait float64, attempts int) config.ConnRetryOptions {
		return config.ConnRetryOptions{WaitStrategy: config.WaitFixed, WaitTime: secs(wait)[0], Attempts: attempts}
	}
	cases := []struct {
		name     string
		answer   answer
		edit     func(*Options)
		attempts int
		waits    []time.Duration
	}{
		// The operator-budget floor. Mutation caught: bound = MaxRetryAfter only
		// (then 0.2+0.2 > 0.3 and only 2 attempts run).
		{"F7_operator_budget_floor", answer{503, nil, ""}, func(o *Options) {
			o.Retry = fixed(0.2, 5)
			o.MaxRetryAfter = 300 * time.Millisecond
		}, 5, secs(0.2, 0.2, 0.2, 0.2)},
		// Mutation caught: "wait > bound-waited" -> "wait > bound" (hints of
		// 2 s would then run all 5 attempts, 8 s of waiting).
		{"F7_hints_bounded", answer{503, map[string]string{"Retry-After": "99999"}, ""}, func(o *Options) {
			o.Retry = fixed(0.2, 5)
			o.MaxRetryAfter = 2 * time.Second
		}, 2, secs(2)},
		// A wait that exactly fills the bound is allowed. Mutation caught: ">" -> ">=".
		{"F7_exact_fill_allowed", answer{503, map[string]string{"Retry-After": "1.5"}, ""}, func(o *Options) {
			o.Retry = fixed(0.5, 4)
			o.MaxRetryAfter = 3 * time.Second
		}, 3, secs(1.5, 1.5)},
		// Mutation caught: "n >= attempts" -> "n > attempts".
		{"F8_stops_after_last_attempt", answer{500, nil, ""}, func(o *Options) { o.Retry = fixed(0, 2) }, 2, secs(0.1)}, // 0 s raised to the F4 floor
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, url := serve(t, tc.answer)
			r := newRig(t, url, tc.edit)
			res, err := fetch(t, r, Request{})
			var re *RetryableError
			if !errors.As(err, &re) || !re.Exhausted {
				t.Fatalf("err = %v, want exhausted", err)
			}
			if s.count() != tc.attempts || res.Attempts != tc.attempts {
				t.Errorf("requests %d, Result.Attempts %d, want %d", s.count(), res.Attempts, tc.attempts)
			}
			if !reflect.DeepEqual(r.waits(), tc.waits) {
				t.Errorf("waits = %v, want %v", r.waits(), tc.waits)
			}
			var total time.Duration
			for _, w := range r.waits() {
				total += w
			}
			if total > r.f.Bound() {
				t.Errorf("waited %v, over the bound %v", total, r.f.Bound())
			}
			if res.Elapsed != total {
				t.Errorf("Elapsed = %v, want %v (mock time)", res.Elapsed, total)
			}
		})
	}
}

// F8: success ends the fetch; so does the first non-retryable answer.
func TestF8_Ends(t *testing.T) {
	ra1 := map[string]string{"Retry-After": "1"}
	t.Run("F8_recovers_after_503", func(t *testing.T) {
		s, url := serve(t, answer{503, ra1, ""}, answer{503, ra1, ""}, ok())
		r := newRig(t, url, nil)
		res, err := fetch(t, r, Request{Paths: []string{"."}})
		if err != nil || res.Bundle == nil || res.Bundle.Hash != "2222" || res.Attempts != 3 || s.count() != 3 {
			t.Fatalf("res %+v err %v requests %d", res, err, s.count())
		}
		if res.LastStatus != 200 || r.warnings() != 0 {
			t.Errorf("LastStatus %d, warnings %d", res.LastStatus, r.warnings())
		}
	})
	// Mutation caught: non-retryable case falls through to the retry path.
	t.Run("F8_first_non_retryable_ends", func(t *testing.T) {
		s, url := serve(t, answer{503, nil, ""}, answer{409, nil, ""}, ok())
		r := newRig(t, url, nil)
		_, err := fetch(t, r, Request{})
		var nre *NonRetryableError
		if !errors.As(err, &nre) || nre.Status != 409 || s.count() != 2 {
			t.Fatalf("err %v requests %d", err, s.count())
		}
	})
	// A 200 whose body is not a bundle is a truncated transfer: retryable.
	t.Run("F1_invalid_bundle_is_retryable", func(t *testing.T) {
		s, url := serve(t, answer{200, nil, `{"manifest":["a"],"hash":`}, ok())
		r := newRig(t, url, nil)
		res, err := fetch(t, r, Request{})
		if err != nil || s.count() != 2 || r.tries[0].Class != ClassInvalidBody {
			t.Fatalf("err %v requests %d tries %+v", err, s.count(), r.tries)
		}
		if !errors.Is(r.tries[0].Err, ErrInvalidBundle) {
			t.Errorf("first attempt err = %v, want ErrInvalidBundle", r.tries[0].Err)
		}
		_ = res
	})
}

// F9: per-attempt lines are DEBUG; exactly one WARNING per failed fetch.
func TestF9_Logging(t *testing.T) {
	cases := []struct {
		name  string
		ans   []answer
		warns int
		class string
	}{
		{"F9_exhausted_one_warning", []answer{{503, nil, ""}}, 1, "class=retryable"},
		{"F9_non_retryable_one_warning", []answer{{409, nil, ""}}, 1, "class=non_retryable"},
		{"F9_success_no_warning", []answer{{500, nil, ""}, ok()}, 0, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, url := serve(t, tc.ans...)
			r := newRig(t, url, nil)
			_, _ = fetch(t, r, Request{})
			if got := r.warnings(); got != tc.warns {
				t.Errorf("warnings = %d, want %d:\n%s", got, tc.warns, r.logs)
			}
			if !strings.Contains(r.logs.String(), tc.class) {
				t.Errorf("log lacks %q:\n%s", tc.class, r.logs)
			}
			if strings.Count(r.logs.String(), "level=DEBUG") != len(r.tries) {
				t.Errorf("want one DEBUG line per attempt:\n%s", r.logs)
			}
			if strings.Contains(r.logs.String(), testToken) {
				t.Error("log leaks the token")
			}
		})
	}
	t.Run("F9_connection_error_class", func(t *testing.T) {
		srv := httptest.NewServer(nil)
		srv.Close()
		r := newRig(t, srv.URL, nil)
		_, _ = fetch(t, r, Request{})
		if r.warnings() != 1 || !strings.Contains(r.logs.String(), "class=connection_error") {
			t.Errorf("logs:\n%s", r.logs)
		}
	})
}

// F10: every attempt reaches OnAttempt, every wait reaches OnRetry.
func TestF10_Hooks(t *testing.T) {
	_, url := serve(t, answer{503, map[string]string{"Retry-After": "2"}, ""}, answer{500, nil, ""}, ok())
	r := newRig(t, url, nil)
	if _, err := fetch(t, r, Request{}); err != nil {
		t.Fatal(err)
	}
	var classes []string
	for _, a := range r.tries {
		classes = append(classes, a.Class)
	}
	if want := []string{ClassRetryable, ClassRetryable, ClassSuccess}; !reflect.DeepEqual(classes, want) {
		t.Errorf("attempt classes = %v, want %v", classes, want)
	}
	if len(r.retries) != 2 || r.retries[0].Attempt != 1 || r.retries[0].Outcome.Status != 503 ||
		!r.retries[0].Outcome.HasRetryAfter || r.retries[1].Attempt != 2 || r.retries[1].Wait != time.Second {
		t.Errorf("retries = %+v", r.retries)
	}
}

// Protocol §4.1: repeated path, base_hash only when known, the scoped
// endpoint, the Bearer token and content-type.
func TestRequest_Protocol41(t *testing.T) {
	cases := []struct {
		name, scope, token string
		req                Request
		path, query, auth  string
	}{
		{"P41_repeated_paths_no_base_hash", "", testToken, Request{Paths: []string{"a", "b/c"}},
			"/policy", "path=a&path=b%2Fc", "Bearer " + testToken},
		{"P41_base_hash_when_known", "default", testToken, Request{Paths: []string{"."}, BaseHash: "abc"},
			"/policy", "base_hash=abc&path=.", "Bearer " + testToken},
		{"P41_scoped_endpoint", "tenant 1", testToken, Request{Paths: []string{"."}},
			"/scopes/tenant%201/policy", "path=.", "Bearer " + testToken},
		{"P41_no_token_no_header", "", "", Request{}, "/policy", "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, url := serve(t, ok())
			r := newRig(t, url+"/", func(o *Options) { o.ScopeID = tc.scope; o.Token = tc.token })
			if _, err := fetch(t, r, tc.req); err != nil {
				t.Fatal(err)
			}
			got := s.reqs[0]
			if got.URL.EscapedPath() != tc.path || got.URL.RawQuery != tc.query || got.Header.Get("Authorization") != tc.auth {
				t.Errorf("got %s ?%s auth %q", got.URL.EscapedPath(), got.URL.RawQuery, got.Header.Get("Authorization"))
			}
			if got.Method != "GET" || got.Header.Get("Content-Type") != "text/plain" {
				t.Errorf("method %s content-type %q", got.Method, got.Header.Get("Content-Type"))
			}
		})
	}
}

// Cancelling the context ends the fetch promptly, during a wait too.
func TestCancel_DuringWait(t *testing.T) {
	_, url := serve(t, answer{503, map[string]string{"Retry-After": "30"}, ""})
	ctx, cancel := context.WithCancel(context.Background())
	r := newRig(t, url, nil)
	r.f.o.OnRetry = func(Retry) { cancel() } // never advances the clock
	res, err := r.f.Fetch(ctx, Request{})
	if !errors.Is(err, context.Canceled) || res.Attempts != 1 {
		t.Fatalf("err %v attempts %d", err, res.Attempts)
	}
	if r.warnings() != 0 {
		t.Errorf("a cancelled fetch is not a failure to warn about:\n%s", r.logs)
	}
}

// F4 with hint jitter (the default): the capped hint is a floor, the wait is
// drawn from [h, h+min(h, cap-h)], so a fleet told the same Retry-After
// does not return in lockstep, and no wait passes the cap.
func TestF4_HintJitter(t *testing.T) {
	cases := []struct {
		name string
		ra   string
		draw float64
		want time.Duration
	}{
		// Mutation caught: "h + time.Duration(f.rand()*...)" -> "h" (no spread).
		{"F4_hint_spread_upwards", "20", 1, 40 * time.Second},
		// Mutation caught: the spread drawn below the hint (h - ...).
		{"F4_hint_is_a_floor", "30", 0, 30 * time.Second},
		// Mutation caught: "min(h, cap-h)" -> "h" (a 50 s hint would wait 100 s).
		{"F4_spread_never_passes_the_cap", "50", 1, 60 * time.Second},
		{"F4_capped_hint_has_no_room", "99999", 1, 60 * time.Second},
		// A broken random source stays in [h, cap]. Mutations caught:
		// "!(r >= 0)" -> "r < 0" (NaN), -> "false" (negative); no "min(r, 1)".
		{"nan_draw_is_the_hint", "20", math.NaN(), 20 * time.Second},
		{"negative_draw_is_the_hint", "20", -1, 20 * time.Second},
		{"draw_above_one_is_the_cap", "50", 7, 60 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, url := serve(t, answer{503, map[string]string{"Retry-After": tc.ra}, ""})
			r := newRig(t, url, func(o *Options) {
				o.NoHintJitter = false
				o.Rand = func() float64 { return tc.draw }
				o.Retry.Attempts = 2
				o.Retry.WaitTime = 0
			})
			fetch(t, r, Request{})
			if got := r.waits(); len(got) != 1 || got[0] != tc.want {
				t.Errorf("waits = %v, want [%v]", got, tc.want)
			}
		})
	}
}

// F8 with Request.Attempts: a deferred re-fetch makes exactly one request and
// ends exhausted with the server's hint. Mutation caught: ignore r.Attempts.
func TestF8_RequestAttemptsOverride(t *testing.T) {
	s, url := serve(t, answer{503, map[string]string{"Retry-After": "30"}, ""})
	r := newRig(t, url, nil)
	_, err := fetch(t, r, Request{Attempts: 1})
	var re *RetryableError
	if !errors.As(err, &re) || !re.Exhausted || re.RetryAfter != 30*time.Second {
		t.Fatalf("err = %v, want exhausted retryable with a 30 s hint", err)
	}
	if n := s.count(); n != 1 {
		t.Errorf("requests = %d, want 1", n)
	}
}

// §6.3: no URL query value reaches an error or a log line, whether the
// URL parses (a redirect's target) or not (a control byte in it).
func TestRedact_QueryNotShown(t *testing.T) {
	const secret = "SECRET-Q"
	redirect := func(t *testing.T) string {
		_, url := serve(t, answer{302, map[string]string{"Location": "http://127.0.0.1:1/x?token=" + secret}, ""})
		return url
	}
	cases := []struct {
		name string
		url  func(t *testing.T) string
	}{
		// Mutation caught: the parsed URL's query kept.
		{"redirect_target_query_dropped", redirect},
		// Mutation caught: no cut at '?' when the URL does not parse.
		{"unparsable_url_cut_by_hand", func(*testing.T) string { return "http://h/x?token=" + secret + "\x7f" }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, tc.url(t), nil)
			_, err := fetch(t, r, Request{Attempts: 1})
			if err == nil {
				t.Fatal("fetch succeeded")
			}
			if strings.Contains(err.Error(), secret) || strings.Contains(r.logs.String(), secret) {
				t.Errorf("query leaked:\nerror: %v\nlogs: %s", err, r.logs)
			}
			if !strings.Contains(err.Error(), "xxxxx") {
				t.Errorf("error %q does not show the query was cut", err)
			}
		})
	}
}

// F7/F8: an exhausted fetch hands the scheduler the hint of its last
// answer, not one its later attempts already waited out.
func TestF8_ExhaustedHint(t *testing.T) {
	ra := func(v string) map[string]string { return map[string]string{"Retry-After": v} }
	for _, tc := range []struct {
		name    string
		answers []answer
		hint    time.Duration // -1: none
	}{
		// Mutation "a.HasRetryAfter" -> "true": the answer without a hint
		// hands on a zero one.
		{"F8_last_answer_without_hint_hands_none", []answer{{503, ra("2"), ""}, {503, nil, ""}}, -1},
		// Mutation "= 0, false": the last answer's hint dropped.
		{"F8_last_answer_hint_handed", []answer{{503, nil, ""}, {503, ra("7"), ""}}, 7 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, url := serve(t, tc.answers...)
			r := newRig(t, url, func(o *Options) { o.Retry.Attempts = 2 })
			_, err := fetch(t, r, Request{})
			var re *RetryableError
			if !errors.As(err, &re) || !re.Exhausted {
				t.Fatalf("err = %v, want an exhausted RetryableError", err)
			}
			if got := map[bool]time.Duration{true: re.RetryAfter, false: -1}[re.HasRetryAfter]; got != tc.hint {
				t.Fatalf("handed hint %v (has %v), want %v", re.RetryAfter, re.HasRetryAfter, tc.hint)
			}
		})
	}
}
