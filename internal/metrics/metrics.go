// Package metrics holds the agent's Prometheus collectors (docs/metrics.md).
// The state behind the gauges (staleness, readiness, strict health) lives in
// internal/status; the gauges read it through Options' funcs.
//
// Every method is a hook the agent wires into the fetcher, scheduler, updater,
// store and pub/sub client; each one is cheap and never blocks. A nil
// *Metrics is valid and records nothing, so library users may leave it out.
package metrics

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Namespace prefixes every metric name.
const Namespace = "opal_client"

// Options configure the collectors.
type Options struct {
	Clock   clock.Clock // nil means the real clock
	Version string      // reported by opal_client_build_info
	// Flat, if set, reports whether the deferral scheduler is in its flat
	// phase (scheduler.Scheduler.Flat).
	Flat func() bool
	// Ready, if set, reports readiness (a policy has been loaded).
	Ready func() bool
	// Stale, if set, is how long the policy has been behind
	// (status.Staleness.Stale); unset reads 0.
	Stale func() time.Duration
	// StrictHealthy, if set, reports the strict health without the store
	// probe (status.Tracker.StrictOK) as opal_client_strict_healthy.
	StrictHealthy func() bool
	// ProcessCollectors adds the Go runtime and process collectors.
	ProcessCollectors bool
}

// Metrics is the agent's set of collectors on its own registry.
type Metrics struct {
	reg *prometheus.Registry
	clk clock.Clock

	attempts      *prometheus.CounterVec
	retries       *prometheus.CounterVec
	fetches       *prometheus.CounterVec
	deferrals     *prometheus.CounterVec
	applies       *prometheus.CounterVec
	applyDuration prometheus.Histogram
	transactions  *prometheus.CounterVec
	policyInfo    *prometheus.GaugeVec
	lastSuccess   prometheus.Gauge
	wsConnected   prometheus.Gauge
	wsReconnects  prometheus.Counter
	wsConnects    prometheus.Counter
	policyUpdates *prometheus.CounterVec
	dataEntries   *prometheus.CounterVec
	dataDeferrals prometheus.Counter
	dataSuccess   prometheus.Gauge
	mu            sync.Mutex
	hash          string
	connectedOnce bool
}

// Fetch outcomes of FetchDone (label "outcome" of opal_client_policy_fetches_total).
const (
	OutcomeSuccess      = "success"
	OutcomeExhausted    = "exhausted"
	OutcomeNonRetryable = "non_retryable"
	OutcomeCancelled    = "cancelled"
)

// DataOutcomeSuccess is the DataEntry outcome of an entry written (the data
// updater's OutcomeSuccess; the other outcomes are counted as they come).
const DataOutcomeSuccess = "success"

