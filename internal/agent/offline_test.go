package agent

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/opal-go/opal-client/config"
	"github.com/opal-go/opal-client/internal/backup"
	"github.com/opal-go/opal-client/internal/metrics"
	"github.com/opal-go/opal-client/internal/status"
	"github.com/opal-go/opal-client/internal/testutil"
	"github.com/opal-go/opal-client/scheduler"
	"github.com/opal-go/opal-client/updater"
)

// Offline mode (docs/offline.md). The end-to-end tests restart the
// agent on the backup the previous run wrote, while the dev server answers
// 503 or is kept away; they wait with deadlines and never sleep.

func offlineEnv(path string, extra ...string) map[string]string {
	env := map[string]string{
		"OPAL_OFFLINE_MODE_ENABLED":  "true",
		"OPAL_STORE_BACKUP_PATH":     path,
		"OPAL_STORE_BACKUP_INTERVAL": "0.1",
	}
	for i := 0; i+1 < len(extra); i += 2 {
		env[extra[i]] = extra[i+1]
	}
	return env
}

// firstRun runs an agent in offline mode until its first policy is loaded,
// then stops it, which writes the backup; it returns the loaded hash.
func firstRun(t *testing.T, srv *testServer, path string) string {
	t.Helper()
	h := start(t, srv, offlineEnv(path))
	tx := h.successTx()
	if err := h.shutdown(); err != nil {
		t.Fatal(err)
	}
	return tx.ID
}

// carolEditor is the example data with carol promoted, so that carol may
// write once the server's newer policy is loaded.
func carolEditor(t *testing.T, srv *testServer) map[string]string {
	data := strings.Replace(srv.files["rbac/data.json"], `"carol": {"roles": ["viewer"]}`, `"carol": {"roles": ["editor"]}`, 1)
	if data == srv.files["rbac/data.json"] {
		t.Fatal("example data changed; fix the test")
	}
	return map[string]string{"rbac/data.json": data}
}

