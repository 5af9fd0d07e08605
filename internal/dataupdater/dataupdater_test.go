package dataupdater_test

import (
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/opal-go/opal-client/internal/dataupdater"
)

func entry(url, dst string) string {
	return `{"url":"` + url + `","topics":["policy_data"],"dst_path":"` + dst + `"}`
}

func update(entries ...string) string {
	s := `{"id":"u1","reason":"test","entries":[`
	for i, e := range entries {
		if i > 0 {
			s += ","
		}
		s += e
	}
	return s + `]}`
}

// TestTopics: an entry is processed only if one of its topics is subscribed,
// exactly (protocol §6.2); no topics means policy_data.
func TestTopics(t *testing.T) {
	cases := []struct {
		name    string
		topics  []string
		entry   string
		written bool
	}{
		{"exact_match", []string{"policy_data"}, `{"url":"","data":{"a":1},"topics":["policy_data"],"dst_path":"/x"}`, true},
		// Guards the default topic (mutation: nil topics match nothing).
		{"default_topic", []string{"policy_data"}, `{"url":"","data":{"a":1},"dst_path":"/x"}`, true},
		// Guards exact matching (mutation: matches returns true).
		{"other_topic_skipped", []string{"policy_data"}, `{"url":"","data":{"a":1},"topics":["billing"],"dst_path":"/x"}`, false},
		{"prefix_is_not_match", []string{"policy_data/users"}, `{"url":"","data":{"a":1},"topics":["policy_data"],"dst_path":"/x"}`, false},
		{"scoped", []string{"s1:data:policy_data"}, `{"url":"","data":{"a":1},"topics":["s1:data:policy_data"],"dst_path":"/x"}`, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				r := newRig(t, rigOpt{topics: tc.topics, noSources: true})
				r.notify(update(tc.entry))
				want := `null`
				if tc.written {
					want = `{"x":{"a":1}}`
				}
				r.wantDoc(want)
			})
		})
	}
	if got := dataupdater.NotifyTopic("tenant1::policy_data"); got != "policy_data" {
		t.Errorf("NotifyTopic = %q", got)
	}
}

// TestDecode: bad messages and entries are refused without a write, and
// never panic.
func TestDecode(t *testing.T) {
	cases := []struct{ name, msg, outcome string }{
		{"not_json", `{"entries":`, ""},
		{"null", `null`, ""},
		{"bad_save_method", update(`{"url":"","data":{},"save_method":"POST","dst_path":"/x"}`), dataupdater.OutcomeInvalid},
		{"no_url_no_data", update(`{"url":"","dst_path":"/x"}`), dataupdater.OutcomeInvalid},
		{"patch_not_array", update(`{"url":"","data":{"op":"add"},"save_method":"PATCH","dst_path":"/x"}`), dataupdater.OutcomeInvalid},
		{"patch_unknown_op", update(`{"url":"","data":[{"op":"frob","path":"/a"}],"save_method":"PATCH","dst_path":"/x"}`), dataupdater.OutcomeInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				r := newRig(t, rigOpt{noSources: true})
				r.notify(tc.msg)
				r.wantDoc(`null`)
				got := r.outcomesList()
				if tc.outcome == "" && len(got) != 0 || tc.outcome != "" && !slices.Equal(got, []string{tc.outcome}) {
					t.Fatalf("outcomes %v, want [%s]", got, tc.outcome)
				}
			})
		})
	}
}

