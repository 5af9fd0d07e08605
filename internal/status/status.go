// Package status is the agent's one record of its sources, in the spirit of
// OPA's bundle plugin Status: the policy (its transactions and how stale it
// is, staleness.go), the data updater's transactions, and the pub/sub
// connection. Readiness (/ready, opal-protocol §5.3), health (/healthcheck,
// lenient as the Python client's, and its strict view), the metrics'
// staleness and strict-health gauges and the "policy stale" warning read
// it, the offline-mode restore records into it (Restored); nothing else
// keeps that state. With the
// health-check policy enabled it also maintains the system.opal policy the
// Python client writes, queryable at /v1/data/system/opal/ready.
package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/benbjohnson/clock"
)

// Transaction types.
const (
	TypePolicy = "policy"
	TypeData   = "data"
)

// Transaction is one policy update or data entry, as the updaters report it
// (the daemon adapts updater.Transaction to it).
type Transaction struct {
	ID      string    `json:"id"`
	Type    string    `json:"transaction_type"`
	Actions []string  `json:"actions"`
	Success bool      `json:"success"`
	Error   string    `json:"error"`
	Created time.Time `json:"creation_time"`
	Ended   time.Time `json:"end_time"`
}

// Stats counts transactions of one type.
type Stats struct {
	Successful int `json:"successful"`
	Failed     int `json:"failed"`
}

// PubSub is the record of the connection to the OPAL server.
type PubSub struct {
	Connected bool
	Since     time.Time // the last change; zero before the first
	Connects  int       // successful connects (subscribe answered)
}

// Snapshot is the whole record at one instant (the health policy renders
// it; tests and embedding programs read it).
type Snapshot struct {
	Ready                  bool
	Healthy                bool // strict: last transactions succeeded; the store is not probed
	Restored               bool // a backup was loaded at startup
	Policy                 State
	PubSub                 PubSub
	LastPolicy             *Transaction
	LastFailedPolicy       *Transaction
	LastData               *Transaction
	LastFailedData         *Transaction
	PolicyStats, DataStats Stats
}

// HealthChecker is the store's reachability probe (updater.Store has it).
type HealthChecker interface {
	Health(ctx context.Context) error
}

// HealthPolicyWriter writes the system.opal health policy; both stores
// implement it.
type HealthPolicyWriter interface {
	SetHealthPolicy(ctx context.Context, rego string) error
}

// Options configure a Tracker.
type Options struct {
	// Clock fills missing transaction times and bounds policy writes; nil = real.
	Clock clock.Clock
	// DataUpdaterEnabled makes health depend on the data transactions too.
	DataUpdaterEnabled bool
	// Store is probed by Healthy; nil = not probed.
	Store HealthChecker
	// HealthPolicy, when set (OPAL_OPA_HEALTH_CHECK_POLICY_ENABLED=true), is
	// written after every transaction.
	HealthPolicy HealthPolicyWriter
	// MaxAge is OPAL_POLICY_MAX_AGE: a policy behind for longer is not
	// ready and not strictly healthy; 0 = no limit.
	MaxAge time.Duration
	// WriteTimeout bounds one health-policy write; 0 = 5 s.
	WriteTimeout time.Duration
	// Logger; nil = slog.Default().
	Logger *slog.Logger
}

// ErrUnhealthy is wrapped by Healthy's errors.
var ErrUnhealthy = errors.New("unhealthy")

// ErrStoreUnreachable is wrapped, with ErrUnhealthy, by Healthy's error when
// the policy store's probe fails: unlike a failed update, that is an outage
// even in offline mode (nothing can be decided).
var ErrStoreUnreachable = errors.New("policy store unreachable")

// Tracker records transactions. Safe for concurrent use.
type Tracker struct {
	opts Options

	mu                       sync.Mutex
	lastPolicy, lastData     *Transaction // the latest, success or not
	failedPolicy, failedData *Transaction
	okPolicy, okData         bool // a success ever
	policyStats, dataStats   Stats
	restored                 bool
	pubsub                   PubSub

	stale *Staleness // the policy's freshness (own lock)

	writeMu sync.Mutex // health-policy writes land in order
}

// New returns an empty Tracker.
func New(opts Options) *Tracker {
	if opts.Clock == nil {
		opts.Clock = clock.New()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = 5 * time.Second
	}
	return &Tracker{opts: opts, stale: NewStaleness(opts.Clock)}
}

// Staleness is the policy's freshness record (the staleness gauge and the
// stale warning read it).
func (t *Tracker) Staleness() *Staleness { return t.stale }

