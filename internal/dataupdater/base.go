// This file is the base data load (protocol §6.3): on every (re)connect the
// sources config is fetched in the queue's place for it, and each periodic
// entry is then polled on its own timer until the next connect or Stop.

package dataupdater

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/opal-go/opal-client/updater"
)

// MinPeriodicInterval is the shortest periodic_update_interval honoured; a
// smaller one (or 0) is raised to it so a bad config cannot spin.
const MinPeriodicInterval = time.Second

// MaxPeriodicInterval is the longest periodic_update_interval honoured; a
// larger one is lowered to it (clamped as a float: converted first, 1e10 s
// would overflow a Duration and poll every second).
const MaxPeriodicInterval = 365 * 24 * time.Hour

// periodicEvery is the poll period of an interval in seconds, clamped to
// [MinPeriodicInterval, MaxPeriodicInterval]; Validate refuses NaN, ±Inf and
// negative intervals before this is reached.
func periodicEvery(sec float64) time.Duration {
	if !(sec < MaxPeriodicInterval.Seconds()) { // NaN and +Inf too
		return MaxPeriodicInterval
	}
	return max(time.Duration(sec*float64(time.Second)), MinPeriodicInterval)
}

// baseKey is the queue key of the base data load: not a data path.
const baseKey = "\x00base data"

// restartLoadLocked cancels the running base load and its periodic timers,
// and admits a new load; u.mu is held and not stopped.
func (u *Updater) restartLoadLocked() {
	if u.connCancel != nil {
		u.connCancel()
	}
	ctx, cancel := context.WithCancel(u.ctx)
	u.connCancel = cancel
	if u.o.SourcesURL == "" || u.o.Queue == nil {
		return
	}
	start := u.clk.Now()
	_ = u.o.Queue.Data(updater.DataWork{
		Name: "base data load",
		Key:  baseKey,
		// The root: the load's entries are unknown until its config
		// arrives, so everything admitted after it waits.
		Path:     nil,
		Coalesce: true, // a newer connect replaces a load still pending
		Prepare: func(qctx context.Context) (*updater.Prepared, error) {
			return u.loadBase(ctx, qctx)
		},
		Done: func(err error) {
			if err == nil || ctx.Err() != nil || errors.Is(err, updater.ErrSuperseded) {
				return
			}
			u.log.Warn("base data sources config not loaded", "error", err)
			u.recordTx(randomID(), "", start, err)
		},
		Defer: u.deferral("base data sources config"),
	})
}

// loadBase fetches the sources config and returns its entries, to take the
// load's place in the queue: those without an interval as one update, each
// periodic one now and then on its own timer.
func (u *Updater) loadBase(ctx, qctx context.Context) (*updater.Prepared, error) {
	fctx, cancel := mergeCancel(qctx, ctx)
	defer cancel()
	var entries []Entry
	_, err := u.fetchBounded(fctx, func(ctx context.Context) (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.o.SourcesURL, nil)
		if err == nil && u.o.Token != "" {
			req.Header.Set("Authorization", "Bearer "+u.o.Token)
		}
		return req, err
	}, func(b []byte) error {
		var err error
		entries, err = DecodeSources(b)
		return err
	})
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	var once []Entry
	for _, e := range entries {
		if e.PeriodicUpdateInterval != nil && e.Validate() == nil {
			e := e
			u.spawn(func() { u.poll(ctx, e) })
			continue
		}
		once = append(once, e)
	}
	works := u.works(ctx, randomID(), "Initial load", once, reportTargets(nil, u.o))
	if works == nil {
		works = []*updater.DataWork{}
	}
	return &updater.Prepared{Expand: works}, nil
}

// poll admits a periodic entry now and then every interval until ctx ends
// (reconnect or Stop): one timer per entry.
func (u *Updater) poll(ctx context.Context, e Entry) {
	every := periodicEvery(*e.PeriodicUpdateInterval)
	for {
		u.admit(ctx, randomID(), "Periodic update", []Entry{e}, nil)
		t := u.clk.Timer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
