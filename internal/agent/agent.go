// Package agent wires the whole PDP sidecar (design §6): configuration ->
// policy store (embedded OPA by default) -> serial update queue with its
// fetcher and deferral scheduler -> pub/sub, plus the client HTTP API with
// its metrics and the policy staleness warning. `opal-client run` is New then
// Run; a Go program can embed the agent the same way.
//
// Shutdown (Run's context ends): the pub/sub socket is closed first so no new
// event is taken, then the data updater is stopped, the update in progress
// sees the cancellation and finishes or aborts its store transaction cleanly
// (U3), the deferral timer is cancelled (D5), and the HTTP servers shut down;
// in offline mode the last backup is written before the store stops.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/gorilla/websocket"

	"github.com/opal-go/opal-client/config"
	"github.com/opal-go/opal-client/fetcher"
	"github.com/opal-go/opal-client/internal/api"
	"github.com/opal-go/opal-client/internal/metrics"
	"github.com/opal-go/opal-client/internal/pubsub"
	"github.com/opal-go/opal-client/internal/redact"
	"github.com/opal-go/opal-client/internal/resync"
	"github.com/opal-go/opal-client/internal/status"
	"github.com/opal-go/opal-client/internal/store/embedded"
	"github.com/opal-go/opal-client/internal/store/oparest"
	"github.com/opal-go/opal-client/scheduler"
	"github.com/opal-go/opal-client/updater"
)

// Defaults for the zero values of Options.
const (
	DefaultStaleWarnInterval = time.Minute
	DefaultShutdownTimeout   = 10 * time.Second
)

// DataUpdater is the seam for the data updater. The agent calls
// OnConnect on every pub/sub (re)connect and OnNotify for each notify on a
// data topic; both must only enqueue. Trigger serves POST
// /data-updater/trigger (reload the base data); Stop is called once at
// shutdown, after the socket is closed and before the update queue stops.
type DataUpdater interface {
	OnConnect()
	OnNotify(topic string, data json.RawMessage)
	Trigger() error
	Stop()
}

// DataDeps is what a data updater is built from.
type DataDeps struct {
	Config *config.Config
	// Queue serialises the data writes with the policy updates (U1): use
	// Queue.Data for every store write.
	Queue *updater.Updater
	// Store is the policy store (*embedded.Store or *oparest.Store).
	Store updater.Store
	// Record reports each data transaction (readiness and health).
	Record func(status.Transaction)
	// Metrics counts data entries by outcome; nil records nothing.
	Metrics    *metrics.Metrics
	HTTPClient *http.Client
	Clock      clock.Clock
	Rand       func() float64
	Logger     *slog.Logger
}

// Options configure an Agent. Only Config is required.
type Options struct {
	Config *config.Config
	Clock  clock.Clock    // nil means the real clock
	Rand   func() float64 // uniform [0,1); nil means math/rand/v2
	Logger *slog.Logger   // nil discards
	// Transport carries the requests to the OPAL server; nil means
	// http.DefaultTransport (with the server TLS settings, withServerTLS).
	Transport http.RoundTripper
	// Dialer opens the pub/sub WebSocket; nil means gorilla's default.
	Dialer *websocket.Dialer
	// Version is reported in the startup log and opal_client_build_info.
	Version string
	// NewDataUpdater, if set and OPAL_DATA_UPDATER_ENABLED, builds the data
	// updater; its topics are then subscribed on the same socket and its
	// transactions count for readiness and health. Nil: no data updater,
	// POST /data-updater/trigger answers 503.
	NewDataUpdater func(DataDeps) (DataUpdater, error)
	// StaleWarnInterval is the cadence of the "policy stale" warning; 0 means
	// DefaultStaleWarnInterval.
	StaleWarnInterval time.Duration
	// ShutdownTimeout bounds the HTTP servers' shutdown; 0 means
	// DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// OnTransaction, if set, sees every policy transaction after readiness,
	// health and metrics have recorded it (tests, embedding programs). It runs
	// on the update queue's goroutine: keep it short.
	OnTransaction func(status.Transaction)
}

// store is what the agent needs of a policy store.
type store interface {
	updater.Store
	status.HealthPolicyWriter
}

// Agent is a wired, not yet running sidecar. Create it with New, then call
// Run exactly once: Run releases everything New acquired.
type Agent struct {
	o       Options
	cfg     *config.Config
	log     *slog.Logger
	clk     clock.Clock
	store   store
	emb     *embedded.Store // nil with an external OPA
	sched   *scheduler.Scheduler
	queue   *updater.Updater
	tracker *status.Tracker
	metrics *metrics.Metrics
	ps      *pubsub.Client // nil when there is nothing to subscribe to
	resync  *resync.Spreader
	data    DataUpdater // read through dataUpdater: replaced on enable (offline.go)
	apiLn   net.Listener
	apiSrv  *http.Server
	off     offline // offline mode (offline.go)

	policyTopics map[string]bool
	dataDeps     DataDeps // to rebuild the data updater on enable
}