// FetchFailed marks the policy as failing: a fetch attempt was retried or a
// whole fetch failed (the fetcher's hooks).
func (t *Tracker) FetchFailed() { t.stale.Failing() }

// Lost marks the policy as possibly behind from at: the connection to the
// server was lost or disabled.
func (t *Tracker) Lost(at time.Time) { t.stale.Lost(at) }

// Restored records a policy loaded from an offline-mode backup taken at
// takenAt: ready (the backup serves), stale from takenAt until the first
// success.
func (t *Tracker) Restored(takenAt time.Time) {
	t.mu.Lock()
	t.restored = true
	t.mu.Unlock()
	t.stale.Restored(takenAt)
}

// PubSubState records the connection's state.
func (t *Tracker) PubSubState(connected bool) {
	now := t.opts.Clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if connected {
		t.pubsub.Connects++
	}
	t.pubsub.Connected, t.pubsub.Since = connected, now
}

// Record stores a transaction (the updater's OnTransaction hook) and, if
// enabled, rewrites the health policy. A failed policy write is logged.
func (t *Tracker) Record(tx Transaction) {
	now := t.opts.Clock.Now()
	if tx.Created.IsZero() {
		tx.Created = now
	}
	if tx.Ended.IsZero() {
		tx.Ended = now
	}
	tx.Actions = append([]string(nil), tx.Actions...)
	t.mu.Lock()
	switch tx.Type {
	case TypeData:
		// Every transaction becomes the last one, failures too: a failure
		// after a success makes the client unhealthy (the Python client
		// only remembers successes).
		t.lastData = &tx
		if tx.Success {
			t.okData = true
			t.dataStats.Successful++
		} else {
			t.failedData = &tx
			t.dataStats.Failed++
		}
	default:
		t.lastPolicy = &tx
		if tx.Success {
			t.okPolicy = true
			t.policyStats.Successful++
		} else {
			t.failedPolicy = &tx
			t.policyStats.Failed++
		}
	}
	t.mu.Unlock()
	if tx.Type != TypeData {
		if tx.Success { // guard: mutation "if !tx.Success {" keeps a current policy stale
			t.stale.Success(tx.Ended)
		} else {
			t.stale.FailedWith(tx.Error)
		}
	}
	if t.opts.HealthPolicy != nil {
		ctx, cancel := t.opts.Clock.WithTimeout(context.Background(), t.opts.WriteTimeout)
		defer cancel()
		if err := t.WriteHealthPolicy(ctx); err != nil {
			t.opts.Logger.Warn("health-check policy not written", "error", err)
		}
	}
}

// Ready reports whether a policy has been applied and, when the data updater
// runs, a data transaction has succeeded (protocol §5.3).
func (t *Tracker) Ready() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.readyLocked()
}

// readyLocked is §5.3's ready: a policy was applied and, when the data
// updater runs, data was written too.
func (t *Tracker) readyLocked() bool {
	return t.okPolicy && (!t.opts.DataUpdaterEnabled || t.okData)
}

// Loaded reports whether the store serves a policy: restored from a backup
// or applied (with the data updater, data written too), however old.
func (t *Tracker) Loaded() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.restored || t.readyLocked()
}

// Serving is /ready: a policy is loaded and, with MaxAge, it has not been
// behind for longer than that.
func (t *Tracker) Serving() bool {
	if max := t.opts.MaxAge; max > 0 && t.stale.Stale() > max { // guard: mutation "max < 0" ignores the max age
		return false
	}
	return t.Loaded()
}

// probe is the store's health probe; its failure is an outage in every
// view (nothing can be decided).
func (t *Tracker) probe(ctx context.Context) error {
	if t.opts.Store != nil {
		if err := t.opts.Store.Health(ctx); err != nil { // guard: mutation "err != nil && false" reports a dead store as healthy
			return fmt.Errorf("%w: %w: %v", ErrUnhealthy, ErrStoreUnreachable, err)
		}
	}
	return nil
}

// Healthy is the Python client's health (/healthcheck, /healthy, /): nil
// when the store answers its probe and a policy transaction (and, with the
// data updater, a data transaction) has ever succeeded. A later failure,
// a lost server or a stale policy leaves it healthy: the store still
// decides with the last policy, and a liveness probe must not restart a
// sidecar for what a restart cannot fix.
func (t *Tracker) Healthy(ctx context.Context) error {
	if err := t.probe(ctx); err != nil {
		return err
	}
	if !t.Ready() { // guard: mutation "if false {" reports an agent that never loaded a policy as healthy
		return fmt.Errorf("%w: no successful %s transaction yet", ErrUnhealthy, t.missing())
	}
	return nil
}

