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

// TestReadyHealthy pins readiness (§5.3), the lenient health of
// /healthcheck (the Python client's: a success ever, and the store answers)
// and the strict view (/healthcheck?strict=true: the last transactions
// succeeded). A later failure leaves the lenient health 200: the old policy
// still decides.
func TestReadyHealthy(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		data                   bool
		storeErr               error
		txs                    []Transaction
		ready, healthy, strict bool
	}{
		// guards mutation "if false {" in Healthy (never loaded is not healthy)
		{"ready_false_before_any_policy", false, nil, nil, false, false, false},
		{"ready_after_policy_success", false, nil, []Transaction{tx(TypePolicy, true)}, true, true, true},
		{"ready_not_after_failure_only", false, nil, []Transaction{tx(TypePolicy, false)}, false, false, false},
		// A failed update after a success: healthy (the Python client only
		// remembers successes), strictly unhealthy.
		{"later_policy_failure_is_healthy_not_strict", false, nil, []Transaction{tx(TypePolicy, true), tx(TypePolicy, false)}, true, true, false},
		{"success_after_failure_is_healthy", false, nil, []Transaction{tx(TypePolicy, false), tx(TypePolicy, true)}, true, true, true},
		{"unreachable_store_is_unhealthy", false, errors.New("down"), []Transaction{tx(TypePolicy, true)}, true, false, false},
		// The store is probed even after a failed update.
		{"unreachable_store_after_failure_is_store_error", false, errors.New("down"), []Transaction{tx(TypePolicy, true), tx(TypePolicy, false)}, true, false, false},
		// §5.3. Catches: readiness ignoring the data updater.
		{"data_enabled_needs_data_success", true, nil, []Transaction{tx(TypePolicy, true)}, false, false, false},
		{"data_enabled_data_ok", true, nil, []Transaction{tx(TypePolicy, true), tx(TypeData, true)}, true, true, true},
		{"data_later_failure_is_healthy_not_strict", true, nil, []Transaction{tx(TypePolicy, true), tx(TypeData, true), tx(TypeData, false)}, true, true, false},
		{"data_disabled_ignores_data_failure", false, nil, []Transaction{tx(TypePolicy, true), tx(TypeData, false)}, true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := New(Options{Clock: clock.NewMock(), DataUpdaterEnabled: tc.data, Store: &fakeStore{tc.storeErr}})
			for _, x := range tc.txs {
				tr.Record(x)
			}
			if got := tr.Ready(); got != tc.ready {
				t.Errorf("Ready = %v, want %v", got, tc.ready)
			}
			for _, view := range []struct {
				name string
				err  error
				want bool
			}{
				{"Healthy", tr.Healthy(context.Background()), tc.healthy},
				{"Strict", tr.Strict(context.Background()), tc.strict},
			} {
				err := view.err
				if (err == nil) != view.want {
					t.Errorf("%s = %v, want healthy=%v", view.name, err, view.want)
				}
				if err != nil && !errors.Is(err, ErrUnhealthy) {
					t.Errorf("%s: error %v does not wrap ErrUnhealthy", view.name, err)
				}
				// guards mutation "err != nil && false" in probe and the
				// probe's order (a failed update must not hide a dead store)
				if got := errors.Is(err, ErrStoreUnreachable); got != (tc.storeErr != nil) {
					t.Errorf("%s: error %v: ErrStoreUnreachable %v, want %v", view.name, err, got, tc.storeErr != nil)
				}
			}
			if got := tr.StrictOK(); tc.storeErr == nil && got != tc.strict {
				t.Errorf("StrictOK = %v, want %v", got, tc.strict)
			}
		})
	}
}

