// This file wraps the store and the fetcher for the metrics: apply times,
// fetch outcomes, and a failed fetch marking the policy as failing.

package agent

import (
	"context"
	"errors"

	"github.com/benbjohnson/clock"

	"github.com/opal-go/opal-client/fetcher"
	"github.com/opal-go/opal-client/internal/metrics"
	"github.com/opal-go/opal-client/internal/status"
	"github.com/opal-go/opal-client/updater"
)

// measuredStore times each bundle apply for the metrics.
type measuredStore struct {
	updater.Store
	m   *metrics.Metrics
	clk clock.Clock
}

func (s measuredStore) ApplyPolicy(ctx context.Context, b *fetcher.PolicyBundle) error {
	start := s.clk.Now()
	err := s.Store.ApplyPolicy(ctx, b)
	bm := (*updater.BaseMismatchError)(nil)
	s.m.StoreApply(s.clk.Since(start), err, errors.As(err, &bm))
	return err
}

// measuredFetcher counts whole fetches by outcome; a failed one (retries
// exhausted or not retryable, not cancelled) marks the policy as failing.
type measuredFetcher struct {
	f *fetcher.Fetcher
	m *metrics.Metrics
	t *status.Tracker
}

func (f measuredFetcher) Fetch(ctx context.Context, r fetcher.Request) (*fetcher.Result, error) {
	res, err := f.f.Fetch(ctx, r)
	outcome := fetchOutcome(err)
	f.m.FetchDone(outcome)
	if outcome == metrics.OutcomeExhausted || outcome == metrics.OutcomeNonRetryable {
		f.t.FetchFailed()
	}
	return res, err
}

func fetchOutcome(err error) string {
	var nre *fetcher.NonRetryableError
	var re *fetcher.RetryableError
	switch {
	case err == nil:
		return metrics.OutcomeSuccess
	case errors.As(err, &nre):
		return metrics.OutcomeNonRetryable
	case errors.As(err, &re):
		return metrics.OutcomeExhausted
	default:
		return metrics.OutcomeCancelled
	}
}
