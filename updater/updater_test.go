package updater_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/opal-go/opal-client/fetcher"
	"github.com/opal-go/opal-client/updater"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// U2/D5/D6: the outcome of a fetch drives the scheduler.
func TestU2_FetchOutcomeDrivesScheduler(t *testing.T) {
	t.Run("exhausted_retryable_arms_with_hint", func(t *testing.T) {
		// Catches: arming without the server's hint, or not arming at all.
		bubble(t, func(t *testing.T) {
			r := newRig(t, rigOpt{})
			r.f.set(hinted(30 * time.Second))
			r.start()
			r.u.Connect()
			settle()
			if a := r.lastArm(t); a.round != 1 || a.delay != 30*time.Second {
				t.Fatalf("armed %+v, want round 1 with the 30s hint", a)
			}
			if !r.s.Pending() {
				t.Fatal("no timer pending")
			}
		})
	})
	t.Run("non_retryable_arms_nothing", func(t *testing.T) {
		// D8. Catches: arming on any error.
		bubble(t, func(t *testing.T) {
			r := newRig(t, rigOpt{})
			r.f.set(okNR, outcome{err: &fetcher.BundlePathNotFound{NonRetryableError: fetcher.NonRetryableError{Status: 404}}})
			r.start()
			r.u.Connect()
			settle()
			r.u.Connect()
			settle()
			if r.nArms() != 0 || r.s.Pending() {
				t.Fatal("non-retryable fetch armed the scheduler")
			}
			if tx := r.transactions(); len(tx) != 2 || tx[0].Success || tx[1].Success {
				t.Fatalf("transactions %+v, want two failures", tx)
			}
		})
	})
	t.Run("success_cancels_and_resets", func(t *testing.T) {
		// D5/D6. Catches: success not resetting the scheduler.
		bubble(t, func(t *testing.T) {
			r := newRig(t, rigOpt{})
			r.f.set(outcome{bundle: full("h1")}, ok503, ok503)
			r.start()
			r.u.Connect()
			settle()
			r.u.Connect()
			settle()
			if r.s.Round() != 2 || !r.s.Pending() {
				t.Fatalf("round %d pending %v, want 2 true", r.s.Round(), r.s.Pending())
			}
			r.u.Connect()
			settle()
			if r.s.Round() != 0 || r.s.Pending() {
				t.Fatalf("after success: round %d pending %v", r.s.Round(), r.s.Pending())
			}
			if got := r.st.Applied(); !slices.Equal(got, []string{"h1"}) {
				t.Fatalf("applied %v", got)
			}
		})
	})
}

// D5/D6: triggers cancel the pending timer; only a genuine update resets
// the rounds. The queue is not running, so only the trigger itself acts.
func TestD6_TriggersVersusUpdates(t *testing.T) {
	for _, tc := range []struct {
		name       string
		trigger    func(u *updater.Updater)
		wantRounds int
	}{
		// Catches: a reconnect resetting the rounds; a reconnect not cancelling.
		{"reconnect_cancels_keeps_rounds", func(u *updater.Updater) { u.Connect() }, 2},
		// Catches: the operator trigger resetting the rounds or not cancelling.
		{"force_full_cancels_keeps_rounds", func(u *updater.Updater) { u.ForceFull() }, 2},
		// Catches: a genuine update not resetting the rounds.
		{"genuine_update_cancels_and_resets", func(u *updater.Updater) { u.PolicyUpdate([]string{"."}) }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				r := newRig(t, rigOpt{})
				r.s.Arm(0, false)
				r.s.Cancel()
				r.s.Arm(0, false)
				tc.trigger(r.u)
				if r.s.Pending() || r.s.Round() != tc.wantRounds {
					t.Fatalf("pending %v round %d; want false %d", r.s.Pending(), r.s.Round(), tc.wantRounds)
				}
			})
		})
	}
	t.Run("empty_intersection_changes_nothing", func(t *testing.T) {
		// §3.3: no fetch at all, and the pending deferral is kept.
		bubble(t, func(t *testing.T) {
			r := newRig(t, rigOpt{dirs: []string{"rbac"}})
			r.s.Arm(0, false)
			r.start()
			r.u.PolicyUpdate([]string{".", "rbac/rules", "rbac/"})
			settle()
			if len(r.f.requests()) != 0 || !r.s.Pending() || r.s.Round() != 1 {
				t.Fatalf("requests %v pending %v round %d", r.f.requests(), r.s.Pending(), r.s.Round())
			}
		})
	})
}

