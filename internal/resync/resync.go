// Package resync spreads the resync a pub/sub (re)connect triggers (design
// §6, fleet): when a server restart drops every socket, every agent
// reconnects within the reconnect spread and, unspread, would fetch its
// policy and base data in the same seconds. An agent that already holds a
// policy instead resyncs at a uniformly random moment of a window that
// opens when the reconnect spread ends, [lost+After, lost+After+Window],
// or at once if that moment has passed (a long outage: the reconnects are
// already spread by their backoff). An agent without a policy resyncs at
// once, so start-up stays fast.
package resync

import (
	"math/rand/v2"
	"sync"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/opal-go/opal-client/internal/backoff"
)

// Options configure a Spreader. Resync is required.
type Options struct {
	// After is how long after the loss the window opens: the pub/sub
	// reconnect spread (OPAL_PUBSUB_RECONNECT_SPREAD).
	After time.Duration
	// Window is OPAL_RESYNC_SPREAD; 0 resyncs at once on every connect.
	Window time.Duration
	Clock  clock.Clock    // nil means the real clock
	Rand   func() float64 // uniform [0,1); nil means math/rand/v2
	// Resync runs the connect's triggers (the full policy update, the base
	// data reload). It must only enqueue; it runs on the caller of
	// Connected or on the timer's goroutine, never under a lock.
	Resync func()
}

// Spreader delays connect resyncs. Its methods are safe for concurrent use.
type Spreader struct {
	o Options

	mu      sync.Mutex
	lost    time.Time    // when the connection was lost; zero if never or since resynced
	timer   *clock.Timer // the pending resync, nil if none
	stopped bool
}

// New returns a Spreader.
func New(o Options) *Spreader {
	if o.Clock == nil {
		o.Clock = clock.New()
	}
	if o.Rand == nil {
		o.Rand = rand.Float64
	}
	return &Spreader{o: o}
}

// Lost records that the connection was lost at at. The first loss since
// the last connect counts.
func (s *Spreader) Lost(at time.Time) {
	s.mu.Lock()
	if s.lost.IsZero() {
		s.lost = at
	}
	s.mu.Unlock()
}

// Connected is a (re)connect. hasPolicy tells whether the agent already
// holds a policy. It runs Resync at once or arms the spread resync, and
// returns the delay chosen (0: at once; -1: a resync was already pending
// or the Spreader is stopped).
func (s *Spreader) Connected(hasPolicy bool) time.Duration {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return -1
	}
	lost := s.lost
	s.lost = time.Time{}
	var d time.Duration
	if hasPolicy && !lost.IsZero() && s.o.Window > 0 { // mutation "false" resyncs a restart in one burst
		target := lost.Add(s.o.After + backoff.Full(0, s.o.Window, s.o.Rand()))
		d = target.Sub(s.o.Clock.Now())
	}
	if d <= 0 {
		s.mu.Unlock()
		s.o.Resync()
		return 0
	}
	if s.timer != nil {
		s.mu.Unlock()
		return -1 // the pending resync serves this connect too
	}
	s.timer = s.o.Clock.AfterFunc(d, s.fire)
	s.mu.Unlock()
	return d
}

func (s *Spreader) fire() {
	s.mu.Lock()
	run := s.timer != nil && !s.stopped
	s.timer = nil
	s.mu.Unlock()
	if run {
		s.o.Resync()
	}
}

// Pending reports whether a spread resync is waiting.
func (s *Spreader) Pending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.timer != nil
}

// Stop cancels a pending resync and refuses later ones (shutdown).
func (s *Spreader) Stop() {
	s.mu.Lock()
	s.stopped = true
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	s.mu.Unlock()
}
