package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/opal-go/opal-client/internal/devserver"
	"github.com/opal-go/opal-client/internal/status"
)

// The data end-to-end tests run the real agent with its data updater against
// the dev server serving the example policy and a data dir (one source,
// accounts.json, PUT at /accounts, which the example policy reads). Data
// updates are published through the dev server's POST /admin/data-update.
// They wait on transactions and server events with deadlines, never sleep.

const accountsPath = "/data-sources/accounts.json"

// newDataServer is newTestServer with a data dir holding accounts.json. Its
// events also get "source" for each data source request.
func newDataServer(t *testing.T, accounts string) *dataServer {
	t.Helper()
	s := &testServer{t: t, dir: t.TempDir(), token: "test-token", files: map[string]string{}, events: make(chan string, 1024)}
	s.write(exampleFiles(t))
	dataDir := t.TempDir()
	writeAccounts(t, dataDir, accounts)
	s.dev = devserver.New(devserver.Options{PolicyDir: s.dir, DataDir: dataDir, Token: s.token})
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/policy":
			s.event("policy")
		case strings.HasPrefix(r.URL.Path, devserver.DataSourcesPrefix):
			s.event("source")
		}
		s.dev.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		s.dev.Close()
		s.srv.CloseClientConnections()
		s.srv.Close()
	})
	return &dataServer{testServer: s, dataDir: dataDir}
}

// dataServer is a testServer with its data dir.
type dataServer struct {
	*testServer
	dataDir string
}

func writeAccounts(t *testing.T, dir, accounts string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "accounts.json"), []byte(accounts), 0o644); err != nil {
		t.Fatal(err)
	}
}

type dataHarness struct {
	*harness
	dataTxs chan status.Transaction
}

// startData runs the agent with the real data updater; its data
// transactions arrive on dataTxs.
func startData(t *testing.T, srv *dataServer, env map[string]string) *dataHarness {
	t.Helper()
	vars := map[string]string{
		"OPAL_DATA_UPDATER_ENABLED":    "true",
		"OPAL_DATA_UPDATER_CONN_RETRY": `{"wait_strategy":"fixed","wait_time":0.1,"attempts":3}`,
	}
	for k, v := range env {
		vars[k] = v
	}
	dataTxs := make(chan status.Transaction, 64)
	h := start(t, srv.testServer, vars, func(o *Options) {
		o.NewDataUpdater = func(d DataDeps) (DataUpdater, error) {
			rec := d.Record
			d.Record = func(tx status.Transaction) { rec(tx); dataTxs <- tx }
			return NewDataUpdater(d)
		}
	})
	return &dataHarness{harness: h, dataTxs: dataTxs}
}

// dataTx waits for the next data transaction.
func (h *dataHarness) dataTx() status.Transaction {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	select {
	case tx := <-h.dataTxs:
		return tx
	case <-ctx.Done():
		h.t.Fatal("no data transaction in time")
		return status.Transaction{}
	}
}

// loaded waits for the first policy and the base data (one entry).
func (h *dataHarness) loaded() {
	h.t.Helper()
	h.successTx()
	if tx := h.dataTx(); !tx.Success {
		h.t.Fatalf("base data not loaded: %s", tx.Error)
	}
}

// publish posts a DataUpdate to the dev server's admin route; it returns
// once the agent has answered the notify.
func (h *dataHarness) publish(update string) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", h.srv.srv.URL+"/admin/data-update", strings.NewReader(update))
	req.Header.Set("Authorization", "Bearer "+h.srv.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatalf("publish: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out struct{ Delivered int }
	if resp.StatusCode != 200 || json.Unmarshal(b, &out) != nil || out.Delivered != 1 {
		h.t.Fatalf("publish: %d %s", resp.StatusCode, b)
	}
}

// accounts reads data.accounts from the embedded OPA.
func (h *dataHarness) accounts() string {
	h.t.Helper()
	resp, err := http.Get("http://" + h.a.OPAAddr() + "/v1/data/accounts")
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b))
}