// New registers every collector on a fresh registry.
func New(o Options) *Metrics {
	if o.Clock == nil {
		o.Clock = clock.New()
	}
	m := &Metrics{reg: prometheus.NewRegistry(), clk: o.Clock}
	stale := o.Stale
	if stale == nil {
		stale = func() time.Duration { return 0 }
	}
	f := promFactory{m.reg}
	m.attempts = f.counterVec("policy_fetch_attempts_total",
		"Policy bundle requests by outcome class and HTTP status (0 = no answer).", "class", "status")
	m.retries = f.counterVec("policy_fetch_retries_total",
		"Waits between attempts of one policy fetch, by the failed attempt's class.", "class")
	m.fetches = f.counterVec("policy_fetches_total",
		"Whole policy fetches by outcome: success, exhausted (retries used up), non_retryable, cancelled.", "outcome")
	m.deferrals = f.counterVec("policy_deferral_rounds_total",
		"Deferred re-fetch timers armed, by phase (escalating or flat).", "phase")
	m.applies = f.counterVec("store_applies_total",
		"Bundles applied to the policy store, by result (success or failure).", "result")
	m.applyDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: Namespace, Name: "store_apply_duration_seconds",
		Help:    "Time to apply one bundle to the policy store (compile and write).",
		Buckets: []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	})
	m.reg.MustRegister(m.applyDuration)
	m.transactions = f.counterVec("policy_transactions_total",
		"Policy update transactions (fetch and apply) by result (success or failure).", "result")
	m.policyUpdates = f.counterVec("policy_update_requests_total",
		"Policy update requests queued, by reason (connect, notification, trigger).", "reason")
	m.dataEntries = f.counterVec("data_entries_total",
		"Data update entries by outcome: success, skipped, invalid, fetch_failed, write_failed.", "outcome")
	m.dataDeferrals = f.counter("data_deferral_rounds_total",
		"Deferred re-fetches armed for data entries whose source stayed down.")
	m.dataSuccess = f.gauge("data_last_success_timestamp_seconds",
		"Unix time of the last data entry written (0 = none yet).")
	m.policyInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "policy_info",
		Help: "Always 1; the hash label is the policy bundle currently loaded.",
	}, []string{"hash"})
	m.reg.MustRegister(m.policyInfo)
	m.lastSuccess = f.gauge("policy_last_success_timestamp_seconds",
		"Unix time of the last successful policy update (0 = none yet).")
	staleGauge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "policy_staleness_seconds",
		Help: "Seconds since the last successful policy update (or since start) while an update is pending or failing; 0 when current.",
	}, func() float64 { return stale().Seconds() })
	m.reg.MustRegister(staleGauge)
	m.wsConnected = f.gauge("pubsub_connected", "1 while the pub/sub WebSocket is connected and subscribed.")
	m.wsConnects = f.counter("pubsub_connects_total", "Successful pub/sub connects (subscribe answered).")
	m.wsReconnects = f.counter("pubsub_reconnects_total", "Successful pub/sub connects after the first one.")
	if o.Flat != nil {
		flat := o.Flat
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "policy_deferral_flat_phase",
			Help: "1 while the deferred re-fetch scheduler is in its flat phase (round budget spent).",
		}, func() float64 { return b2f(flat()) }))
	}
	if o.Ready != nil {
		ready := o.Ready
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "ready",
			Help: "1 once a policy has been loaded (the /ready answer).",
		}, func() float64 { return b2f(ready()) }))
	}
	if o.StrictHealthy != nil {
		strict := o.StrictHealthy
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "strict_healthy",
			Help: "1 while the last policy (and data) update succeeded and the policy is not older than OPAL_POLICY_MAX_AGE (the /healthcheck?strict=true view, without the store probe).",
		}, func() float64 { return b2f(strict()) }))
	}
	bi := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "build_info", Help: "Always 1; the version label is the agent's version.",
	}, []string{"version"})
	bi.WithLabelValues(o.Version).Set(1)
	m.reg.MustRegister(bi)
	if o.ProcessCollectors {
		m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return m
}

type promFactory struct{ reg *prometheus.Registry }

func (f promFactory) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help}, labels)
	f.reg.MustRegister(c)
	return c
}

func (f promFactory) counter(name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help})
	f.reg.MustRegister(c)
	return c
}

func (f promFactory) gauge(name, help string) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help})
	f.reg.MustRegister(g)
	return g
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Registry is the registry holding every collector (tests gather from it).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// FetchAttempt counts one policy bundle request (fetcher OnAttempt, F10).
func (m *Metrics) FetchAttempt(class string, status int) {
	if m == nil {
		return
	}
	m.attempts.WithLabelValues(class, strconv.Itoa(status)).Inc()
}

// FetchRetry counts one wait between attempts (fetcher OnRetry, F10).
func (m *Metrics) FetchRetry(class string) {
	if m == nil {
		return
	}
	m.retries.WithLabelValues(class).Inc()
}

// FetchDone counts one whole fetch by outcome (Outcome*).
func (m *Metrics) FetchDone(outcome string) {
	if m == nil {
		return
	}
	m.fetches.WithLabelValues(outcome).Inc()
}