// TestOffline_RestartWithBackup: restarted while the server answers 503, the
// agent decides from the backup at once, ready and online:false; when the
// server recovers the first fetch is a delta from the restored hash and the
// new policy replaces the backup's.
func TestOffline_RestartWithBackup(t *testing.T) {
	srv := newTestServer(t, exampleFiles(t))
	dir := filepath.Join(t.TempDir(), "backup")
	path := filepath.Join(dir, "opa.json")
	old := firstRun(t, srv, path)

	t.Run("backup_file_is_0600_in_a_0700_dir", func(t *testing.T) {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatalf("no backup after a clean shutdown: %v", err)
		}
		di, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 || di.Mode().Perm() != 0o700 {
			t.Fatalf("backup %v, dir %v; want 0600 and 0700", fi.Mode().Perm(), di.Mode().Perm())
		}
		st, _, err := backup.Read(path)
		if err != nil || st.Hash != old {
			t.Fatalf("backup hash %v (err %v), want the loaded %s", st, err, old)
		}
	})

	srv.update(carolEditor(t, srv)) // nobody subscribed: the restarted agent must fetch it
	srv.setScript(retryAfter(503, "1"), retryAfter(503, "1"))
	before := len(srv.policyRequests())
	begin := time.Now()
	// An hour between backups: after the first one, a later success stays
	// pending until the shutdown flush writes it.
	h := start(t, srv, offlineEnv(path, "OPAL_STORE_BACKUP_INTERVAL", "3600"))

	t.Run("decisions_from_the_backup_within_a_second", func(t *testing.T) {
		if !h.decide("alice", "write") || h.decide("carol", "write") {
			t.Fatal("the restored policy does not decide as the backed-up one")
		}
		if d := time.Since(begin); d > time.Second {
			t.Fatalf("first decision %v after start, want < 1s", d)
		}
	})
	t.Run("ready_and_offline_before_the_server_answers", func(t *testing.T) {
		// guards mutation "return a.ready()" in serving (restored does not count)
		if code, body := h.get("/ready"); code != 200 || body != `{"status":"ok"}` {
			t.Fatalf("/ready = %d %s", code, body)
		}
		if code, body := h.get("/healthcheck"); code != 200 || body != `{"online":false,"status":"ok"}` {
			t.Fatalf("/healthcheck = %d %s", code, body)
		}
		if h.metric("opal_client_policy_info", map[string]string{"hash": old}) != 1 {
			t.Error("policy_info does not carry the restored hash")
		}
	})
	t.Run("server_recovers_online_with_new_decisions", func(t *testing.T) {
		tx := h.successTx()
		if tx.ID != srv.head() || tx.ID == old {
			t.Fatalf("transaction %s, want the new head %s", tx.ID, srv.head())
		}
		if got := srv.policyRequests()[before].Get("base_hash"); got != old {
			t.Fatalf("first fetch base_hash=%q, want the restored %s", got, old)
		}
		if !h.decide("carol", "write") {
			t.Fatal("the server's policy did not replace the backup's")
		}
		if code, body := h.get("/healthcheck"); code != 200 || body != `{"online":true,"status":"ok"}` {
			t.Fatalf("/healthcheck = %d %s", code, body)
		}
		if h.metric("opal_client_policy_staleness_seconds", nil) != 0 {
			t.Error("staleness must end with the first success")
		}
	})
	t.Run("shutdown_backs_up_the_new_policy", func(t *testing.T) {
		// The recovery's backup is written at once (none yet this run); the
		// next policy, an interval early, only by the flush on shutdown.
		waitBackup(t, path, srv.head())
		srv.update(map[string]string{"rbac/extra.rego": "package app.extra\n\nx := 1\n"})
		h.successTx()
		if err := h.shutdown(); err != nil {
			t.Fatal(err)
		}
		// guards mutation "_ = a" for the socket's stop in Run
		h.a.off.mu.Lock()
		running := h.a.off.psCancel != nil
		h.a.off.mu.Unlock()
		if running {
			t.Fatal("the pub/sub socket outlived shutdown")
		}
		if st, _, err := backup.Read(path); err != nil || st.Hash != srv.head() {
			t.Fatalf("backup after the update: %v, err %v; want hash %s", st, err, srv.head())
		}
	})
}

// waitBackup waits, within the test deadline, until the backup at path holds
// hash (the writer works in the background).
func waitBackup(t *testing.T, path, hash string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	tk := time.NewTicker(5 * time.Millisecond)
	defer tk.Stop()
	for {
		if st, _, err := backup.Read(path); err == nil && st.Hash == hash {
			return
		}
		select {
		case <-tk.C:
		case <-ctx.Done():
			t.Fatalf("the backup never held %s", hash)
		}
	}
}

