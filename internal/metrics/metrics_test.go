package metrics

import (
	"errors"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
)

func TestMetricsMove(t *testing.T) {
	clk := clock.NewMock()
	flat := false
	strict := true
	m := New(Options{Clock: clk, Version: "v1", Flat: func() bool { return flat }, Ready: func() bool { return true },
		Stale: func() time.Duration { return 90 * time.Second }, StrictHealthy: func() bool { return strict }})
	m.FetchAttempt("retryable", 503)
	m.FetchAttempt("retryable", 503)
	m.FetchRetry("retryable")
	m.FetchDone(OutcomeExhausted)
	m.DeferralArmed(false)
	m.DeferralArmed(true)
	flat = true
	m.StoreApply(time.Millisecond, nil, false)
	m.StoreApply(time.Millisecond, errors.New("compile"), false)
	// A base mismatch is not a failure. guards mutation
	// "if false {" in StoreApply
	m.StoreApply(time.Millisecond, errors.New("delta on another base"), true)
	clk.Add(time.Minute)
	m.Transaction("aaa", true, clk.Now())
	m.Transaction("bbb", true, clk.Now())
	m.PubSubState(true)
	m.PubSubState(false)
	m.PubSubState(true)
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"opal_client_policy_fetch_attempts_total", map[string]string{"class": "retryable", "status": "503"}, 2},
		{"opal_client_policy_fetch_retries_total", nil, 1},
		{"opal_client_policy_fetches_total", map[string]string{"outcome": "exhausted"}, 1},
		{"opal_client_policy_deferral_rounds_total", map[string]string{"phase": "flat"}, 1},
		{"opal_client_policy_deferral_flat_phase", nil, 1},
		{"opal_client_store_applies_total", map[string]string{"result": "failure"}, 1},
		{"opal_client_store_applies_total", map[string]string{"result": "base_mismatch"}, 1},
		{"opal_client_policy_info", map[string]string{"hash": "bbb"}, 1},
		{"opal_client_policy_last_success_timestamp_seconds", nil, float64(clk.Now().Unix())},
		{"opal_client_policy_staleness_seconds", nil, 90},
		{"opal_client_strict_healthy", nil, 1},
		{"opal_client_pubsub_connected", nil, 1},
		{"opal_client_pubsub_reconnects_total", nil, 1},
		{"opal_client_ready", nil, 1},
	}
	for _, c := range checks {
		if got, ok := Value(m.Registry(), c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s%v = %v (found %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if _, ok := Value(m.Registry(), "opal_client_policy_info", map[string]string{"hash": "aaa"}); ok {
		t.Error("the old hash must leave the info metric")
	}
	m.Restored("ccc") // after a success: only the hash label moves
	if v, ok := Value(m.Registry(), "opal_client_policy_info", map[string]string{"hash": "ccc"}); !ok || v != 1 {
		t.Error("Restored does not set policy_info")
	}
	var nilM *Metrics
	nilM.Restored("x")
	nilM.FetchAttempt("x", 1)
	nilM.Transaction("x", true, time.Time{})
}

// TestDataEntry pins the data metrics: entries by outcome, and the last
// success time moves only on a success.
func TestDataEntry(t *testing.T) {
	clk := clock.NewMock()
	clk.Add(time.Hour)
	m := New(Options{Clock: clk})
	m.DataEntry("success")
	at := float64(clk.Now().Unix())
	clk.Add(time.Minute)
	// guards mutation "if outcome != DataOutcomeSuccess {" in DataEntry
	m.DataEntry("invalid")
	m.DataEntry("invalid")
	m.DataDeferral()
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"opal_client_data_entries_total", map[string]string{"outcome": "success"}, 1},
		{"opal_client_data_entries_total", map[string]string{"outcome": "invalid"}, 2},
		{"opal_client_data_deferral_rounds_total", nil, 1},
		{"opal_client_data_last_success_timestamp_seconds", nil, at},
	}
	for _, c := range checks {
		if got, ok := Value(m.Registry(), c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s%v = %v (found %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	var nilM *Metrics
	nilM.DataEntry("success")
	nilM.DataDeferral()
}