// New builds the agent: it starts the store (the embedded OPA binds its
// listener), binds the client API's listener and writes the health policy if
// enabled. Nothing is fetched or subscribed before Run.
func New(ctx context.Context, o Options) (a *Agent, err error) {
	if o.Config == nil {
		return nil, errors.New("agent: no configuration")
	}
	if o.Clock == nil {
		o.Clock = clock.New()
	}
	if o.Rand == nil {
		o.Rand = rand.Float64
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.StaleWarnInterval <= 0 {
		o.StaleWarnInterval = DefaultStaleWarnInterval
	}
	if o.ShutdownTimeout <= 0 {
		o.ShutdownTimeout = DefaultShutdownTimeout
	}
	if o, err = withServerTLS(o); err != nil {
		return nil, err
	}
	cfg := o.Config
	a = &Agent{o: o, cfg: cfg, log: o.Logger, clk: o.Clock, policyTopics: map[string]bool{}}
	// The agent, not the named result: every error return sets that to nil.
	built := a
	defer func() {
		if err != nil {
			built.release() // guard: mutation "_ = built; a.release()" panics on a failed New (TestAuthKeyStopsTheStart)
		}
	}()

	if err := a.openStore(ctx); err != nil {
		return nil, err
	}

	a.sched = scheduler.New(scheduler.Options{
		Enabled:       cfg.PolicyUpdaterRescheduleOnRetryable,
		MaxRetryAfter: cfg.PolicyUpdaterMaxRetryAfter,
		MaxRounds:     cfg.PolicyUpdaterMaxDeferredRounds,
		Clock:         o.Clock,
		Rand:          o.Rand,
		Logger:        a.log,
		Fire:          a.fireDeferred,
		OnArm:         func(_ int, _ time.Duration, flat bool) { a.metrics.DeferralArmed(flat) },
	})
	a.tracker = status.New(status.Options{
		Clock:              o.Clock,
		DataUpdaterEnabled: cfg.DataUpdaterEnabled && o.NewDataUpdater != nil,
		Store:              a.store,
		HealthPolicy:       a.healthPolicyWriter(),
		MaxAge:             cfg.PolicyMaxAge,
		Logger:             a.log,
	})
	a.metrics = metrics.New(metrics.Options{
		Clock: o.Clock, Version: o.Version, Flat: a.sched.Flat, Ready: a.serving, ProcessCollectors: true,
		Stale: a.tracker.Staleness().Stale, StrictHealthy: a.tracker.StrictOK,
	})
	// Before anything connects: a valid backup makes the agent ready now.
	a.setupOffline(ctx)

	httpClient := &http.Client{Transport: o.Transport}
	fo := fetcher.PolicyOptions(cfg)
	fo.HTTPClient, fo.Clock, fo.Rand, fo.Logger = httpClient, o.Clock, o.Rand, a.log
	fo.OnAttempt = func(at fetcher.Attempt) { a.metrics.FetchAttempt(at.Class, at.Status) }
	fo.OnRetry = func(r fetcher.Retry) {
		a.metrics.FetchRetry(r.Outcome.Class)
		a.tracker.FetchFailed()
	}
	f := fetcher.New(fo)
	a.queue = updater.New(updater.Options{
		Store:         measuredStore{a.store, a.metrics, o.Clock},
		Fetcher:       measuredFetcher{f, a.metrics, a.tracker},
		Scheduler:     a.sched,
		Dirs:          cfg.PolicySubscriptionDirs,
		FetchWorkers:  cfg.DataFetchConcurrency,
		Clock:         o.Clock,
		Logger:        a.log,
		OnTransaction: a.onTransaction,
		MinInterval:   cfg.PolicyUpdaterMinFetchInterval, // coalesces notification bursts
	})
	// A reconnect's resync is spread when a policy is already held (fleet).
	a.resync = resync.New(resync.Options{After: cfg.PubSubReconnectSpread, Window: cfg.ResyncSpread,
		Clock: o.Clock, Rand: o.Rand, Resync: a.resyncNow})

	if cfg.DataUpdaterEnabled && o.NewDataUpdater != nil {
		a.dataDeps = DataDeps{
			Config: cfg, Queue: a.queue, Store: a.store, Record: a.recordData, Metrics: a.metrics,
			HTTPClient: httpClient, Clock: o.Clock, Rand: o.Rand, Logger: a.log,
		}
		a.data, err = o.NewDataUpdater(a.dataDeps)
		if err != nil {
			return nil, fmt.Errorf("agent: data updater: %w", err)
		}
	}
	a.newPubSub()

	if cfg.OPAHealthCheckPolicyEnabled {
		// Queued: written once the queue runs, and retried under the
		// deferral's backoff while the store is not up (data.go).
		if err := a.tracker.WriteHealthPolicy(ctx); err != nil {
			return nil, fmt.Errorf("agent: writing the health policy: %w", err)
		}
	}

	auth, err := api.NewVerifier(api.VerifierOptions{
		PublicKey: cfg.AuthPublicKey, Format: cfg.AuthPublicKeyFormat, Algorithm: cfg.AuthJWTAlgorithm,
		Audience: cfg.AuthJWTAudience, Issuer: cfg.AuthJWTIssuer, Clock: o.Clock,
	})
	if err != nil {
		return nil, fmt.Errorf("agent: client API authentication: %w", err)
	}
	if auth == nil {
		a.log.Info("client API authentication disabled (no OPAL_AUTH_PUBLIC_KEY): the connectivity routes are open")
	}
	addr := net.JoinHostPort(cfg.ClientAPIServerHost, strconv.Itoa(cfg.ClientAPIServerPort))
	a.apiLn, err = net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("agent: client API: %w", err)
	}
	apiOpts := api.Options{
		Healthy: a.tracker.Healthy,
		Strict:  a.tracker.Strict,
		Loaded:  a.tracker.Loaded,
		Ready:   a.serving,
		Metrics: a.metrics.Handler(),
		// Offline mode: online:false health and the connectivity switches.
		OfflineMode:  a.off.enabled,
		Connectivity: a,
		Auth:         auth,
		Clock:        o.Clock,
		Logger:       a.log,
	}
	if cfg.PolicyUpdaterEnabled {
		apiOpts.TriggerPolicy = func() {
			a.metrics.UpdateRequested("trigger")
			a.queue.ForceFull()
		}
	}
	if a.data != nil {
		apiOpts.TriggerData = a.triggerData
	}
	a.apiSrv = &http.Server{Handler: api.Handler(apiOpts), ReadHeaderTimeout: 10 * time.Second}
	return a, nil
}

