package updater_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/opal-go/opal-client/fetcher"
	"github.com/opal-go/opal-client/internal/memstore"
	"github.com/opal-go/opal-client/internal/testutil"
	"github.com/opal-go/opal-client/scheduler"
	"github.com/opal-go/opal-client/updater"
)

// outcome is what the fake fetcher answers to one Fetch.
type outcome struct {
	bundle *fetcher.PolicyBundle
	err    error
}

// fakeFetcher answers from a script (then from def) and records requests.
// If gate is set, each Fetch waits for a value on it first.
type fakeFetcher struct {
	mu     sync.Mutex
	script []outcome
	def    outcome
	reqs   []fetcher.Request
	gate   chan struct{}
	gen    func() outcome // if set, answers every Fetch
}

func (f *fakeFetcher) Fetch(ctx context.Context, r fetcher.Request) (*fetcher.Result, error) {
	f.mu.Lock()
	f.reqs = append(f.reqs, fetcher.Request{Paths: append([]string(nil), r.Paths...), BaseHash: r.BaseHash, Attempts: r.Attempts})
	o := f.def
	if f.gen != nil {
		o = f.gen()
	} else if len(f.script) > 0 {
		o, f.script = f.script[0], f.script[1:]
	}
	gate := f.gate
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			// As a real attempt cut short may be: a retryable error.
			return &fetcher.Result{}, &fetcher.RetryableError{Exhausted: true, Err: ctx.Err()}
		}
	}
	return &fetcher.Result{Bundle: o.bundle, Attempts: 1}, o.err
}

func (f *fakeFetcher) requests() []fetcher.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fetcher.Request(nil), f.reqs...)
}

func (f *fakeFetcher) set(def outcome, script ...outcome) {
	f.mu.Lock()
	f.def, f.script = def, script
	f.mu.Unlock()
}

func full(hash string) *fetcher.PolicyBundle {
	return &fetcher.PolicyBundle{Hash: hash, Manifest: []string{"p.rego"},
		PolicyModules: []fetcher.PolicyModule{{Path: "p.rego", Rego: "package p # " + hash}}}
}

func delta(from, hash string) *fetcher.PolicyBundle {
	b := full(hash)
	b.OldHash = &from
	return b
}

var (
	ok503 = outcome{err: &fetcher.RetryableError{Status: 503, Exhausted: true}}
	okNR  = outcome{err: &fetcher.NonRetryableError{Status: 409}}
)

func hinted(d time.Duration) outcome {
	return outcome{err: &fetcher.RetryableError{Status: 503, Exhausted: true, RetryAfter: d, HasRetryAfter: true}}
}

type armRec struct {
	round int
	delay time.Duration
	flat  bool
}

// rig is an Updater with a memstore, a fake fetcher and a real scheduler on
// a mock clock, running inside a synctest bubble (tests call settle to let
// the queue run until every goroutine is blocked).
type rig struct {
	u     *updater.Updater
	s     *scheduler.Scheduler
	st    *memstore.Store
	f     *fakeFetcher
	clk   *clock.Mock
	log   *testutil.LogRecorder
	mu    sync.Mutex
	arms  []armRec
	txs   []updater.Transaction
	runEr chan error
}

type rigOpt struct {
	dirs      []string
	maxRounds int
	disabled  bool
	noSched   bool
	workers   int
	ceiling   time.Duration // 0 means one minute unless exact
	rand      func() float64
	exact     bool // take maxRounds and ceiling as given, zeros included
}

func newRig(t *testing.T, o rigOpt) *rig {
	t.Helper()
	r := &rig{st: memstore.New(), f: &fakeFetcher{def: outcome{bundle: full("h1")}}, clk: clock.NewMock(),
		log: &testutil.LogRecorder{}, runEr: make(chan error, 1)}
	logger := slog.New(r.log)
	if o.maxRounds == 0 && !o.exact {
		o.maxRounds = 20
	}
	if !o.noSched {
		if o.ceiling == 0 && !o.exact {
			o.ceiling = time.Minute
		}
		var jitter func(time.Duration) time.Duration
		if o.rand == nil {
			jitter = func(d time.Duration) time.Duration { return d }
		}
		r.s = scheduler.New(scheduler.Options{Enabled: !o.disabled, MaxRetryAfter: o.ceiling, MaxRounds: o.maxRounds,
			Clock: r.clk, Jitter: jitter, Rand: o.rand, Logger: logger,
			Fire: func() { r.u.Deferred() },
			OnArm: func(round int, d time.Duration, flat bool) {
				r.mu.Lock()
				r.arms = append(r.arms, armRec{round, d, flat})
				r.mu.Unlock()
			}})
	}
	r.u = updater.New(updater.Options{Store: r.st, Fetcher: r.f, Scheduler: r.s, Dirs: o.dirs, FetchWorkers: o.workers,
		Clock: r.clk, Logger: logger, OnTransaction: func(tx updater.Transaction) {
			r.mu.Lock()
			r.txs = append(r.txs, tx)
			r.mu.Unlock()
		}})
	t.Cleanup(func() {
		r.u.Stop()
		if r.s != nil {
			r.s.Stop()
		}
	})
	return r
}

func (r *rig) start() {
	go func() { r.runEr <- r.u.Run(context.Background()) }()
}

// settle waits until every goroutine of the bubble is durably blocked: the
// queue has run everything it can.
func settle() { synctest.Wait() }

func (r *rig) lastArm(t *testing.T) armRec {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.arms) == 0 {
		t.Fatal("scheduler never armed")
	}
	return r.arms[len(r.arms)-1]
}

func (r *rig) nArms() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.arms)
}

func (r *rig) transactions() []updater.Transaction {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]updater.Transaction(nil), r.txs...)
}

// bubble runs f in a synctest bubble.
func bubble(t *testing.T, f func(t *testing.T)) { synctest.Test(t, f) }
