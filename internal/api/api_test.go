package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/opal-go/opal-client/internal/status"
)

type fake struct {
	healthy  error
	ready    bool
	policy   int
	data     int
	dataErr  error
	noPolicy bool
	noData   bool
}

func (f *fake) handler() http.Handler {
	o := Options{
		Healthy: func(context.Context) error { return f.healthy },
		Ready:   func() bool { return f.ready },
		Metrics: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "opal_client_ready 1\n") }),
	}
	if !f.noPolicy {
		o.TriggerPolicy = func() { f.policy++ }
	}
	if !f.noData {
		o.TriggerData = func() error { f.data++; return f.dataErr }
	}
	return Handler(o)
}

func do(h http.Handler, method, path string) (int, string) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec.Code, strings.TrimSpace(rec.Body.String())
}

// TestP7_Health pins protocol §7's health routes: /healthcheck, /healthy and /
// answer 200 {"status":"ok","online":true} when healthy and 503
// {"status":"unavailable"} otherwise.
func TestP7_Health(t *testing.T) {
	for _, path := range []string{"/healthcheck", "/healthy", "/"} {
		cases := []struct {
			name string
			err  error
			code int
			body string
		}{
			// guards mutation "if err == nil {" in health
			{"healthy_is_200_online", nil, 200, `{"online":true,"status":"ok"}`},
			{"unhealthy_is_503_unavailable", errors.New("last policy transaction failed"), 503, `{"status":"unavailable"}`},
		}
		for _, c := range cases {
			t.Run(strings.Trim(path, "/")+"/"+c.name, func(t *testing.T) {
				f := &fake{healthy: c.err}
				code, body := do(f.handler(), "GET", path)
				if code != c.code || body != c.body {
					t.Fatalf("GET %s = %d %s, want %d %s", path, code, body, c.code, c.body)
				}
			})
		}
	}
	t.Run("unknown_path_is_404", func(t *testing.T) {
		if code, _ := do((&fake{}).handler(), "GET", "/nope"); code != 404 {
			t.Fatalf("code %d", code)
		}
	})
	t.Run("health_gets_a_deadline", func(t *testing.T) {
		var had bool
		h := Handler(Options{Healthy: func(ctx context.Context) error { _, had = ctx.Deadline(); return nil }})
		do(h, "GET", "/healthcheck")
		if !had {
			t.Fatal("the store probe must be bounded")
		}
	})
}

