package fleetsim

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/benbjohnson/clock"
)

// TestFleetSimulation is the fleet benchmark (make bench), skipped unless
// OPAL_FLEETSIM=1. It prints one table per scenario, the targets' verdicts,
// and writes the scenario (a) timeline plot at C = 200/s. Settings:
// OPAL_FLEETSIM_AGENTS (10000), OPAL_FLEETSIM_SEED (1), OPAL_FLEETSIM_SVG
// (docs/fleet-a-timeline.svg; "-" writes none), OPAL_FLEETSIM_ONLY (a
// comma-separated subset of scenarios), OPAL_FLEETSIM_RESYNC_SPREAD
// (seconds: our agents with another OPAL_RESYNC_SPREAD).
func TestFleetSimulation(t *testing.T) {
	if os.Getenv("OPAL_FLEETSIM") != "1" {
		t.Skip("set OPAL_FLEETSIM=1 to run the fleet simulation")
	}
	base := Config{Agents: envInt(t, "OPAL_FLEETSIM_AGENTS", 10000), Seed: uint64(envInt(t, "OPAL_FLEETSIM_SEED", 1))}
	if os.Getenv("OPAL_FLEETSIM_RESYNC_SPREAD") != "" { // a sensitivity run: our agents with another window
		base.ResyncSpread = time.Duration(envInt(t, "OPAL_FLEETSIM_RESYNC_SPREAD", 0)) * time.Second
	}
	svg := os.Getenv("OPAL_FLEETSIM_SVG")
	if svg == "" {
		svg = filepath.Join("..", "..", "docs", "fleet-a-timeline.svg")
	}
	only := os.Getenv("OPAL_FLEETSIM_ONLY") // e.g. "r,s": a subset of scenarios
	var scs []Scenario
	for _, sc := range Scenarios() {
		if only == "" || slices.Contains(strings.Split(only, ","), sc.Name) {
			scs = append(scs, sc)
		}
	}
	results := map[string][]Result{}
	begin := time.Now()
	for _, sc := range scs {
		start := time.Now()
		for _, run := range RunsOf(sc) {
			cfg := base
			cfg.Capacity, cfg.Queue = run.Capacity, run.Queue
			synctest.Test(t, func(t *testing.T) { results[sc.Name] = append(results[sc.Name], Run(sc, run.Policy, cfg)) })
		}
		WriteTable(os.Stdout, sc, results[sc.Name])
		fmt.Printf("\n(simulated %s of %d agents, %d runs, in %.1f s of wall time)\n", sc.End(), base.Agents, len(results[sc.Name]), time.Since(start).Seconds())
	}
	fmt.Printf("\n### Targets (10,000 agents, C = %d/s, defaults)\n\n", TargetCapacity)
	for _, v := range Targets(scs, results) {
		fmt.Println("-", v)
	}
	fmt.Printf("\nTotal wall time %.1f s (seed %d).\n", time.Since(begin).Seconds(), base.Seed)
	if svg != "-" && results["a"] != nil {
		var at200 []Result
		for _, r := range results["a"] {
			if r.Capacity == TargetCapacity && !r.Queue {
				at200 = append(at200, r)
			}
		}
		f, err := os.Create(svg)
		if err != nil {
			t.Fatal(err)
		}
		if err := WriteSVG(f, scenario(t, "a"), at200, 180*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		fmt.Println("Wrote", svg)
	}
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

func scenario(t *testing.T, name string) Scenario {
	for _, sc := range Scenarios() {
		if sc.Name == name {
			return sc
		}
	}
	t.Fatalf("no scenario %q", name)
	return Scenario{}
}

// TestScenarioA runs 50 agents of each policy through scenario (a) on an
// unlimited server and pins what the real code does there.
func TestScenarioA(t *testing.T) {
	const n = 50
	sc := scenario(t, "a")
	run := func(p Policy) (r Result) {
		synctest.Test(t, func(t *testing.T) { r = Run(sc, p, Config{Agents: n, Seed: 7}) })
		return r
	}
	t.Run("ours_recovers_every_agent", func(t *testing.T) {
		r := run(Ours)
		// Catches the restart not reaching the agents' sockets (no
		// reconnect, no resync: no agent recovers), and the server serving
		// early or late (the times move).
		if r.Stale != 0 {
			t.Fatalf("stale = %d, want 0", r.Stale)
		}
		// Reconnect in [0.1 s, 15 s], resync in [15 s, 70 s]; the 503 with
		// Retry-After 30 is a floor spread into [30 s, 60 s] (F4) and the
		// deferral spreads upward from it (D2): everyone holds the new
		// policy within 75 s of the recovery at 45 s.
		if r.T100 > 75*time.Second {
			t.Fatalf("last agent recovered %v after recovery, want <= 75 s", r.T100)
		}
		if r.T100-r.T50 < time.Second {
			t.Fatalf("recovery times %v %v %v are bunched, want spread by the jitter", r.T50, r.T99, r.T100)
		}
		// One handshake and two data requests per agent: the restart's
		// reconnect and its resync.
		if r.Handshakes != 1 || r.Data != 2 {
			t.Fatalf("handshakes %v, data %v per agent; want 1 and 2", r.Handshakes, r.Data)
		}
	})
	t.Run("python_gives_up_after_5_attempts", func(t *testing.T) {
		r := run(PythonOPAL)
		// Catches an off-by-one in the Python model's attempt count.
		if r.OutageRequests != 5 || r.PolicyReqs != 5 {
			t.Fatalf("requests per agent = %v (in all %v), want 5", r.OutageRequests, r.PolicyReqs)
		}
		if r.Stale != n || r.T50 != -1 {
			t.Fatalf("stale = %d, T50 = %v; the Python client never recovers without an event", r.Stale, r.T50)
		}
	})
	t.Run("opa_recovers_on_its_poll", func(t *testing.T) {
		r := run(OPABundle)
		if r.Stale != 0 || r.T100 > 150*time.Second || r.Handshakes != 0 {
			t.Fatalf("stale = %d, T100 = %v, handshakes %v; want all within 120 s x 1.2 of polling, no socket", r.Stale, r.T100, r.Handshakes)
		}
	})
}

// TestScenarioDPlus checks that a notification reaches our agents and the
// Python baseline, and not OPA (which has no pub/sub).
func TestScenarioDPlus(t *testing.T) {
	sc := scenario(t, "d+")
	sc.Tail = time.Minute
	for _, p := range []Policy{Ours, PythonOPAL} {
		var r Result
		synctest.Test(t, func(t *testing.T) { r = Run(sc, p, Config{Agents: 20, Seed: 3}) })
		if r.Stale != 0 || r.T100 > time.Second {
			t.Errorf("%s: stale = %d, T100 = %v; want every agent at the notification", p, r.Stale, r.T100)
		}
	}
}

// TestMaxRetryAfter120 checks that the MAX_RETRY_AFTER=120 row runs with the
// raised cap: a 503 with Retry-After 99999 until 100 s is capped at 120 s
// (no room to spread, F4), so no agent asks twice before 100 s. Catches the
// row running at the default 60 s (a second request in the outage).
func TestMaxRetryAfter120(t *testing.T) {
	const n = 20
	sc := Scenario{Name: "cap", Phases: []Phase{{Until: 100 * time.Second, Status: http.StatusServiceUnavailable, RetryAfter: "99999"}}, Tail: 3 * time.Minute, Drop: true}
	var r Result
	synctest.Test(t, func(t *testing.T) { r = Run(sc, OursMaxRetryAfter120, Config{Agents: n, Seed: 5}) })
	if r.OutageRequests != 1 {
		t.Fatalf("policy requests per agent in outage = %v, want 1", r.OutageRequests)
	}
	if r.Stale != 0 {
		t.Fatalf("stale = %d", r.Stale)
	}
}

// The capacity: beyond C answers in a second a 503 without Retry-After; the
// queueing variant answers late instead. And a restart's sockets drop and
// reconnect; a down server refuses handshakes.
func TestServerModel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sc := Scenario{Name: "x", Phases: []Phase{{Until: 10 * time.Second, Down: true}}, Tail: 10 * time.Second}
		clk := clockNew()
		srv := newServer(sc, Config{Capacity: 2}, clk)
		ctx := context.Background()
		if _, _, _, err := srv.servePolicy(ctx); err == nil {
			t.Fatal("a down server answered")
		}
		if srv.handshake() == nil {
			t.Fatal("a down server accepted a handshake")
		}
		time.Sleep(10 * time.Second)
		var got []int
		for range 3 {
			st, _, _, _ := srv.servePolicy(ctx)
			got = append(got, st)
		}
		// Mutation: the capacity not applied.
		if !slices.Equal(got, []int{200, 200, 503}) || srv.refused.Load() != 1 {
			t.Fatalf("answers %v, refused %d; want 200 200 503 and 1", got, srv.refused.Load())
		}
		q := newServer(Scenario{Name: "q", Tail: 10 * time.Second}, Config{Capacity: 2, Queue: true}, clk)
		start := time.Now()
		for range 3 {
			if st, _, _, _ := q.servePolicy(ctx); st != 200 {
				t.Fatalf("queued answer %d", st)
			}
		}
		// The third answer waits for its slot: 2 per second, 0.5 s apart.
		if waited := time.Since(start); waited != time.Second {
			t.Fatalf("three queued answers took %v, want 1 s", waited)
		}
	})
}

