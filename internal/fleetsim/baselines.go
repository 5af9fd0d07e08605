package fleetsim

import (
	"context"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/opal-go/opal-client/config"
)

// sleep waits d on clk; false if ctx ended first.
func sleep(ctx context.Context, clk clock.Clock, d time.Duration) bool {
	t := clk.Timer(d)
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		t.Stop()
		return false
	}
}

// loop is the goroutine of a baseline agent.
type loop struct {
	done   chan struct{}
	events chan struct{}
}

func (a *loop) notify() {
	select {
	case a.events <- struct{}{}:
	default: // one is already waiting; the scenarios publish once
	}
}

func (a *loop) stop() { <-a.done }

// startPython models the Python OPAL client on master (protocol §8): on
// connect and on every notification, one fetch of at most 5 attempts with
// the default random_exponential waits (up to 1, 2, 4, 8 s), every failure
// retried alike (409 included), no Retry-After; after the last failure
// nothing is re-queued, so it waits for the next event.
func startPython(ctx context.Context, i int, connect time.Duration, rnd func() float64,
	clk clock.Clock, srv *server, rec *recorder) *loop {
	a := &loop{done: make(chan struct{}), events: make(chan struct{}, 1)}
	retry := config.DefaultPolicyUpdaterConnRetry()
	update := func() bool {
		for n := 1; ; n++ {
			if status, _, _ := srv.serve(); ok(status) {
				rec.recovered(i)
				return true
			}
			if n >= retry.Attempts {
				return true
			}
			if !sleep(ctx, clk, retry.Wait(n, rnd)) {
				return false
			}
		}
	}
	go func() {
		defer close(a.done)
		if !sleep(ctx, clk, connect) || !update() {
			return
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-a.events:
				if !update() {
					return
				}
			}
		}
	}()
	return a
}

// OPA bundle downloader defaults (v1/download: minRetryDelay, polling
// min_delay_seconds and max_delay_seconds).
const (
	opaMinRetryDelay = 100 * time.Millisecond
	opaMinPoll       = 60 * time.Second
	opaMaxPoll       = 120 * time.Second
)

// opaBackoff is OPA's util.DefaultBackoff with the random draw injected:
// 0 for the first retry, then 100 ms x 1.6^n capped at the max delay, with
// +-20% jitter; no Retry-After.
func opaBackoff(retries int, rnd func() float64) time.Duration {
	if retries == 0 {
		return 0
	}
	b, limit := float64(opaMinRetryDelay), float64(opaMaxPoll)
	for b < limit && retries > 0 {
		b *= 1.6
		retries--
	}
	b = min(b, limit)
	return time.Duration(b * (1 + 0.2*(rnd()*2-1)))
}

func opaPoll(rnd func() float64) time.Duration {
	return opaMinPoll + time.Duration(rnd()*float64(opaMaxPoll-opaMinPoll))
}

// startOPA models OPA's bundle downloader loop (v1/download.Downloader.loop):
// after a success it polls again in U(60 s, 120 s); after an error it retries
// after opaBackoff of the error count. It has no pub/sub, so the outage finds
// each agent at a uniformly random point of its poll interval.
func startOPA(ctx context.Context, i int, rnd func() float64, clk clock.Clock, srv *server, rec *recorder) *loop {
	a := &loop{done: make(chan struct{}), events: make(chan struct{}, 1)}
	go func() {
		defer close(a.done)
		if !sleep(ctx, clk, time.Duration(rnd()*float64(opaPoll(rnd)))) {
			return
		}
		retry := 0
		for {
			var delay time.Duration
			if status, _, _ := srv.serve(); ok(status) {
				rec.recovered(i)
				retry, delay = 0, opaPoll(rnd)
			} else {
				delay = opaBackoff(retry, rnd)
				retry++
			}
			if !sleep(ctx, clk, delay) {
				return
			}
		}
	}()
	return a
}
