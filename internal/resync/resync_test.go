package resync

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/benbjohnson/clock"
)

const s = time.Second

// rig is a Spreader on a mock clock; tests run in a synctest bubble and
// call synctest.Wait after advancing it, so a timer's resync has run.
func rig(draw float64) (*Spreader, *clock.Mock, *atomic.Int64) {
	clk := clock.NewMock()
	n := &atomic.Int64{}
	sp := New(Options{After: 15 * s, Window: 55 * s, Clock: clk, Rand: func() float64 { return draw },
		Resync: func() { n.Add(1) }})
	return sp, clk, n
}

// The resync of a reconnect is spread over [lost+After, lost+After+Window]
// for an agent that holds a policy; at once otherwise.
func TestSpread(t *testing.T) {
	for _, tc := range []struct {
		name      string
		draw      float64
		hasPolicy bool
		lostAgo   time.Duration // before the connect; -1: never lost
		want      time.Duration
	}{
		// Mutation "false": the restart's resyncs in one burst.
		{"restart_spread_mid", 0.5, true, 5 * s, 15*s + 27500*time.Millisecond - 5*s},
		{"restart_spread_top", 1, true, 5 * s, 65 * s},
		// Mutation: a policy-less agent waits (start-up slowed).
		{"no_policy_at_once", 1, false, 5 * s, 0},
		{"first_connect_at_once", 1, true, -1, 0},
		// A long outage: the moment has passed, the reconnect is already spread.
		{"long_outage_at_once", 1, true, 20 * time.Minute, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				sp, clk, n := rig(tc.draw)
				if tc.lostAgo >= 0 {
					sp.Lost(clk.Now())
					clk.Add(tc.lostAgo)
				}
				d := sp.Connected(tc.hasPolicy)
				if d != tc.want {
					t.Fatalf("delay %v, want %v", d, tc.want)
				}
				if (d == 0) != (n.Load() == 1) {
					t.Fatalf("resyncs now %d with delay %v", n.Load(), d)
				}
				clk.Add(d)
				synctest.Wait()
				if n.Load() != 1 {
					t.Fatalf("%d resyncs after the delay, want 1", n.Load())
				}
			})
		})
	}
}

// A second connect while a resync is pending adds none; Stop cancels it.
func TestPendingAndStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sp, clk, n := rig(1)
		sp.Lost(clk.Now())
		sp.Connected(true)
		sp.Lost(clk.Now())
		if d := sp.Connected(true); d != -1 || !sp.Pending() {
			t.Fatalf("second connect: delay %v pending %v; want -1, true", d, sp.Pending())
		}
		sp.Stop()
		clk.Add(time.Hour)
		synctest.Wait()
		// Stop cancels the timer, and fire refuses after Stop: no resync after shutdown.
		if n.Load() != 0 || sp.Pending() {
			t.Fatalf("after Stop: %d resyncs, pending %v", n.Load(), sp.Pending())
		}
		if sp.Connected(false) != -1 || n.Load() != 0 {
			t.Fatal("Connected after Stop resynced")
		}
	})
}
