package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/opal-go/opal-client/internal/dataupdater"
	"github.com/opal-go/opal-client/internal/status"
	"github.com/opal-go/opal-client/scheduler"
	"github.com/opal-go/opal-client/updater"
)

// NewDataUpdater builds the data updater from the agent's
// dependencies: set it as Options.NewDataUpdater. Data writes go through
// d.Queue; deferral, Retry-After cap and rounds follow the policy updater's
// settings (OPAL_POLICY_UPDATER_*), the retry and timeouts the data ones.
func NewDataUpdater(d DataDeps) (DataUpdater, error) {
	ds, ok := d.Store.(dataupdater.Store)
	if !ok {
		return nil, fmt.Errorf("store %T cannot write data", d.Store)
	}
	cfg := d.Config
	return dataupdater.New(dataupdater.Options{
		Store:             ds,
		Queue:             d.Queue,
		Topics:            cfg.DataTopicNames(),
		SourcesURL:        cfg.DefaultDataSourcesConfigURL,
		Token:             cfg.ClientToken,
		Retry:             cfg.DataUpdaterConnRetry,
		MaxRetryAfter:     cfg.PolicyUpdaterMaxRetryAfter,
		AttemptTimeout:    cfg.HTTPFetcherTimeout,
		FetchTimeout:      cfg.FetchingCallbackTimeout,
		Reschedule:        cfg.PolicyUpdaterRescheduleOnRetryable,
		MaxDeferredRounds: cfg.PolicyUpdaterMaxDeferredRounds,
		SplitRootData:     cfg.SplitRootData,
		Report:            cfg.ShouldReportOnDataUpdates,
		Callbacks:         cfg.DefaultUpdateCallbacks,
		HTTPClient:        d.HTTPClient,
		Clock:             d.Clock,
		Rand:              d.Rand,
		Logger:            d.Logger,
		OnOutcome:         d.Metrics.DataEntry, // guard: mutation "nil" leaves data entries uncounted (TestE2E_Data/U3_bad_patch_leaves_data_unchanged)
		OnArm:             func(string, int, time.Duration) { d.Metrics.DataDeferral() },
		OnTransaction: func(tx updater.Transaction) {
			if d.Record != nil {
				d.Record(status.Transaction{ID: tx.ID, Type: tx.Type, Actions: tx.Actions, Success: tx.Success,
					Error: tx.Error, Created: tx.Created, Ended: tx.Ended})
			}
		},
	}), nil
}

// healthPolicyKey is the update queue's key of the health-check policy.
const healthPolicyKey = "\x00health-check policy"

// queuedHealthPolicy writes the health-check policy through the update
// queue (U1): one key, coalesced (latest wins), so a burst of transactions
// costs one compile, not one per entry. A write that fails transiently (the
// store not up yet) is retried under the deferral's backoff.
type queuedHealthPolicy struct{ a *Agent }

// SetHealthPolicy queues the write of rego and returns at once.
func (h *queuedHealthPolicy) SetHealthPolicy(_ context.Context, rego string) error {
	a := h.a
	return a.queue.Data(updater.DataWork{
		Name:      "health-check policy",
		Key:       healthPolicyKey,
		Unordered: true,
		Coalesce:  true, // guard: mutation "false" compiles once per transaction (TestHealthPolicyCoalesced)
		Apply:     func(ctx context.Context) error { return a.store.SetHealthPolicy(ctx, rego) },
		Done: func(err error) {
			switch {
			case err == nil:
				a.log.Debug("health-check policy written") // one compile (docs/performance.md counts these)
			case err != updater.ErrSuperseded:
				a.log.Warn("health-check policy not written", "error", err)
			}
		},
		Defer: func(fire func()) *scheduler.Scheduler {
			return scheduler.New(scheduler.Options{
				Enabled:       a.cfg.PolicyUpdaterRescheduleOnRetryable,
				MaxRetryAfter: a.cfg.PolicyUpdaterMaxRetryAfter,
				MaxRounds:     a.cfg.PolicyUpdaterMaxDeferredRounds,
				Clock:         a.clk,
				Rand:          a.o.Rand,
				Fire:          fire,
			})
		},
	})
}
