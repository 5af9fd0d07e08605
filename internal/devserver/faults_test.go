package devserver

import (
	"encoding/json"
	"testing"
)

// The fault routes: a restart, scripted answers and the request log, for
// trying the client by hand; token-protected like the other admin routes.
func TestAdminFaults(t *testing.T) {
	s, hs := dataSetup(t, Options{Token: "tok"})
	t.Run("admin_faults_without_token_401", func(t *testing.T) {
		// guards mutation "if !s.authorized(r) {" -> "if false {" in handleAdminScript
		for _, path := range []string{"/admin/drop-sockets", "/admin/script"} {
			if st, _ := post(t, hs.URL+path, "", `{"path":"/policy","answers":[{"status":503}]}`); st != 401 {
				t.Fatalf("%s: status %d", path, st)
			}
		}
		if st, _, _ := get(t, hs.URL+"/admin/requests", "nope"); st != 401 {
			t.Fatalf("requests: status %d", st)
		}
	})
	t.Run("script_answers_then_serves_normally", func(t *testing.T) {
		st, body := post(t, hs.URL+"/admin/script", "tok",
			`{"path":"/policy","answers":[{"status":503,"headers":{"Retry-After":"8"},"body":"{\"detail\":\"cloning\"}","count":2}]}`)
		if st != 200 || body != `{"path":"/policy","queued":2}` {
			t.Fatalf("%d %s", st, body)
		}
		var got []string
		for range 3 {
			st, h, b := get(t, hs.URL+"/policy", "tok")
			got = append(got, mustJSON([]any{st, h.Get("Retry-After"), st != 200 && string(b) == `{"detail":"cloning"}`}))
		}
		// guards mutation "for range max(a.Count, 1)" -> "for range 1"
		if want := []string{`[503,"8",true]`, `[503,"8",true]`, `[200,"",false]`}; mustJSON(got) != mustJSON(want) {
			t.Fatalf("answers %v, want %v", got, want)
		}
	})
	t.Run("script_bad_body_400", func(t *testing.T) {
		// guards mutation: the bound on scripted answers dropped (the
		// overflowing count also fails a bound written as a sum)
		for _, b := range []string{`{`, `{"path":"policy","answers":[{"status":503}]}`, `{"path":"/policy","answers":[]}`,
			`{"path":"/policy","answers":[{"status":42}]}`, `{"path":"/policy","answers":[{"status":503,"count":200000}]}`,
			`{"path":"/policy","answers":[{"status":503},{"status":503,"count":9223372036854775807}]}`,
			`{"path":"/admin/script","answers":[{"status":503}]}`} {
			if st, _ := post(t, hs.URL+"/admin/script", "tok", b); st != 400 {
				t.Fatalf("%s: status %d", b, st)
			}
		}
	})
	t.Run("drop_sockets_is_a_restart", func(t *testing.T) {
		// guards mutation: the route answers without dropping the sockets
		connects := subscriberConnects(t, hs, "tok", "policy:.")
		st, body := post(t, hs.URL+"/admin/drop-sockets", "tok", "")
		if st != 200 || body != `{"dropped":1}` {
			t.Fatalf("%d %s", st, body)
		}
		waitFor(t, connects, "reconnect after the drop")
	})
	t.Run("requests_lists_the_log", func(t *testing.T) {
		st, _, b := get(t, hs.URL+"/admin/requests", "tok")
		var recs []Record
		if err := json.Unmarshal(b, &recs); st != 200 || err != nil {
			t.Fatalf("%d %v", st, err)
		}
		var scripted, served int
		for _, r := range recs {
			if r.Path == "/policy" && r.Status == 503 {
				scripted++
			}
			if r.Path == "/policy" && r.Status == 200 {
				served++
			}
		}
		// The earlier subtest's two scripted answers and the normal one.
		if scripted != 2 || served != 1 || len(recs) > len(s.Requests()) {
			t.Fatalf("log %+v", recs)
		}
	})
}
