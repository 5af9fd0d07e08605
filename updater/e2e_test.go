package updater_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/opal-go/opal-client/config"
	"github.com/opal-go/opal-client/fetcher"
	"github.com/opal-go/opal-client/internal/memstore"
	"github.com/opal-go/opal-client/internal/testutil"
	"github.com/opal-go/opal-client/scheduler"
	"github.com/opal-go/opal-client/updater"
)

const e2eBundle = `{"manifest":["rbac/rbac.rego"],"hash":"2222","old_hash":null,
 "data_modules":[{"path":"rbac","data":"{\"roles\":{\"admin\":[\"read\"]}}"}],
 "policy_modules":[{"path":"rbac/rbac.rego","package_name":"app.rbac","rego":"package app.rbac\n"}],
 "deleted_files":null}`

// End to end: an httptest server answers 503 (Retry-After: 7) three times,
// then 200. The real fetcher (one attempt per fetch, so it never waits),
// the real scheduler and the queue bring the bundle into the memstore on
// the mock clock: deferred rounds of 7 s (the hint), 10 s, 20 s. The test
// waits on real I/O only, bounded by a deadline.
func TestE2E_OutageThenRecovery(t *testing.T) {
	var mu sync.Mutex
	hits := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits++
		n := hits
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if n <= 3 {
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte(e2eBundle))
	}))
	defer srv.Close()

	clk := clock.NewMock()
	rec := &testutil.LogRecorder{}
	logger := slog.New(rec)
	f := fetcher.New(fetcher.Options{ServerURL: srv.URL, Token: "tok",
		Retry:         config.ConnRetryOptions{WaitStrategy: config.WaitFixed, WaitTime: time.Second, Attempts: 1},
		MaxRetryAfter: time.Minute, Clock: clk, Logger: logger, HTTPClient: srv.Client()})
	st := memstore.New()
	txs := make(chan updater.Transaction, 10)
	var delays []time.Duration
	var u *updater.Updater
	sch := scheduler.New(scheduler.Options{Enabled: true, MaxRetryAfter: time.Minute, MaxRounds: 20, Clock: clk,
		Jitter: func(d time.Duration) time.Duration { return d }, Logger: logger,
		Fire:  func() { u.Deferred() },
		OnArm: func(_ int, d time.Duration, _ bool) { delays = append(delays, d) }})
	u = updater.New(updater.Options{Store: st, Fetcher: f, Scheduler: sch, Clock: clk, Logger: logger,
		OnTransaction: func(tx updater.Transaction) { txs <- tx }})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- u.Run(ctx) }()
	defer func() { u.Stop(); sch.Stop(); <-done }()

	next := func() updater.Transaction {
		select {
		case tx := <-txs:
			return tx
		case <-ctx.Done():
			t.Fatal("no transaction before the deadline")
			return updater.Transaction{}
		}
	}
	u.Connect()
	want := []time.Duration{7 * time.Second, 10 * time.Second, 20 * time.Second}
	for i, d := range want {
		if tx := next(); tx.Success {
			t.Fatalf("fetch %d succeeded during the outage", i+1)
		}
		if len(delays) != i+1 || delays[i] != d {
			t.Fatalf("deferral %d: delays %v, want %v", i+1, delays, want[:i+1])
		}
		clk.Add(d) // the timer only queues the deferred re-fetch (D4)
	}
	if tx := next(); !tx.Success || tx.ID != "2222" {
		t.Fatalf("after the outage: %+v", tx)
	}
	if h, _ := st.PolicyHash(ctx); h != "2222" || sch.Pending() || sch.Round() != 0 {
		t.Fatalf("hash %q pending %v round %d; want 2222, no timer, rounds reset", h, sch.Pending(), sch.Round())
	}
	// F9 + D7: one WARNING for the first exhausted fetch (the fetcher
	// rate-limits the later ones, within its WarnEvery, to DEBUG) and one
	// per deferral round (from the scheduler), nothing else.
	if n := rec.Count(slog.LevelWarn); n != 4 {
		for _, r := range rec.Records() {
			t.Log(r.Level, r.Message)
		}
		t.Fatalf("%d warnings, want 1 exhausted fetch + 3 rounds", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if hits != 4 {
		t.Fatalf("%d requests, want 4", hits)
	}
}
