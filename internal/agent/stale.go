// This file is the periodic "policy stale" warning (docs/operations.md): at
// most one WARNING per StaleWarnInterval once the policy is that far behind.

package agent

import (
	"context"
	"time"
)

// warnStale logs the "policy stale" WARNING at most once per tick
// (StaleWarnInterval) while the policy has been behind for at least one
// interval (docs/operations.md).
func (a *Agent) warnStale(ctx context.Context, tick <-chan time.Time) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
			a.checkStale()
		}
	}
}

// checkStale logs the stale warning if it is due and reports whether it did.
func (a *Agent) checkStale() bool {
	st := a.tracker.Staleness().State()
	if st.Stale < a.o.StaleWarnInterval { // guard: mutation "if st.Stale < 0 {" warns about a current or briefly late policy
		return false
	}
	args := []any{"stale_for", st.Stale.Round(time.Second).String(), "stale_seconds", int64(st.Stale.Seconds())}
	if st.LastSuccess.IsZero() {
		args = append(args, "last_success", "never")
	} else {
		args = append(args, "last_success", st.LastSuccess.UTC().Format(time.RFC3339))
	}
	if st.LastError != "" {
		args = append(args, "last_error", st.LastError)
	}
	args = append(args, "deferral_round", a.sched.Round(), "deferral_flat", a.sched.Flat())
	a.log.Warn("policy stale", args...)
	return true
}