// DeferralArmed counts one armed deferral round (scheduler OnArm, D7).
func (m *Metrics) DeferralArmed(flat bool) {
	if m == nil {
		return
	}
	phase := "escalating"
	if flat {
		phase = "flat"
	}
	m.deferrals.WithLabelValues(phase).Inc()
}

// StoreApply records one bundle applied to the store and how long it took.
// A delta refused because the store moved to another base is counted as
// result="base_mismatch", not as a failure: the updater then fetches a full
// bundle, and nothing is wrong.
func (m *Metrics) StoreApply(d time.Duration, err error, baseMismatch bool) {
	if m == nil {
		return
	}
	m.applyDuration.Observe(d.Seconds())
	if baseMismatch { // guard: mutation "if false {" counts a harmless base mismatch as a failure
		m.applies.WithLabelValues("base_mismatch").Inc()
		return
	}
	if err != nil {
		m.applies.WithLabelValues("failure").Inc()
		return
	}
	m.applies.WithLabelValues("success").Inc()
}

// UpdateRequested counts one policy update request by reason.
func (m *Metrics) UpdateRequested(reason string) {
	if m == nil {
		return
	}
	m.policyUpdates.WithLabelValues(reason).Inc()
}

// Transaction records the outcome of one policy update: on success the
// policy hash and the time of the success. (The staleness it ends or starts
// is status.Tracker.Record's.)
func (m *Metrics) Transaction(hash string, success bool, ended time.Time) {
	if m == nil {
		return
	}
	if !success {
		m.transactions.WithLabelValues("failure").Inc()
		return
	}
	m.transactions.WithLabelValues("success").Inc()
	if ended.IsZero() {
		ended = m.clk.Now()
	}
	m.lastSuccess.Set(float64(ended.UnixNano()) / 1e9)
	m.setHash(hash)
}

// Restored records a policy loaded from an offline-mode backup:
// policy_info carries its hash. The last-success timestamp is left alone:
// nothing has been fetched yet (the staleness from the backup's time is
// status.Tracker.Restored's).
func (m *Metrics) Restored(hash string) {
	if m == nil {
		return
	}
	m.setHash(hash)
}

func (m *Metrics) setHash(hash string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if hash != m.hash {
		if m.hash != "" {
			m.policyInfo.DeleteLabelValues(m.hash)
		}
		m.hash = hash
		m.policyInfo.WithLabelValues(hash).Set(1)
	}
}

// DataEntry counts one data update entry by outcome (the data updater's
// OnOutcome: success, skipped, invalid, fetch_failed, write_failed) and
// stamps the time of the last success.
func (m *Metrics) DataEntry(outcome string) {
	if m == nil {
		return
	}
	m.dataEntries.WithLabelValues(outcome).Inc()
	if outcome == DataOutcomeSuccess { // guard: mutation "if outcome != DataOutcomeSuccess {" stamps failures as successes
		m.dataSuccess.Set(float64(m.clk.Now().UnixNano()) / 1e9)
	}
}

// DataDeferral counts one deferred re-fetch armed for a data entry.
func (m *Metrics) DataDeferral() {
	if m == nil {
		return
	}
	m.dataDeferrals.Inc()
}

// PubSubState records the WebSocket's state (pubsub OnState). Every
// connect after the first counts as a reconnect.
func (m *Metrics) PubSubState(connected bool) {
	if m == nil {
		return
	}
	if !connected {
		m.wsConnected.Set(0)
		return
	}
	m.wsConnected.Set(1)
	m.wsConnects.Inc()
	m.mu.Lock()
	again := m.connectedOnce
	m.connectedOnce = true
	m.mu.Unlock()
	if again {
		m.wsReconnects.Inc()
	}
}

// Value returns the value of the first sample of the named counter or gauge
// in g whose labels include labels (tests and e2e checks read metrics with it).
func Value(g prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, false
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, s := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range s.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue next
				}
			}
			switch {
			case s.Counter != nil:
				return s.Counter.GetValue(), true
			case s.Gauge != nil:
				return s.Gauge.GetValue(), true
			}
		}
	}
	return 0, false
}
