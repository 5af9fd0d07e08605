package dataupdater_test

import (
	"encoding/json"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/opal-go/opal-client/internal/dataupdater"
)

// TestU1_OlderDeferralNeverOverwritesNewer: an entry whose source answered
// 503 is deferred; an inline PUT to the same path arrives next; when the
// deferral would have fired, the path still holds the newer data, and the
// deferral is gone (it does not accumulate).
func TestU1_OlderDeferralNeverOverwritesNewer(t *testing.T) {
	bubble(t, func(t *testing.T) {
		r := newRig(t, rigOpt{noSources: true, reschedule: true, retry: cfgFixed(time.Second, 1)})
		r.src.set("/users", reply{status: 503})
		r.notify(update(entry("http://src/users", "/users")))
		r.advance(100 * time.Millisecond)
		if k, _ := r.q.DataDeferrals(); k != 1 {
			t.Fatalf("%d deferrals after a 503, want 1", k)
		}
		r.src.set("/users", reply{status: 200, body: `{"v":"old"}`})
		r.notify(update(`{"url":"","data":{"v":"new"},"dst_path":"/users"}`))
		r.advance(2 * time.Minute)
		r.wantDoc(`{"users":{"v":"new"}}`)
		if k, n := r.q.DataDeferrals(); k != 0 || n != 0 {
			t.Fatalf("deferrals %d timers %d after a newer write, want 0 0", k, n)
		}
		if n := len(r.src.requests("/users")); n != 1 {
			t.Fatalf("the superseded source was fetched %d times, want once", n)
		}
	})
}

