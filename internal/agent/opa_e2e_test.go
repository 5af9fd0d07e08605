package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opal-go/opal-client/internal/devserver"
	"github.com/opal-go/opal-client/internal/testutil"
)

// The external-store end-to-end tests run the real agent against a real
// `opa run --server` (testutil.OPABinary; `make test` installs it). They
// wait on transactions and OPA's answers with deadlines, never sleep; the
// only real delays are the deferral's 5 s floor jittered to 2.5 s.

// storeSecret is the password in OPAL_POLICY_STORE_URL: it must never reach
// a log line or an error text.
const storeSecret = "ST0RE-S3CRET"

// realOPA is an `opa run --server` on addr.
type realOPA struct {
	t    *testing.T
	addr string
	cmd  *exec.Cmd
}

// freeAddr returns a loopback address nothing listens on (yet).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// startOPA runs the real OPA on addr and waits until it answers /health.
func startOPA(t *testing.T, addr string) *realOPA {
	t.Helper()
	bin := testutil.OPABinary(t)
	o := &realOPA{t: t, addr: addr, cmd: exec.Command(bin, "run", "--server", "--addr", addr, "--log-level", "error")}
	if err := o.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.cmd.Process.Kill(); _ = o.cmd.Wait() })
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+addr+"/health", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return o
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("opa on %s not up in time", addr)
		case <-time.After(20 * time.Millisecond): // polling a child process: no event to wait on
		}
	}
}

// get returns OPA's answer to GET path, decoded.
func (o *realOPA) get(path string) any {
	o.t.Helper()
	resp, err := http.Get("http://" + o.addr + path)
	if err != nil {
		o.t.Fatal(err)
	}
	defer resp.Body.Close()
	d := json.NewDecoder(resp.Body)
	d.UseNumber()
	var v struct{ Result any }
	if err := d.Decode(&v); err != nil {
		o.t.Fatalf("GET %s: %v", path, err)
	}
	return v.Result
}

// policies maps each module id to its source.
func (o *realOPA) policies() map[string]string {
	out := map[string]string{}
	for _, p := range o.get("/v1/policies").([]any) {
		m := p.(map[string]any)
		out[m["id"].(string)] = m["raw"].(string)
	}
	return out
}

// storeURL is the agent's OPAL_POLICY_STORE_URL for addr, with the secret
// as user name and password (Go's client hides only the password).
func storeURL(addr string) string { return "http://" + storeSecret + ":" + storeSecret + "@" + addr }

func externalEnv(addr string) map[string]string {
	return map[string]string{
		"OPAL_INLINE_OPA_ENABLED":              "false",
		"OPAL_POLICY_STORE_URL":                storeURL(addr),
		"OPAL_POLICY_STORE_CONN_RETRY":         `{"wait_strategy":"fixed","wait_time":0.1,"attempts":2}`,
		"OPAL_POLICY_UPDATER_MAX_RETRY_AFTER":  "5",
		"OPAL_OPA_HEALTH_CHECK_POLICY_ENABLED": "true",
	}
}

// wantServerState checks that OPA holds exactly the server's policy (its
// module sources) and the base data, and the health-check policy.
func wantServerState(t *testing.T, o *realOPA, srv *dataServer, accounts string) {
	t.Helper()
	pol := o.policies()
	if pol["rbac/rbac.rego"] != srv.files["rbac/rbac.rego"] {
		t.Fatalf("OPA's rbac.rego differs from the server's:\n%s", pol["rbac/rbac.rego"])
	}
	for id := range pol {
		if id != "rbac/rbac.rego" && !strings.HasPrefix(id, "opal/") && !strings.Contains(id, "healthcheck") {
			t.Fatalf("OPA holds a module the server has not: %s", id)
		}
	}
	var wantData any
	d := json.NewDecoder(strings.NewReader(srv.files["rbac/data.json"]))
	d.UseNumber()
	_ = d.Decode(&wantData)
	if got := o.get("/v1/data/rbac"); !reflect.DeepEqual(got, wantData) {
		t.Fatalf("data.rbac = %v, want the bundle's %v", got, wantData)
	}
	var wantAcc any
	d = json.NewDecoder(strings.NewReader(accounts))
	d.UseNumber()
	_ = d.Decode(&wantAcc)
	if got := o.get("/v1/data/accounts"); !reflect.DeepEqual(got, wantAcc) {
		t.Fatalf("data.accounts = %v, want %v", got, wantAcc)
	}
}