func (a *Agent) openStore(ctx context.Context) error {
	cfg := a.cfg
	if cfg.InlineOPAEnabled {
		s, err := embedded.New(ctx, embedded.Options{
			OPA:                 cfg.InlineOPAConfig,
			V0Compatible:        cfg.OPAV0Compat,
			LogFormat:           cfg.InlineOPALogFormat,
			PolicyPathsToIgnore: cfg.PolicyStorePolicyPathsToIgnore,
			Logger:              a.log,
		})
		if err != nil {
			return fmt.Errorf("agent: embedded OPA: %w", err)
		}
		a.store, a.emb = s, s
		return nil
	}
	token := ""
	if cfg.PolicyStoreAuthType == "token" {
		token = cfg.PolicyStoreAuthToken
	}
	// The 100 ms floor and the attempt cap of every retry loop (F4).
	retry, changed := cfg.PolicyStoreConnRetry.Bounded()
	for _, c := range changed {
		a.log.Warn("OPAL_POLICY_STORE_CONN_RETRY out of bounds; adjusted", "change", c)
	}
	s, err := oparest.New(oparest.Options{
		URL:                 cfg.PolicyStoreURL,
		AuthToken:           token,
		Attempts:            retry.Attempts,
		Wait:                func(n int) time.Duration { return retry.Wait(n, a.o.Rand) },
		Clock:               a.o.Clock,
		PolicyPathsToIgnore: cfg.PolicyStorePolicyPathsToIgnore,
		Logger:              a.log,
		V0Compatible:        cfg.OPAV0Compat,
		TLSClientCert:       cfg.PolicyStoreTLSClientCert,
		TLSClientKey:        cfg.PolicyStoreTLSClientKey,
		TLSCA:               cfg.PolicyStoreTLSCA,
	})
	if err != nil {
		return fmt.Errorf("agent: OPA at %s: %w", cfg.PolicyStoreURL, err)
	}
	a.store = s
	return nil
}

func (a *Agent) healthPolicyWriter() status.HealthPolicyWriter {
	if !a.cfg.OPAHealthCheckPolicyEnabled {
		return nil
	}
	return &queuedHealthPolicy{a: a} // through the update queue, coalesced (data.go)
}