// TestU1_BaseLoadReservesItsPlace: a notification that arrives while the
// sources config is being fetched is written after the base data: a PUT
// supersedes the older base entry, a PATCH applies on top of it.
func TestU1_BaseLoadReservesItsPlace(t *testing.T) {
	cases := []struct{ name, notified, want string }{
		{"U1_newer_put_wins_over_base", `{"url":"","data":{"v":"notified"},"dst_path":"/users"}`, `{"users":{"v":"notified"}}`},
		// Catches: a newer patch superseding the base PUT it needs.
		{"U1_newer_patch_applies_on_base", `{"url":"","save_method":"PATCH","data":[{"op":"add","path":"/w","value":1}],"dst_path":"/users"}`, `{"users":{"v":"base","w":1}}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				r := newRig(t, rigOpt{})
				gate := make(chan struct{})
				r.src.set("/data/config", reply{status: 200, gate: gate, body: `{"entries":[{"url":"","data":{"v":"base"},"dst_path":"/users"}]}`})
				r.du.OnConnect()
				synctest.Wait()
				r.notify(update(tc.notified))
				synctest.Wait()
				close(gate)
				r.wantDoc(tc.want)
			})
		})
	}
}

// TestStaleBaseWriteSkipped: a base entry already fetched but still queued
// when a reconnect starts a new load is not written (the stale queued-write
// skip); the new load's data lands.
func TestStaleBaseWriteSkipped(t *testing.T) {
	bubble(t, func(t *testing.T) {
		r := newRig(t, rigOpt{})
		hold := make(chan struct{})
		second := make(chan struct{})
		r.src.set("/slow", reply{status: 200, body: `[]`, gate: hold})
		r.src.set("/data/config",
			reply{status: 200, body: `{"entries":[{"url":"","data":{"v":"old"},"dst_path":"/a"}]}`},
			reply{status: 200, gate: second, body: `{"entries":[{"url":"","data":{"v":"new"},"dst_path":"/a"}]}`})
		// An earlier patch of the root keeps the base entry queued (a
		// patch supersedes nothing, and nothing supersedes it).
		r.notify(update(`{"url":"http://src/slow","save_method":"PATCH","dst_path":"/"}`))
		r.du.OnConnect()
		synctest.Wait()
		r.du.OnConnect() // the first load is stale now
		synctest.Wait()
		close(hold)
		synctest.Wait()
		close(second)
		r.wantDoc(`{"a":{"v":"new"}}`)
		// The patch and the new load's entry: not the stale one.
		// Catches: the skip disabled (mutation "_ = 0" in the write).
		if r.st.writes != 2 {
			t.Fatalf("%d writes, want 2 (the stale base entry was written)", r.st.writes)
		}
	})
}

// TestEntryRefusedAtOnce: what can never succeed is refused before any
// fetch or write, with a clear message, and never deferred.
func TestEntryRefusedAtOnce(t *testing.T) {
	cases := []struct {
		name, entry, want string
	}{
		{"non_http_fetcher", `{"url":"postgresql://db/x","config":{"fetcher":"PostgresFetchProvider"},"dst_path":"/a"}`, "PostgresFetchProvider"},
		{"nul_in_dst_path", `{"url":"","data":1,"dst_path":"/a\u0000b"}`, "NUL"},
		{"dotdot_in_dst_path", `{"url":"","data":1,"dst_path":"/a/../system"}`, `".."`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				r := newRig(t, rigOpt{noSources: true, reschedule: true})
				r.notify(update(tc.entry))
				r.advance(time.Minute)
				txs := r.transactions()
				if len(txs) != 1 || txs[0].Success || !strings.Contains(txs[0].Error, tc.want) {
					t.Fatalf("transactions %+v, want one failure naming %s", txs, tc.want)
				}
				if got := r.outcomesList(); len(got) != 1 || got[0] != dataupdater.OutcomeInvalid {
					t.Fatalf("outcomes %v, want [invalid]", got)
				}
				if k, _ := r.q.DataDeferrals(); k != 0 || len(r.src.reqs) != 0 || r.st.writes != 0 {
					t.Fatalf("deferrals %d, requests %d, writes %d: want none", k, len(r.src.reqs), r.st.writes)
				}
			})
		})
	}
}

// TestReportHash pins the report's hash to the Python client's
// DataUpdater.calc_hash. The literals come from python3 (3.11):
//
//	import json, hashlib
//	hashlib.sha256(json.dumps(json.loads(doc)).encode()).hexdigest()
//
// and, for a body stored as text or a JSON string, of the text itself.
func TestReportHash(t *testing.T) {
	cases := []struct {
		name, body string
		text       bool
		want       string
	}{
		{"python_json_dumps_defaults",
			`{"b":1,"a":[1.5,2e20,-0.0,1e-5,"h\u00e9\ud83d\ude00\n\u0001"],"c":null,"t":true,"big":9007199254740993,"x":100.0,"b":2,"y":0.0001,"z":1e16,"w":123456789012345.6}`,
			false, "001e0d0e115878dbe5af944a25d95067f20c43908d92ea81be39f39e5d126d01"},
		{"patch_ops", `[{"op":"add","path":"/x","value":1}]`, false, "b4dd6ebbc869d0c9d94ea7029c0251d25d5d96fc5eec5d5881edd76d7223610f"},
		{"json_string_hashed_as_text", `"just a string"`, false, "f9c8bc58fb70985e624a22f3ef9faab71dc1179bcfe015e51e75fb2df59e88f4"},
		{"is_json_false_text", `plain text body`, true, "9fc5d90c995fdacb82e2cb454025e169a5b94d0cd31051d23e82d51338311da8"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := dataupdater.ReportHash([]byte(tc.body), tc.text); got != tc.want {
				t.Fatalf("hash %s, want %s", got, tc.want)
			}
		})
	}
}

// TestReportFidelity: the report carries the data's hash, and a callback
// given as [url, config] is called with its method and headers (opal issue
// #166).
func TestReportFidelity(t *testing.T) {
	bubble(t, func(t *testing.T) {
		r := newRig(t, rigOpt{noSources: true, report: true})
		r.src.set("/data/callback_report", reply{status: 200, body: `{}`})
		r.src.set("/cb", reply{status: 200, body: `{}`})
		r.notify(`{"id":"u9","entries":[{"url":"","data":[{"op":"add","path":"/x","value":1}],"save_method":"PATCH","dst_path":"/a"}],` +
			`"callback":{"callbacks":[["http://other/cb",{"method":"put","headers":{"X-Callback-Key":"k1"}}]]}}`)
		synctest.Wait()
		q := r.src.requests("/cb")
		if len(q) != 1 || q[0].Method != "PUT" || q[0].Header.Get("X-Callback-Key") != "k1" {
			t.Fatalf("callback requests %v: want one PUT with its header", q)
		}
		var rep dataupdater.Report
		if err := json.Unmarshal([]byte(r.src.body(q[0])), &rep); err != nil || len(rep.Reports) != 1 {
			t.Fatalf("report %s: %v", r.src.body(q[0]), err)
		}
		if h := rep.Reports[0].Hash; h != "b4dd6ebbc869d0c9d94ea7029c0251d25d5d96fc5eec5d5881edd76d7223610f" {
			t.Fatalf("report hash %q, want the Python client's", h)
		}
	})
}

// TestNoSecretInLogs runs the failing cases with a secret in every position
// of a URL (query value, user:password, user name as the token, fragment)
// and greps every log line and every transaction's error text.
func TestNoSecretInLogs(t *testing.T) {
	const secret = "S3CR3T"
	urls := []string{
		"http://src/down?token=" + secret,
		"http://user:" + secret + "@src/down",
		"http://" + secret + "@src/down",
		"http://src/down#" + secret,
		"http://" + secret + ":" + secret + "@src/refused?a=" + secret + "#" + secret,
	}
	for _, u := range urls {
		t.Run(strings.NewReplacer(secret, "SECRET", "/", "_", ":", "_").Replace(u), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				r := newRig(t, rigOpt{noSources: true, reschedule: true, report: true, retry: cfgFixed(time.Second, 2)})
				r.src.set("/down", reply{status: 503, body: `{"detail":"down"}`})
				r.src.set("/refused", reply{refused: true})
				r.src.set("/data/callback_report", reply{status: 500})
				r.notify(`{"entries":[{"url":"` + u + `","dst_path":"/a"}],"callback":{"callbacks":["` + u + `"]}}`)
				r.advance(30 * time.Second)
				logs := r.log.String()
				if strings.Contains(logs, secret) {
					t.Fatalf("a log line holds the secret:\n%s", logs)
				}
				for _, tx := range r.transactions() {
					if strings.Contains(tx.Error, secret) {
						t.Fatalf("a transaction error holds the secret: %s", tx.Error)
					}
				}
				if !strings.Contains(logs, "data fetch deferred") || strings.Contains(logs, "policy fetch deferred") {
					t.Fatalf("the deferral is not logged as data:\n%s", logs)
				}
			})
		})
	}
}
