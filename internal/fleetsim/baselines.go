package fleetsim

import (
	"context"
	"sync"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/opal-go/opal-client/config"
	"github.com/opal-go/opal-client/internal/backoff"
)

// sleep waits d on clk; false if ctx ended first.
func sleep(ctx context.Context, clk clock.Clock, d time.Duration) bool {
	return backoff.Sleep(ctx, clk, d)
}

// loop is the goroutine of a baseline agent; pending counts notifications
// not yet processed (the Python client queues every one).
type loop struct {
	done    chan struct{}
	events  chan struct{} // buffered 1: "pending > 0"
	mu      sync.Mutex
	pending int
}

func newLoop() *loop { return &loop{done: make(chan struct{}), events: make(chan struct{}, 1)} }

func (a *loop) notify() {
	a.mu.Lock()
	a.pending++
	a.mu.Unlock()
	select {
	case a.events <- struct{}{}:
	default:
	}
}

// take removes one pending notification, false if none.
func (a *loop) take() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pending == 0 {
		return false
	}
	a.pending--
	return true
}

func (a *loop) stop() { <-a.done }

// pythonReconnectWait is fastapi_websocket_rpc's default retry wait,
// tenacity's wait_random_exponential(min=0.1, max=120): uniform in
// [0.1 s, max(0.1 s, min(2^(n-1) s, 120 s))] before the n-th retry.
func pythonReconnectWait(n int, rnd func() float64) time.Duration {
	high := backoff.Exponential(time.Second, n, 120*time.Second)
	return backoff.Full(100*time.Millisecond, high, rnd())
}

// startPython models the Python OPAL client on master (protocol §8). Its
// socket reconnects at once when it drops (the client loop reopens the
// connection), then retries a refused connect with pythonReconnectWait. On
// every connect it loads its base data (/data/config and a source) and
// fetches the policy; every notification is queued and fetched in turn.
// A fetch makes at most 5 attempts with the default random_exponential
// waits (up to 1, 2, 4, 8 s), every failure retried alike (409 included),
// no Retry-After; after the last failure nothing is re-queued.
func startPython(e *env) *loop {
	a := newLoop()
	retry := config.DefaultPolicyUpdaterConnRetry()
	update := func() bool {
		e.stats.fetch(e.srv)
		for n := 1; ; n++ {
			e.stats.policy(e.srv)
			status, _, body, _ := e.srv.servePolicy(e.ctx)
			if status == 200 {
				e.rec.applied(e.i, hashOf(body))
				return true
			}
			if n >= retry.Attempts {
				return true
			}
			if !sleep(e.ctx, e.clk, retry.Wait(n, e.rnd)) {
				return false
			}
		}
	}
	drops := e.srv.drops()
	connected := make(chan struct{}, 1)
	// The socket: connected before the event.
	go func() {
		for {
			select {
			case <-e.ctx.Done():
				return
			case <-drops:
			}
			for n := 0; ; n++ {
				if n > 0 && !sleep(e.ctx, e.clk, pythonReconnectWait(n, e.rnd)) {
					return
				}
				drops = e.srv.drops()
				if e.srv.handshake() == nil {
					break
				}
			}
			e.srv.connectData()
			select {
			case connected <- struct{}{}:
			default:
			}
		}
	}()
	go func() {
		defer close(a.done)
		for {
			select {
			case <-e.ctx.Done():
				return
			case <-connected:
				if !update() {
					return
				}
			case <-a.events:
				for a.take() {
					if !update() {
						return
					}
				}
			}
		}
	}()
	return a
}

// hashOf reads the hash of a served bundle (the simulator's bundles only).
func hashOf(body []byte) string {
	const key = `"hash":"`
	for i := 0; i+len(key)+40 <= len(body); i++ {
		if string(body[i:i+len(key)]) == key {
			return string(body[i+len(key) : i+len(key)+40])
		}
	}
	return ""
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
// after opaBackoff of the error count. It has no pub/sub (no socket, no
// notification), so an event finds each agent at a uniformly random point
// of its poll interval.
func startOPA(e *env) *loop {
	a := newLoop()
	go func() {
		defer close(a.done)
		if !sleep(e.ctx, e.clk, time.Duration(e.rnd()*float64(opaPoll(e.rnd)))) {
			return
		}
		retry := 0
		for {
			var delay time.Duration
			e.stats.fetch(e.srv)
			e.stats.policy(e.srv)
			if status, _, body, _ := e.srv.servePolicy(e.ctx); status == 200 {
				e.rec.applied(e.i, hashOf(body))
				retry, delay = 0, opaPoll(e.rnd)
			} else {
				delay = opaBackoff(retry, e.rnd)
				retry++
			}
			if !sleep(e.ctx, e.clk, delay) {
				return
			}
		}
	}()
	return a
}
