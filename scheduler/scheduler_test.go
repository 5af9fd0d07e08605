package scheduler_test

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/benbjohnson/clock"
	"go.uber.org/goleak"

	"github.com/opal-go/opal-client/internal/testutil"
	"github.com/opal-go/opal-client/scheduler"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type armed struct {
	round int
	delay time.Duration
	flat  bool
}

// rig is a scheduler on a mock clock whose Fire signals a channel. Tests
// run it inside a synctest bubble: the mock's internal settling sleeps are
// virtual, and a timer that never fires is reported at once as a deadlock
// instead of hanging until the test timeout.
type rig struct {
	s     *scheduler.Scheduler
	clk   *clock.Mock
	log   *testutil.LogRecorder
	fired chan struct{}
	arms  []armed
}

func newRig(t *testing.T, o scheduler.Options) *rig {
	t.Helper()
	r := &rig{clk: clock.NewMock(), log: &testutil.LogRecorder{}, fired: make(chan struct{}, 100)}
	o.Clock = r.clk
	o.Logger = slog.New(r.log)
	if o.Fire == nil {
		o.Fire = func() { r.fired <- struct{}{} }
	}
	o.OnArm = func(round int, d time.Duration, flat bool) { r.arms = append(r.arms, armed{round, d, flat}) }
	r.s = scheduler.New(o)
	t.Cleanup(r.s.Stop)
	return r
}

func identity(d time.Duration) time.Duration { return d }

func defaults() scheduler.Options {
	return scheduler.Options{Enabled: true, MaxRetryAfter: 60 * time.Second, MaxRounds: 20, Jitter: identity}
}

const s = time.Second

// armAndFire arms, then advances the mock clock to fire the timer, waiting
// until Fire has run (the timer only enqueues: D4).
func (r *rig) armAndFire(t *testing.T, hint time.Duration, has bool) {
	t.Helper()
	if !r.s.Arm(hint, has) {
		t.Fatalf("Arm refused with no timer pending")
	}
	r.clk.Add(r.arms[len(r.arms)-1].delay)
	<-r.fired
}

// Catches: dropping the ceiling cap, the doubling, the hint, the floor, the
// flat boundary (see mutations.txt: D2_*, D3_*).
func TestD2_Delay(t *testing.T) {
	for _, tc := range []struct {
		name      string
		round     int
		hint      time.Duration
		has       bool
		ceiling   time.Duration
		maxRounds int
		want      time.Duration
		wantFlat  bool
	}{
		{"round_1_is_5s", 1, 0, false, 60 * s, 20, 5 * s, false},
		{"round_2_doubles", 2, 0, false, 60 * s, 20, 10 * s, false},
		{"round_4_is_40s", 4, 0, false, 60 * s, 20, 40 * s, false},
		{"round_5_capped_at_ceiling", 5, 0, false, 60 * s, 20, 60 * s, false},
		{"hint_above_base_wins", 1, 30 * s, true, 60 * s, 20, 30 * s, false},
		{"hint_below_base_ignored", 3, 2 * s, true, 60 * s, 20, 20 * s, false},
		{"hint_without_has_ignored", 1, 30 * s, false, 60 * s, 20, 5 * s, false},
		{"hint_above_ceiling_capped", 1, time.Hour, true, 60 * s, 20, 60 * s, false},
		{"floor_with_ceiling_0", 3, 0, false, 0, 20, 5 * s, false},
		{"floor_with_ceiling_0_and_hint", 1, 30 * s, true, 0, 20, 5 * s, false},
		{"floor_with_ceiling_2s", 1, 0, false, 2 * s, 20, 5 * s, false},
		{"last_escalating_round", 20, 0, false, 60 * s, 20, 60 * s, false},
		{"flat_after_budget", 21, 0, false, 60 * s, 20, 60 * s, true},
		{"flat_ignores_hint", 21, 10 * s, true, 60 * s, 20, 60 * s, true},
		{"flat_floor", 21, 0, false, 0, 20, 5 * s, true},
		{"round_40_saturates", 40, 0, false, time.Duration(1 << 62), 100, time.Duration(1 << 62), false},
		{"round_63_saturates", 63, 0, false, time.Duration(1 << 62), 100, time.Duration(1 << 62), false},
		{"round_1e6_saturates", 1_000_000, 0, false, time.Hour, 2_000_000, time.Hour, false},
		{"zero_budget_is_flat_at_once", 1, 0, false, 60 * s, 0, 60 * s, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, flat := scheduler.Delay(tc.round, tc.hint, tc.has, tc.ceiling, tc.maxRounds)
			if d != tc.want || flat != tc.wantFlat {
				t.Fatalf("Delay = %v, flat %v; want %v, flat %v", d, flat, tc.want, tc.wantFlat)
			}
		})
	}
}

