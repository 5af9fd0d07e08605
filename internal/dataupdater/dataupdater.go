// Package dataupdater is the data side of the agent (protocol §6): it loads
// base data from OPAL_DEFAULT_DATA_SOURCES_CONFIG_URL on every (re)connect,
// applies DataUpdate messages from the data topics, fetches each entry's
// source with the fetcher's classified retry (F1-F8), and writes the result
// through the serial update queue (U1) into the store.
//
// Fetches run concurrently and off the queue, so a slow source never holds
// up a policy update; only the store writes are queued. Entries on
// overlapping dst_paths are fetched and written in arrival order. A source
// that stays down arms a deferred re-fetch of its own entry with a
// scheduler (D1-D3), one timer per entry.
package dataupdater

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/opal-go/opal-client/config"
	"github.com/opal-go/opal-client/fetcher"
	"github.com/opal-go/opal-client/scheduler"
	"github.com/opal-go/opal-client/updater"
)

// TypeData is the Type of a data Transaction.
const TypeData = "data"

// Transaction actions (protocol §5.3).
const (
	ActionSet   = "set_policy_data"
	ActionPatch = "patch_policy_data"
)

// Entry outcomes, as OnOutcome sees them (metrics by entry outcome).
const (
	OutcomeSuccess     = "success"
	OutcomeSkipped     = "skipped"      // no subscribed topic
	OutcomeInvalid     = "invalid"      // bad entry, body or patch
	OutcomeFetchFailed = "fetch_failed" // the source did not answer usably
	OutcomeWriteFailed = "write_failed" // the store refused the write
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

// ErrStopped is returned by Trigger after Stop.
var ErrStopped = errors.New("dataupdater: stopped")

// ErrFetchTimeout ends a fetch that ran past OPAL_FETCHING_CALLBACK_TIMEOUT;
// it is wrapped in an exhausted *fetcher.RetryableError.
var ErrFetchTimeout = errors.New("fetch exceeded OPAL_FETCHING_CALLBACK_TIMEOUT")

// Queue is the serial update queue; *updater.Updater implements it.
type Queue interface {
	Data(name string, apply func(ctx context.Context) error) error
}

// Options configure an Updater. Zero values take the defaults noted.
type Options struct {
	Store Store
	Queue Queue
	// Topics are the subscribed data topics, scoped (config.DataTopicNames).
	Topics []string
	// SourcesURL is OPAL_DEFAULT_DATA_SOURCES_CONFIG_URL; "" loads no base data.
	SourcesURL string
	// Token is the OPAL client token, sent only to SourcesURL and to report
	// callbacks on the same host, never to data sources.
	Token string
	// Retry is OPAL_DATA_UPDATER_CONN_RETRY; zero value: the policy default.
	Retry config.ConnRetryOptions
	// MaxRetryAfter caps Retry-After hints (F4) and deferral delays (D2).
	MaxRetryAfter time.Duration
	// AttemptTimeout is OPAL_HTTP_FETCHER_TIMEOUT; 0 means 5 s.
	AttemptTimeout time.Duration
	// FetchTimeout is OPAL_FETCHING_CALLBACK_TIMEOUT, the bound of one whole
	// fetch, waits included; 0 means 10 s.
	FetchTimeout time.Duration
	// Reschedule enables the deferred re-fetch of an entry whose source stays
	// down (D1, D8); MaxDeferredRounds as D3.
	Reschedule        bool
	MaxDeferredRounds int
	// SplitRootData is OPAL_SPLIT_ROOT_DATA.
	SplitRootData bool
	// Report sends a report of each update to Callbacks and to the update's
	// own callbacks (OPAL_SHOULD_REPORT_ON_DATA_UPDATES, OPAL_DEFAULT_UPDATE_CALLBACKS).
	Report    bool
	Callbacks []string
	// MaxBodyBytes limits a source's body; 0 is the fetcher's default.
	MaxBodyBytes int64
	HTTPClient   *http.Client   // nil: a plain client (redirects followed)
	Clock        clock.Clock    // nil: the real clock
	Rand         func() float64 // uniform [0,1) for backoff and jitter; nil: math/rand
	Jitter       func(time.Duration) time.Duration
	Logger       *slog.Logger // nil discards
	// OnTransaction sees each entry's outcome as a Transaction of TypeData
	// (readiness, health, the health policy). Keep it short.
	OnTransaction func(updater.Transaction)
	// OnOutcome sees each entry's outcome (Outcome* constants): metrics.
	OnOutcome func(outcome string)
	// OnArm sees each deferral armed for an entry: metrics, tests.
	OnArm func(key string, round int, delay time.Duration)
}

// Updater is the data updater. Its methods are safe for concurrent use and
// never block on the network: work runs in goroutines, writes go through
// the Queue.
type Updater struct {
	o     Options
	f     *fetcher.Fetcher
	clk   clock.Clock
	log   *slog.Logger
	order order

	ctx    context.Context // ends at Stop
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu         sync.Mutex
	stopped    bool
	connCancel context.CancelFunc // the running base load and its periodic timers
	deferred   map[string]*deferral
}

// deferral is the single deferred re-fetch timer of one entry (or of the
// base data config), with the latest version of what to re-run.
type deferral struct {
	s   *scheduler.Scheduler
	run func()
}

// New returns an Updater; it does nothing until OnConnect or OnNotify.
func New(o Options) *Updater {
	if o.AttemptTimeout <= 0 {
		o.AttemptTimeout = 5 * time.Second
	}
	if o.FetchTimeout <= 0 {
		o.FetchTimeout = 10 * time.Second
	}
	if o.Retry == (config.ConnRetryOptions{}) {
		o.Retry = config.DefaultPolicyUpdaterConnRetry()
	}
	u := &Updater{o: o, clk: o.Clock, log: o.Logger, deferred: map[string]*deferral{}}
	if u.clk == nil {
		u.clk = clock.New()
	}
	if u.log == nil {
		u.log = slog.New(slog.DiscardHandler)
	}
	u.f = fetcher.New(fetcher.Options{
		Retry:          o.Retry,
		MaxRetryAfter:  o.MaxRetryAfter,
		AttemptTimeout: o.AttemptTimeout,
		MaxBodyBytes:   o.MaxBodyBytes,
		HTTPClient:     o.HTTPClient,
		Clock:          u.clk,
		Rand:           o.Rand,
		Logger:         u.log,
	})
	u.ctx, u.cancel = context.WithCancel(context.Background())
	return u
}

// OnConnect loads base data (protocol §6.3): it cancels the previous load
// and its periodic timers, cancels (keeping their rounds, as D5/D6) every
// pending deferral, then fetches the sources config and runs its entries.
// It returns at once.
func (u *Updater) OnConnect() {
	u.mu.Lock()
	if u.stopped {
		u.mu.Unlock()
		return
	}
	for _, d := range u.deferred {
		d.s.Cancel()
	}
	u.restartLoadLocked()
	u.mu.Unlock()
}

// Trigger reloads base data, as POST /data-updater/trigger asks.
func (u *Updater) Trigger() error {
	u.mu.Lock()
	stopped := u.stopped
	u.mu.Unlock()
	if stopped {
		return ErrStopped
	}
	u.OnConnect()
	return nil
}

// OnNotify handles a notify on a data topic: the data is a DataUpdate. Bad
// messages are logged and dropped. It returns at once; the order of calls
// is the order of writes to overlapping paths.
func (u *Updater) OnNotify(topic string, data json.RawMessage) {
	up, err := DecodeUpdate(data)
	if err != nil {
		u.log.Warn("data update ignored", "topic", NotifyTopic(topic), "error", err)
		return
	}
	u.Apply(up)
}

// Apply runs a DataUpdate: each entry whose topics match is fetched and
// written, concurrently with entries on other paths. It returns at once.
func (u *Updater) Apply(up *Update) {
	id := up.ID
	if id == "" {
		id = randomID()
	}
	u.apply(u.ctx, id, up.Reason, up.Entries, reportTargets(up, u.o))
}

// Stop cancels every fetch, timer and pending write of the updater and waits
// for its goroutines. Later calls do nothing.
func (u *Updater) Stop() {
	u.mu.Lock()
	if u.stopped {
		u.mu.Unlock()
		return
	}
	u.stopped = true
	ds := u.deferred
	u.deferred = map[string]*deferral{}
	u.mu.Unlock()
	u.cancel()
	for _, d := range ds {
		d.s.Stop()
	}
	u.wg.Wait()
}

// goLocked starts a tracked goroutine; u.mu is held and not stopped.
func (u *Updater) goLocked(f func()) {
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		f()
	}()
}

