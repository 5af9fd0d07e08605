// This file is the reconnect schedule: how long the client waits before the
// next connection attempt. It is pure (no clock, no socket), so the fleet
// simulator runs the same code the client does.

package pubsub

import (
	"errors"
	"time"

	"github.com/opal-go/opal-client/internal/backoff"
)

// Start-up backoff bounds: the first retry of a client that never connected
// waits about MinBackoff, later ones grow to MaxBackoff (the Python
// client's wait_random_exponential(min=0.1, max=120)), and never past
// Options.ReconnectMaxWait.
const (
	MinBackoff = 100 * time.Millisecond
	MaxBackoff = 120 * time.Second
)

// Backoff is the wait before reconnect attempt number attempt (1 = the first
// retry after a failure or after a stable connection ended), given a uniform
// draw rnd in [0,1): uniform in [MinBackoff, min(MaxBackoff, MinBackoff*2^attempt)]
// ("full jitter" above a floor). The floor keeps even a zero draw from
// becoming a hot loop; the doubling saturates, so any attempt count is safe.
func Backoff(attempt int, rnd float64) time.Duration {
	return backoff.New(reconnectPolicy, nil, func() float64 { return rnd }).Wait(attempt)
}

// reconnectPolicy is the reconnect backoff: full jitter above MinBackoff,
// the step after failure n being MinBackoff*2^n, capped at MaxBackoff.
var reconnectPolicy = backoff.Policy{Name: "pubsub reconnect", Base: MinBackoff, Max: MaxBackoff,
	Floor: MinBackoff, Jitter: backoff.JitterFull, StepOffset: 1}

// Reconnect is the reconnect schedule of one client (pure, so the fleet
// simulator runs the same code): Next is the wait before the next
// connection attempt, given how the last one ended.
type Reconnect struct {
	Spread, MaxWait, StableAfter, MaxRetryAfter time.Duration
	Rand                                        func() float64

	failures  int  // failed attempts since the last established connection
	connected bool // a connection was ever established
}

// NewReconnect returns the schedule of o's settings (defaults filled).
func NewReconnect(o Options) *Reconnect {
	o = New(o).o
	return &Reconnect{Spread: o.ReconnectSpread, MaxWait: o.ReconnectMaxWait, StableAfter: o.StableAfter,
		MaxRetryAfter: o.MaxRetryAfter, Rand: o.Rand}
}

// Next is the wait after an attempt that stayed subscribed for up (0: it
// never got there) and ended with err.
func (r *Reconnect) Next(up time.Duration, err error) time.Duration {
	var d time.Duration
	if up > 0 {
		r.connected = true
	}
	switch {
	case up > 0 && (up >= r.StableAfter || r.failures == 0):
		// An established connection ended: spread the first reconnect.
		r.failures = 0
		d = backoff.Full(MinBackoff, r.Spread, r.Rand())
	case r.connected:
		// Reconnecting (or flapping): grow from the spread, capped. The
		// first wait at the cap is drawn over the whole cap, so the
		// phases of a fleet that dropped together cover the cadence; the
		// later ones stay near the cap (few attempts, a bounded return).
		r.failures++
		step := backoff.Exponential(r.Spread, r.failures, r.MaxWait)
		if step == r.MaxWait && backoff.Exponential(r.Spread, r.failures-1, r.MaxWait) < r.MaxWait {
			d = backoff.Full(MinBackoff, step, r.Rand())
		} else {
			d = backoff.Narrow(step, r.Rand())
		}
	default:
		// Never connected yet: start-up is quick, then grows.
		r.failures++
		d = min(Backoff(r.failures, r.Rand()), r.MaxWait)
	}
	var he *HandshakeError
	if errors.As(err, &he) && he.HasRetryAfter && r.MaxRetryAfter > 0 {
		// A refused handshake's Retry-After, under the cap of fetches.
		h := min(he.RetryAfter, r.MaxRetryAfter)
		d = max(d, backoff.Up(h, r.MaxRetryAfter, r.Rand()))
	}
	return d
}
