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
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/opal-go/opal-client/config"
	"github.com/opal-go/opal-client/fetcher"
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

// ErrStopped is returned by Trigger after Stop.
var ErrStopped = errors.New("dataupdater: stopped")

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

// mergeCancel is a context cancelled when either a or b ends.
func mergeCancel(a, b context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(a)
	stop := context.AfterFunc(b, cancel)
	return ctx, func() { stop(); cancel() }
}

func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
