// Package updater is the serial update queue (design U1-U3): connect
// triggers, pub/sub policy updates, deferred re-fetches, operator triggers,
// data work and health-policy writes become store transactions, run one at a
// time by a single goroutine (Run). The queue is keyed by target: the policy,
// or a data path (data.go). Enqueueing never blocks and never refuses for
// lack of room: policy requests that pile up are coalesced with the queue's
// tail, never reordered across a store write, and data work is coalesced per
// key (latest wins), so a flood of notifications cannot grow memory without
// bound.
//
// The Updater wires the deferral scheduler (D5, D6): a successful fetch and a
// genuine policy update reset it; a connect trigger or forced update cancels
// its timer but keeps its rounds; a fetch that ends exhausted on retryable
// errors arms it with the hint of the answer that ended it; a non-retryable one
// arms nothing.
package updater

import (
	"container/list"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/opal-go/opal-client/fetcher"
	"github.com/opal-go/opal-client/scheduler"
)

// Fetcher fetches one policy bundle with its whole retry policy;
// *fetcher.Fetcher implements it.
type Fetcher interface {
	Fetch(ctx context.Context, r fetcher.Request) (*fetcher.Result, error)
}

// TypePolicy is the Type of a policy Transaction.
const TypePolicy = "policy"

// Transaction is the outcome of one policy update, reported through
// Options.OnTransaction (protocol §5.3). ID is the bundle hash, or random hex
// when no bundle was fetched.
type Transaction struct {
	ID      string
	Type    string
	Actions []string
	Success bool
	Error   string
	Created time.Time
	Ended   time.Time
}

// Options configures an Updater.
type Options struct {
	Store   Store
	Fetcher Fetcher
	// Scheduler defers re-fetches after exhausted fetches; nil disables deferral.
	Scheduler *scheduler.Scheduler
	// Dirs are the subscription directories (OPAL_POLICY_SUBSCRIPTION_DIRS);
	// nil means ["."]. A full update fetches all of them.
	Dirs []string
	// FetchWorkers bounds the data works prepared (fetched) at once; 0 means
	// DefaultFetchWorkers.
	FetchWorkers int
	Clock        clock.Clock  // nil means the real clock
	Logger       *slog.Logger // nil discards
	// OnTransaction, if set, sees every policy update's outcome (health,
	// readiness, metrics). It runs on the queue's goroutine: keep it short.
	OnTransaction func(Transaction)
	// MinInterval (OPAL_POLICY_UPDATER_MIN_INTERVAL) is the least time
	// between the starts of two policy fetches: a burst of notifications is
	// coalesced into the queued policy request while it waits, so the
	// first notification after a quiet period is fetched at once, the last
	// one of a burst always by a trailing fetch. 0 fetches back to back.
	MinInterval time.Duration
}

// Reasons a policy request was queued; merged requests keep all of them.
const (
	reasonConnect = 1 << iota
	reasonUpdate
	reasonDeferred
	reasonForced
)

// item is one queued policy request.
type item struct {
	all     bool     // every subscription dir
	dirs    []string // when !all: the changed dirs, a subset of Options.Dirs
	force   bool     // no base_hash (operator trigger)
	reasons int
	seq     uint64 // admission order, shared with the data works
}

// merge folds a later policy request into it. The union fetches everything
// either would have; forcing wins.
func (it *item) merge(o *item) {
	it.all = it.all || o.all
	if it.all {
		it.dirs = nil
	} else {
		for _, d := range o.dirs {
			if !slices.Contains(it.dirs, d) {
				it.dirs = append(it.dirs, d)
			}
		}
	}
	it.force = it.force || o.force
	it.reasons |= o.reasons
}

// Updater is the serial update queue. Create it with New, start Run in one
// goroutine, and feed it with Connect, PolicyUpdate, ForceFull, Deferred and
// Data from any goroutine.
type Updater struct {
	o     Options
	store Store
	fetch Fetcher
	sched *scheduler.Scheduler
	dirs  []string
	clk   clock.Clock
	log   *slog.Logger

	wake     chan struct{} // buffered 1: "the queue is not empty"
	prepWake chan struct{} // buffered 1: "a data work may be prepared"

	lastPolicy time.Time // start of the last policy fetch (Run's goroutine only)

	mu       sync.Mutex
	queue    []*item // policy requests
	seq      uint64  // last admission
	data     *list.List
	root     *node
	defs     map[string]*deferral
	coalesce map[string]*dataItem
	toPrep   []*dataItem
	stopped  bool
	running  bool
	cancel   context.CancelFunc
	done     chan struct{}
	busy     bool // an item is being run (tests)
}