// TestMaxAge pins OPAL_POLICY_MAX_AGE in the record: a policy behind for
// longer is neither serving (/ready) nor strictly healthy, but stays
// healthy (a restart would not make it younger); a restored backup is
// loaded and counts its age from when it was taken.
func TestMaxAge(t *testing.T) {
	for _, tc := range []struct {
		name                     string
		maxAge                   time.Duration
		restored                 time.Duration // > 0: a backup this old, no success
		behind                   time.Duration // after a success, failing this long
		lost                     time.Duration // after a success, server lost this long
		serving, healthy, strict bool
	}{
		{"off_ignores_any_age", 0, 0, 48 * time.Hour, 0, true, true, false},
		// guards mutation "max < 0" in Serving
		{"over_age_not_serving_not_strict_still_healthy", time.Hour, 0, 2 * time.Hour, 0, false, true, false},
		{"under_age_serving", time.Hour, 0, 30 * time.Minute, 0, true, true, false},
		{"current_is_strict", time.Hour, 0, 0, 0, true, true, true},
		// guards mutation "d > max+time.Hour" in strictState: the last update
		// succeeded, but the server is gone for longer than the max age.
		{"lost_server_over_age_not_strict", time.Hour, 0, 0, 2 * time.Hour, false, true, false},
		{"lost_server_under_age_strict", time.Hour, 0, 0, 30 * time.Minute, true, true, true},
		{"restored_old_backup_not_serving", time.Hour, 2 * time.Hour, 0, 0, false, false, false},
		{"restored_recent_backup_serving", time.Hour, time.Minute, 0, 0, true, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewMock()
			tr := New(Options{Clock: clk, MaxAge: tc.maxAge})
			if tc.restored > 0 {
				tr.Restored(clk.Now())
				clk.Add(tc.restored)
			} else {
				tr.Record(Transaction{ID: "h1", Type: TypePolicy, Success: true})
				if tc.behind > 0 {
					tr.Record(Transaction{ID: "h2", Type: TypePolicy, Error: "fetch: 503"})
					clk.Add(tc.behind)
				}
				if tc.lost > 0 {
					tr.Lost(clk.Now())
					clk.Add(tc.lost)
				}
			}
			if got := tr.Serving(); got != tc.serving {
				t.Errorf("Serving = %v, want %v (stale %v)", got, tc.serving, tr.Staleness().Stale())
			}
			if got := tr.Healthy(context.Background()) == nil; got != tc.healthy {
				t.Errorf("Healthy = %v, want %v", got, tc.healthy)
			}
			if got := tr.Strict(context.Background()) == nil; got != tc.strict {
				t.Errorf("Strict = %v, want %v", got, tc.strict)
			}
			if !tr.Loaded() {
				t.Error("a loaded policy, however old, is Loaded")
			}
		})
	}
}

// TestRecordDrivesStaleness: policy transactions move the staleness record
// (success ends it, a failure starts it with its error), data transactions
// do not; the pub/sub record counts connects.
func TestRecordDrivesStaleness(t *testing.T) {
	clk := clock.NewMock()
	tr := New(Options{Clock: clk})
	tr.Record(Transaction{ID: "h1", Type: TypePolicy, Success: true})
	// guards mutation "if !tx.Success {" in Record
	if d := tr.Staleness().Stale(); d != 0 {
		t.Fatalf("stale %v after a success", d)
	}
	tr.Record(Transaction{ID: "h2", Type: TypePolicy, Error: "fetch: 503"})
	tr.Record(Transaction{ID: "d1", Type: TypeData, Success: true})
	clk.Add(time.Minute)
	s := tr.Snapshot()
	if s.Policy.Stale != time.Minute || s.Policy.LastError != "fetch: 503" {
		t.Fatalf("policy record %+v, want 1m stale with the error", s.Policy)
	}
	tr.PubSubState(true)
	tr.PubSubState(false)
	tr.PubSubState(true)
	if p := tr.Snapshot().PubSub; !p.Connected || p.Connects != 2 || !p.Since.Equal(clk.Now()) {
		t.Fatalf("pub/sub record %+v", p)
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