func (a *Agent) newPubSub() {
	var topics []string
	if a.cfg.PolicyUpdaterEnabled {
		for _, t := range a.cfg.PolicyTopics() {
			a.policyTopics[t] = true
			topics = append(topics, t)
		}
	}
	if a.data != nil {
		topics = append(topics, a.cfg.DataTopicNames()...)
	}
	if len(topics) == 0 {
		return
	}
	a.ps = pubsub.New(pubsub.Options{
		URL:             a.cfg.ServerPubSubURL,
		Token:           a.cfg.ClientToken,
		Topics:          topics,
		OnConnect:       a.onConnect,
		OnNotify:        a.onNotify,
		OnState:         a.onPubSubState,
		KeepAlive:       a.cfg.KeepAliveInterval,
		MaxMessageBytes: a.cfg.PubSubMaxMessageBytes,
		// Fleet: spread and cap reconnects; a refused handshake's
		// Retry-After under the cap of fetches.
		ReconnectSpread:  a.cfg.PubSubReconnectSpread,
		ReconnectMaxWait: a.cfg.PubSubReconnectMaxWait,
		MaxRetryAfter:    a.cfg.PolicyUpdaterMaxRetryAfter,
		Clock:            a.o.Clock,
		Rand:             a.o.Rand,
		Logger:           a.log,
		Dialer:           a.o.Dialer,
		Statistics:       statistics(a.cfg),
	})
}

// APIAddr is the client API's bound address (host:port).
func (a *Agent) APIAddr() string { return a.apiLn.Addr().String() }

// OPAAddr is the embedded OPA's REST API address, "" with an external OPA.
func (a *Agent) OPAAddr() string {
	if a.emb == nil {
		return ""
	}
	return a.emb.Addr()
}

// Metrics returns the agent's collectors.
func (a *Agent) Metrics() *metrics.Metrics { return a.metrics }

// Ready reports whether a policy has been loaded (and, with the data
// updater, data: see ready).
func (a *Agent) Ready() bool { return a.serving() }

// Run serves until ctx ends or the client API fails, then shuts down in
// order (see the package comment). It returns nil after a shutdown asked for
// by ctx and the API server's error otherwise.
func (a *Agent) Run(ctx context.Context) error {
	a.log.Info("opal-client starting", "version", a.o.Version, "api", a.APIAddr(), "opa", a.OPAAddr(),
		"server", redact.URL(a.cfg.ServerURL), "store", storeKind(a.emb != nil))

	var wg sync.WaitGroup
	apiErr := make(chan error, 1)
	wg.Go(func() {
		if err := a.apiSrv.Serve(a.apiLn); !errors.Is(err, http.ErrServerClosed) {
			apiErr <- err
		}
	})
	a.startBackups() // before the first transaction
	queueCtx, stopQueue := context.WithCancel(context.Background())
	defer stopQueue()
	wg.Go(func() { _ = a.queue.Run(queueCtx) })
	a.startPubSub() // unless offline mode keeps connectivity disabled
	warnCtx, stopWarn := context.WithCancel(context.Background())
	defer stopWarn()
	staleTicker := a.clk.Ticker(a.o.StaleWarnInterval)
	defer staleTicker.Stop()
	wg.Go(func() { a.warnStale(warnCtx, staleTicker.C) })

	var runErr error
	select {
	case <-ctx.Done():
		a.log.Info("shutting down")
	case runErr = <-apiErr:
		a.log.Error("client API failed; shutting down", "error", runErr)
	}
	// Stop taking events: the socket closes before anything else stops.
	a.stopPubSub(true)
	a.resync.Stop()
	a.stopData(true)
	// The update in progress sees the cancellation and finishes or aborts
	// its store transaction; Stop waits for it and drops what is queued.
	stopQueue()
	a.queue.Stop()
	a.sched.Stop()
	stopWarn()
	sctx, cancel := a.clk.WithTimeout(context.Background(), a.o.ShutdownTimeout)
	defer cancel()
	if err := a.apiSrv.Shutdown(sctx); err != nil {
		_ = a.apiSrv.Close()
	}
	wg.Wait()
	// After the last transaction, before the store goes: the final backup.
	a.stopBackups(sctx)
	if a.emb != nil {
		if err := a.emb.Shutdown(sctx); err != nil {
			a.log.Warn("embedded OPA shutdown", "error", err)
		}
	}
	a.log.Info("stopped")
	return runErr
}

// release frees what New acquired when New fails half-way.
func (a *Agent) release() {
	if a.apiLn != nil {
		_ = a.apiLn.Close()
	}
	if a.sched != nil {
		a.sched.Stop()
	}
	if a.emb != nil {
		sctx, cancel := a.clk.WithTimeout(context.Background(), a.o.ShutdownTimeout)
		defer cancel()
		_ = a.emb.Shutdown(sctx)
	}
}

func storeKind(embeddedOPA bool) string {
	if embeddedOPA {
		return "embedded OPA"
	}
	return "OPA over REST"
}