// D3/D6: a reconnect storm during an outage still reaches the flat phase.
// Catches: a reconnect resetting the rounds.
func TestD6_ReconnectStormReachesFlat(t *testing.T) {
	bubble(t, func(t *testing.T) {
		r := newRig(t, rigOpt{maxRounds: 3})
		r.f.set(ok503)
		r.start()
		for i := 0; i < 6; i++ {
			r.u.Connect()
			settle()
		}
		if !r.s.Flat() {
			t.Fatalf("not flat after 6 failed reconnects (round %d)", r.s.Round())
		}
		// One WARNING per escalating round and one on entering the flat phase
		// (D7); the fake fetcher logs nothing and the updater only DEBUG (F9).
		if n := r.log.Count(slog.LevelWarn); n != 4 {
			t.Fatalf("%d warnings, want 4", n)
		}
		r.f.set(outcome{bundle: full("h2")})
		r.u.PolicyUpdate([]string{"."})
		settle()
		if r.s.Flat() || r.s.Round() != 0 {
			t.Fatal("a genuine update did not clear the flat phase")
		}
	})
}

// U1/U2: the request carries the right paths and base hash.
func TestU2_Requests(t *testing.T) {
	for _, tc := range []struct {
		name    string
		dirs    []string
		stored  string
		readErr error
		act     func(u *updater.Updater)
		want    fetcher.Request
	}{
		// Catches: connect not using the stored hash.
		{"connect_uses_stored_hash_and_all_dirs", []string{"a", "b"}, "h0", nil,
			func(u *updater.Updater) { u.Connect() }, fetcher.Request{Paths: []string{"a", "b"}, BaseHash: "h0"}},
		// Catches: a forced update sending base_hash.
		{"force_full_ignores_hash", []string{"a"}, "h0", nil,
			func(u *updater.Updater) { u.ForceFull() }, fetcher.Request{Paths: []string{"a"}}},
		// Catches: a policy update not intersecting with the subscription dirs.
		{"update_intersects_dirs", []string{"a", "b/c"}, "h0", nil,
			func(u *updater.Updater) { u.PolicyUpdate([]string{".", "b", "b/c", "x", "b/c"}) },
			fetcher.Request{Paths: []string{"b/c"}, BaseHash: "h0"}},
		// D3: a deferred re-fetch is one request; the scheduler is its backoff.
		// Catches: "it.reasons == reasonDeferred" -> "false" (a whole retry
		// policy per flat round, several requests a round).
		{"deferred_uses_stored_hash_and_one_attempt", nil, "h0", nil,
			func(u *updater.Updater) { u.Deferred() }, fetcher.Request{Paths: []string{"."}, BaseHash: "h0", Attempts: 1}},
		// Catches: "it.force = it.force || o.force" -> "it.force = it.force"
		// (an operator trigger merged after a connect losing its force).
		{"force_full_merged_after_connect_ignores_hash", []string{"a"}, "h0", nil,
			func(u *updater.Updater) { u.Connect(); u.ForceFull() }, fetcher.Request{Paths: []string{"a"}}},
		// Catches: "==" -> "&" (a connect merged with a deferral losing its retries).
		{"connect_merged_with_deferred_keeps_full_retries", nil, "h0", nil,
			func(u *updater.Updater) { u.Deferred(); u.Connect() }, fetcher.Request{Paths: []string{"."}, BaseHash: "h0"}},
		// F11. Catches: aborting on a hash read failure.
		{"F11_read_failure_degrades_to_full", nil, "h0", errors.New("store down"),
			func(u *updater.Updater) { u.Connect() }, fetcher.Request{Paths: []string{"."}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				r := newRig(t, rigOpt{dirs: tc.dirs})
				if tc.stored != "" {
					if err := r.st.ApplyPolicy(context.Background(), full(tc.stored)); err != nil {
						t.Fatal(err)
					}
				}
				r.st.FailReads(tc.readErr)
				tc.act(r.u) // queued before Run, so a merge is certain
				r.start()
				settle()
				got := r.f.requests()
				if len(got) != 1 || !slices.Equal(got[0].Paths, tc.want.Paths) || got[0].BaseHash != tc.want.BaseHash || got[0].Attempts != tc.want.Attempts {
					t.Fatalf("requests %+v, want [%+v]", got, tc.want)
				}
			})
		})
	}
}

// F11: a hash read failure still arms the scheduler when the fetch fails.
func TestF11_ReadFailureStillArms(t *testing.T) {
	bubble(t, func(t *testing.T) {
		r := newRig(t, rigOpt{})
		r.st.FailReads(errors.New("store down"))
		r.f.set(ok503)
		r.start()
		r.u.Connect()
		settle()
		if !r.s.Pending() || r.s.Round() != 1 {
			t.Fatal("failing fetch after a read failure did not arm")
		}
	})
}

