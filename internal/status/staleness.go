package status

import (
	"sync"
	"time"

	"github.com/benbjohnson/clock"
)

// Staleness tracks how long the loaded policy has been behind: from the
// last successful policy update (or from start, before the first one) while
// an update is pending or failing. It is pending from start until the first
// success, and failing from any failed attempt, fetch or transaction until
// the next success. A lost or disabled connection to the server (Lost)
// makes a current policy behind from that moment until the next success.
// Safe for concurrent use.
type Staleness struct {
	clk     clock.Clock
	mu      sync.Mutex
	since   time.Time // the last success, or the start
	from    time.Time // what Stale counts from: since, or when the connection was lost
	loaded  bool      // a success has happened
	behind  bool      // pending or failing
	lastErr string
}

// NewStaleness returns a tracker that is pending (no policy loaded yet) from
// clk's now.
func NewStaleness(clk clock.Clock) *Staleness {
	if clk == nil {
		clk = clock.New()
	}
	now := clk.Now()
	return &Staleness{clk: clk, since: now, from: now, behind: true}
}

// Failing marks the policy as behind: an update was wanted and did not
// succeed. The staleness keeps counting from the last success.
func (s *Staleness) Failing() {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.failLocked()
	s.mu.Unlock()
}

// failLocked marks a failure: a current policy becomes behind since the last
// success; one already behind keeps counting from where it started.
func (s *Staleness) failLocked() {
	if !s.behind {
		s.from = s.since
	}
	s.behind = true
}

// Lost marks the policy as possibly behind from t: the pub/sub connection
// was lost or disabled, so an update may go unseen. A policy already behind
// keeps counting from where it started; a current one counts from t, not
// from its last success (it was known current until t). The next success
// clears it, so a brief reconnect, whose full update succeeds, leaves only
// a few seconds of staleness.
func (s *Staleness) Lost(t time.Time) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.behind { // guard: mutation "if false {" restarts the count of a policy already behind
		return
	}
	s.behind, s.from = true, t
}

// FailedWith is Failing with the error to report in the stale warning.
func (s *Staleness) FailedWith(err string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.failLocked()
	s.lastErr = err
	s.mu.Unlock()
}

// Success marks the policy as current as of t.
func (s *Staleness) Success(t time.Time) {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.since, s.from, s.loaded, s.behind, s.lastErr = t, t, true, false, ""
	s.mu.Unlock()
}

// Restored marks a policy loaded from an offline-mode backup taken at t:
// still pending (no update from the server yet), but the staleness counts
// from t, not from start, since that is how old the policy really is. It
// changes nothing once a success has been recorded.
func (s *Staleness) Restored(t time.Time) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.loaded { // guard: mutation "if false {" lets an old backup time overwrite a success
		return
	}
	s.since, s.from, s.loaded, s.behind = t, t, true, true
}

// Stale is how long the policy has been behind; 0 while it is current.
func (s *Staleness) Stale() time.Duration {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.behind { // guard: mutation "if s.behind {" makes a current policy read as stale
		return 0
	}
	if d := s.clk.Now().Sub(s.from); d > 0 {
		return d
	}
	return 0
}

// State is a snapshot for the stale warning.
type State struct {
	Stale       time.Duration // 0 while current
	LastSuccess time.Time     // zero before the first success
	LastError   string        // the last failure reported through FailedWith
}

// State returns the current staleness with its context.
func (s *Staleness) State() State {
	if s == nil {
		return State{}
	}
	st := State{Stale: s.Stale()}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.loaded {
		st.LastSuccess = s.since
	}
	st.LastError = s.lastErr
	return st
}
