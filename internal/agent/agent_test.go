package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/opal-go/opal-client/config"
	"github.com/opal-go/opal-client/fetcher"
	"github.com/opal-go/opal-client/internal/api"
	"github.com/opal-go/opal-client/internal/metrics"
	"github.com/opal-go/opal-client/internal/status"
	"github.com/opal-go/opal-client/internal/testutil"
	"github.com/opal-go/opal-client/scheduler"
	"github.com/opal-go/opal-client/updater"
)

// TestStaleWarning pins the "policy stale" contract warning: it appears only
// once the policy has been behind for a whole interval, and names how long.
func TestStaleWarning(t *testing.T) {
	cases := []struct {
		name   string
		behind time.Duration
		loaded bool
		want   bool
	}{
		{"current_policy_is_quiet", 0, true, false},
		// guards mutation "if st.Stale < 0 {" in checkStale
		{"behind_less_than_an_interval_is_quiet", 59 * time.Second, true, false},
		{"behind_an_interval_warns", time.Minute, true, true},
		{"never_loaded_warns", 2 * time.Minute, false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clk := clock.NewMock()
			var buf testutil.SyncBuffer
			a := &Agent{o: Options{StaleWarnInterval: time.Minute}, clk: clk,
				log:     slog.New(slog.NewTextHandler(&buf, nil)),
				metrics: metrics.New(metrics.Options{Clock: clk}),
				tracker: status.New(status.Options{Clock: clk}),
				sched:   scheduler.New(scheduler.Options{Clock: clk, Fire: func() {}})}
			if c.loaded {
				a.tracker.Record(status.Transaction{ID: "h1", Type: status.TypePolicy, Success: true})
				if c.behind > 0 {
					a.tracker.Record(status.Transaction{ID: "h2", Type: status.TypePolicy, Error: "fetch: 503"})
				}
			}
			clk.Add(c.behind)
			if got := a.checkStale(); got != c.want {
				t.Fatalf("warned %v, want %v; log %q", got, c.want, buf.String())
			}
			if c.want && !strings.Contains(buf.String(), "policy stale") {
				t.Fatalf("log %q", buf.String())
			}
			if c.want && c.loaded && !strings.Contains(buf.String(), "last_error=\"fetch: 503\"") {
				t.Fatalf("the warning must carry the last error: %q", buf.String())
			}
		})
	}
}

type fakeData struct {
	mu       sync.Mutex
	connects int
	notifies []string
}

func (f *fakeData) OnConnect() { f.mu.Lock(); f.connects++; f.mu.Unlock() }
func (f *fakeData) OnNotify(topic string, _ json.RawMessage) {
	f.mu.Lock()
	f.notifies = append(f.notifies, topic)
	f.mu.Unlock()
}
func (f *fakeData) Trigger() error { return errors.New("not now") }
func (f *fakeData) Stop()          {}

// TestP33_Notify pins the routing of notifies (protocol §3.3): a valid
// policy message is queued, an invalid one is ignored with a warning, and
// other topics go to the data updater.
func TestP33_Notify(t *testing.T) {
	srv := newTestServer(t, exampleFiles(t))
	data := &fakeData{}
	h := start(t, srv, map[string]string{"OPAL_DATA_UPDATER_ENABLED": "true"}, func(o *Options) {
		o.NewDataUpdater = func(d DataDeps) (DataUpdater, error) {
			if d.Queue == nil || d.Store == nil || d.Record == nil {
				t.Error("incomplete data deps")
			}
			return data, nil
		}
	})
	h.successTx()
	// The data updater counts for readiness: report its first load.
	h.a.tracker.Record(status.Transaction{ID: "d1", Type: status.TypeData, Success: true})
	t.Run("data_topic_goes_to_the_data_updater", func(t *testing.T) {
		srv.dev.Publish([]string{"policy_data"}, map[string]any{"entries": []any{}})
		data.mu.Lock()
		defer data.mu.Unlock()
		if len(data.notifies) != 1 || data.notifies[0] != "policy_data" || data.connects != 1 {
			t.Fatalf("data updater saw %v, %d connects", data.notifies, data.connects)
		}
	})
	t.Run("invalid_policy_message_is_ignored_with_a_warning", func(t *testing.T) {
		before := len(srv.policyRequests())
		// guards mutation "m.ChangedDirectories == nil" -> "false"
		srv.dev.Publish([]string{"policy:."}, map[string]any{"old_policy_hash": "a", "new_policy_hash": "b"})
		srv.dev.Publish([]string{"policy:."}, "garbage")
		if got := len(srv.policyRequests()); got != before || h.a.queue.Len() != 0 {
			t.Fatalf("an invalid message queued an update (%d -> %d requests)", before, got)
		}
		if !strings.Contains(h.logs.String(), "invalid policy update message ignored") {
			t.Fatal("no warning")
		}
	})
	t.Run("refused_data_trigger_is_503", func(t *testing.T) {
		if code, _ := h.post("/data-updater/trigger"); code != 503 {
			t.Fatalf("code %d", code)
		}
	})
	t.Run("policy_trigger_forces_a_full_fetch", func(t *testing.T) {
		if code, body := h.post("/policy-updater/trigger"); code != 200 || body != `{"status":"ok"}` {
			t.Fatalf("= %d %s", code, body)
		}
		h.successTx()
		reqs := srv.policyRequests()
		if reqs[len(reqs)-1].Has("base_hash") {
			t.Fatal("a forced update must not send base_hash")
		}
	})
}