// New returns an Updater; nothing runs until Run.
func New(o Options) *Updater {
	u := &Updater{o: o, store: o.Store, fetch: o.Fetcher, sched: o.Scheduler,
		dirs: o.Dirs, clk: o.Clock, log: o.Logger, wake: make(chan struct{}, 1), prepWake: make(chan struct{}, 1),
		data: list.New(), root: &node{}, defs: map[string]*deferral{}, coalesce: map[string]*dataItem{}}
	if len(u.dirs) == 0 {
		u.dirs = []string{"."}
	}
	if u.o.FetchWorkers <= 0 {
		u.o.FetchWorkers = DefaultFetchWorkers
	}
	if u.clk == nil {
		u.clk = clock.New()
	}
	if u.log == nil {
		u.log = slog.New(slog.DiscardHandler)
	}
	return u
}

// enqueue adds a policy request, merging it into the queue's tail when the
// tail is a policy request, so that nothing moves across a data write. It
// never blocks.
func (u *Updater) enqueue(it *item) error {
	u.mu.Lock()
	switch {
	case u.stopped:
		u.mu.Unlock()
		return nil
	case len(u.queue) > 0 && u.queue[len(u.queue)-1].seq == u.seq:
		u.queue[len(u.queue)-1].merge(it)
	default:
		u.seq++
		it.seq = u.seq
		u.queue = append(u.queue, it)
	}
	u.mu.Unlock()
	select {
	case u.wake <- struct{}{}:
	default: // already signalled
	}
	return nil
}

// Connect queues the full update of a pub/sub (re)connect. It cancels the
// pending deferral but keeps its rounds (D5, D6): reconnects are frequent in
// exactly the outages the round budget is for.
func (u *Updater) Connect() {
	if u.sched != nil {
		u.sched.Cancel() // connect: keep the rounds (D6)
	}
	u.enqueue(&item{all: true, reasons: reasonConnect})
}