// A delta on another base is answered with a full fetch, applied instead.
// Catches: dropping the full re-fetch on BaseMismatchError.
func TestU2_BaseMismatchFetchesFull(t *testing.T) {
	bubble(t, func(t *testing.T) {
		r := newRig(t, rigOpt{})
		if err := r.st.ApplyPolicy(context.Background(), full("h0")); err != nil {
			t.Fatal(err)
		}
		r.f.set(outcome{bundle: full("h2")}, outcome{bundle: delta("other", "h2")})
		r.start()
		r.u.Connect()
		settle()
		reqs := r.f.requests()
		if len(reqs) != 2 || reqs[0].BaseHash != "h0" || reqs[1].BaseHash != "" {
			t.Fatalf("requests %+v, want a delta then a full fetch", reqs)
		}
		if h, _ := r.st.PolicyHash(context.Background()); h != "h2" {
			t.Fatalf("hash %q, want h2", h)
		}
		if tx := r.transactions(); len(tx) != 1 || !tx[0].Success || tx[0].ID != "h2" {
			t.Fatalf("transactions %+v", tx)
		}
	})
}

// U3: a store write failure is reported and leaves the store as it was.
func TestU3_ApplyFailureReported(t *testing.T) {
	bubble(t, func(t *testing.T) {
		r := newRig(t, rigOpt{})
		r.st.FailWrites(errors.New("disk full"))
		r.start()
		r.u.Connect()
		settle()
		tx := r.transactions()
		if len(tx) != 1 || tx[0].Success || tx[0].Error == "" || tx[0].ID != "h1" || tx[0].Type != "policy" {
			t.Fatalf("transactions %+v, want one failed policy transaction for h1", tx)
		}
		if h, _ := r.st.PolicyHash(context.Background()); h != "" {
			t.Fatal("failed write changed the store")
		}
		if n := r.log.Count(slog.LevelWarn); n != 1 {
			t.Fatalf("%d warnings, want 1 for the failed apply", n)
		}
	})
}

// A failed fetch has no bundle hash: its transaction gets a random hex id.
func TestU2_TransactionIDWithoutBundle(t *testing.T) {
	bubble(t, func(t *testing.T) {
		r := newRig(t, rigOpt{})
		r.f.set(okNR)
		// Both queued before Run, so they merge into one transaction; a
		// worker started first could take the Connect alone.
		r.u.Connect()
		r.u.ForceFull()
		r.start()
		settle()
		tx := r.transactions()
		if len(tx) != 1 || len(tx[0].ID) != 32 || tx[0].Success {
			t.Fatalf("transactions %+v, want one failure with a 32-hex id", tx)
		}
	})
}

// U2: requests that pile up while one runs coalesce with the tail, never
// across a data write, and a flood stays bounded.
func TestU2_Coalescing(t *testing.T) {
	t.Run("flood_is_one_request", func(t *testing.T) {
		// Catches: appending instead of merging with the tail.
		bubble(t, func(t *testing.T) {
			r := newRig(t, rigOpt{dirs: []string{"a", "b"}})
			r.f.gate = make(chan struct{})
			r.start()
			r.u.Connect()
			settle() // the connect fetch is now blocked
			for i := 0; i < 10000; i++ {
				r.u.PolicyUpdate([]string{"a"})
			}
			r.u.PolicyUpdate([]string{"b"})
			if r.u.Len() != 1 {
				t.Fatalf("queue holds %d requests, want 1", r.u.Len())
			}
			r.f.gate <- struct{}{}
			r.f.gate <- struct{}{}
			settle()
			reqs := r.f.requests()
			if len(reqs) != 2 || !slices.Equal(reqs[1].Paths, []string{"a", "b"}) {
				t.Fatalf("requests %+v, want the connect then one fetch of the union", reqs)
			}
		})
	})
	t.Run("deferred_widens_to_all_dirs", func(t *testing.T) {
		bubble(t, func(t *testing.T) {
			r := newRig(t, rigOpt{dirs: []string{"a", "b", "c"}})
			r.f.gate = make(chan struct{})
			r.start()
			r.u.Connect()
			settle()
			r.u.PolicyUpdate([]string{"a"})
			r.u.Deferred()
			r.u.PolicyUpdate([]string{"b"})
			close(r.f.gate)
			settle()
			reqs := r.f.requests()
			if len(reqs) != 2 || !slices.Equal(reqs[1].Paths, []string{"a", "b", "c"}) {
				t.Fatalf("requests %+v, want one fetch of every dir", reqs)
			}
		})
	})
	t.Run("never_across_a_data_write", func(t *testing.T) {
		// Catches: merging into any earlier policy request (reordering).
		bubble(t, func(t *testing.T) {
			r := newRig(t, rigOpt{dirs: []string{"a", "b"}})
			r.f.gate = make(chan struct{})
			r.start()
			r.u.Connect()
			settle()
			r.u.PolicyUpdate([]string{"a"})
			fetchesBeforeData := -1
			r.u.Data(updater.DataWork{Name: "d", Path: []string{"d"}, Apply: func(context.Context) error { fetchesBeforeData = len(r.f.requests()); return nil }})
			r.u.PolicyUpdate([]string{"b"})
			if r.u.Len() != 3 {
				t.Fatalf("queue holds %d, want policy, data, policy", r.u.Len())
			}
			close(r.f.gate)
			settle()
			reqs := r.f.requests()
			if fetchesBeforeData != 2 || len(reqs) != 3 || !slices.Equal(reqs[2].Paths, []string{"b"}) {
				t.Fatalf("data ran after %d fetches; requests %+v", fetchesBeforeData, reqs)
			}
		})
	})
}