// TestOffline_BadBackupStartsEmpty: a backup that cannot be used is logged
// once and ignored; the agent is empty and not ready until the server answers.
func TestOffline_BadBackupStartsEmpty(t *testing.T) {
	cases := []struct {
		name  string
		write func(t *testing.T, path string)
	}{
		{"corrupt_file", func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte(`{"format":"nope"}`+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"does_not_compile", func(t *testing.T, path string) {
			st := &backup.State{Hash: "h", Policies: map[string]string{"x/x.rego": "package x\nallow if {\n"},
				Data: json.RawMessage(`{}`), Owned: map[string]string{}}
			if err := backup.Write(path, st, time.Now()); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := newTestServer(t, exampleFiles(t))
			path := filepath.Join(t.TempDir(), "opa.json")
			c.write(t, path)
			srv.setScript(retryAfter(503, "1"), retryAfter(503, "1"))
			h := start(t, srv, offlineEnv(path))
			if code, _ := h.get("/ready"); code != 503 {
				t.Fatal("ready on a refused backup")
			}
			if code, body := h.get("/healthcheck"); code != 503 || body != `{"status":"unavailable"}` {
				t.Fatalf("/healthcheck = %d %s", code, body)
			}
			if n := strings.Count(h.logs.String(), "store backup ignored"); n != 1 {
				t.Fatalf("%d refusal lines, want 1", n)
			}
			h.successTx()
			if !h.decide("alice", "write") {
				t.Fatal("no decision after the server answered")
			}
		})
	}
}

// TestOffline_ConnectivityDisabled: with
// OPAL_DEFAULT_OPAL_SERVER_CONNECTIVITY_DISABLED and a valid backup the agent
// serves the backup and connects only when enabled through the API.
func TestOffline_ConnectivityDisabled(t *testing.T) {
	srv := newTestServer(t, exampleFiles(t))
	path := filepath.Join(t.TempDir(), "opa.json")
	firstRun(t, srv, path)
	srv.update(carolEditor(t, srv))
	handshakes := srv.accepted()

	h := start(t, srv, offlineEnv(path, "OPAL_DEFAULT_OPAL_SERVER_CONNECTIVITY_DISABLED", "true"))
	if code, body := h.get("/opal-server/connectivity"); code != 200 ||
		body != `{"offline_mode_enabled":true,"opal_server_connectivity_disabled":true}` {
		t.Fatalf("status = %d %s", code, body)
	}
	if code, body := h.get("/healthcheck"); code != 200 || body != `{"online":false,"status":"ok"}` {
		t.Fatalf("/healthcheck = %d %s", code, body)
	}
	if h.decide("carol", "write") {
		t.Fatal("decided from the server's policy while disconnected")
	}
	if code, body := h.post("/opal-server/connectivity/enable"); code != 200 || body != `{"status":"enabled"}` {
		t.Fatalf("enable = %d %s", code, body)
	}
	tx := h.successTx()
	if tx.ID != srv.head() || !h.decide("carol", "write") {
		t.Fatalf("after enable: transaction %s, want %s", tx.ID, srv.head())
	}
	if got := srv.accepted() - handshakes; got != 1 {
		t.Fatalf("%d handshakes by the restarted agent, want 1 (after enable)", got)
	}
	if code, body := h.post("/opal-server/connectivity/disable"); code != 200 || body != `{"status":"disabled"}` {
		t.Fatalf("disable = %d %s", code, body)
	}
	if h.metric("opal_client_pubsub_connected", nil) != 0 {
		t.Fatal("the socket is still up after disable")
	}
	// A disconnected agent keeps serving what it has.
	if !h.decide("carol", "write") {
		t.Fatal("disable dropped the policy")
	}
}

// TestOffline_NoBackupConnectsAnyway: connectivity disabled by default but
// nothing to restore: staying away would leave the store empty forever.
func TestOffline_NoBackupConnectsAnyway(t *testing.T) {
	srv := newTestServer(t, exampleFiles(t))
	path := filepath.Join(t.TempDir(), "missing", "opa.json")
	h := start(t, srv, offlineEnv(path, "OPAL_DEFAULT_OPAL_SERVER_CONNECTIVITY_DISABLED", "true"))
	h.successTx()
	if code, body := h.get("/opal-server/connectivity"); code != 200 || !strings.Contains(body, `"opal_server_connectivity_disabled":false`) {
		t.Fatalf("status = %d %s", code, body)
	}
}

// unitAgent is an Agent with only what readiness, backups and the switch
// need, on a mock clock.
func unitAgent(clk *clock.Mock, cfg *config.Config, buf *testutil.SyncBuffer) *Agent {
	return &Agent{cfg: cfg, clk: clk, log: slog.New(slog.NewTextHandler(buf, nil)),
		metrics: metrics.New(metrics.Options{Clock: clk}),
		tracker: status.New(status.Options{Clock: clk, MaxAge: cfg.PolicyMaxAge, Logger: slog.New(slog.DiscardHandler)}),
		sched:   scheduler.New(scheduler.Options{Clock: clk, Fire: func() {}})}
}

// TestOffline_MaxAge pins OPAL_POLICY_MAX_AGE: off by default; when set,
// /ready turns 503 once the policy has been behind longer, counted from the
// restored backup's time when one was loaded.
func TestOffline_MaxAge(t *testing.T) {
	cases := []struct {
		name     string
		maxAge   time.Duration
		restored time.Duration // > 0: restored a backup this old, no success
		behind   time.Duration // after a success, failing for this long
		want     bool
	}{
		{"off_ignores_any_age", 0, 0, 48 * time.Hour, true},
		// guards mutation "max < 0" in serving
		{"on_older_is_not_ready", time.Hour, 0, 2 * time.Hour, false},
		{"on_younger_is_ready", time.Hour, 0, 30 * time.Minute, true},
		{"on_current_is_ready", time.Hour, 0, 0, true},
		{"restored_old_backup_is_not_ready", time.Hour, 2 * time.Hour, 0, false},
		{"restored_recent_backup_is_ready", time.Hour, time.Minute, 0, true},
		{"off_restored_old_backup_is_ready", 0, 2 * time.Hour, 0, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clk := clock.NewMock()
			a := unitAgent(clk, &config.Config{PolicyMaxAge: c.maxAge}, &testutil.SyncBuffer{})
			if c.restored > 0 {
				a.tracker.Restored(clk.Now())
				clk.Add(c.restored)
			} else {
				a.tracker.Record(status.Transaction{ID: "h1", Type: status.TypePolicy, Success: true})
				if c.behind > 0 {
					a.tracker.Record(status.Transaction{ID: "h2", Type: status.TypePolicy, Error: "fetch: 503"})
					clk.Add(c.behind)
				}
			}
			if got := a.serving(); got != c.want {
				t.Fatalf("ready %v, want %v (stale %v)", got, c.want, a.tracker.Staleness().Stale())
			}
		})
	}
}