// PolicyUpdate queues the update a pub/sub policy message asks for. Only the
// changed directories that are subscription dirs, matched exactly as
// configured (protocol §3.3), are fetched; if none is, nothing is fetched
// and nothing changes (unlike the Python client's whole-repo fetch). A
// genuine update resets the deferral (D5, D6). It reports whether an update
// was queued (false: no changed dir is a subscription dir).
func (u *Updater) PolicyUpdate(changedDirs []string) bool {
	var dirs []string
	for _, d := range changedDirs {
		if slices.Contains(u.dirs, d) && !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	if len(dirs) == 0 {
		u.log.Debug("policy update outside the subscription dirs ignored", "changed", len(changedDirs))
		return false
	}
	if u.sched != nil {
		u.sched.Reset() // genuine update (D6)
	}
	return u.enqueue(&item{dirs: dirs, reasons: reasonUpdate}) == nil
}

// ForceFull queues a full update that ignores the stored hash (no
// base_hash): the operator trigger. It cancels the pending deferral and
// keeps its rounds, like Connect.
func (u *Updater) ForceFull() {
	if u.sched != nil {
		u.sched.Cancel() // operator trigger: keep the rounds
	}
	u.enqueue(&item{all: true, force: true, reasons: reasonForced})
}

// Deferred queues the deferred re-fetch of every subscription dir (D4): the
// scheduler's Fire calls it.
func (u *Updater) Deferred() {
	u.enqueue(&item{all: true, reasons: reasonDeferred})
}

// pop takes the next request: the policy request or the data work that
// may run now and was admitted first.
func (u *Updater) pop() (*item, *dataItem) {
	u.mu.Lock()
	defer u.mu.Unlock()
	d := u.nextDataLocked()
	if len(u.queue) > 0 && (d == nil || u.queue[0].seq < d.seq) {
		it := u.queue[0]
		u.queue[0] = nil
		u.queue = u.queue[1:]
		u.busy = true
		return it, nil
	}
	if d != nil {
		d.state = stWriting
		u.busy = true
		return nil, d
	}
	u.busy = false
	return nil, nil
}

// Run is the queue's single consumer (U1). It runs requests one at a time
// until ctx is done or Stop is called; a store transaction in progress sees
// the cancellation and finishes or aborts cleanly (U3). It returns nil after
// Stop and ctx's error otherwise. Only one Run may be active.
func (u *Updater) Run(ctx context.Context) error {
	u.mu.Lock()
	if u.running {
		u.mu.Unlock()
		return errors.New("updater: Run already active")
	}
	if u.stopped {
		u.mu.Unlock()
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	u.running, u.cancel, u.done = true, cancel, make(chan struct{})
	done := u.done
	u.mu.Unlock()
	defer func() {
		cancel()
		u.mu.Lock()
		u.running, u.busy = false, false
		u.mu.Unlock()
		close(done)
	}()
	var workers sync.WaitGroup
	defer workers.Wait() // before done closes: Stop returns with no worker left
	for i := 0; i < u.o.FetchWorkers; i++ {
		workers.Go(func() { u.prepWorker(ctx) })
	}
	for {
		if ctx.Err() != nil {
			break
		}
		if d := u.policyHold(); d > 0 {
			// Requests arriving meanwhile merge into the waiting policy one.
			t := u.clk.Timer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
			continue
		}
		it, d := u.pop()
		if it == nil && d == nil {
			select {
			case <-u.wake:
				continue
			case <-ctx.Done():
			}
			break
		}
		if it != nil {
			u.runPolicy(ctx, it)
		} else {
			u.runData(ctx, d)
		}
	}
	u.mu.Lock()
	stopped := u.stopped
	u.mu.Unlock()
	if stopped {
		return nil
	}
	return ctx.Err()
}

// policyHold is how long a policy request that is next in admission order
// must still wait for MinInterval since the last policy fetch began (0:
// none). Data work admitted before it is not held.
func (u *Updater) policyHold() time.Duration {
	if u.o.MinInterval <= 0 || u.lastPolicy.IsZero() {
		return 0
	}
	u.mu.Lock()
	d := u.nextDataLocked()
	head := len(u.queue) > 0 && (d == nil || u.queue[0].seq < d.seq)
	u.mu.Unlock()
	if !head {
		return 0
	}
	return u.lastPolicy.Add(u.o.MinInterval).Sub(u.clk.Now())
}

// Stop makes Run return, drops what is queued and every data deferral,
// refuses later requests, and waits for Run to finish the request in
// progress.
func (u *Updater) Stop() {
	u.mu.Lock()
	u.stopped = true
	u.queue = nil
	for e := u.data.Front(); e != nil; e = e.Next() {
		if it := e.Value.(*dataItem); it.cancel != nil {
			it.cancel()
		}
	}
	u.data.Init() // guard: mutation "_ = 0" leaves the data work queued after Stop
	u.root, u.toPrep, u.coalesce = &node{}, nil, map[string]*dataItem{}
	var defs []*scheduler.Scheduler
	for _, d := range u.defs {
		defs = append(defs, d.s)
	}
	u.defs = map[string]*deferral{}
	cancel, done, running := u.cancel, u.done, u.running
	u.mu.Unlock()
	for _, s := range defs {
		s.Stop()
	}
	if running {
		cancel()
		<-done
	}
}

// runPolicy is one policy update (U2): read the hash (F11), fetch, apply,
// report, and feed the outcome to the scheduler.
func (u *Updater) runPolicy(ctx context.Context, it *item) {
	u.lastPolicy = u.clk.Now()
	tx := Transaction{Type: TypePolicy, Actions: []string{"set_policies"}, Created: u.lastPolicy}
	base := ""
	if !it.force {
		h, err := u.store.PolicyHash(ctx)
		if err != nil {
			// F11: degrade to a full bundle; a failing fetch still arms below.
			u.log.Warn("reading the policy hash failed; fetching a full bundle", "error", err)
		} else {
			base = h
		}
	}
	paths := it.dirs
	if it.all {
		paths = u.dirs
	}
	// A deferred re-fetch is one request: the scheduler's rounds are its
	// backoff (D3's one request per flat round). Merged with any other
	// reason, the request gets the full retry policy.
	attempts := 0
	if it.reasons == reasonDeferred {
		attempts = 1
	}
	b, err := u.fetchBundle(ctx, paths, base, attempts)
	fetched := err == nil
	if err == nil {
		err = u.store.ApplyPolicy(ctx, b)
		if bm := (*BaseMismatchError)(nil); errors.As(err, &bm) {
			u.log.Info("delta bundle on another base; fetching a full bundle", "base", bm.Base, "current", bm.Current)
			b, err = u.fetchBundle(ctx, paths, "", attempts)
			fetched = err == nil
			if err == nil {
				if err = u.store.ApplyPolicy(ctx, b); err != nil {
					u.warnApply("applying the full policy bundle failed", b, err)
				}
			}
		} else if err != nil {
			u.warnApply("applying the policy bundle failed", b, err)
		}
	}
	if fetched && u.sched != nil && ctx.Err() == nil {
		if err != nil && IsTransient(err) {
			// The store did not take it (unreachable, a 5xx, a partial
			// write): re-fetch later under the fetches' escalation, jitter
			// and cap; the rounds are not reset.
			u.sched.Arm(0, false) // guard: mutation "_ = 0" leaves a store that failed transiently unrepaired
		} else {
			u.sched.Reset() // success (D5, D6)
		}
	}
	tx.Ended = u.clk.Now()
	tx.Success = err == nil
	if err != nil {
		tx.Error = err.Error()
	}
	if b != nil && b.Hash != "" {
		tx.ID = b.Hash
	} else {
		tx.ID = randomID()
	}
	if err == nil {
		u.log.Info("policy updated", "hash", b.Hash, "delta", b.IsDelta(), "paths", paths)
	}
	if u.o.OnTransaction != nil {
		u.o.OnTransaction(tx)
	}
}

// fetchBundle fetches and feeds the outcome to the scheduler: success resets
// it (D5, D6), an exhausted retryable error arms it with its last answer's hint (D1),
// anything else arms nothing (D8). The fetcher itself logs the one WARNING
// of a failed fetch (F9), so this only logs at DEBUG.
func (u *Updater) fetchBundle(ctx context.Context, paths []string, base string, attempts int) (*fetcher.PolicyBundle, error) {
	res, err := u.fetch.Fetch(ctx, fetcher.Request{Paths: paths, BaseHash: base, Attempts: attempts})
	if err == nil && (res == nil || res.Bundle == nil) {
		err = errors.New("updater: fetcher returned no bundle")
	}
	if err == nil {
		if u.sched != nil {
			u.sched.Cancel() // fetched (D5); the rounds reset once the store took it
		}
		return res.Bundle, nil
	}
	u.log.Debug("policy fetch failed", "error", err, "base_hash", base != "")
	var re *fetcher.RetryableError
	if ctx.Err() == nil && errors.As(err, &re) && u.sched != nil {
		u.sched.Arm(re.RetryAfter, re.HasRetryAfter)
	}
	return nil, err
}

// warnApply logs a failed apply with what it did to the store: a partial
// write left the store holding part of the bundle (the next update is a full
// bundle); any other failure left it unchanged.
func (u *Updater) warnApply(msg string, b *fetcher.PolicyBundle, err error) {
	state := "unchanged"
	if IsPartial(err) {
		state = "partly written; the next update is a full bundle"
	}
	retry := "not retried"
	if IsTransient(err) && u.sched != nil {
		retry = "deferred re-fetch"
	}
	u.log.Warn(msg, "hash", b.Hash, "store", state, "retry", retry, "error", err)
}

func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// Idle reports whether nothing is queued or running (tests, the simulator).
func (u *Updater) Idle() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.queue) == 0 && u.data.Len() == 0 && !u.busy
}

// Len is the number of queued requests and data works (not counting one
// being written).
func (u *Updater) Len() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := len(u.queue)
	for e := u.data.Front(); e != nil; e = e.Next() {
		if e.Value.(*dataItem).state != stWriting {
			n++
		}
	}
	return n
}