// mismatchStore refuses every bundle as a delta on another base.
type mismatchStore struct{ updater.Store }

func (mismatchStore) ApplyPolicy(context.Context, *fetcher.PolicyBundle) error {
	return fmt.Errorf("apply: %w", &updater.BaseMismatchError{Current: "a", Base: "b"})
}

// TestCounters_AlertsAreBuiltOn: the counters alerts are built on
// count only what they name.
func TestCounters_AlertsAreBuiltOn(t *testing.T) {
	t.Run("a_base_mismatch_is_no_store_failure", func(t *testing.T) {
		clk := clock.NewMock()
		m := metrics.New(metrics.Options{Clock: clk})
		s := measuredStore{mismatchStore{}, m, clk}
		_ = s.ApplyPolicy(context.Background(), &fetcher.PolicyBundle{})
		// guards mutation "false && errors.As(err, &bm)" in measuredStore
		if v, _ := metrics.Value(m.Registry(), "opal_client_store_applies_total", map[string]string{"result": "failure"}); v != 0 {
			t.Fatalf("failure = %v, want 0", v)
		}
		if v, _ := metrics.Value(m.Registry(), "opal_client_store_applies_total", map[string]string{"result": "base_mismatch"}); v != 1 {
			t.Fatalf("base_mismatch = %v, want 1", v)
		}
	})
	cases := []struct {
		name string
		dirs string
		want float64
	}{
		// guards mutation "|| true" in onNotify
		{"notify_outside_the_subscription_dirs_is_not_counted", `["other"]`, 0},
		{"notify_in_a_subscription_dir_is_counted", `["rbac"]`, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clk := clock.NewMock()
			a := &Agent{clk: clk, log: slog.New(slog.DiscardHandler), metrics: metrics.New(metrics.Options{Clock: clk}),
				policyTopics: map[string]bool{"policy:rbac": true},
				queue:        updater.New(updater.Options{Clock: clk, Dirs: []string{"rbac"}})}
			a.onNotify("policy:rbac", json.RawMessage(`{"old_policy_hash":"a","new_policy_hash":"b","changed_directories":`+c.dirs+`}`))
			v, _ := metrics.Value(a.metrics.Registry(), "opal_client_policy_update_requests_total", map[string]string{"reason": "notification"})
			if v != c.want || float64(a.queue.Len()) != c.want {
				t.Fatalf("counted %v, queued %d; want %v", v, a.queue.Len(), c.want)
			}
		})
	}
}

// TestAuthKeyStopsTheStart: an OPAL_AUTH_PUBLIC_KEY that cannot be used
// stops New (the Python client would log it and serve the connectivity
// routes unauthenticated); without one New starts, the routes open.
func TestAuthKeyStopsTheStart(t *testing.T) {
	for _, c := range []struct {
		name, key string
		fails     bool
	}{
		{"unusable_key_stops_the_start", "ssh-rsa not-base64", true},
		{"no_key_starts_open", "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			vars := map[string]string{"OPAL_AUTH_PUBLIC_KEY": c.key, "OPAL_DATA_UPDATER_ENABLED": "false"}
			cfg, err := config.LoadFrom(func(k string) (string, bool) { v, ok := vars[k]; return v, ok })
			if err != nil {
				t.Fatal(err)
			}
			cfg.ClientAPIServerPort, cfg.InlineOPAConfig.Addr = 0, "127.0.0.1:0"
			a, err := New(context.Background(), Options{Config: cfg})
			if c.fails {
				if !errors.Is(err, api.ErrKey) {
					t.Fatalf("New = %v, want api.ErrKey", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			a.release()
		})
	}
}
