package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/opal-go/opal-client/config"
	"github.com/opal-go/opal-client/internal/devserver"
	"github.com/opal-go/opal-client/internal/metrics"
	"github.com/opal-go/opal-client/internal/status"
	"github.com/opal-go/opal-client/internal/testutil"
)

// The end-to-end tests run the real agent (embedded OPA, fetcher, scheduler,
// queue, pub/sub, API) against fakeServer over loopback sockets. They wait on
// events with a deadline and never sleep; the only real delays are the short
// ones configured (100 ms backoff, 1 s Retry-After, the 5 s deferral floor
// jittered to 2.5 s).

const deadline = 10 * time.Second

type harness struct {
	t    *testing.T
	srv  *testServer
	a    *Agent
	txs  chan status.Transaction
	logs *testutil.SyncBuffer
	stop context.CancelFunc
	done chan error
}

func exampleFiles(t *testing.T) map[string]string {
	files := map[string]string{}
	for _, f := range []string{"rbac.rego", "data.json"} {
		b, err := os.ReadFile("../../examples/policy/rbac/" + f)
		if err != nil {
			t.Fatal(err)
		}
		files["rbac/"+f] = string(b)
	}
	return files
}

// start runs an agent against srv; env overrides the test defaults.
func start(t *testing.T, srv *testServer, env map[string]string, opts ...func(*Options)) *harness {
	t.Helper()
	vars := map[string]string{
		"OPAL_SERVER_URL":                     srv.srv.URL,
		"OPAL_CLIENT_TOKEN":                   srv.token,
		"OPAL_DATA_UPDATER_ENABLED":           "false",
		"OPAL_POLICY_UPDATER_CONN_RETRY":      `{"wait_strategy":"fixed","wait_time":0.1,"attempts":2}`,
		"OPAL_POLICY_UPDATER_MAX_RETRY_AFTER": "1",
		"OPAL_POLICY_FETCH_ATTEMPT_TIMEOUT":   "5",
		// Real time: reconnect quickly and resync at once (the fleet spread
		// is tested on virtual time in internal/fleetsim).
		"OPAL_PUBSUB_RECONNECT_SPREAD": "0.2",
		"OPAL_RESYNC_SPREAD":           "0",
		"OPAL_LOG_LEVEL":               "DEBUG",
	}
	for k, v := range env {
		vars[k] = v
	}
	cfg, err := config.LoadFrom(func(k string) (string, bool) { v, ok := vars[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	cfg.ClientAPIServerPort = 0
	cfg.InlineOPAConfig.Addr = "127.0.0.1:0"
	h := &harness{t: t, srv: srv, txs: make(chan status.Transaction, 64), logs: &testutil.SyncBuffer{}, done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	h.stop = cancel
	o := Options{
		Config:        cfg,
		Rand:          func() float64 { return 0 }, // shortest jitter and backoff: fast, still bounded below
		Logger:        slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Version:       "test",
		OnTransaction: func(tx status.Transaction) { h.txs <- tx },
	}
	for _, f := range opts {
		f(&o)
	}
	h.a, err = New(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	go func() { h.done <- h.a.Run(ctx) }()
	t.Cleanup(func() {
		h.shutdown()
		if t.Failed() {
			t.Logf("agent log:\n%s", h.logs.String())
		}
	})
	return h
}

// shutdown cancels Run and waits for it (bounded).
func (h *harness) shutdown() error {
	h.stop()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	select {
	case err := <-h.done:
		h.done <- err // later calls see it too
		return err
	case <-ctx.Done():
		h.t.Fatal("Run did not return after cancel")
		return nil
	}
}

// tx waits for the next policy transaction.
func (h *harness) tx() status.Transaction {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	select {
	case tx := <-h.txs:
		return tx
	case <-ctx.Done():
		h.t.Fatal("no policy transaction in time")
		return status.Transaction{}
	}
}

// successTx waits for a successful transaction, skipping failed ones.
func (h *harness) successTx() status.Transaction {
	h.t.Helper()
	for {
		if tx := h.tx(); tx.Success {
			return tx
		}
	}
}

// waitEvent waits until the server has seen n events of kind e in total.
func (h *harness) waitEvents(kind string, n int) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	seen := 0
	for seen < n {
		select {
		case e := <-h.srv.events:
			if e == kind {
				seen++
			}
		case <-ctx.Done():
			h.t.Fatalf("saw %d %s events, want %d", seen, kind, n)
		}
	}
}

func (h *harness) get(path string) (int, string) {
	h.t.Helper()
	resp, err := http.Get("http://" + h.a.APIAddr() + path)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

func (h *harness) post(path string) (int, string) {
	h.t.Helper()
	resp, err := http.Post("http://"+h.a.APIAddr()+path, "application/json", nil)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// decide asks the embedded OPA data.app.rbac.allow.
func (h *harness) decide(user, action string) bool {
	h.t.Helper()
	in, _ := json.Marshal(map[string]any{"input": map[string]string{"user": user, "action": action, "resource": "documents"}})
	resp, err := http.Post("http://"+h.a.OPAAddr()+"/v1/data/app/rbac/allow", "application/json", bytes.NewReader(in))
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Result *bool `json:"result"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.Result == nil {
		h.t.Fatalf("decision: status %d, err %v", resp.StatusCode, err)
	}
	return *out.Result
}

func (h *harness) metric(name string, labels map[string]string) float64 {
	v, _ := metrics.Value(h.a.Metrics().Registry(), name, labels)
	return v
}

func TestE2E_StartReadyDecision(t *testing.T) {
	srv := newTestServer(t, exampleFiles(t))
	h := start(t, srv, nil)
	tx := h.successTx()
	if tx.ID != srv.head() {
		t.Fatalf("transaction %s, want the head %s", tx.ID, srv.head())
	}
	if code, body := h.get("/ready"); code != 200 || body != `{"status":"ok"}` {
		t.Fatalf("/ready = %d %s", code, body)
	}
	if code, body := h.get("/healthcheck"); code != 200 || body != `{"online":true,"status":"ok"}` {
		t.Fatalf("/healthcheck = %d %s", code, body)
	}
	if !h.decide("alice", "write") || !h.decide("carol", "read") || h.decide("carol", "write") {
		t.Fatal("wrong decisions from the example policy")
	}
	for name, want := range map[string]float64{
		"opal_client_store_applies_total":      1,
		"opal_client_pubsub_connected":         1,
		"opal_client_pubsub_connects_total":    1,
		"opal_client_policy_staleness_seconds": 0,
	} {
		if got := h.metric(name, nil); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if h.metric("opal_client_policy_info", map[string]string{"hash": srv.head()}) != 1 {
		t.Error("policy_info does not carry the head hash")
	}
	if h.metric("opal_client_policy_last_success_timestamp_seconds", nil) == 0 {
		t.Error("last success time not set")
	}
	if h.metric("opal_client_policy_fetch_attempts_total", map[string]string{"class": "success", "status": "200"}) != 1 {
		t.Error("the successful attempt is not counted")
	}
	if code, body := h.get("/metrics"); code != 200 || !strings.Contains(body, "opal_client_policy_staleness_seconds 0") {
		t.Fatalf("/metrics = %d", code)
	}
	// Exactly one fetch per connect: the socket's first connect made one request.
	if n := len(srv.policyRequests()); n != 1 {
		t.Fatalf("%d policy requests after one connect, want 1", n)
	}
}

func TestE2E_NotificationDelta(t *testing.T) {
	srv := newTestServer(t, exampleFiles(t))
	h := start(t, srv, nil)
	first := h.successTx()
	if h.decide("carol", "write") {
		t.Fatal("carol may not write yet")
	}
	data := strings.Replace(srv.files["rbac/data.json"], `"carol": {"roles": ["viewer"]}`, `"carol": {"roles": ["editor"]}`, 1)
	if data == srv.files["rbac/data.json"] {
		t.Fatal("example data changed; fix the test")
	}
	srv.update(map[string]string{"rbac/data.json": data})
	tx := h.successTx()
	if tx.ID != srv.head() || tx.ID == first.ID {
		t.Fatalf("transaction %s, want the new head %s", tx.ID, srv.head())
	}
	reqs := srv.policyRequests()
	if got := reqs[len(reqs)-1].Get("base_hash"); got != first.ID {
		t.Fatalf("the update asked base_hash=%q, want a delta from %s", got, first.ID)
	}
	if !h.decide("carol", "write") {
		t.Fatal("the new policy data is not in effect")
	}
	if got := h.metric("opal_client_policy_update_requests_total", map[string]string{"reason": "notification"}); got != 1 {
		t.Fatalf("notification requests %v", got)
	}
}

func TestE2E_BadBundleKeepsOldPolicy(t *testing.T) {
	srv := newTestServer(t, exampleFiles(t))
	h := start(t, srv, nil)
	h.successTx()
	good := srv.files["rbac/rbac.rego"]
	srv.update(map[string]string{"rbac/rbac.rego": good + "\nallow if {\n"}) // does not parse
	if tx := h.tx(); tx.Success {
		t.Fatal("a bundle that does not compile was applied")
	}
	if !h.decide("alice", "write") || h.decide("carol", "write") {
		t.Fatal("old decisions changed after a failed bundle")
	}
	// The Python client's health: the old policy still decides, so the
	// liveness probe's /healthcheck stays 200; the strict view reports the
	// failure.
	if code, body := h.get("/healthcheck"); code != 200 || body != `{"online":true,"status":"ok"}` {
		t.Fatalf("/healthcheck after a failure = %d %s", code, body)
	}
	if code, body := h.get("/healthcheck?strict=true"); code != 503 || body != `{"status":"unavailable"}` {
		t.Fatalf("/healthcheck?strict=true after a failure = %d %s", code, body)
	}
	if h.metric("opal_client_strict_healthy", nil) != 0 {
		t.Error("opal_client_strict_healthy must be 0 after a failed update")
	}
	if code, _ := h.get("/ready"); code != 200 {
		t.Fatal("a later failure must not unready the agent")
	}
	if h.metric("opal_client_store_applies_total", map[string]string{"result": "failure"}) != 1 {
		t.Error("the failed apply is not counted")
	}
	srv.update(map[string]string{"rbac/rbac.rego": good + "\n# fixed\n"})
	h.successTx()
	if code, _ := h.get("/healthcheck?strict=true"); code != 200 {
		t.Fatalf("/healthcheck?strict=true after the fix = %d", code)
	}
	if h.metric("opal_client_strict_healthy", nil) != 1 {
		t.Error("opal_client_strict_healthy must be 1 once current")
	}
	if h.metric("opal_client_policy_staleness_seconds", nil) != 0 {
		t.Error("staleness must be 0 once current")
	}
}

// 503 with Retry-After 1 for the first requests: the fetch is exhausted, the
// deferred re-fetch (D4) brings the policy in with no notification and no
// reconnect.
func TestE2E_RetryAfterRecoversThroughDeferral(t *testing.T) {
	srv := newTestServer(t, exampleFiles(t))
	srv.setScript(retryAfter(503, "1"), retryAfter(503, "1"), retryAfter(503, "1"))
	h := start(t, srv, nil)
	if tx := h.tx(); tx.Success {
		t.Fatal("the first update should have failed")
	}
	if code, _ := h.get("/ready"); code != 503 {
		t.Fatal("ready without a policy")
	}
	if h.metric("opal_client_policy_staleness_seconds", nil) <= 0 {
		t.Error("staleness must count while the first load fails")
	}
	h.successTx()
	if !h.decide("alice", "read") {
		t.Fatal("no decision after recovery")
	}
	subs := srv.accepted()
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"opal_client_policy_fetch_attempts_total", map[string]string{"class": "retryable", "status": "503"}, 3},
		// The connect fetch retries once (2 attempts); each deferred re-fetch
		// is a single request (D3), so the third 503 ends round 1's fetch and
		// round 2's fetch succeeds.
		{"opal_client_policy_fetch_retries_total", map[string]string{"class": "retryable"}, 1},
		{"opal_client_policy_fetches_total", map[string]string{"outcome": "exhausted"}, 2},
		{"opal_client_policy_fetches_total", map[string]string{"outcome": "success"}, 1},
		{"opal_client_policy_deferral_rounds_total", map[string]string{"phase": "escalating"}, 2},
		{"opal_client_pubsub_reconnects_total", nil, 0},
		{"opal_client_policy_staleness_seconds", nil, 0},
		{"opal_client_policy_update_requests_total", map[string]string{"reason": "notification"}, 0},
	}
	for _, c := range checks {
		if got := h.metric(c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if subs != 1 || len(srv.policyRequests()) != 4 {
		t.Fatalf("subscribes %d, policy requests %d; want 1 and 4", subs, len(srv.policyRequests()))
	}
}

// 409: one request, nothing armed, no re-fetch until the next event (F1, D8).
func TestE2E_409OneRequestUntilNextEvent(t *testing.T) {
	srv := newTestServer(t, exampleFiles(t))
	srv.setScript(retryAfter(409, ""))
	h := start(t, srv, nil)
	if tx := h.tx(); tx.Success {
		t.Fatal("409 applied")
	}
	if n := len(srv.policyRequests()); n != 1 || h.a.sched.Pending() {
		t.Fatalf("after 409: %d requests, deferral pending %v; want 1, false", n, h.a.sched.Pending())
	}
	if h.metric("opal_client_policy_fetches_total", map[string]string{"outcome": "non_retryable"}) != 1 {
		t.Error("the non-retryable fetch is not counted")
	}
	srv.update(map[string]string{"rbac/extra.rego": "package app.extra\n\nx := 1\n"})
	h.successTx()
	if n := len(srv.policyRequests()); n != 2 {
		t.Fatalf("%d requests, want 2", n)
	}
}

// The server drops the socket; the agent reconnects and resyncs what changed
// while it was away, with exactly one fetch per connect.
func TestE2E_DroppedSocketReconnectsAndResyncs(t *testing.T) {
	srv := newTestServer(t, exampleFiles(t))
	h := start(t, srv, nil)
	h.successTx()
	data := strings.Replace(srv.files["rbac/data.json"], `"carol": {"roles": ["viewer"]}`, `"carol": {"roles": ["editor"]}`, 1)
	srv.updateUnseen(map[string]string{"rbac/data.json": data}) // missed: no notification
	srv.dev.RefuseHandshakes(0)
	if tx := h.successTx(); tx.ID != srv.head() {
		t.Fatalf("resynced to %s, want %s", tx.ID, srv.head())
	}
	if !h.decide("carol", "write") {
		t.Fatal("the change made while disconnected is not in effect")
	}
	subs := srv.accepted()
	if subs != 2 || len(srv.policyRequests()) != 2 {
		t.Fatalf("subscribes %d, policy requests %d; want 2 and 2 (one fetch per connect)", subs, len(srv.policyRequests()))
	}
	if h.metric("opal_client_pubsub_reconnects_total", nil) != 1 {
		t.Error("reconnect not counted")
	}
}

// A server that keeps dropping every socket: each reconnect gives exactly one
// fetch (one Connect per connect) and the policy stays loaded.
func TestE2E_EverySocketDropped(t *testing.T) {
	srv := newTestServer(t, exampleFiles(t))
	h := start(t, srv, nil)
	for i := 1; i <= 3; i++ {
		h.successTx()
		if got := len(srv.policyRequests()); got != i {
			t.Fatalf("connect %d: %d policy requests", i, got)
		}
		srv.dev.DropAllSockets()
	}
	h.successTx()
	if !h.decide("alice", "read") {
		t.Fatal("no decision")
	}
	if got := h.metric("opal_client_pubsub_reconnects_total", nil); got != 3 {
		t.Errorf("reconnects %v, want 3", got)
	}
	if got, acc := len(srv.policyRequests()), srv.accepted(); got != acc {
		t.Errorf("%d fetches for %d connects", got, acc)
	}
}

// A bad token: the handshake is refused (403) and retried with backoff, never
// in a hot loop; the agent stays unready.
func TestE2E_BadTokenBacksOff(t *testing.T) {
	srv := newTestServer(t, exampleFiles(t))
	h := start(t, srv, map[string]string{"OPAL_CLIENT_TOKEN": "wrong"})
	h.waitEvents("handshake", 4)
	var at []time.Time
	for _, r := range srv.dev.Requests() {
		if r.Path == "/ws" {
			if r.Status != http.StatusForbidden {
				t.Fatalf("handshake answered %d, want 403", r.Status)
			}
			at = append(at, r.Time)
		}
	}
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < 90*time.Millisecond {
			t.Fatalf("handshake %d came %v after the previous one: a hot loop", i+1, gap)
		}
	}
	if code, _ := h.get("/ready"); code != 503 {
		t.Fatal("ready without a policy")
	}
	if !strings.Contains(h.logs.String(), "handshake refused") || strings.Contains(h.logs.String(), "wrong") {
		t.Fatal("the refusal must be logged, the token never")
	}
}

// Shutdown during a long Retry-After wait returns promptly and cleanly.
func TestE2E_ShutdownDuringLongRetryAfter(t *testing.T) {
	srv := newTestServer(t, exampleFiles(t))
	srv.setScript(retryAfter(503, "3600"), retryAfter(503, "3600"))
	h := start(t, srv, map[string]string{"OPAL_POLICY_UPDATER_MAX_RETRY_AFTER": "3600"})
	h.waitEvents("policy", 1)
	if err := h.shutdown(); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if n := len(srv.policyRequests()); n != 1 {
		t.Fatalf("%d requests; the wait should have been cut short", n)
	}
	if h.a.sched.Timers() != 0 {
		t.Fatal("a deferral timer outlived shutdown (D5)")
	}
	if !strings.Contains(h.logs.String(), "stopped") {
		t.Fatal("no clean stop")
	}
}

// TestE2E_OutageKeepsHealthcheck200: the endpoints the official chart probes
// (/healthcheck for liveness and readiness) stay 200 while the server
// answers 503 after a policy was loaded and decisions keep working; the
// strict view reports the failed update.
func TestE2E_OutageKeepsHealthcheck200(t *testing.T) {
	srv := newTestServer(t, exampleFiles(t))
	h := start(t, srv, nil)
	h.successTx()
	// Longer than one fetch's attempts and any deferred re-fetch in the
	// test's span: the outage lasts.
	outage := make([]devserver.Answer, 50)
	for i := range outage {
		outage[i] = retryAfter(503, "")
	}
	srv.setScript(outage...)
	if code, _ := h.post("/policy-updater/trigger"); code != 200 {
		t.Fatalf("trigger = %d", code)
	}
	if tx := h.tx(); tx.Success {
		t.Fatal("the update during the outage should have failed")
	}
	for _, c := range []struct {
		path string
		code int
	}{
		{"/healthcheck", 200}, {"/healthy", 200}, {"/", 200}, {"/ready", 200},
		{"/healthcheck?strict=true", 503},
	} {
		if code, body := h.get(c.path); code != c.code {
			t.Errorf("%s during the outage = %d %s, want %d", c.path, code, body, c.code)
		}
	}
	if !h.decide("alice", "write") {
		t.Fatal("decisions stopped during the outage")
	}
}