// TestSummary checks the figures computed from the counts.
func TestSummary(t *testing.T) {
	sc := Scenario{Name: "x", Phases: []Phase{{Until: 10 * time.Second, Status: http.StatusServiceUnavailable}}, Tail: 10 * time.Second}
	srv := newServer(sc, Config{}, clockNew())
	// 4 agents; 8 requests in the outage, then 4 at 10 s, 1 at 11 s, 1 at
	// 14 s; 4 handshakes at 0 s.
	for s, c := range map[int]int64{0: 8, 10: 4, 11: 1, 14: 1} {
		srv.buckets[kindPolicy][s].Store(c)
	}
	srv.buckets[kindHandshake][0].Store(4)
	rec := &recorder{at: make([]atomic.Int64, 4)}
	for i, at := range []time.Duration{10200 * time.Millisecond, 10500 * time.Millisecond, 11 * time.Second, 14500 * time.Millisecond} {
		rec.at[i].Store(int64(at) + 1)
	}
	r := summarize(sc, Ours, 4, srv, rec)
	t.Run("outage_requests_per_agent", func(t *testing.T) {
		if r.OutageRequests != 2 || r.OutageHandshakes != 1 || r.PeakRPS != 12 {
			t.Fatalf("policy %v, handshakes %v per agent, peak %d; want 2, 1, 12", r.OutageRequests, r.OutageHandshakes, r.PeakRPS)
		}
	})
	t.Run("percentiles_from_recovery", func(t *testing.T) {
		// Catches an off-by-one in the rank: 50% of 4 is the 2nd agent.
		if r.T50 != 500*time.Millisecond || r.T99 != 4500*time.Millisecond || r.T100 != 4500*time.Millisecond {
			t.Fatalf("T50/T99/T100 = %v %v %v", r.T50, r.T99, r.T100)
		}
	})
	t.Run("recovery_window_ends_with_the_last_agent", func(t *testing.T) {
		// Window [10 s, 15 s): 6 requests in 5 s, peak 4. Catches a window
		// that runs to the end of the simulation.
		if r.RecoveryPeak != 4 || r.RecoveryMean != 6.0/5 {
			t.Fatalf("peak %d mean %v, want 4 and 1.2", r.RecoveryPeak, r.RecoveryMean)
		}
	})
}