// TestBaseData: on connect the sources config is fetched with the client
// token (redirects followed), its entries are fetched WITHOUT the token
// (only their own headers), and written (protocol §6.3, §6.4).
func TestBaseData(t *testing.T) {
	bubble(t, func(t *testing.T) {
		r := newRig(t, rigOpt{})
		r.src.set("/data/config", reply{status: 307, location: "http://ext/config?token=jwt"})
		r.src.set("/config", reply{status: 200, body: `{"entries":[` +
			`{"url":"http://src/roles","config":{"headers":{"X-Api-Key":"k"}},"topics":["policy_data"],"dst_path":"/roles"},` +
			`{"url":"http://src/users","topics":["policy_data"],"dst_path":"/users","save_method":"PUT"}]}`})
		r.src.set("/roles", reply{status: 200, body: `{"admin":["read"]}`})
		r.src.set("/users", reply{status: 200, body: `["bob"]`})
		r.du.OnConnect()
		r.wantDoc(`{"roles":{"admin":["read"]},"users":["bob"]}`)
		if c := r.src.requests("/data/config"); len(c) != 1 || c[0].Header.Get("Authorization") != "Bearer "+token {
			t.Fatalf("config request: %v", c)
		}
		// Never the client token to a data source: guards fetchSource
		// (mutation: set Authorization from the token).
		for _, p := range []string{"/roles", "/users"} {
			for _, q := range r.src.requests(p) {
				if q.Header.Get("Authorization") != "" {
					t.Fatalf("%s got Authorization %q", p, q.Header.Get("Authorization"))
				}
			}
		}
		if q := r.src.requests("/roles"); len(q) != 1 || q[0].Header.Get("X-Api-Key") != "k" {
			t.Fatalf("entry headers not sent")
		}
		txs := r.transactions()
		if len(txs) != 2 || !txs[0].Success || txs[0].Type != dataupdater.TypeData || txs[0].Actions[0] != dataupdater.ActionSet {
			t.Fatalf("transactions %+v", txs)
		}
	})
}

// TestF4_RetryAfter: a source that answers 429 with Retry-After, then 200,
// is fetched again within the one fetch: not before the hint, and by twice
// the hint (F4: the hint is a floor, spread upwards within the cap).
func TestF4_RetryAfter(t *testing.T) {
	bubble(t, func(t *testing.T) {
		r := newRig(t, rigOpt{noSources: true})
		r.src.set("/roles", reply{status: 429, retryAfter: "3"}, reply{status: 200, body: `{"a":1}`})
		r.notify(update(entry("http://src/roles", "/roles")))
		r.advance(2900 * time.Millisecond)
		if n := len(r.src.requests("/roles")); n != 1 {
			t.Fatalf("%d requests before the hint ran out, want 1", n)
		}
		r.advance(3200 * time.Millisecond)
		r.wantDoc(`{"roles":{"a":1}}`)
	})
}

// TestFetchBound: a source that hangs is cut by the attempt timeout, and the
// whole fetch by OPAL_FETCHING_CALLBACK_TIMEOUT (10 s here); the entry fails
// and arms its own deferral.
func TestFetchBound(t *testing.T) {
	bubble(t, func(t *testing.T) {
		r := newRig(t, rigOpt{noSources: true, reschedule: true,
			retry: cfgFixed(5*time.Second, 10)})
		r.src.set("/roles", reply{hang: true})
		r.notify(update(entry("http://src/roles", "/roles")))
		r.advance(9900 * time.Millisecond)
		if got := r.outcomesList(); len(got) != 0 {
			t.Fatalf("ended before the bound: %v", got)
		}
		// Guards the whole-fetch bound (mutation: FetchTimeout timer never fires).
		r.advance(200 * time.Millisecond)
		if got := r.outcomesList(); !slices.Equal(got, []string{dataupdater.OutcomeFetchFailed}) {
			t.Fatalf("outcomes %v", got)
		}
		if e, n := r.q.DataDeferrals(); e != 1 || n != 1 {
			t.Fatalf("deferred entries %d timers %d, want 1 1", e, n)
		}
	})
}