// D4/U1: the deferred re-fetch runs through the queue, serialised with a
// concurrent pub/sub update: no two store transactions overlap.
func TestD4_DeferredSerialisedWithUpdate(t *testing.T) {
	bubble(t, func(t *testing.T) {
		r := newRig(t, rigOpt{})
		r.f.set(outcome{bundle: full("h1")}, ok503)
		hold := make(chan struct{})
		entered := make(chan struct{}, 4)
		r.st.BeforeWrite = func(context.Context) { entered <- struct{}{}; <-hold }
		r.start()
		r.u.Connect()
		settle()
		if !r.s.Pending() {
			t.Fatal("not armed")
		}
		r.clk.Add(5 * time.Second) // fires: Deferred is queued, not fetched here
		settle()
		<-entered // the deferred re-fetch's transaction is open
		r.f.set(outcome{bundle: full("h2")})
		r.u.PolicyUpdate([]string{"."})
		settle()
		if len(entered) != 0 {
			t.Fatal("a second transaction started while one is open")
		}
		close(hold)
		settle()
		if n := len(r.f.requests()); n != 3 {
			t.Fatalf("%d fetches, want connect, deferred, update", n)
		}
		if r.st.Overlaps() != 0 {
			t.Fatalf("%d overlapping transactions", r.st.Overlaps())
		}
		if got := r.st.Applied(); !slices.Equal(got, []string{"h1", "h2"}) {
			t.Fatalf("applied %v", got)
		}
	})
}

// Run ends on Stop (nil) or on its context (the context's error); requests
// after Stop are dropped.
func TestU1_RunStop(t *testing.T) {
	t.Run("stop", func(t *testing.T) {
		bubble(t, func(t *testing.T) {
			r := newRig(t, rigOpt{})
			r.f.gate = make(chan struct{})
			r.start()
			r.u.Connect()
			settle()
			r.u.Stop() // the blocked fetch sees the cancellation
			if err := <-r.runEr; err != nil {
				t.Fatalf("Run after Stop: %v", err)
			}
			r.u.Connect()
			if r.u.Len() != 0 || r.nArms() != 0 {
				t.Fatal("request accepted or scheduler armed after Stop")
			}
		})
	})
	t.Run("context", func(t *testing.T) {
		bubble(t, func(t *testing.T) {
			r := newRig(t, rigOpt{})
			ctx, cancel := context.WithCancel(context.Background())
			go func() { r.runEr <- r.u.Run(ctx) }()
			settle()
			cancel()
			if err := <-r.runEr; !errors.Is(err, context.Canceled) {
				t.Fatalf("Run: %v", err)
			}
		})
	})
}

// When the full bundle fetched after a base mismatch fails to
// apply, that is one WARNING, as for any failed apply (U3). Mutation caught:
// the WARNING of the full bundle's apply dropped.
func TestU3_ApplyFailureAfterBaseMismatchWarned(t *testing.T) {
	bubble(t, func(t *testing.T) {
		r := newRig(t, rigOpt{})
		if err := r.st.ApplyPolicy(context.Background(), full("h0")); err != nil {
			t.Fatal(err)
		}
		bad := full("h2")
		bad.DataModules = []fetcher.DataModule{{Path: "x", Data: "{not json"}}
		r.f.set(outcome{bundle: bad}, outcome{bundle: delta("other", "h2")})
		r.start()
		r.u.Connect()
		settle()
		if reqs := r.f.requests(); len(reqs) != 2 || reqs[1].BaseHash != "" {
			t.Fatalf("requests %+v, want a delta then a full fetch", reqs)
		}
		if tx := r.transactions(); len(tx) != 1 || tx[0].Success {
			t.Fatalf("transactions %+v, want one failed", tx)
		}
		if h, _ := r.st.PolicyHash(context.Background()); h != "h0" {
			t.Fatalf("hash %q, want h0 (unchanged)", h)
		}
		if n := r.log.Count(slog.LevelWarn); n != 1 {
			t.Fatalf("%d warnings, want 1 for the failed apply", n)
		}
	})
}