// Catches: dropping the doubling's saturation (round 10^6 would overflow).
func TestD2_DelayNeverNegative(t *testing.T) {
	for n := 1; n < 200; n++ {
		if d, _ := scheduler.Delay(n, 0, false, time.Duration(1<<62), 1000); d < scheduler.Floor {
			t.Fatalf("round %d: delay %v below the floor", n, d)
		}
	}
}

// D2/D3 at defaults: 5, 10, 20, 40, 60 x16 escalating (1035 s), then flat 60.
func TestD2_SequenceAtDefaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, defaults())
		var sum time.Duration
		for i := 0; i < 25; i++ {
			r.armAndFire(t, 0, false)
		}
		want := []time.Duration{5 * s, 10 * s, 20 * s, 40 * s}
		for i, a := range r.arms {
			w := 60 * s
			if i < len(want) {
				w = want[i]
			}
			if a.delay != w {
				t.Fatalf("round %d: delay %v, want %v", i+1, a.delay, w)
			}
			if a.flat != (i >= 20) {
				t.Fatalf("round %d: flat %v", i+1, a.flat)
			}
			if i < 20 {
				sum += a.delay
			}
		}
		if sum != 1035*s {
			t.Fatalf("escalation sums to %v, want 1035s", sum)
		}
	})
}

// D2 jitter: each draw lands in [d/2, d]; the extremes of the source map to
// the ends. Catches: dropping the jitter, a wrong lower bound.
func TestD2_Jitter(t *testing.T) {
	for _, tc := range []struct {
		name string
		u    float64
		want time.Duration
	}{
		{"draw_0_is_half", 0, 2500 * time.Millisecond},
		{"draw_half_is_three_quarters", 0.5, 3750 * time.Millisecond},
		{"draw_out_of_range_is_clamped", 7, 5 * s},
		{"negative_draw_is_clamped", -1, 2500 * time.Millisecond},
		// NaN passes min/max; unclamped, the delay was hugely negative.
		{"nan_draw_is_half", math.NaN(), 2500 * time.Millisecond},
		{"inf_draw_is_clamped", math.Inf(1), 5 * s},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := defaults()
				o.Jitter = nil
				o.Rand = func() float64 { return tc.u }
				r := newRig(t, o)
				r.s.Arm(0, false)
				if got := r.arms[0].delay; got != tc.want {
					t.Fatalf("delay %v, want %v", got, tc.want)
				}
			})
		})
	}
	t.Run("sequence_within_bounds", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			o := defaults()
			o.Jitter = nil
			seed := uint64(1)
			o.Rand = func() float64 { // a small LCG keeps the test deterministic
				seed = seed*6364136223846793005 + 1442695040888963407
				return float64(seed>>11) / (1 << 53)
			}
			r := newRig(t, o)
			for i := 0; i < 30; i++ {
				r.armAndFire(t, 0, false)
			}
			for i, a := range r.arms {
				base, _ := scheduler.Delay(i+1, 0, false, 60*s, 20)
				if a.delay < base/2 || a.delay > base {
					t.Fatalf("round %d: delay %v outside [%v, %v]", i+1, a.delay, base/2, base)
				}
			}
		})
	})
}