// TestTargets checks the verdicts on made-up figures.
func TestTargets(t *testing.T) {
	res := func(sc string, o Result) map[string][]Result {
		o.Policy, o.Capacity = Ours, TargetCapacity
		return map[string][]Result{sc: {o,
			{Policy: PythonOPAL, Capacity: TargetCapacity, T100: 100 * time.Second, OutageHandshakes: 27, PeakRPS: 5000},
			{Policy: OPABundle, Capacity: TargetCapacity, T100: 140 * time.Second, OutageRequests: 5.4},
		}}
	}
	verdict := func(t *testing.T, sc string, o Result, target string) Verdict {
		t.Helper()
		for _, v := range Targets(Scenarios(), res(sc, o)) {
			if v.Target == target {
				return v
			}
		}
		t.Fatalf("no %s verdict", target)
		return Verdict{}
	}
	for _, tc := range []struct {
		name, sc, target string
		o                Result
		pass             bool
	}{
		// Mutation: R1's limit moved.
		{"R1_at_1000", "r", "R1", Result{PeakRPS: 1000}, true},
		{"R1_over_1000", "r", "R1", Result{PeakRPS: 1001}, false},
		{"R2_75s", "r", "R2", Result{T100: 75 * time.Second}, true},
		{"R2_late", "r", "R2", Result{T100: 76 * time.Second}, false},
		{"A0a_below_opa", "a0", "A0a", Result{OutageRequests: 5, T100: time.Second}, true},
		{"A0a_above_opa", "a0", "A0a", Result{OutageRequests: 6, T100: time.Second}, false},
		{"S2_fewer_handshakes", "s", "S2", Result{OutageHandshakes: 26, T100: time.Second}, true},
		{"S2_as_many", "s", "S2", Result{OutageHandshakes: 27, T100: time.Second}, false},
		{"T100_no_worse", "s", "T100", Result{T100: 100 * time.Second}, true},
		{"T100_worse", "s", "T100", Result{T100: 101 * time.Second}, false},
		{"N1_two", "n", "N1", Result{MaxAgentFetchesPerSec: 2}, true},
		{"N1_three", "n", "N1", Result{MaxAgentFetchesPerSec: 3}, false},
		{"N2_stale", "n", "N2", Result{Stale: 1}, false},
		{"PM_2", "c", "PM", Result{RecoveryPeak: 2, RecoveryMean: 1}, true},
		{"PM_over_2", "c", "PM", Result{RecoveryPeak: 3, RecoveryMean: 1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if v := verdict(t, tc.sc, tc.o, tc.target); v.Pass != tc.pass {
				t.Fatalf("%v, want pass %v", v, tc.pass)
			}
		})
	}
}