// spawn starts a tracked goroutine unless stopped.
func (u *Updater) spawn(f func()) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.stopped {
		return false
	}
	u.goLocked(f)
	return true
}

const configKey = "\x00config"

// loadBase fetches the sources config and runs its entries: those without
// an interval as one update, each periodic one now and on its own timer.
func (u *Updater) loadBase(ctx context.Context) {
	if u.o.SourcesURL == "" {
		return
	}
	var entries []Entry
	_, err := u.fetchBounded(ctx, func(ctx context.Context) (*http.Request, error) {
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
		return
	}
	if err != nil {
		u.log.Warn("base data sources config not loaded", "error", err)
		u.recordTx(randomID(), "", u.clk.Now(), err)
		u.defer_(configKey, err, func() { u.OnConnectDeferred() })
		return
	}
	u.succeeded(configKey)
	var once []Entry
	for _, e := range entries {
		if e.PeriodicUpdateInterval != nil && e.Validate() == nil {
			e := e
			u.spawn(func() { u.poll(ctx, e) })
			continue
		}
		once = append(once, e)
	}
	u.apply(ctx, randomID(), "Initial load", once, reportTargets(nil, u.o))
}

// OnConnectDeferred is the deferred retry of a base load whose sources
// config could not be fetched: it reloads without cancelling the other
// deferrals.
func (u *Updater) OnConnectDeferred() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.stopped {
		return
	}
	u.restartLoadLocked()
}