// noSecret fails if the store's secret reached a log line.
func noSecret(t *testing.T, h *harness) {
	t.Helper()
	if logs := h.logs.String(); strings.Contains(logs, storeSecret) {
		t.Fatalf("the store URL's secret reached the log:\n%s", logs)
	}
}

// waitData waits for n data transactions and returns how many failed.
func (h *dataHarness) waitData(n int) (failed int) {
	h.t.Helper()
	for i := 0; i < n; i++ {
		if tx := h.dataTx(); !tx.Success {
			failed++
		}
	}
	return failed
}

// failingProxy is a reverse proxy to OPA that answers 500 to the first n
// PUTs of a policy module (not the health-check policy).
type failingProxy struct {
	srv  *httptest.Server
	mu   sync.Mutex
	left int
	hit  int
}

func newFailingProxy(t *testing.T, target string, n int) *failingProxy {
	u, _ := url.Parse("http://" + target)
	rp := httputil.NewSingleHostReverseProxy(u)
	p := &failingProxy{left: n}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "PUT" && strings.HasPrefix(r.URL.Path, "/v1/policies/rbac") {
			p.mu.Lock()
			fail := p.left > 0
			if fail {
				p.left--
				p.hit++
			}
			p.mu.Unlock()
			if fail {
				_, _ = io.Copy(io.Discard, r.Body)
				http.Error(w, `{"code":"internal_error","message":"injected"}`, http.StatusInternalServerError)
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// TestE2E_ExternalStoreRepair: an external OPA that fails a write half-way,
// or that starts after the agent, ends up holding exactly the server's
// current policy and data, without any new notification; the store URL's
// secret never reaches the log.
func TestE2E_ExternalStoreRepair(t *testing.T) {
	const accounts = `{"dave":{"roles":["viewer"]}}`

	// guards mutation "_ = 0" of the transient store failure's re-arm
	t.Run("U2_500_on_a_module_write_repaired", func(t *testing.T) {
		o := startOPA(t, freeAddr(t))
		// Both attempts of the module's PUT fail: the data went in, the
		// module did not (a partial write).
		p := newFailingProxy(t, o.addr, 2)
		srv := newDataServer(t, accounts)
		h := startData(t, srv, externalEnv(strings.TrimPrefix(p.srv.URL, "http://")))
		if tx := h.tx(); tx.Success || !strings.Contains(tx.Error, "OPA holds part of it") {
			t.Fatalf("first policy transaction %+v, want the partial write", tx)
		}
		if !strings.Contains(h.logs.String(), "partly written") {
			t.Fatal("the warning does not say the store was partly written")
		}
		if tx := h.successTx(); tx.ID != srv.head() {
			t.Fatalf("repaired to %s, want the server's %s", tx.ID, srv.head())
		}
		if f := h.waitData(1); f != 0 {
			t.Fatal("base data not written")
		}
		wantServerState(t, o, srv, accounts)
		noSecret(t, h.harness)
	})

	// guards the transient class of an unreachable OPA (RemoteError.Transient)
	t.Run("U2_opa_starting_after_the_agent_waited_for", func(t *testing.T) {
		addr := freeAddr(t)
		srv := newDataServer(t, accounts)
		h := startData(t, srv, externalEnv(addr))
		if tx := h.tx(); tx.Success {
			t.Fatal("a policy was applied to an OPA that is not up")
		}
		o := startOPA(t, addr)
		if tx := h.successTx(); tx.ID != srv.head() {
			t.Fatalf("policy %s, want the server's %s", tx.ID, srv.head())
		}
		for h.dataTx().Success == false { // the base data's deferral repairs it too
		}
		wantServerState(t, o, srv, accounts)
		if pol := o.policies(); !hasHealthPolicy(pol) {
			t.Fatalf("the health-check policy was never written: %v", keys(pol))
		}
		noSecret(t, h.harness)
	})
}

func hasHealthPolicy(pol map[string]string) bool {
	for _, src := range pol {
		if strings.HasPrefix(src, "package system.opal") {
			return true
		}
	}
	return false
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestE2E_ExternalStoreBulkUpdate: a 3,000-entry update, inline and from
// URLs, lands whole in `opa run` (no entry dropped for lack of room).
func TestE2E_ExternalStoreBulkUpdate(t *testing.T) {
	const n = 3000
	const accounts = `{"dave":{"roles":["viewer"]}}`
	for _, kind := range []string{"inline", "url"} {
		t.Run("U1_3000_"+kind+"_entries_land_whole", func(t *testing.T) {
			o := startOPA(t, freeAddr(t))
			srv := newDataServer(t, accounts)
			env := externalEnv(o.addr)
			env["OPAL_OPA_HEALTH_CHECK_POLICY_ENABLED"] = "false"
			h := startData(t, srv, env)
			h.loaded()
			var b strings.Builder
			b.WriteString(`{"id":"bulk","entries":[`)
			for i := 0; i < n; i++ {
				if i > 0 {
					b.WriteByte(',')
				}
				if kind == "inline" {
					fmt.Fprintf(&b, `{"url":"","dst_path":"/bulk/e%d","data":{"i":%d}}`, i, i)
				} else {
					fmt.Fprintf(&b, `{"url":"%s%s","dst_path":"/bulk/e%d"}`, srv.srv.URL, accountsPath, i)
				}
			}
			b.WriteString(`]}`)
			h.publish(b.String())
			if f := h.waitData(n); f != 0 {
				t.Fatalf("%d of %d entries failed", f, n)
			}
			got, _ := o.get("/v1/data/bulk").(map[string]any)
			if len(got) != n {
				t.Fatalf("OPA holds %d of %d entries", len(got), n)
			}
			if kind == "inline" {
				if v := got["e2999"].(map[string]any)["i"]; v != json.Number(strconv.Itoa(2999)) {
					t.Fatalf("e2999 = %v", v)
				}
			}
		})
	}
}

// TestE2E_ExternalStoreDeferralSuperseded: an entry whose source stays down
// is deferred; a newer inline write to the same path lands in `opa run` and
// deletes the deferral, so the older entry can never overwrite it.
func TestE2E_ExternalStoreDeferralSuperseded(t *testing.T) {
	const accounts = `{"dave":{"roles":["viewer"]}}`
	o := startOPA(t, freeAddr(t))
	srv := newDataServer(t, accounts)
	env := externalEnv(o.addr)
	env["OPAL_OPA_HEALTH_CHECK_POLICY_ENABLED"] = "false"
	h := startData(t, srv, env)
	h.loaded()
	writeAccounts(t, srv.dataDir, `{"v":"old"}`)
	srv.dev.Script(accountsPath, devserver.Answer{Status: 503}, devserver.Answer{Status: 503}, devserver.Answer{Status: 503})
	h.publish(`{"entries":[{"url":"` + srv.srv.URL + accountsPath + `","dst_path":"/accounts"}]}`)
	if tx := h.dataTx(); tx.Success {
		t.Fatal("a source answering 503 was written")
	}
	if k, _ := h.a.queue.DataDeferrals(); k != 1 {
		t.Fatalf("%d deferrals after the source stayed down, want 1", k)
	}
	h.publish(`{"entries":[{"url":"","dst_path":"/accounts","data":{"v":"new"}}]}`)
	if tx := h.dataTx(); !tx.Success {
		t.Fatalf("the newer write failed: %s", tx.Error)
	}
	if k, n := h.a.queue.DataDeferrals(); k != 0 || n != 0 {
		t.Fatalf("deferrals %d timers %d after a newer write of the path, want 0 0", k, n)
	}
	if got := o.get("/v1/data/accounts"); !reflect.DeepEqual(got, map[string]any{"v": "new"}) {
		t.Fatalf("data.accounts = %v, want the newer data", got)
	}
}
