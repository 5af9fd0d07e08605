// Package dataupdater is the data side of the agent (protocol §6): it loads
// base data from OPAL_DEFAULT_DATA_SOURCES_CONFIG_URL on every (re)connect,
// applies DataUpdate messages from the data topics, fetches each entry's
// source with the fetcher's classified retry (F1-F8), and writes the result
// through the serial update queue (U1) into the store.
//
// Every entry is admitted to the queue on arrival, keyed by its dst_path
// (U1); the queue fetches in its bounded worker pool, coalesces per path
// (latest wins), keeps overlapping paths in arrival order and holds at most
// one deferred re-fetch per path (D1-D3), superseded by anything newer. The
// base data load takes its place in the queue when the connect happens, not
// when its config arrives.
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
	"sync/atomic"
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
	Data(w updater.DataWork) error
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
	o   Options
	f   *fetcher.Fetcher
	clk clock.Clock
	log *slog.Logger

	ctx    context.Context // ends at Stop
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu         sync.Mutex
	stopped    bool
	connCancel context.CancelFunc // the running base load and its periodic timers
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
	u := &Updater{o: o, clk: o.Clock, log: o.Logger}
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
// and its periodic timers, and admits the new load to the queue now, so a
// notification that arrives while the sources config is fetched is written
// after the base data, never under it. It returns at once.
func (u *Updater) OnConnect() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.stopped {
		return
	}
	u.restartLoadLocked()
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

// Apply admits a DataUpdate: each entry whose topics match goes to the
// queue now, keyed by its dst_path. It returns at once.
func (u *Updater) Apply(up *Update) {
	id := up.ID
	if id == "" {
		id = randomID()
	}
	u.admit(u.ctx, id, up.Reason, up.Entries, reportTargets(up, u.o))
}

// Stop cancels every fetch, timer and pending write of the updater and waits
// for its goroutines. Later calls do nothing. Work already admitted to the
// queue finds the updater stopped and writes nothing.
func (u *Updater) Stop() {
	u.mu.Lock()
	if u.stopped {
		u.mu.Unlock()
		return
	}
	u.stopped = true
	u.mu.Unlock()
	u.cancel()
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

// mergeCancel is a context cancelled when either a or b ends.
func mergeCancel(a, b context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(a)
	stop := context.AfterFunc(b, cancel)
	return ctx, func() { stop(); cancel() }
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

// prepare checks the entry and produces its write (inline data, or the
// source's answer) and the bytes the report's hash is computed from.
func (u *Updater) prepare(ctx context.Context, e Entry) (Write, []byte, error) {
	w := Write{Path: e.Path(), Method: e.Method(), SplitRoot: u.o.SplitRootData}
	if err := e.Validate(); err != nil {
		return w, nil, err
	}
	body := []byte(e.Data)
	if !e.Inline() {
		var err error
		if body, err = u.fetchSource(ctx, e); err != nil {
			return w, nil, err
		}
	}
	if w.Method == MethodPatch {
		ops, err := DecodePatch(body)
		w.Patch = ops
		return w, body, err
	}
	if e.Config != nil && e.Config.IsJSON != nil && !*e.Config.IsJSON && !e.Inline() {
		w.Value = string(body)
		return w, body, nil
	}
	v, err := decodeValue(body)
	if err != nil {
		return w, nil, &DecodeError{What: "data", Err: err}
	}
	w.Value = v
	return w, body, nil
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