// TestD1_OneTimerPerEntry: a source that stays down arms one deferral for
// its entry, whose re-fetch arms the next round; never more than one timer
// per entry; a success drops it.
func TestD1_OneTimerPerEntry(t *testing.T) {
	bubble(t, func(t *testing.T) {
		r := newRig(t, rigOpt{noSources: true, reschedule: true, retry: cfgFixed(time.Second, 1)})
		r.src.set("/roles", reply{status: 503})
		r.src.set("/users", reply{status: 503})
		msg := update(entry("http://src/roles", "/roles"), entry("http://src/users", "/users"))
		r.notify(msg)
		synctest.Wait()
		r.notify(msg) // the same entries again: still one timer each
		r.advance(100 * time.Millisecond)
		if e, n := r.q.DataDeferrals(); e != 2 || n != 2 {
			t.Fatalf("deferred entries %d timers %d, want 2 2", e, n)
		}
		// D2: round 1 is 5 s; the re-fetch fails and arms round 2 (10 s).
		r.advance(5 * time.Second)
		if n := len(r.src.requests("/roles")); n != 3 {
			t.Fatalf("%d requests of /roles after round 1, want 3", n)
		}
		if e, n := r.q.DataDeferrals(); e != 2 || n != 2 {
			t.Fatalf("after round 1: deferred entries %d timers %d, want 2 2", e, n)
		}
		r.src.set("/roles", reply{status: 200, body: `1`})
		r.advance(10 * time.Second)
		r.wantDoc(`{"roles":1}`)
		if e, n := r.q.DataDeferrals(); e != 1 || n != 1 {
			t.Fatalf("after success: deferred entries %d timers %d, want 1 1", e, n)
		}
		// D6: the success reset the entry's rounds: its next outage starts
		// again at round 1 (5 s), not round 3 (20 s). Guards the reset on
		// success (mutation: succeeded does nothing).
		r.src.set("/roles", reply{status: 503})
		r.notify(update(entry("http://src/roles", "/roles")))
		r.advance(100 * time.Millisecond)
		if d := r.lastArm(); d != 5*time.Second {
			t.Fatalf("first deferral after a success: %s, want 5s", d)
		}
	})
}

// TestOrder: writes to overlapping dst_paths keep their order even when the
// first one's source is slow; a disjoint path is not held up.
func TestOrder(t *testing.T) {
	bubble(t, func(t *testing.T) {
		r := newRig(t, rigOpt{noSources: true})
		gate := make(chan struct{})
		r.src.set("/slow", reply{status: 200, body: `{"v":"first"}`, gate: gate})
		r.notify(update(entry("http://src/slow", "/users")))
		r.notify(update(`{"url":"","data":{"v":"second"},"dst_path":"/users/x"}`))
		r.notify(update(`{"url":"","data":1,"dst_path":"/other"}`))
		// Guards the overlap wait (mutation: admit waits for nothing).
		r.wantDoc(`{"other":1}`)
		close(gate)
		r.wantDoc(`{"other":1,"users":{"v":"first","x":{"v":"second"}}}`)
	})
}

// TestHangDoesNotDelayPolicy: a data source that hangs holds no queue slot:
// a policy update queued after it is applied at once (U1).
func TestHangDoesNotDelayPolicy(t *testing.T) {
	bubble(t, func(t *testing.T) {
		r := newRig(t, rigOpt{noSources: true})
		r.src.set("/roles", reply{hang: true})
		r.src.set("/policy", reply{status: 200, body: `{"manifest":[],"hash":"h1","old_hash":null,"data_modules":[],"policy_modules":[],"deleted_files":null}`})
		r.notify(update(entry("http://src/roles", "/roles")))
		r.q.Connect()
		synctest.Wait()
		if h, _ := r.pol.PolicyHash(t.Context()); h != "h1" {
			t.Fatalf("policy hash %q: the policy update waited for the data source", h)
		}
	})
}

// TestU3_BadPatch: a JSON-Patch that does not apply fails that entry alone,
// leaves the data as it was, and is reported.
func TestU3_BadPatch(t *testing.T) {
	bubble(t, func(t *testing.T) {
		r := newRig(t, rigOpt{noSources: true})
		r.notify(update(`{"url":"","data":{"bob":1},"dst_path":"/users"}`))
		r.wantDoc(`{"users":{"bob":1}}`)
		r.notify(update(`{"url":"","save_method":"PATCH","dst_path":"/users","data":[{"op":"add","path":"/carol","value":2},{"op":"remove","path":"/nobody"}]}`,
			`{"url":"","data":3,"dst_path":"/groups"}`))
		r.wantDoc(`{"groups":3,"users":{"bob":1}}`)
		txs := r.transactions()
		var failed int
		for _, tx := range txs {
			if !tx.Success {
				failed++
				if tx.Actions[0] != dataupdater.ActionPatch || tx.Error == "" {
					t.Fatalf("failed tx %+v", tx)
				}
			}
		}
		if failed != 1 || len(txs) != 3 {
			t.Fatalf("transactions %+v", txs)
		}
	})
}