// TestOffline_BackupAfterSuccessOnly: successful policy and data
// transactions schedule a backup, failed ones do not.
func TestOffline_BackupAfterSuccessOnly(t *testing.T) {
	cases := []struct {
		name    string
		tx      status.Transaction
		exports int64
	}{
		// guards mutation "w != nil {" in notifyBackup
		{"failed_data_is_not_backed_up", status.Transaction{ID: "d1", Type: status.TypeData, Success: false}, 0},
		{"data_success_is_backed_up", status.Transaction{ID: "d1", Type: status.TypeData, Success: true}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clk := clock.NewMock()
			a := unitAgent(clk, &config.Config{}, &testutil.SyncBuffer{})
			var n atomic.Int64
			// Hold the clock's interval: at most the first write and the one on Close.
			a.off.writer.Store(backup.NewWriter(backup.WriterOptions{
				Path: filepath.Join(t.TempDir(), "opa.json"), Interval: time.Hour, Clock: clk,
				Logger: slog.New(slog.DiscardHandler),
				Export: func(context.Context) (*backup.State, error) {
					n.Add(1)
					return &backup.State{Policies: map[string]string{}, Data: json.RawMessage(`{}`), Owned: map[string]string{}}, nil
				},
			}))
			a.recordData(c.tx)
			a.stopBackups(context.Background()) // Close writes what is pending, waits for a write in progress
			if got := n.Load(); got != c.exports {
				t.Fatalf("%d exports, want %d", got, c.exports)
			}
		})
	}
}

// TestOffline_Setup pins which configurations put offline mode in effect.
func TestOffline_Setup(t *testing.T) {
	t.Run("external_opa_is_ignored_with_a_warning", func(t *testing.T) {
		var buf testutil.SyncBuffer
		a := unitAgent(clock.NewMock(), &config.Config{OfflineModeEnabled: true,
			StoreBackupPath: filepath.Join(t.TempDir(), "opa.json")}, &buf)
		a.setupOffline(context.Background()) // a.emb is nil: an external OPA
		// guards mutation "if false {" in setupOffline
		if a.off.enabled || !strings.Contains(buf.String(), "offline mode is ignored with an external OPA") {
			t.Fatalf("enabled %v, log %q", a.off.enabled, buf.String())
		}
	})
	t.Run("switch_reports_no_change", func(t *testing.T) {
		a := unitAgent(clock.NewMock(), &config.Config{}, &testutil.SyncBuffer{})
		// guards mutation "if false {" in SetServerConnectivity
		if a.SetServerConnectivity(true) {
			t.Fatal("enabling an enabled connection reported a change")
		}
		if !a.SetServerConnectivity(false) || !a.ServerConnectivityDisabled() || a.SetServerConnectivity(false) {
			t.Fatal("disable did not switch exactly once")
		}
	})
}