// TestP7_Ready pins /ready: 200 {"status":"ok"} once a policy is loaded, else 503.
func TestP7_Ready(t *testing.T) {
	cases := []struct {
		name  string
		ready bool
		code  int
		body  string
	}{
		// guards mutation "if o.Ready == nil || o.Ready() {"
		{"ready_is_200_ok", true, 200, `{"status":"ok"}`},
		{"not_ready_is_503", false, 503, `{"status":"unavailable"}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, body := do((&fake{ready: c.ready}).handler(), "GET", "/ready")
			if code != c.code || body != c.body {
				t.Fatalf("GET /ready = %d %s", code, body)
			}
		})
	}
	t.Run("no_ready_func_is_503", func(t *testing.T) {
		if code, _ := do(Handler(Options{}), "GET", "/ready"); code != 503 {
			t.Fatalf("code %d", code)
		}
	})
}

// TestP7_Triggers pins the trigger routes: POST only, {"status":"ok"} after
// enqueueing, 503 when the updater is not there or refuses.
func TestP7_Triggers(t *testing.T) {
	t.Run("policy_trigger_enqueues_once", func(t *testing.T) {
		f := &fake{}
		code, body := do(f.handler(), "POST", "/policy-updater/trigger")
		if code != 200 || body != `{"status":"ok"}` || f.policy != 1 {
			t.Fatalf("= %d %s, triggers %d", code, body, f.policy)
		}
	})
	t.Run("policy_trigger_is_post_only", func(t *testing.T) {
		f := &fake{}
		if code, _ := do(f.handler(), "GET", "/policy-updater/trigger"); code != 405 || f.policy != 0 {
			t.Fatalf("GET = %d, triggers %d", code, f.policy)
		}
	})
	t.Run("policy_trigger_without_updater_is_503", func(t *testing.T) {
		if code, _ := do((&fake{noPolicy: true}).handler(), "POST", "/policy-updater/trigger"); code != 503 {
			t.Fatalf("code %d", code)
		}
	})
	t.Run("data_trigger_ok", func(t *testing.T) {
		f := &fake{}
		code, body := do(f.handler(), "POST", "/data-updater/trigger")
		if code != 200 || body != `{"status":"ok"}` || f.data != 1 {
			t.Fatalf("= %d %s, triggers %d", code, body, f.data)
		}
	})
	t.Run("data_trigger_disabled_is_503", func(t *testing.T) {
		code, body := do((&fake{noData: true}).handler(), "POST", "/data-updater/trigger")
		if code != 503 || body != `{"status":"unavailable"}` {
			t.Fatalf("= %d %s", code, body)
		}
	})
	// guards mutation "if err == nil {" in the data trigger
	t.Run("data_trigger_refused_is_503", func(t *testing.T) {
		code, _ := do((&fake{dataErr: errors.New("stopped")}).handler(), "POST", "/data-updater/trigger")
		if code != 503 {
			t.Fatalf("code %d", code)
		}
	})
}

func TestMetricsRoute(t *testing.T) {
	code, body := do((&fake{}).handler(), "GET", "/metrics")
	if code != 200 || !strings.Contains(body, "opal_client_ready 1") {
		t.Fatalf("= %d %q", code, body)
	}
	if code, _ := do(Handler(Options{}), "GET", "/metrics"); code != 404 {
		t.Fatalf("no metrics handler: %d", code)
	}
}

// TestP7_OfflineHealth pins the offline-mode health answer (protocol §7,
// offline mode): ready but not healthy is 200 {"status":"ok","online":false} with
// offline mode, 503 without; not ready is 503 either way.
func TestP7_OfflineHealth(t *testing.T) {
	cases := []struct {
		name           string
		offline, ready bool
		healthy        error
		code           int
		body           string
	}{
		{"offline_ready_unhealthy_is_200_offline", true, true, errors.New("no policy transaction yet"), 200, `{"online":false,"status":"ok"}`},
		// guards mutation "if o.Ready != nil && o.Ready() {" in health
		{"online_mode_ready_unhealthy_is_503", false, true, errors.New("no policy transaction yet"), 503, `{"status":"unavailable"}`},
		{"offline_not_ready_is_503", true, false, errors.New("no policy transaction yet"), 503, `{"status":"unavailable"}`},
		{"offline_healthy_is_online", true, true, nil, 200, `{"online":true,"status":"ok"}`},
		// An unreachable store is an outage in offline mode too. guards mutation "(true || errors.Is(err, status.ErrStoreUnreachable))" in health
		{"offline_ready_store_unreachable_is_503", true, true, fmt.Errorf("%w: %w: refused", status.ErrUnhealthy, status.ErrStoreUnreachable), 503, `{"status":"unavailable"}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := Handler(Options{OfflineMode: c.offline, Ready: func() bool { return c.ready },
				Healthy: func(context.Context) error { return c.healthy }})
			if code, body := do(h, "GET", "/healthcheck"); code != c.code || body != c.body {
				t.Fatalf("GET /healthcheck = %d %s, want %d %s", code, body, c.code, c.body)
			}
		})
	}
}

type switchFake struct {
	disabled bool
	calls    int
}

func (s *switchFake) ServerConnectivityDisabled() bool { return s.disabled }

func (s *switchFake) SetServerConnectivity(enabled bool) bool {
	s.calls++
	changed := s.disabled == enabled
	s.disabled = !enabled
	return changed
}

