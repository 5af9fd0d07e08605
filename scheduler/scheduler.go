// Package scheduler holds the single deferred re-fetch timer of an updater
// (design D1-D8): after a fetch ends exhausted on retryable errors it arms one
// timer with an escalating, jittered delay, then a flat cadence once the round
// budget is spent, and never gives up. When the timer fires it only calls
// Options.Fire, which must enqueue a deferred re-fetch (D4); it never fetches.
//
// The scheduler is generic: the policy updater owns one, and a data updater
// may own one per data entry.
package scheduler

import (
	"bytes"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/opal-go/opal-client/internal/backoff"
)

// Floor is the smallest deferral delay before jitter (D2), and the flat
// cadence when MAX_RETRY_AFTER is below it (D3).
const Floor = 5 * time.Second

// Options configures a Scheduler. The zero value of every field except Fire
// is usable.
type Options struct {
	// Enabled is OPAL_POLICY_UPDATER_RESCHEDULE_ON_RETRYABLE; false disables
	// all deferral, flat phase included (D8).
	Enabled bool
	// MaxRetryAfter is the ceiling of a delay (OPAL_POLICY_UPDATER_MAX_RETRY_AFTER).
	// The 5 s floor wins over a smaller ceiling.
	MaxRetryAfter time.Duration
	// MaxRounds is OPAL_POLICY_UPDATER_MAX_DEFERRED_ROUNDS: escalating
	// rounds before the flat cadence. Negative counts as 0.
	MaxRounds int
	// Clock drives the timer; nil means the real clock.
	Clock clock.Clock
	// Rand is a uniform source in [0,1) for the default jitter; nil means
	// math/rand/v2.
	Rand func() float64
	// Jitter, if set, replaces the default draw (backoff.Half into
	// [d/2, d] without a hint; upward from the hint with one, see Arm). An
	// identity function disables jitter.
	Jitter func(time.Duration) time.Duration
	// Logger receives the WARNING per round and on entering the flat phase
	// (D7); nil discards.
	Logger *slog.Logger
	// Fire is called, from the timer's goroutine, when the timer fires. It
	// must only enqueue a deferred re-fetch and return at once (D4). It may
	// call any method of the Scheduler, Stop included.
	Fire func()
	// OnArm, if set, sees every armed timer: its round, the jittered delay
	// and whether it is a flat-phase round (a metrics hook). It runs on the
	// caller of Arm, outside the Scheduler's lock, so it may call back.
	OnArm func(round int, delay time.Duration, flat bool)
}

// Scheduler is the single deferred re-fetch timer. Its methods are safe for
// concurrent use.
type Scheduler struct {
	opts Options
	clk  clock.Clock
	log  *slog.Logger

	mu      sync.Mutex
	timer   *clock.Timer // the pending timer, nil if none (D1)
	round   int          // rounds armed since the last reset, saturating
	flat    bool         // in the flat phase (D3)
	stopped bool
	armed   int    // timers created and not yet stopped or fired (test invariant)
	gen     uint64 // identifies the current timer to its own callback
	firing  uint64 // goroutine id of the running Fire, 0 if none
	wg      sync.WaitGroup
}