// D3/D7: the flat phase is entered once, warned once, and cleared by Reset.
// Catches: warning every flat round, no per-round warning, Reset keeping
// the flat phase or the rounds, rounds not saturating.
func TestD3_FlatPhase(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := defaults()
		o.MaxRounds = 3
		r := newRig(t, o)
		for i := 0; i < 3; i++ {
			r.armAndFire(t, 0, false)
		}
		if r.s.Flat() || r.log.Count(slog.LevelWarn) != 3 {
			t.Fatalf("after the budget: flat %v, %d warnings; want false, 3", r.s.Flat(), r.log.Count(slog.LevelWarn))
		}
		for i := 0; i < 10; i++ {
			r.armAndFire(t, 0, false)
		}
		if !r.s.Flat() {
			t.Fatal("not flat after the budget")
		}
		if n := r.log.Count(slog.LevelWarn); n != 4 {
			t.Fatalf("%d warnings, want 3 rounds + 1 on entering the flat phase", n)
		}
		if r.s.Round() != 4 {
			t.Fatalf("Round() = %d, want saturated at 4", r.s.Round())
		}
		r.s.Reset()
		if r.s.Flat() || r.s.Round() != 0 {
			t.Fatalf("after Reset: flat %v, round %d", r.s.Flat(), r.s.Round())
		}
		r.armAndFire(t, 0, false)
		if last := r.arms[len(r.arms)-1]; last.round != 1 || last.delay != 5*s || last.flat {
			t.Fatalf("after Reset armed %+v, want round 1, 5s", last)
		}
	})
}

// D1: arming while a timer is pending is a no-op, even from many goroutines.
// Catches: allowing a second timer.
func TestD1_OnePendingTimer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, defaults())
		var wg sync.WaitGroup
		var mu sync.Mutex
		ok := 0
		for i := 0; i < 64; i++ {
			wg.Go(func() {
				if r.s.Arm(time.Duration(i)*s, true) {
					mu.Lock()
					ok++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if ok != 1 || r.s.Timers() != 1 || !r.s.Pending() || r.s.Round() != 1 {
			t.Fatalf("%d Arms succeeded, %d timers, round %d; want exactly one", ok, r.s.Timers(), r.s.Round())
		}
		r.clk.Add(time.Minute)
		<-r.fired
		if r.s.Pending() || r.s.Timers() != 0 {
			t.Fatal("timer still pending after it fired")
		}
		select {
		case <-r.fired:
			t.Fatal("Fire called twice")
		default:
		}
	})
}

// D4: firing only calls Fire, once, after the delay and not before.
func TestD4_FireAfterDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, defaults())
		r.s.Arm(0, false)
		r.clk.Add(4 * s)
		select {
		case <-r.fired:
			t.Fatal("fired before its delay")
		default:
		}
		r.clk.Add(1 * s)
		<-r.fired
	})
}

// D5/D6: Cancel stops the timer and keeps the rounds; Reset clears them.
// Catches: Cancel resetting rounds, Cancel leaving the timer.
func TestD5_Cancel(t *testing.T) {
	t.Run("cancel_keeps_rounds", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newRig(t, defaults())
			r.armAndFire(t, 0, false)
			r.s.Arm(0, false)
			r.s.Cancel()
			if r.s.Pending() || r.s.Timers() != 0 || r.s.Round() != 2 {
				t.Fatalf("pending %v, timers %d, round %d; want false, 0, 2", r.s.Pending(), r.s.Timers(), r.s.Round())
			}
			r.clk.Add(time.Hour)
			select {
			case <-r.fired:
				t.Fatal("cancelled timer fired")
			default:
			}
			if !r.s.Arm(0, false) || r.arms[len(r.arms)-1].delay != 20*s {
				t.Fatalf("next round after Cancel: %+v, want round 3, 20s", r.arms[len(r.arms)-1])
			}
		})
	})
	t.Run("reset_clears_rounds", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newRig(t, defaults())
			r.armAndFire(t, 0, false)
			r.s.Arm(0, false)
			r.s.Reset()
			if r.s.Pending() || r.s.Round() != 0 {
				t.Fatalf("pending %v, round %d", r.s.Pending(), r.s.Round())
			}
			r.clk.Add(time.Hour)
			select {
			case <-r.fired:
				t.Fatal("reset timer fired")
			default:
			}
		})
	})
}

