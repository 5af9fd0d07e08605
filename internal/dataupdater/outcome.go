// This file records how each run of an entry ended: its report, its transaction
// (readiness, health), the outcome metric and one log line.

package dataupdater

import (
	"context"
	"errors"
	"time"

	"github.com/opal-go/opal-client/fetcher"
	"github.com/opal-go/opal-client/updater"
)

// finish records one run's outcome: report, transaction, metrics, log.
func (u *Updater) finish(ctx context.Context, id, reason string, e Entry, start time.Time, body []byte, err error, rep *reporter) {
	if err != nil && (ctx.Err() != nil || u.ctx.Err() != nil) {
		return // cancelled by reconnect or Stop: not an outcome
	}
	rep.done(e, body, err)
	if errors.Is(err, updater.ErrSuperseded) {
		u.log.Debug("data entry superseded by a newer update", "id", id, "dst_path", e.DstPath)
		return
	}
	u.recordTx(id, e.Method(), start, err)
	var nr *fetcher.NonRetryableError
	var rt *fetcher.RetryableError
	switch {
	case err == nil:
		u.outcome(OutcomeSuccess)
		u.log.Debug("data entry written", "id", id, "reason", reason, "dst_path", e.DstPath, "method", e.Method())
	case errors.As(err, &rt):
		u.outcome(OutcomeFetchFailed)
	case errors.As(err, &nr):
		u.outcome(OutcomeFetchFailed)
	case isInvalid(err):
		u.outcome(OutcomeInvalid)
		u.log.Warn("data entry refused", "id", id, "dst_path", e.DstPath, "error", err)
	default:
		u.outcome(OutcomeWriteFailed)
		state := "unchanged"
		if updater.IsPartial(err) {
			state = "partly written"
		}
		retry := "not retried"
		if updater.IsTransient(err) && u.o.Reschedule {
			retry = "deferred re-fetch"
		}
		u.log.Warn("data entry not written", "id", id, "dst_path", e.DstPath, "store", state, "retry", retry, "error", err)
	}
}

func isInvalid(err error) bool {
	var de *DecodeError
	var pe *PatchError
	var pp *ProtectedPathError
	var rc *RuleConflictError
	return errors.As(err, &de) || errors.As(err, &pe) || errors.As(err, &pp) || errors.As(err, &rc)
}

func (u *Updater) outcome(o string) {
	if u.o.OnOutcome != nil {
		u.o.OnOutcome(o)
	}
}

func (u *Updater) recordTx(id, method string, start time.Time, err error) {
	if u.o.OnTransaction == nil {
		return
	}
	tx := updater.Transaction{ID: id, Type: TypeData, Success: err == nil, Created: start, Ended: u.clk.Now()}
	switch method {
	case MethodPatch:
		tx.Actions = []string{ActionPatch}
	case "":
	default:
		tx.Actions = []string{ActionSet}
	}
	if err != nil {
		tx.Error = err.Error()
	}
	u.o.OnTransaction(tx)
}