// missing names the side that never succeeded.
func (t *Tracker) missing() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.okPolicy {
		return TypePolicy
	}
	return TypeData
}

// Strict is the strict health (/healthcheck?strict=true): nil when the store
// answers its probe, the last policy transaction succeeded, the data side is
// fine (updater disabled or its last transaction succeeded) and, with
// MaxAge, the policy has not been behind for longer than that.
func (t *Tracker) Strict(ctx context.Context) error {
	// The store first: an unreachable store must not hide behind a failed
	// update, which offline mode answers as healthy.
	if err := t.probe(ctx); err != nil {
		return err
	}
	return t.strictState()
}

// StrictOK is Strict without the store probe (the metrics' gauge).
func (t *Tracker) StrictOK() bool { return t.strictState() == nil }

func (t *Tracker) strictState() error {
	if max := t.opts.MaxAge; max > 0 {
		if d := t.stale.Stale(); d > max { // guard: mutation "d > max+time.Hour" hides an over-age policy from the strict view
			return fmt.Errorf("%w: policy behind for %s, over OPAL_POLICY_MAX_AGE %s", ErrUnhealthy, d.Round(time.Second), max)
		}
	}
	s := t.Snapshot()
	if !s.Healthy {
		t.mu.Lock()
		defer t.mu.Unlock()
		switch {
		case t.lastPolicy == nil:
			return fmt.Errorf("%w: no policy transaction yet", ErrUnhealthy)
		case !t.lastPolicy.Success:
			return fmt.Errorf("%w: last policy transaction %s failed: %s", ErrUnhealthy, t.lastPolicy.ID, t.lastPolicy.Error)
		case t.lastData == nil:
			return fmt.Errorf("%w: no data transaction yet", ErrUnhealthy)
		default:
			return fmt.Errorf("%w: last data transaction %s failed: %s", ErrUnhealthy, t.lastData.ID, t.lastData.Error)
		}
	}
	return nil
}

// Snapshot returns the current state.
func (t *Tracker) Snapshot() Snapshot {
	policy := t.stale.State() // its own lock, never under t.mu
	t.mu.Lock()
	defer t.mu.Unlock()
	policyOK := t.lastPolicy != nil && t.lastPolicy.Success
	dataOK := !t.opts.DataUpdaterEnabled || (t.lastData != nil && t.lastData.Success)
	return Snapshot{
		Ready:            t.readyLocked(),
		Healthy:          policyOK && dataOK,
		Restored:         t.restored,
		Policy:           policy,
		PubSub:           t.pubsub,
		LastPolicy:       clone(t.lastPolicy),
		LastFailedPolicy: clone(t.failedPolicy),
		LastData:         clone(t.lastData),
		LastFailedData:   clone(t.failedData),
		PolicyStats:      t.policyStats,
		DataStats:        t.dataStats,
	}
}

func clone(tx *Transaction) *Transaction {
	if tx == nil {
		return nil
	}
	c := *tx
	return &c
}

// WriteHealthPolicy renders the current snapshot and writes it; the daemon
// calls it once at startup (the Python client stops if that fails).
func (t *Tracker) WriteHealthPolicy(ctx context.Context) error {
	if t.opts.HealthPolicy == nil {
		return nil
	}
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	return t.opts.HealthPolicy.SetHealthPolicy(ctx, RenderHealthPolicy(t.Snapshot()))
}

// RenderHealthPolicy renders the system.opal policy of the Python client:
// ready and healthy, the last (failed) transactions and the statistics, as
// JSON literals (valid Rego terms). healthy does not include the store
// probe: a policy evaluated inside OPA is evidently reachable.
func RenderHealthPolicy(s Snapshot) string {
	var b strings.Builder
	b.WriteString("package system.opal\n\n")
	fmt.Fprintf(&b, "default ready := %t\n\n", s.Ready)
	fmt.Fprintf(&b, "default healthy := %t\n\n", s.Healthy)
	lit := func(name string, v any) {
		j, _ := json.Marshal(v) // plain structs: cannot fail
		fmt.Fprintf(&b, "%s := %s\n\n", name, j)
	}
	obj := func(tx *Transaction) any {
		if tx == nil {
			return map[string]any{}
		}
		return tx
	}
	lit("last_policy_transaction", obj(s.LastPolicy))
	lit("last_failed_policy_transaction", obj(s.LastFailedPolicy))
	lit("last_data_transaction", obj(s.LastData))
	lit("last_failed_data_transaction", obj(s.LastFailedData))
	lit("transaction_policy_statistics", s.PolicyStats)
	lit("transaction_data_statistics", s.DataStats)
	return b.String()
}