// D8: disabled means no timer at all, flat phase included.
func TestD8_Disabled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := defaults()
		o.Enabled = false
		o.MaxRounds = 0
		r := newRig(t, o)
		for i := 0; i < 5; i++ {
			if r.s.Arm(10*s, true) {
				t.Fatal("disabled scheduler armed")
			}
		}
		if r.s.Pending() || r.s.Flat() || r.log.Count(slog.LevelWarn) != 0 || len(r.arms) != 0 {
			t.Fatal("disabled scheduler changed state or logged")
		}
	})
}

// D5: Stop cancels the pending timer, refuses later Arms, and waits for a
// timer goroutine that is running Fire. Runs in a synctest bubble so a Stop
// that never returns is reported at once as a deadlock.
func TestD5_Stop(t *testing.T) {
	t.Run("cancels_and_refuses", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			fired := false
			sc := scheduler.New(scheduler.Options{Enabled: true, MaxRetryAfter: 60 * s, MaxRounds: 20,
				Jitter: identity, Fire: func() { fired = true }})
			sc.Arm(0, false)
			// Catches: a cancelled timer's goroutine never counted done
			// (Stop would wait for it forever).
			stopped := make(chan struct{})
			go func() { sc.Stop(); close(stopped) }()
			synctest.Wait()
			select {
			case <-stopped:
			default:
				t.Fatal("Stop waits for the goroutine of a timer it cancelled")
			}
			if sc.Pending() || sc.Arm(0, false) {
				t.Fatal("Stop left a timer or allowed a new one")
			}
			time.Sleep(time.Hour) // virtual time inside the bubble
			if fired {
				t.Fatal("stopped timer fired")
			}
		})
	})
	t.Run("waits_for_running_fire", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			release := make(chan struct{})
			entered := make(chan struct{})
			sc := scheduler.New(scheduler.Options{Enabled: true, MaxRetryAfter: 60 * s, MaxRounds: 20,
				Jitter: identity, Fire: func() { close(entered); <-release }})
			sc.Arm(0, false)
			<-entered // the timer goroutine is inside Fire
			stopped := make(chan struct{})
			go func() { sc.Stop(); close(stopped) }()
			synctest.Wait()
			select {
			case <-stopped:
				t.Fatal("Stop returned while Fire was running")
			default:
			}
			close(release)
			<-stopped
		})
	})
}

// Catches: a round 10^6 that overflows or loops: a saturated scheduler
// stays flat with the ceiling and arming stays O(1).
func TestD3_ManyRoundsStayFlat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := defaults()
		r := newRig(t, o)
		for i := 0; i < 200; i++ {
			r.s.Arm(0, false)
			r.s.Cancel()
		}
		if last := r.arms[len(r.arms)-1]; !last.flat || last.delay != 60*s || r.s.Round() != 21 {
			t.Fatalf("after 200 rounds: %+v, round %d", last, r.s.Round())
		}
	})
}

// D2 with a hint: the jittered delay never comes before the server's
// Retry-After and never passes the ceiling; it spreads upward from the hint.
func TestD2_HintJitter(t *testing.T) {
	for _, tc := range []struct {
		name string
		hint time.Duration
		u    float64
		want time.Duration
	}{
		// Mutation "lo := d / 2": a draw of 0 came back at 4s after Retry-After 8.
		{"draw_0_is_the_hint", 8 * s, 0, 8 * s},
		// Mutation "hi := d": no spread at all.
		{"draw_1_is_twice_the_hint", 8 * s, 1, 16 * s},
		// Mutation "hi := max(d, 2*h)": 40s doubled to 80s past the 60s ceiling.
		{"spread_stays_under_ceiling", 40 * s, 1, 60 * s},
		{"hint_over_ceiling_is_ceiling", 300 * s, 0.5, 60 * s},
		// Mutation "u := r()": an unclamped draw of 7 lands far past the ceiling.
		{"draw_out_of_range_stays_under_ceiling", 40 * s, 7, 60 * s},
		{"hint_below_escalation_keeps_escalation_floor", 2 * s, 0, 2500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := defaults()
				o.Jitter = nil
				o.Rand = func() float64 { return tc.u }
				r := newRig(t, o)
				r.s.Arm(tc.hint, true)
				if got := r.arms[0].delay; got != tc.want {
					t.Fatalf("hint %v, draw %v: delay %v, want %v", tc.hint, tc.u, got, tc.want)
				}
			})
		})
	}
	t.Run("never_before_hint_any_round", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			o := defaults()
			o.Jitter = nil
			seed := uint64(7)
			o.Rand = func() float64 {
				seed = seed*6364136223846793005 + 1442695040888963407
				return float64(seed>>11) / (1 << 53)
			}
			r := newRig(t, o)
			for i := 0; i < 30; i++ {
				r.armAndFire(t, 8*s, true)
			}
			for i, a := range r.arms {
				if a.delay < 8*s || a.delay > 60*s {
					t.Fatalf("round %d: delay %v outside [8s, 60s]", i+1, a.delay)
				}
			}
		})
	})
}