// stopCounter is a data updater that counts its Stop calls.
type stopCounter struct {
	fakeData
	stops atomic.Int64
}

func (s *stopCounter) Stop() { s.stops.Add(1) }

// TestOffline_DisableStopsUpdaters: a disabled agent
// re-fetches nothing on its own: no deferred re-fetch fires, an operator
// trigger leaves no deferral armed, and the data updater is stopped, then
// replaced by a fresh one on enable.
func TestOffline_DisableStopsUpdaters(t *testing.T) {
	t.Run("deferred_fire_does_nothing_while_disabled", func(t *testing.T) {
		clk := clock.NewMock()
		a := unitAgent(clk, &config.Config{}, &testutil.SyncBuffer{})
		a.queue = updater.New(updater.Options{Clock: clk})
		a.off.disabled = true
		a.fireDeferred() // guards mutation "if false {" in fireDeferred
		if n := a.queue.Len(); n != 0 {
			t.Fatalf("%d updates queued by a deferral while disabled", n)
		}
		a.off.disabled = false
		if a.fireDeferred(); a.queue.Len() != 1 {
			t.Fatal("an enabled agent's deferral queued nothing")
		}
	})
	t.Run("trigger_while_disabled_leaves_no_deferral", func(t *testing.T) {
		clk := clock.NewMock()
		a := unitAgent(clk, &config.Config{}, &testutil.SyncBuffer{})
		a.sched = scheduler.New(scheduler.Options{Enabled: true, Clock: clk, Fire: func() {}})
		a.off.disabled = true
		a.sched.Arm(0, false) // the triggered fetch failed retryably
		a.onTransaction(updater.Transaction{ID: "x", Type: updater.TypePolicy, Ended: clk.Now()})
		if a.sched.Pending() { // guards mutation "if false {" in onTransaction
			t.Fatal("a deferral stays armed while disabled")
		}
	})
	t.Run("data_updater_stopped_on_disable_replaced_on_enable", func(t *testing.T) {
		a := unitAgent(clock.NewMock(), &config.Config{}, &testutil.SyncBuffer{})
		first, second := &stopCounter{}, &stopCounter{}
		a.data = first
		a.o.NewDataUpdater = func(DataDeps) (DataUpdater, error) { return second, nil }
		a.SetServerConnectivity(false) // guards mutation "_ = a" for a.stopData(false)
		if first.stops.Load() != 1 {
			t.Fatalf("disable stopped the data updater %d times, want 1", first.stops.Load())
		}
		if err := a.triggerData(); !errors.Is(err, ErrConnectivityDisabled) { // guards mutation "if false {" in triggerData
			t.Fatalf("data trigger while disabled = %v", err)
		}
		a.SetServerConnectivity(true) // guards mutation "_ = a" for a.startData()
		if a.dataUpdater() != DataUpdater(second) || second.stops.Load() != 0 {
			t.Fatal("enable did not start a new data updater")
		}
		a.stopData(true) // Run's shutdown
		if first.stops.Load() != 1 || second.stops.Load() != 1 {
			t.Fatalf("stops %d, %d; want 1, 1", first.stops.Load(), second.stops.Load())
		}
	})
}