func TestOPABackoff(t *testing.T) {
	mid := func() float64 { return 0.5 } // no jitter
	cases := []struct {
		name    string
		retries int
		rnd     func() float64
		lo, hi  time.Duration
	}{
		// Catches a first retry that waits.
		{"first_retry_immediate", 0, mid, 0, 0},
		{"second_is_160ms", 1, mid, 160 * time.Millisecond, 160 * time.Millisecond},
		// Catches a missing or wrong cap at the max delay.
		{"capped_at_max_delay", 50, mid, 120 * time.Second, 120 * time.Second},
		// Catches a jitter other than +-20%.
		{"jitter_up_20pct", 50, func() float64 { return 0.999999 }, 143 * time.Second, 144 * time.Second},
		{"jitter_down_20pct", 50, func() float64 { return 0 }, 96 * time.Second, 96 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := opaBackoff(c.retries, c.rnd)
			if d < c.lo-time.Millisecond || d > c.hi+time.Millisecond {
				t.Fatalf("opaBackoff(%d) = %v, want in [%v, %v]", c.retries, d, c.lo, c.hi)
			}
		})
	}
}

// The Python client's reconnect: wait_random_exponential(min=0.1, max=120).
func TestPythonReconnectWait(t *testing.T) {
	for _, tc := range []struct {
		n    int
		r    float64
		want time.Duration
	}{{1, 1, time.Second}, {1, 0, 100 * time.Millisecond}, {4, 1, 8 * time.Second}, {30, 1, 120 * time.Second}} {
		if got := pythonReconnectWait(tc.n, func() float64 { return tc.r }); got != tc.want {
			t.Errorf("pythonReconnectWait(%d, %v) = %v, want %v", tc.n, tc.r, got, tc.want)
		}
	}
}

func clockNew() clock.Clock { return clock.New() }