// restartLoadLocked cancels the running base load and its periodic timers,
// and starts a new load; u.mu is held and not stopped.
func (u *Updater) restartLoadLocked() {
	if u.connCancel != nil {
		u.connCancel()
	}
	ctx, cancel := context.WithCancel(u.ctx)
	u.connCancel = cancel
	u.goLocked(func() { u.loadBase(ctx) })
}

// poll runs a periodic entry now and then every interval until ctx ends
// (reconnect or Stop): one timer per entry.
func (u *Updater) poll(ctx context.Context, e Entry) {
	every := periodicEvery(*e.PeriodicUpdateInterval)
	for {
		wait, s := u.order.admit(e.Path())
		u.runEntry(ctx, randomID(), "Periodic update", e, wait, s, nil)
		t := u.clk.Timer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// apply admits the matching entries in order, then runs each in its own
// goroutine.
func (u *Updater) apply(ctx context.Context, id, reason string, entries []Entry, report []string) {
	var rep *reporter
	if len(report) > 0 {
		rep = newReporter(u, id, report)
	}
	for _, e := range entries {
		if !e.matches(u.o.Topics) {
			u.outcome(OutcomeSkipped)
			u.log.Debug("data entry skipped: no subscribed topic", "dst_path", e.DstPath, "topics", e.Topics)
			continue
		}
		wait, s := u.order.admit(e.Path())
		rep.add()
		if !u.spawn(func() { u.runEntry(ctx, id, reason, e, wait, s, rep) }) {
			u.order.release(s)
			return
		}
	}
	rep.close()
}

// runEntry waits for the earlier entries on overlapping paths, fetches,
// writes through the queue, and reports. s is released at the end.
func (u *Updater) runEntry(ctx context.Context, id, reason string, e Entry, wait []chan struct{}, s *slot, rep *reporter) {
	defer u.order.release(s)
	for _, w := range wait {
		select {
		case <-w:
		case <-ctx.Done():
			return
		}
	}
	start := u.clk.Now()
	w, err := u.prepare(ctx, e)
	if err == nil {
		err = u.write(ctx, e, w)
	}
	if ctx.Err() != nil && err != nil {
		return // cancelled by reconnect or Stop: not an outcome
	}
	rep.done(e, err)
	u.recordTx(id, e.Method(), start, err)
	key := e.key()
	var nr *fetcher.NonRetryableError
	var rt *fetcher.RetryableError
	switch {
	case err == nil:
		u.outcome(OutcomeSuccess)
		u.succeeded(key)
		u.log.Debug("data entry written", "id", id, "reason", reason, "dst_path", e.DstPath, "method", e.Method())
	case errors.As(err, &rt) && rt.Exhausted:
		u.outcome(OutcomeFetchFailed)
		u.defer_(key, err, func() { u.rerun(e) })
	case errors.As(err, &nr):
		u.outcome(OutcomeFetchFailed)
	case isInvalid(err):
		u.outcome(OutcomeInvalid)
		u.log.Warn("data entry refused", "id", id, "dst_path", e.DstPath, "error", err)
	default:
		u.outcome(OutcomeWriteFailed)
		u.log.Warn("data entry not written", "id", id, "dst_path", e.DstPath, "error", err)
	}
}

func isInvalid(err error) bool {
	var de *DecodeError
	var pe *PatchError
	var pp *ProtectedPathError
	var rc *RuleConflictError
	return errors.As(err, &de) || errors.As(err, &pe) || errors.As(err, &pp) || errors.As(err, &rc)
}

// rerun is a deferred re-fetch of one entry.
func (u *Updater) rerun(e Entry) {
	wait, s := u.order.admit(e.Path())
	if !u.spawn(func() { u.runEntry(u.ctx, randomID(), "Deferred re-fetch", e, wait, s, nil) }) {
		u.order.release(s)
	}
}

// prepare checks the entry and produces its write: inline data, or the
// source's answer.
func (u *Updater) prepare(ctx context.Context, e Entry) (Write, error) {
	w := Write{Path: e.Path(), Method: e.Method(), SplitRoot: u.o.SplitRootData}
	if err := e.Validate(); err != nil {
		return w, err
	}
	body := []byte(e.Data)
	if !e.Inline() {
		var err error
		if body, err = u.fetchSource(ctx, e); err != nil {
			return w, err
		}
	}
	if w.Method == MethodPatch {
		ops, err := DecodePatch(body)
		w.Patch = ops
		return w, err
	}
	if e.Config != nil && e.Config.IsJSON != nil && !*e.Config.IsJSON && !e.Inline() {
		w.Value = string(body)
		return w, nil
	}
	v, err := decodeValue(body)
	if err != nil {
		return w, &DecodeError{What: "data", Err: err}
	}
	w.Value = v
	return w, nil
}

// fetchSource fetches an entry's URL with only its own headers: the OPAL
// token is never sent to a data source.
func (u *Updater) fetchSource(ctx context.Context, e Entry) ([]byte, error) {
	method := http.MethodGet
	var headers map[string]string
	var reqBody []byte
	asJSON := true
	if c := e.Config; c != nil {
		if c.Method != "" {
			method = strings.ToUpper(c.Method)
		}
		headers = c.Headers
		if d := bytes.TrimSpace(c.Data); len(d) > 0 && !bytes.Equal(d, []byte("null")) {
			reqBody = d
		}
		asJSON = c.IsJSON == nil || *c.IsJSON
	}
	var body []byte
	_, err := u.fetchBounded(ctx, func(ctx context.Context) (*http.Request, error) {
		var rd *bytes.Reader
		if reqBody != nil {
			rd = bytes.NewReader(reqBody)
		}
		var req *http.Request
		var err error
		if rd != nil {
			req, err = http.NewRequestWithContext(ctx, method, e.URL, rd)
		} else {
			req, err = http.NewRequestWithContext(ctx, method, e.URL, nil)
		}
		if err != nil {
			return nil, err
		}
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		if reqBody != nil && req.Header.Get("Content-Type") == "" {
			req.Header.Set("Content-Type", "application/json")
		}
		return req, nil
	}, func(b []byte) error {
		// A body that does not decode may be a truncated transfer: retry
		// (F1). PATCH bodies are checked after the fetch.
		if asJSON && !json.Valid(b) {
			return errors.New("body is not JSON")
		}
		body = b
		return nil
	})
	return body, err
}

// fetchBounded runs one classified fetch bounded as a whole by FetchTimeout
// on the injected clock; running past it ends the fetch exhausted, with the
// last Retry-After hint, so the entry's deferral arms.
func (u *Updater) fetchBounded(ctx context.Context, newRequest func(context.Context) (*http.Request, error), decode func([]byte) error) (*fetcher.Result, error) {
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	t := u.clk.AfterFunc(u.o.FetchTimeout, func() { cancel(ErrFetchTimeout) })
	defer t.Stop()
	res, err := u.f.Do(fctx, newRequest, decode)
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(fctx), ErrFetchTimeout) {
		u.log.Warn("data fetch abandoned", "bound", u.o.FetchTimeout, "attempts", res.Attempts)
		return res, &fetcher.RetryableError{Status: res.LastStatus, Exhausted: true, Message: "no usable answer in time", Err: ErrFetchTimeout}
	}
	return res, err
}

// write queues the store write and waits for it.
func (u *Updater) write(ctx context.Context, e Entry, w Write) error {
	if u.o.Queue == nil || u.o.Store == nil {
		return errors.New("dataupdater: no queue or store")
	}
	done := make(chan error, 1)
	name := e.Method() + " /" + joinPath(w.Path)
	if err := u.o.Queue.Data(name, func(qctx context.Context) error {
		if ctx.Err() != nil {
			// Superseded (reconnect) or stopped while queued: a stale
			// base write must not land after the new load's.
			done <- ctx.Err()
			return nil
		}
		err := u.o.Store.WriteData(qctx, w)
		done <- err
		return err
	}); err != nil {
		return err
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// defer_ arms the entry's own deferral after a fetch ended exhausted on
// retryable errors; run is what the timer re-runs (D4: it only starts it).
func (u *Updater) defer_(key string, err error, run func()) {
	var rt *fetcher.RetryableError
	if !u.o.Reschedule || !errors.As(err, &rt) || !rt.Exhausted {
		return
	}
	u.mu.Lock()
	if u.stopped {
		u.mu.Unlock()
		return
	}
	d, ok := u.deferred[key]
	if !ok {
		d = &deferral{}
		d.s = scheduler.New(scheduler.Options{
			Enabled:       true,
			MaxRetryAfter: u.o.MaxRetryAfter,
			MaxRounds:     u.o.MaxDeferredRounds,
			Clock:         u.clk,
			Rand:          u.o.Rand,
			Jitter:        u.o.Jitter,
			Logger:        u.log.With("data_entry", key),
			Fire: func() {
				u.mu.Lock()
				r := d.run
				u.mu.Unlock()
				r()
			},
			OnArm: func(round int, delay time.Duration, _ bool) {
				if u.o.OnArm != nil {
					u.o.OnArm(key, round, delay)
				}
			},
		})
		u.deferred[key] = d
	}
	d.run = run
	u.mu.Unlock()
	d.s.Arm(rt.RetryAfter, rt.HasRetryAfter)
}

// succeeded drops the entry's deferral: its timer and its rounds (D5, D6).
func (u *Updater) succeeded(key string) {
	u.mu.Lock()
	d, ok := u.deferred[key]
	delete(u.deferred, key)
	u.mu.Unlock()
	if ok {
		d.s.Stop()
	}
}

// Deferred reports the number of entries with a pending deferral timer, and
// the number of timers (tests: at most one per entry).
func (u *Updater) Deferred() (entries, timers int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, d := range u.deferred {
		if d.s.Pending() {
			entries++
		}
		timers += d.s.Timers()
	}
	return entries, timers
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

func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