// TestP7_Connectivity pins the Python client's /opal-server/connectivity
// routes: status, the two switches with their "already_" answers, and 400
// without offline mode.
func TestP7_Connectivity(t *testing.T) {
	t.Run("status_reports_both_flags", func(t *testing.T) {
		h := Handler(Options{OfflineMode: true, Connectivity: &switchFake{disabled: true}})
		code, body := do(h, "GET", "/opal-server/connectivity")
		if code != 200 || body != `{"offline_mode_enabled":true,"opal_server_connectivity_disabled":true}` {
			t.Fatalf("= %d %s", code, body)
		}
	})
	// guards mutation "if false {" in connectivity (the offline-mode check)
	t.Run("without_offline_mode_is_400", func(t *testing.T) {
		sw := &switchFake{}
		h := Handler(Options{Connectivity: sw})
		for _, verb := range []string{"disable", "enable"} {
			code, body := do(h, "POST", "/opal-server/connectivity/"+verb)
			if code != 400 || !strings.Contains(body, "offline mode is not enabled") {
				t.Fatalf("%s = %d %s", verb, code, body)
			}
		}
		if sw.calls != 0 {
			t.Fatal("the switch moved without offline mode")
		}
	})
	// guards mutation "if false {" in connectivity (the changed check)
	t.Run("switches_report_changes", func(t *testing.T) {
		sw := &switchFake{}
		h := Handler(Options{OfflineMode: true, Connectivity: sw})
		steps := []struct{ verb, want string }{
			{"disable", `{"status":"disabled"}`},
			{"disable", `{"status":"already_disabled"}`},
			{"enable", `{"status":"enabled"}`},
			{"enable", `{"status":"already_enabled"}`},
		}
		for _, s := range steps {
			if code, body := do(h, "POST", "/opal-server/connectivity/"+s.verb); code != 200 || body != s.want {
				t.Fatalf("%s = %d %s, want %s", s.verb, code, body, s.want)
			}
		}
	})
	t.Run("no_switch_is_503", func(t *testing.T) {
		if code, _ := do(Handler(Options{OfflineMode: true}), "POST", "/opal-server/connectivity/enable"); code != 503 {
			t.Fatalf("code %d", code)
		}
	})
	t.Run("switch_is_post_only", func(t *testing.T) {
		if code, _ := do(Handler(Options{OfflineMode: true, Connectivity: &switchFake{}}), "GET", "/opal-server/connectivity/enable"); code != 405 {
			t.Fatalf("code %d", code)
		}
	})
}

// TestHealthStrictView pins the two views of the health routes: the lenient
// one (the Python client's; what the chart's liveness probe reads) and
// ?strict=true (the last update failed, or the policy is older than
// OPAL_POLICY_MAX_AGE). In offline mode the lenient view answers
// online:false for any loaded policy, the strict one only while ready.
func TestHealthStrictView(t *testing.T) {
	failed := errors.New("last policy transaction failed")
	for _, c := range []struct {
		name          string
		offline       bool
		healthy       error
		strict        error
		loaded, ready bool
		path          string
		code          int
		body          string
	}{
		{"lenient_ignores_a_failed_update", false, nil, failed, true, true, "/healthcheck", 200, `{"online":true,"status":"ok"}`},
		// guards mutation "strict && false" in health
		{"strict_reports_a_failed_update", false, nil, failed, true, true, "/healthcheck?strict=true", 503, `{"status":"unavailable"}`},
		{"strict_on_healthy_route", false, nil, failed, true, true, "/healthy?strict=1", 503, `{"status":"unavailable"}`},
		{"strict_false_is_lenient", false, nil, failed, true, true, "/?strict=false", 200, `{"online":true,"status":"ok"}`},
		{"strict_healthy_is_200", false, nil, nil, true, true, "/healthcheck?strict=true", 200, `{"online":true,"status":"ok"}`},
		{"offline_lenient_over_age_is_online_false", true, failed, failed, true, false, "/healthcheck", 200, `{"online":false,"status":"ok"}`},
		{"offline_strict_over_age_is_503", true, failed, failed, true, false, "/healthcheck?strict=true", 503, `{"status":"unavailable"}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := Handler(Options{
				Healthy:     func(context.Context) error { return c.healthy },
				Strict:      func(context.Context) error { return c.strict },
				Loaded:      func() bool { return c.loaded },
				Ready:       func() bool { return c.ready },
				OfflineMode: c.offline,
			})
			if code, body := do(h, "GET", c.path); code != c.code || body != c.body {
				t.Fatalf("GET %s = %d %s, want %d %s", c.path, code, body, c.code, c.body)
			}
		})
	}
}
