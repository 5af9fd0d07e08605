// This file turns the matching entries of an update into queue works (U1):
// fetched in the pool, written alone, each with its deferred re-fetch (D1-D3).

package dataupdater

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/opal-go/opal-client/scheduler"
	"github.com/opal-go/opal-client/updater"
)

// admit queues the matching entries in order.
func (u *Updater) admit(ctx context.Context, id, reason string, entries []Entry, report []callback) {
	if u.o.Queue == nil {
		return
	}
	for _, w := range u.works(ctx, id, reason, entries, report) {
		_ = u.o.Queue.Data(*w)
	}
}

// works turns the matching entries of one update into queue works; an
// entry refused before any fetch (Validate) is reported at once.
func (u *Updater) works(ctx context.Context, id, reason string, entries []Entry, report []callback) []*updater.DataWork {
	var rep *reporter
	if len(report) > 0 {
		rep = newReporter(u, id, report)
	}
	var out []*updater.DataWork
	for _, e := range entries {
		if !e.matches(u.o.Topics) {
			u.outcome(OutcomeSkipped)
			u.log.Debug("data entry skipped: no subscribed topic", "dst_path", e.DstPath, "topics", e.Topics)
			continue
		}
		rep.add()
		if err := e.Validate(); err != nil {
			u.finish(ctx, id, reason, e, u.clk.Now(), nil, err, rep)
			continue
		}
		out = append(out, u.work(ctx, id, reason, e, rep))
	}
	rep.close()
	return out
}

// work is the queue work of one entry: fetch in the pool, write alone.
func (u *Updater) work(ctx context.Context, id, reason string, e Entry, rep *reporter) *updater.DataWork {
	path := e.Path()
	w := &updater.DataWork{Name: e.Method() + " /" + joinPath(path), Path: path}
	if e.Method() == MethodPut {
		if len(path) > 0 {
			w.Replaces = [][]string{path}
		} else if keys := inlineRootKeys(e); keys != nil {
			w.Replaces = keys
		}
	}
	var reported atomic.Bool
	var body []byte
	start := u.clk.Now()
	w.Prepare = func(qctx context.Context) (*updater.Prepared, error) {
		start = u.clk.Now()
		pctx, cancel := mergeCancel(qctx, ctx)
		defer cancel()
		wr, b, err := u.prepare(pctx, e)
		body = b
		if err != nil {
			return nil, err
		}
		return &updater.Prepared{Apply: func(qctx context.Context) error {
			if ctx.Err() != nil {
				// Superseded (reconnect) or stopped while queued: a stale
				// base write must not land after the new load's.
				return ctx.Err() // guard: mutation "_ = 0" writes a stale base entry (TestStaleBaseWriteSkipped)
			}
			if u.o.Store == nil {
				return errors.New("dataupdater: no store")
			}
			return u.o.Store.WriteData(qctx, wr)
		}}, nil
	}
	w.Done = func(err error) {
		r := rep
		if reported.Swap(true) {
			r = nil // a deferred re-run: the update's report went already
		}
		u.finish(ctx, id, reason, e, start, body, err, r)
	}
	if u.o.Reschedule {
		w.Defer = u.deferral("data entry " + w.Name)
	}
	return w
}

// inlineRootKeys are the top-level keys an inline root PUT writes (it
// replaces them whole), or nil.
func inlineRootKeys(e Entry) [][]string {
	if !e.Inline() {
		return nil
	}
	v, err := decodeValue(e.Data)
	if err != nil {
		return nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil
	}
	out := make([][]string, 0, len(m))
	for k := range m {
		out = append(out, []string{k})
	}
	return out
}

// deferral makes the scheduler of one queue key's deferred re-fetch
// (D1-D3), logged as data; nil when rescheduling is off.
func (u *Updater) deferral(what string) func(fire func()) *scheduler.Scheduler {
	if !u.o.Reschedule {
		return nil
	}
	return func(fire func()) *scheduler.Scheduler {
		return scheduler.New(scheduler.Options{
			Enabled:       true,
			MaxRetryAfter: u.o.MaxRetryAfter,
			MaxRounds:     u.o.MaxDeferredRounds,
			Clock:         u.clk,
			Rand:          u.o.Rand,
			Jitter:        u.o.Jitter,
			// The scheduler's own lines speak of the policy: log here.
			Logger: nil,
			Fire:   fire,
			OnArm: func(round int, delay time.Duration, flat bool) {
				if flat {
					u.log.Debug("data fetch deferred (flat cadence)", "what", what, "round", round, "delay", delay)
				} else {
					u.log.Warn("data fetch deferred", "what", what, "round", round, "delay", delay)
				}
				if u.o.OnArm != nil {
					u.o.OnArm(what, round, delay)
				}
			},
		})
	}
}