// TestPeriodic: an entry with periodic_update_interval is fetched now and
// every interval on its own timer; a reconnect replaces the timer, Stop ends it.
func TestPeriodic(t *testing.T) {
	bubble(t, func(t *testing.T) {
		r := newRig(t, rigOpt{})
		r.src.set("/data/config", reply{status: 200, body: `{"entries":[{"url":"http://src/p","dst_path":"/p","periodic_update_interval":10}]}`})
		r.src.set("/p", reply{status: 200, body: `1`})
		r.du.OnConnect()
		r.advance(25 * time.Second)
		if n := len(r.src.requests("/p")); n != 3 {
			t.Fatalf("%d fetches in 25 s, want 3 (0, 10, 20)", n)
		}
		// Guards the cancel on reconnect (mutation: keep the old load's context).
		r.du.OnConnect()
		r.advance(9 * time.Second)
		if n := len(r.src.requests("/p")); n != 4 {
			t.Fatalf("%d fetches after reconnect, want 4 (old timer cancelled, new load ran)", n)
		}
		r.du.Stop()
		r.advance(30 * time.Second)
		if n := len(r.src.requests("/p")); n != 4 {
			t.Fatalf("%d fetches after Stop, want 4", n)
		}
	})
}

// TestPeriodicInterval: periodic_update_interval is clamped as a float
// before it becomes a Duration, and a negative one is refused, not polled.
func TestPeriodicInterval(t *testing.T) {
	cases := []struct {
		name, interval string
		fetches        int // in one hour
		outcomes       []string
	}{
		// Catches: converting before clamping (1e10 s overflows to the 1 s floor).
		{"huge_is_clamped_not_1s", "1e10", 1, []string{dataupdater.OutcomeSuccess}},
		// Catches: dropping the check in Validate (polled every second).
		{"negative_refused", "-5", 0, []string{dataupdater.OutcomeInvalid}},
		{"small_raised_to_min", "0.001", 3601, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				r := newRig(t, rigOpt{})
				r.src.set("/data/config", reply{status: 200, body: `{"entries":[{"url":"http://src/p","dst_path":"/p","periodic_update_interval":` + tc.interval + `}]}`})
				r.src.set("/p", reply{status: 200, body: `1`})
				r.du.OnConnect()
				r.advance(time.Hour)
				if n := len(r.src.requests("/p")); n != tc.fetches {
					t.Fatalf("%d fetches in an hour, want %d", n, tc.fetches)
				}
				if got := r.outcomesList(); tc.outcomes != nil && !slices.Equal(got, tc.outcomes) {
					t.Fatalf("outcomes %v, want %v", got, tc.outcomes)
				}
			})
		})
	}
}

// TestReport: with reporting on, one report per update goes to the callbacks,
// with the client token only on the OPAL server's host.
func TestReport(t *testing.T) {
	bubble(t, func(t *testing.T) {
		r := newRig(t, rigOpt{noSources: true, report: true})
		r.src.set("/data/callback_report", reply{status: 200, body: `{}`})
		r.src.set("/cb", reply{status: 200, body: `{}`})
		r.notify(`{"id":"u9","entries":[{"url":"","data":1,"dst_path":"/a"}],"callback":{"callbacks":["http://other/cb"]}}`)
		synctest.Wait()
		// The sources URL is unset here, so no host gets the token.
		for _, p := range []string{"/data/callback_report", "/cb"} {
			q := r.src.requests(p)
			if len(q) != 1 || q[0].Method != "POST" || q[0].Header.Get("Authorization") != "" {
				t.Fatalf("%s: %v", p, q)
			}
		}
	})
}
