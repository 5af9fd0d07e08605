package backoff

import (
	"context"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/benbjohnson/clock"
)

const (
	ms = time.Millisecond
	s  = time.Second
)

func TestExponential(t *testing.T) {
	for _, tc := range []struct {
		name          string
		base          time.Duration
		n             int
		ceiling, want time.Duration
	}{
		{"first_step_is_base", 5 * s, 1, 0, 5 * s},
		{"step_zero_is_first", 5 * s, 0, 0, 5 * s},
		{"doubles", 5 * s, 4, 0, 40 * s},
		// Mutation: the ceiling test dropped.
		{"capped", 5 * s, 10, 60 * s, 60 * s},
		// Mutation: the saturation test dropped (a shift wraps to 0 or negative).
		{"step_64_saturates", 5 * s, 65, 0, maxDuration},
		{"step_40_saturates", 5 * s, 40, 0, maxDuration},
		{"huge_step_capped", time.Second, math.MaxInt32, 120 * s, 120 * s},
		{"zero_base_stays_zero", 0, 50, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Exponential(tc.base, tc.n, tc.ceiling); got != tc.want {
				t.Fatalf("Exponential(%v, %d, %v) = %v, want %v", tc.base, tc.n, tc.ceiling, got, tc.want)
			}
		})
	}
}

func TestJitterConventions(t *testing.T) {
	for _, tc := range []struct {
		name string
		got  time.Duration
		want time.Duration
	}{
		{"full_zero_draw_is_floor", Full(100*ms, 400*ms, 0), 100 * ms},
		{"full_mid_draw", Full(100*ms, 500*ms, 0.5), 300 * ms},
		{"full_top_draw_is_step", Full(100*ms, 400*ms, 1), 400 * ms},
		{"full_step_below_floor_is_floor", Full(100*ms, 50*ms, 1), 100 * ms},
		{"half_zero_draw_is_half", Half(5*s, 0), 2500 * ms},
		{"half_mid_draw", Half(5*s, 0.5), 3750 * ms},
		// Mutation "return min(r, 1)" -> "return r": a draw above one goes past the step.
		{"half_draw_above_one_clamped", Half(5*s, 7), 5 * s},
		// Mutation "!(r >= 0)" -> "r < 0": NaN makes the wait negative.
		{"half_nan_draw_is_half", Half(5*s, math.NaN()), 2500 * ms},
		{"full_negative_draw_is_floor", Full(100*ms, 400*ms, -3), 100 * ms},
		{"narrow_zero_draw_is_nine_tenths", Narrow(50*s, 0), 45 * s},
		{"narrow_top_draw_is_step", Narrow(50*s, 1), 50 * s},
		{"up_zero_draw_is_hint", Up(8*s, 60*s, 0), 8 * s},
		{"up_top_draw_doubles_small_hint", Up(8*s, 60*s, 1), 16 * s},
		// Mutation "min(h, ceiling-h)" -> "h": the spread passes the ceiling.
		{"up_stays_under_ceiling", Up(40*s, 60*s, 1), 60 * s},
		{"up_hint_at_ceiling_exact", Up(60*s, 60*s, 1), 60 * s},
		{"up_hint_over_ceiling_not_lowered", Up(90*s, 60*s, 1), 90 * s},
		{"up_no_hint", Up(0, 60*s, 1), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Fatalf("got %v, want %v", tc.got, tc.want)
			}
		})
	}
}

// A stateful Backoff: Next grows, Reset starts over, the floor holds.
func TestBackoffState(t *testing.T) {
	r := 1.0
	b := New(Policy{Name: "reconnect", Base: 100 * ms, Max: 120 * s, Floor: 100 * ms, Jitter: JitterFull, StepOffset: 1},
		clock.NewMock(), func() float64 { return r })
	for i, want := range []time.Duration{200 * ms, 400 * ms, 800 * ms} {
		if got := b.Next(); got != want {
			t.Fatalf("failure %d: wait %v, want %v", i+1, got, want)
		}
	}
	if b.Failures() != 3 {
		t.Fatalf("failures %d, want 3", b.Failures())
	}
	// Mutation "b.n = 0" -> "_ = 0": Reset keeps growing.
	b.Reset()
	if got := b.Next(); got != 200*ms {
		t.Fatalf("after Reset: wait %v, want 200ms", got)
	}
	r = 0
	// Mutation "return max(d, b.p.Floor)" -> "return d": a zero draw of a
	// policy without jitter floor would loop hot.
	nf := New(Policy{Base: 0, Floor: 100 * ms}, nil, nil)
	if got := nf.Next(); got != 100*ms {
		t.Fatalf("zero step: wait %v, want the 100ms floor", got)
	}
	if got := New(Policy{Base: 5 * s, Jitter: JitterHalf}, nil, nil).Wait(2); got != 5*s {
		t.Fatalf("half of step 10s with a zero draw: %v, want 5s", got)
	}
}

func TestSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := clock.New()
		start := clk.Now()
		if !Sleep(context.Background(), clk, 3*s) || clk.Since(start) != 3*s {
			t.Fatalf("Sleep did not wait 3s: %v", clk.Since(start))
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if Sleep(ctx, clk, time.Hour) {
			t.Fatal("Sleep on a done context reported a full wait")
		}
	})
}