// TestStaleness_LostConnection: a lost or disabled
// connection ages the policy from that moment, so the stale warning and
// OPAL_POLICY_MAX_AGE see a hard-down server; the socket's close at
// shutdown does not.
func TestStaleness_LostConnection(t *testing.T) {
	cases := []struct {
		name  string
		lose  func(a *Agent)
		stale time.Duration
		ready bool
	}{
		// guards mutation "if false {" in onPubSubState
		{"lost_socket_ages_from_the_loss", func(a *Agent) { a.onPubSubState(true); a.onPubSubState(false) }, 2 * time.Minute, false},
		// guards mutation "if !connected {" in onPubSubState
		{"shutdown_close_is_no_loss", func(a *Agent) { a.off.stopped = true; a.onPubSubState(false) }, 0, true},
		// guards mutation "_ = a" for the Lost call in SetServerConnectivity
		{"disable_ages_from_the_switch", func(a *Agent) { a.SetServerConnectivity(false) }, 2 * time.Minute, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clk := clock.NewMock()
			a := unitAgent(clk, &config.Config{PolicyMaxAge: time.Minute}, &testutil.SyncBuffer{})
			a.tracker.Record(status.Transaction{ID: "h1", Type: status.TypePolicy, Success: true})
			clk.Add(time.Hour) // a quiet server: current, however old
			c.lose(a)
			clk.Add(2 * time.Minute)
			if got := a.tracker.Staleness().Stale(); got != c.stale {
				t.Fatalf("stale %v, want %v", got, c.stale)
			}
			if got := a.serving(); got != c.ready {
				t.Fatalf("ready %v, want %v", got, c.ready)
			}
			a.tracker.Record(status.Transaction{ID: "h1", Type: status.TypePolicy, Success: true}) // the reconnect's update
			if got := a.tracker.Staleness().Stale(); got != 0 {
				t.Fatalf("stale %v after a success", got)
			}
		})
	}
}

// TestOffline_PythonClientBackupRestores: a sidecar switched from the Python
// client restores the backup that client wrote ({"policies","data"} at
// OPAL_STORE_BACKUP_PATH) while the server answers 503: it decides at once,
// ready and online:false; without a hash to start from, the first fetch is
// a full bundle; the next backup is in the format both clients read.
func TestOffline_PythonClientBackupRestores(t *testing.T) {
	srv := newTestServer(t, exampleFiles(t))
	files := exampleFiles(t)
	path := filepath.Join(t.TempDir(), "opa.json")
	// The Python client's OpaClient.full_export: json.dumps of both keys.
	py, err := json.Marshal(map[string]any{
		"policies": map[string]string{"rbac/rbac.rego": files["rbac/rbac.rego"]},
		"data":     map[string]json.RawMessage{"rbac": json.RawMessage(files["rbac/data.json"])},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, py, 0o600); err != nil {
		t.Fatal(err)
	}
	srv.setScript(retryAfter(503, "1"), retryAfter(503, "1"))
	before := len(srv.policyRequests())
	h := start(t, srv, offlineEnv(path))
	t.Run("decides_ready_and_offline_from_the_python_backup", func(t *testing.T) {
		if !h.decide("alice", "write") || h.decide("carol", "write") {
			t.Fatal("the Python client's backup does not decide")
		}
		if code, _ := h.get("/ready"); code != 200 {
			t.Fatalf("/ready = %d", code)
		}
		if code, body := h.get("/healthcheck"); code != 200 || body != `{"online":false,"status":"ok"}` {
			t.Fatalf("/healthcheck = %d %s", code, body)
		}
	})
	t.Run("first_fetch_is_full", func(t *testing.T) {
		h.successTx()
		if got := srv.policyRequests()[before].Get("base_hash"); got != "" {
			t.Fatalf("first fetch base_hash=%q, want a full bundle", got)
		}
	})
	t.Run("next_backup_is_ours_in_the_python_format", func(t *testing.T) {
		waitBackup(t, path, srv.head())
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var both struct {
			Policies map[string]string `json:"policies"`
			Data     map[string]any    `json:"data"`
		}
		if err := json.Unmarshal(raw, &both); err != nil || both.Policies["rbac/rbac.rego"] == "" || both.Data["rbac"] == nil {
			t.Fatalf("the backup is not readable by the Python client: %v %s", err, raw)
		}
	})
}