// New returns a Scheduler with no timer pending.
func New(o Options) *Scheduler {
	if o.MaxRounds < 0 {
		o.MaxRounds = 0
	}
	if o.MaxRetryAfter < 0 {
		o.MaxRetryAfter = 0
	}
	s := &Scheduler{opts: o, clk: o.Clock, log: o.Logger}
	if s.clk == nil {
		s.clk = clock.New()
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return s
}

// Delay is the delay before jitter of round n (1-based) given the server's
// last hint, and whether that round is in the flat phase (D2, D3):
//
//	escalating (n <= maxRounds): clamp(max(hint, 5s*2^(n-1)), 5s, ceiling), the floor winning
//	flat       (n >  maxRounds): max(ceiling, 5s)
//
// It is pure, O(1) for any n, and never overflows.
func Delay(round int, hint time.Duration, hasHint bool, ceiling time.Duration, maxRounds int) (time.Duration, bool) {
	ceiling = max(ceiling, Floor)
	if round > maxRounds {
		return ceiling, true
	}
	d := backoff.Exponential(Floor, round, 0)
	if hasHint && hint > d {
		d = hint
	}
	return min(d, ceiling), false
}

// jitter draws the delay actually used from the delay before jitter d (D2).
// Without a hint: uniformly into [d/2, d] (backoff.Half). With a hint h,
// capped at the ceiling: uniformly into [max(h, d/2), max(d, min(2h, ceiling))],
// so the re-fetch never comes back before the server's Retry-After and
// never after the ceiling (a spread upward from the hint, as F4 does).
func (s *Scheduler) jitter(d, hint time.Duration, hasHint bool) time.Duration {
	if s.opts.Jitter != nil {
		return s.opts.Jitter(d)
	}
	r := rand.Float64
	if s.opts.Rand != nil {
		r = s.opts.Rand
	}
	u := backoff.Unit(r())
	if !hasHint || hint <= 0 {
		return backoff.Half(d, u)
	}
	ceiling := max(s.opts.MaxRetryAfter, Floor)
	h := min(hint, ceiling)
	lo := max(h, d/2)               // never before the hint
	hi := max(d, min(2*h, ceiling)) // never past the ceiling
	return lo + time.Duration(u*float64(hi-lo))
}

// Arm starts the deferral timer after a fetch ended exhausted on retryable
// errors, with the hint of the answer that ended it (D1, F8). It reports whether a
// timer was started: it does nothing while one is pending, when disabled
// (D8), or after Stop.
func (s *Scheduler) Arm(hint time.Duration, hasHint bool) bool {
	s.mu.Lock()
	if !s.opts.Enabled || s.stopped || s.timer != nil {
		s.mu.Unlock()
		return false
	}
	if s.round <= s.opts.MaxRounds { // saturate: flat rounds need no count
		s.round++
	}
	round := s.round
	base, flat := Delay(round, hint, hasHint, s.opts.MaxRetryAfter, s.opts.MaxRounds)
	d := s.jitter(base, hint, hasHint)
	enterFlat := flat && !s.flat
	if enterFlat {
		s.flat = true
	}
	s.wg.Add(1)
	s.armed++
	s.gen++
	g := s.gen
	s.timer = s.clk.AfterFunc(d, func() { s.fire(g) })
	s.mu.Unlock()

	// Logger and hook run outside the lock: either may call back.
	switch {
	case enterFlat:
		s.log.Warn("policy fetch still failing: entering flat re-fetch cadence",
			"rounds", s.opts.MaxRounds, "delay", d, "cadence", base)
	case !flat:
		s.log.Warn("policy fetch deferred", "round", round, "delay", d, "hint", hintAttr(hint, hasHint))
	}
	if s.opts.OnArm != nil {
		s.opts.OnArm(round, d, flat)
	}
	return true
}

func hintAttr(hint time.Duration, has bool) any {
	if !has {
		return "none"
	}
	return hint
}

// fire runs on the timer's goroutine. A timer that was cancelled while
// firing finds itself no longer current and does nothing.
func (s *Scheduler) fire(g uint64) {
	defer s.wg.Done()
	s.mu.Lock()
	current := s.timer != nil && s.gen == g
	if current {
		s.timer = nil
		s.armed--
		s.firing = goid()
	}
	s.mu.Unlock()
	if !current {
		return
	}
	defer func() {
		s.mu.Lock()
		s.firing = 0
		s.mu.Unlock()
	}()
	if s.opts.Fire != nil {
		s.opts.Fire()
	}
}

// goid is the current goroutine's id, read from its stack header
// ("goroutine 42 [running]:"). Stop uses it only to know whether it is
// called from inside Fire, where waiting for Fire would wait for itself.
func goid() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	id, _ := strconv.ParseUint(string(b), 10, 64)
	return id
}

// cancelLocked stops the pending timer, if any; s.mu is held.
func (s *Scheduler) cancelLocked() {
	if s.timer == nil {
		return
	}
	if s.timer.Stop() {
		s.wg.Done() // its function will never run
	}
	s.timer = nil
	s.armed--
}

// Cancel stops the pending timer and keeps the round counter and flat
// phase: what a connect/reconnect trigger does (D5, D6).
func (s *Scheduler) Cancel() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cancelLocked()
}

// Reset stops the pending timer and resets the rounds and the flat phase:
// what a successful fetch or a genuine policy update does (D5, D6).
func (s *Scheduler) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cancelLocked()
	s.round = 0
	s.flat = false
}

// Stop cancels the pending timer, refuses any later Arm, and returns once
// no timer goroutine of this Scheduler is running (D5). Called from inside
// Fire, it returns at once instead of waiting for its own caller; the Fire
// goroutine ends when Fire returns.
func (s *Scheduler) Stop() {
	s.mu.Lock()
	s.stopped = true
	s.cancelLocked()
	self := s.firing != 0 && s.firing == goid()
	s.mu.Unlock()
	if self {
		return
	}
	s.wg.Wait()
}

// Round is the number of rounds armed since the last Reset, saturating at
// MaxRounds+1 once the flat phase is reached.
func (s *Scheduler) Round() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.round
}

// Flat reports whether the scheduler is in the flat phase (D3).
func (s *Scheduler) Flat() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.flat
}

// Pending reports whether a timer is pending.
func (s *Scheduler) Pending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.timer != nil
}

// Timers is the number of timers started and neither fired nor stopped: 0
// or 1 (D1). It lets tests and the fleet simulator check that invariant.
func (s *Scheduler) Timers() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.armed
}
