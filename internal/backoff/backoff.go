// Package backoff is the one backoff of the agent, in the spirit of
// tailscale's util/backoff: a saturating exponential step, three named
// jitter conventions (one per purpose), a stateful Backoff with an injected
// clock and random source, and a Sleep that a context can cut short.
//
// Every retry loop of the agent computes its waits here: the fetcher's
// configured backoff (config.ConnRetryOptions), the deferral scheduler, the
// pub/sub reconnect and the external store's write retry.
//
// The conventions, and who uses which:
//
//	Full  uniform in [floor, d]: reconnects ("full jitter" above a floor) and
//	      random_exponential (floor 0); a fleet that failed together spreads
//	      over the whole step.
//	Half  uniform in [d/2, d]: the deferred re-fetch without a server hint;
//	      keeps at least half the escalation.
//	Up    uniform in [h, h+min(h, ceiling-h)]: a server's Retry-After h; never
//	      earlier than the server asked, never past the ceiling.
//	Narrow uniform in [0.9d, d]: the reconnect cadence of a long outage; the
//	      wait stays near d (few attempts, a bounded return) while phases
//	      that an earlier spread set apart keep drifting.
package backoff

import (
	"context"
	"math"
	"time"

	"github.com/benbjohnson/clock"
)

// maxDuration is where every computed duration saturates.
const maxDuration = time.Duration(math.MaxInt64)

// Unit clamps a random draw into [0, 1]: a broken source (NaN, negative,
// above one) must never make a wait negative or longer than its bound. NaN
// fails every comparison and min/max pass it through, so it is tested first.
func Unit(r float64) float64 {
	if !(r >= 0) { // mutation "r < 0" lets NaN through
		return 0
	}
	return min(r, 1)
}

// Exponential is base*2^(n-1) for the n-th step (n < 1 counts as 1), capped
// at ceiling when ceiling > 0, saturating instead of overflowing: O(1) for
// any n.
func Exponential(base time.Duration, n int, ceiling time.Duration) time.Duration {
	if n < 1 {
		n = 1
	}
	d := base
	if base > 0 && n > 1 {
		// A shift of 63 or more gives 0, so every such n saturates too.
		if shift := n - 1; base > maxDuration>>shift {
			d = maxDuration
		} else {
			d = base << shift
		}
	}
	if ceiling > 0 && d > ceiling {
		d = ceiling
	}
	return d
}

// Full draws uniformly in [floor, d] (d below floor gives floor).
func Full(floor, d time.Duration, r float64) time.Duration {
	if d <= floor {
		return floor
	}
	return floor + time.Duration(Unit(r)*float64(d-floor))
}

// Half draws uniformly in [d/2, d].
func Half(d time.Duration, r float64) time.Duration {
	half := d / 2
	return half + time.Duration(Unit(r)*float64(d-half))
}

// Narrow draws uniformly in [0.9d, d].
func Narrow(d time.Duration, r float64) time.Duration {
	lo := d - d/10
	return lo + time.Duration(Unit(r)*float64(d-lo))
}

// Up spreads a server hint h upward within ceiling: uniformly in
// [h, h+min(h, ceiling-h)]. A hint at or above the ceiling is returned as is
// (the caller caps it first); h <= 0 gives h.
func Up(h, ceiling time.Duration, r float64) time.Duration {
	if h <= 0 {
		return h
	}
	spread := max(min(h, ceiling-h), 0)
	return h + time.Duration(Unit(r)*float64(spread))
}

// Jitter names a convention for Policy.
type Jitter int

// The conventions of the package comment.
const (
	JitterNone Jitter = iota // the step itself
	JitterFull               // [Floor, step]
	JitterHalf               // [step/2, step]
)

// Policy describes a stateful Backoff.
type Policy struct {
	// Name labels the backoff in logs (e.g. "pubsub reconnect").
	Name string
	// Base is the first step; each failure doubles it.
	Base time.Duration
	// Max caps every step (0: uncapped, saturating).
	Max time.Duration
	// Floor is the least wait of JitterFull, and the least wait of any
	// draw: no hot loop whatever the source.
	Floor time.Duration
	// Jitter is how a step becomes a wait.
	Jitter Jitter
	// StepOffset shifts the exponent: step n is Base*2^(n-1+StepOffset).
	// The pub/sub reconnect's first retry draws up to Base*2.
	StepOffset int
}

// Backoff counts consecutive failures and draws the wait before the next
// try. It is not safe for concurrent use: each retry loop owns one.
type Backoff struct {
	p   Policy
	clk clock.Clock
	rnd func() float64
	n   int
}

// New returns a Backoff; nil clk means the real clock, nil rnd a zero draw
// (the shortest wait of the convention).
func New(p Policy, clk clock.Clock, rnd func() float64) *Backoff {
	if clk == nil {
		clk = clock.New()
	}
	if rnd == nil {
		rnd = func() float64 { return 0 }
	}
	return &Backoff{p: p, clk: clk, rnd: rnd}
}

// Name is the policy's name.
func (b *Backoff) Name() string { return b.p.Name }

// Failures is the number of failures since the last Reset.
func (b *Backoff) Failures() int { return b.n }

// Reset forgets the failures: the next wait is the first step again.
func (b *Backoff) Reset() { b.n = 0 }

// Next records a failure and returns the wait before the next try.
func (b *Backoff) Next() time.Duration {
	if b.n < math.MaxInt32 {
		b.n++
	}
	return b.Wait(b.n)
}

// Wait is the wait after the n-th consecutive failure, without recording
// anything (the pure form of Next).
func (b *Backoff) Wait(n int) time.Duration {
	if n < 1 {
		n = 1
	}
	step := Exponential(b.p.Base, n+b.p.StepOffset, b.p.Max)
	var d time.Duration
	switch b.p.Jitter {
	case JitterFull:
		d = Full(b.p.Floor, step, b.rnd())
	case JitterHalf:
		d = Half(step, b.rnd())
	default:
		d = step
	}
	return max(d, b.p.Floor)
}

// Sleep waits d on clk, or until ctx ends; it reports whether the whole wait
// passed.
func Sleep(ctx context.Context, clk clock.Clock, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := clk.Timer(d)
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		t.Stop()
		return false
	}
}