func patchUpdate(ops string) string {
	return `{"id":"p1","reason":"test","entries":[{"url":"","topics":["policy_data"],"dst_path":"/accounts","save_method":"PATCH","data":` + ops + `}]}`
}

const promoteDave = `[{"op":"add","path":"/dave/roles/-","value":"editor"}]`

func (h *dataHarness) waitSource(n int) { h.waitEvents("source", n) }

func TestE2E_Data(t *testing.T) {
	const viewer = `{"dave":{"roles":["viewer"]}}`

	// guards mutation `SourcesURL: ""` in NewDataUpdater (no base data)
	t.Run("6_3_base_data_on_connect", func(t *testing.T) {
		h := startData(t, newDataServer(t, `{"dave":{"roles":["editor"]}}`), nil)
		h.loaded()
		if !h.decide("dave", "write") || h.decide("dave", "delete") {
			t.Fatal("the base data is not in effect")
		}
		if code, _ := h.get("/ready"); code != 200 {
			t.Fatalf("/ready = %d after policy and data", code)
		}
		if got := h.metric("opal_client_data_entries_total", map[string]string{"outcome": "success"}); got != 1 {
			t.Fatalf("data entries success = %v", got)
		}
	})

	// guards mutation "return true" in Agent.ready (ready without data)
	t.Run("5_3_ready_needs_data", func(t *testing.T) {
		srv := newDataServer(t, viewer)
		srv.dev.Script(accountsPath, devserver.Answer{Status: 404, Body: `{"detail":"gone"}`}) // non-retryable: one failed transaction
		h := startData(t, srv, nil)
		h.successTx()
		if tx := h.dataTx(); tx.Success {
			t.Fatal("a 404 source was written")
		}
		if code, _ := h.get("/ready"); code != 503 {
			t.Fatalf("/ready = %d with a policy but no data (§5.3)", code)
		}
		if h.metric("opal_client_ready", nil) != 0 {
			t.Fatal("the ready gauge must follow /ready")
		}
		h.publish(`{"entries":[{"url":"","dst_path":"/accounts","data":` + viewer + `}]}`)
		if tx := h.dataTx(); !tx.Success {
			t.Fatalf("inline PUT failed: %s", tx.Error)
		}
		if code, _ := h.get("/ready"); code != 200 {
			t.Fatalf("/ready = %d after a data success", code)
		}
	})

	// guards mutations "_ = topic" for a.data.OnNotify in onNotify and
	// OnOutcome nil in NewDataUpdater
	t.Run("6_2_inline_patch_changes_decision", func(t *testing.T) {
		h := startData(t, newDataServer(t, viewer), nil)
		h.loaded()
		if h.decide("dave", "write") {
			t.Fatal("a viewer may not write")
		}
		h.publish(patchUpdate(promoteDave))
		if tx := h.dataTx(); !tx.Success || tx.ID != "p1" {
			t.Fatalf("patch transaction %+v", tx)
		}
		if !h.decide("dave", "write") {
			t.Fatal("the published patch is not in effect")
		}
		if got := h.metric("opal_client_data_entries_total", map[string]string{"outcome": "success"}); got != 2 {
			t.Fatalf("data entries success = %v, want 2 (base + patch)", got)
		}
	})

	// guards mutation `MaxRetryAfter: 0` in NewDataUpdater (the hint ignored)
	t.Run("F3_source_429_retry_after_then_200", func(t *testing.T) {
		srv := newDataServer(t, viewer)
		h := startData(t, srv, map[string]string{"OPAL_POLICY_UPDATER_MAX_RETRY_AFTER": "2"})
		h.loaded()
		writeAccounts(t, srv.dataDir, `{"dave":{"roles":["editor"]}}`)
		srv.dev.Script(accountsPath, devserver.Answer{Status: 429, Header: http.Header{"Retry-After": {"1"}}, Body: `{"detail":"slow down"}`})
		before := len(srv.dev.Requests())
		h.publish(`{"entries":[{"url":"` + srv.srv.URL + accountsPath + `","dst_path":"/accounts"}]}`)
		if tx := h.dataTx(); !tx.Success {
			t.Fatalf("URL update failed: %s", tx.Error)
		}
		if !h.decide("dave", "write") {
			t.Fatal("the fetched source is not in effect")
		}
		var at []time.Time
		var codes []int
		for _, r := range srv.dev.Requests()[before:] {
			if r.Path == accountsPath {
				at, codes = append(at, r.Time), append(codes, r.Status)
			}
		}
		if fmt.Sprint(codes) != "[429 200]" {
			t.Fatalf("source answers %v, want [429 200]", codes)
		}
		// The 0.1 s backoff alone would come back at once: the hint is honoured.
		if gap := at[1].Sub(at[0]); gap < 900*time.Millisecond {
			t.Fatalf("retried %v after a 429 with Retry-After: 1", gap)
		}
	})

	// guards mutation of dataupdater.apply running the entry inline (the
	// fetch would hold the notify, hence the policy update behind it)
	t.Run("U1_hanging_source_does_not_delay_policy", func(t *testing.T) {
		srv := newDataServer(t, viewer)
		h := startData(t, srv, map[string]string{"OPAL_HTTP_FETCHER_TIMEOUT": "60", "OPAL_FETCHING_CALLBACK_TIMEOUT": "120"})
		h.loaded()
		srv.dev.Script(accountsPath, devserver.Answer{Status: 200, Body: `{"dave":`, Stall: true})
		h.publish(`{"entries":[{"url":"` + srv.srv.URL + accountsPath + `","dst_path":"/accounts"}]}`)
		h.waitSource(2) // the base load's request and the stalled one
		rego := srv.files["rbac/rbac.rego"]
		srv.update(map[string]string{"rbac/rbac.rego": strings.Replace(rego, `allow if "admin" in user_roles`, `allow if "owner" in user_roles`, 1)})
		if tx := h.successTx(); tx.ID != srv.head() {
			t.Fatalf("policy %s, want %s", tx.ID, srv.head())
		}
		select {
		case tx := <-h.dataTxs:
			t.Fatalf("the stalled fetch ended (%+v) before the policy update: it was waited for", tx)
		default:
		}
		if h.decide("alice", "delete") {
			t.Fatal("the new policy is not in effect")
		}
	})

	// guards mutation OnOutcome nil in NewDataUpdater (the refusal uncounted)
	t.Run("U3_bad_patch_leaves_data_unchanged", func(t *testing.T) {
		h := startData(t, newDataServer(t, viewer), nil)
		h.loaded()
		before := h.accounts()
		// The first operation applies, the second does not: nothing is written.
		h.publish(patchUpdate(`[{"op":"add","path":"/dave/roles/-","value":"editor"},{"op":"remove","path":"/nobody"}]`))
		if tx := h.dataTx(); tx.Success {
			t.Fatal("a patch that does not apply succeeded")
		}
		if got := h.accounts(); got != before || h.decide("dave", "write") {
			t.Fatalf("data changed by a failed patch: %s -> %s", before, got)
		}
		if got := h.metric("opal_client_data_entries_total", map[string]string{"outcome": "invalid"}); got != 1 {
			t.Fatalf("invalid entries = %v, want 1", got)
		}
	})

	// guards mutation "_ = a.data" for a.data.OnConnect in onConnect
	t.Run("6_3_reconnect_reloads_base_data", func(t *testing.T) {
		srv := newDataServer(t, viewer)
		h := startData(t, srv, nil)
		h.loaded()
		h.publish(patchUpdate(promoteDave))
		if tx := h.dataTx(); !tx.Success || !h.decide("dave", "write") {
			t.Fatal("patch not applied")
		}
		srv.dev.DropAllSockets()
		if tx := h.dataTx(); !tx.Success {
			t.Fatalf("base reload failed: %s", tx.Error)
		}
		if h.decide("dave", "write") {
			t.Fatal("the reconnect did not reload the base data")
		}
		if n := h.metric("opal_client_pubsub_reconnects_total", nil); n != 1 {
			t.Fatalf("reconnects %v", n)
		}
	})
}