// lockProbe is a slog handler that calls back into the scheduler: a
// logger called under the scheduler's lock deadlocks (synctest reports it).
type lockProbe struct {
	s     **scheduler.Scheduler
	calls *int
}

func (h lockProbe) Enabled(context.Context, slog.Level) bool { return true }
func (h lockProbe) Handle(context.Context, slog.Record) error {
	_ = (*h.s).Pending()
	*h.calls++
	return nil
}
func (h lockProbe) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h lockProbe) WithGroup(string) slog.Handler      { return h }

// Hooks and loggers run outside the lock: an OnArm and a logger that call
// back into the scheduler do not deadlock.
func TestHooksOutsideLock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sc *scheduler.Scheduler
		logs, arms := 0, 0
		o := defaults()
		o.MaxRounds = 1
		o.Logger = slog.New(lockProbe{&sc, &logs})
		o.OnArm = func(int, time.Duration, bool) { _ = sc.Round(); arms++ }
		sc = scheduler.New(o)
		defer sc.Stop()
		for range 3 {
			sc.Arm(0, false)
			sc.Cancel()
		}
		if arms != 3 || logs != 2 { // round 1, then entering the flat phase
			t.Fatalf("OnArm %d times, logger %d times; want 3, 2", arms, logs)
		}
	})
}

// Stop is safe from inside Fire: it returns at once instead of waiting for
// its own goroutine, and no later Arm starts a timer.
func TestStopInsideFire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sc *scheduler.Scheduler
		done := make(chan struct{})
		o := defaults()
		o.Fire = func() { sc.Stop(); close(done) }
		sc = scheduler.New(o)
		sc.Arm(0, false)
		<-done // a Stop that waited for itself would deadlock here
		if sc.Arm(0, false) {
			t.Fatal("Arm after Stop inside Fire started a timer")
		}
		sc.Stop() // and from outside, afterwards, it still returns
	})
}

// gateClock is a mock clock whose first AfterFunc function waits at a gate:
// it lets a test hold a timer that has fired but whose function has not yet
// run, the race a generation check exists for.
type gateClock struct {
	*clock.Mock
	gate  chan struct{}
	gated bool
}

func (c *gateClock) AfterFunc(d time.Duration, f func()) *clock.Timer {
	if !c.gated {
		c.gated = true
		return c.Mock.AfterFunc(d, func() { <-c.gate; f() })
	}
	return c.Mock.AfterFunc(d, f)
}

// A timer cancelled after it fired but before its function ran must not
// fire the timer armed after it (D1, D5): the generation check.
func TestStaleTimerDoesNotFireSuccessor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := &gateClock{Mock: clock.NewMock(), gate: make(chan struct{})}
		fired := 0
		o := defaults()
		o.Clock = clk
		o.Fire = func() { fired++ }
		sc := scheduler.New(o)
		defer sc.Stop()
		sc.Arm(0, false) // timer A, 5s
		clk.Add(5 * s)   // A fires; its function waits at the gate
		synctest.Wait()  //
		sc.Cancel()      // too late to stop A: its function is due
		sc.Arm(0, false) // timer B, 10s
		close(clk.gate)  // A's function runs now
		synctest.Wait()  //
		if fired != 0 || !sc.Pending() || sc.Timers() != 1 {
			t.Fatalf("stale timer: fired %d, pending %v, timers %d; want 0, true, 1", fired, sc.Pending(), sc.Timers())
		}
		clk.Add(10 * s)
		synctest.Wait()
		if fired != 1 {
			t.Fatalf("successor fired %d times, want 1", fired)
		}
	})
}
