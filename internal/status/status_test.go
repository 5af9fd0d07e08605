package status

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/opal-go/opal-client/internal/store/embedded"
	st "github.com/opal-go/opal-client/internal/store/storetest"
)

type fakeStore struct{ err error }

func (f *fakeStore) Health(context.Context) error { return f.err }

func tx(typ string, ok bool) Transaction {
	t := Transaction{ID: "h", Type: typ, Success: ok, Actions: []string{"set_policies"}}
	if !ok {
		t.Error = "boom"
	}
	return t
}

func TestReadyHealthy(t *testing.T) {
	for _, tc := range []struct {
		name         string
		data         bool
		storeErr     error
		txs          []Transaction
		ready, healy bool
	}{
		{"ready_false_before_any_policy", false, nil, nil, false, false},
		{"ready_after_policy_success", false, nil, []Transaction{tx(TypePolicy, true)}, true, true},
		{"ready_not_after_failure_only", false, nil, []Transaction{tx(TypePolicy, false)}, false, false},
		// Catches: only successes updating the last transaction (the Python quirk).
		{"later_policy_failure_is_unhealthy", false, nil, []Transaction{tx(TypePolicy, true), tx(TypePolicy, false)}, true, false},
		{"success_after_failure_is_healthy", false, nil, []Transaction{tx(TypePolicy, false), tx(TypePolicy, true)}, true, true},
		{"unreachable_store_is_unhealthy", false, errors.New("down"), []Transaction{tx(TypePolicy, true)}, true, false},
		// Review finding 5: the store is probed even after a failed update.
		{"unreachable_store_after_failure_is_store_error", false, errors.New("down"), []Transaction{tx(TypePolicy, true), tx(TypePolicy, false)}, true, false},
		// §5.3. Catches: readiness ignoring the data updater.
		{"data_enabled_needs_data_success", true, nil, []Transaction{tx(TypePolicy, true)}, false, false},
		{"data_enabled_data_ok", true, nil, []Transaction{tx(TypePolicy, true), tx(TypeData, true)}, true, true},
		{"data_later_failure_is_unhealthy", true, nil, []Transaction{tx(TypePolicy, true), tx(TypeData, true), tx(TypeData, false)}, true, false},
		{"data_disabled_ignores_data_failure", false, nil, []Transaction{tx(TypePolicy, true), tx(TypeData, false)}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := New(Options{Clock: clock.NewMock(), DataUpdaterEnabled: tc.data, Store: &fakeStore{tc.storeErr}})
			for _, x := range tc.txs {
				tr.Record(x)
			}
			if got := tr.Ready(); got != tc.ready {
				t.Errorf("Ready = %v, want %v", got, tc.ready)
			}
			err := tr.Healthy(context.Background())
			if (err == nil) != tc.healy {
				t.Errorf("Healthy = %v, want healthy=%v", err, tc.healy)
			}
			if err != nil && !errors.Is(err, ErrUnhealthy) {
				t.Errorf("error %v does not wrap ErrUnhealthy", err)
			}
			// guards mutation "err != nil && false" in Healthy and the probe's
			// order (a failed update must not hide a dead store)
			if got := errors.Is(err, ErrStoreUnreachable); got != (tc.storeErr != nil) {
				t.Errorf("error %v: ErrStoreUnreachable %v, want %v", err, got, tc.storeErr != nil)
			}
		})
	}
}

func TestRecordFillsTimesAndStats(t *testing.T) {
	mc := clock.NewMock()
	mc.Set(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	tr := New(Options{Clock: mc})
	tr.Record(tx(TypePolicy, true))
	tr.Record(tx(TypePolicy, false))
	s := tr.Snapshot()
	if s.PolicyStats != (Stats{Successful: 1, Failed: 1}) {
		t.Fatalf("stats %+v", s.PolicyStats)
	}
	if !s.LastPolicy.Ended.Equal(mc.Now()) || s.LastFailedPolicy == nil || s.LastFailedPolicy.Error != "boom" {
		t.Fatalf("snapshot %+v", s)
	}
}

// TestHealthPolicy: the system.opal policy in a real embedded OPA, queryable
// at /v1/data/system/opal/ready, kept by full bundles, following every transaction.
func TestHealthPolicy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := embedded.New(ctx, embedded.Options{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Shutdown(ctx) }()
	o := st.OPA{T: t, Base: "http://" + e.Addr()}
	tr := New(Options{Clock: clock.NewMock(), Store: e, HealthPolicy: e})
	if err := tr.WriteHealthPolicy(ctx); err != nil {
		t.Fatal(err)
	}
	if got := o.Get("/v1/data/system/opal/ready"); got != `{"result":false}` {
		t.Fatalf("ready at start = %s", got)
	}
	if err := e.ApplyPolicy(ctx, st.Full("h1", map[string]string{"p.rego": "package p\n\nx := 1\n"}, nil)); err != nil {
		t.Fatal(err)
	}
	tr.Record(Transaction{ID: "h1", Type: TypePolicy, Success: true, Actions: []string{"set_policies"}})
	for _, tc := range []struct{ name, path, want string }{
		{"ready_after_success", "/v1/data/system/opal/ready", `{"result":true}`},
		{"healthy_after_success", "/v1/data/system/opal/healthy", `{"result":true}`},
		{"stats", "/v1/data/system/opal/transaction_policy_statistics", `{"result":{"failed":0,"successful":1}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := o.Get(tc.path); got != tc.want {
				t.Fatalf("%s = %s, want %s", tc.path, got, tc.want)
			}
		})
	}
	tr.Record(Transaction{ID: "h2", Type: TypePolicy, Success: false, Error: "does not compile"})
	t.Run("healthy_false_after_failure", func(t *testing.T) {
		if got := o.Get("/v1/data/system/opal/healthy"); got != `{"result":false}` {
			t.Fatalf("healthy = %s", got)
		}
		if got := o.Get("/v1/data/system/opal/last_failed_policy_transaction/error"); got != `{"result":"does not compile"}` {
			t.Fatalf("last failed = %s", got)
		}
	})
	t.Run("full_bundle_keeps_health_policy", func(t *testing.T) {
		if err := e.ApplyPolicy(ctx, st.Full("h3", map[string]string{"q.rego": "package q\n\nx := 1\n"}, nil)); err != nil {
			t.Fatal(err)
		}
		if got := o.Get("/v1/data/system/opal/ready"); got != `{"result":true}` {
			t.Fatalf("ready = %s", got)
		}
		if got := o.Get("/v1/data/system/opal/policy_hash"); got != `{"result":"h3"}` {
			t.Fatalf("hash = %s", got)
		}
	})
	t.Run("render_is_rego", func(t *testing.T) {
		if !strings.HasPrefix(RenderHealthPolicy(tr.Snapshot()), "package system.opal\n") {
			t.Fatal("bad render")
		}
	})
}
