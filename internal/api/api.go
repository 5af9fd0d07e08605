// Package api is the client's HTTP API (opal-protocol §7) on
// OPAL_CLIENT_API_SERVER_HOST:PORT, with the Python client's routes and
// bodies, plus GET /metrics:
//
//	GET /healthcheck, /healthy, /   the Python client's health: 200 {"status":"ok","online":true} once a
//	                                policy (and data) update has succeeded and the store answers, also
//	                                after later failures, a lost server or a stale policy; in offline mode
//	                                200 {"status":"ok","online":false} when a (restored) policy is loaded
//	                                but not healthy; else 503 {"status":"unavailable"}
//	GET /healthcheck?strict=true    (also /healthy, /) the strict view: 503 when the last update failed or
//	                                the policy is older than OPAL_POLICY_MAX_AGE; offline mode as above
//	GET /ready                      200 {"status":"ok"} once a policy is loaded, else 503 {"status":"unavailable"}
//	POST /policy-updater/trigger    queues a forced full policy update: 200 {"status":"ok"}
//	POST /data-updater/trigger      reloads base data: 200 {"status":"ok"}, 503 when the data updater is off
//	GET /opal-server/connectivity   200 {"opal_server_connectivity_disabled":b,"offline_mode_enabled":b}
//	POST /opal-server/connectivity/disable, /enable
//	                                200 {"status":"disabled"|"already_disabled"|"enabled"|"already_enabled"};
//	                                400 {"detail":...} without offline mode
//	GET /metrics                    Prometheus text format
//
// Handlers never block on an update: triggers only enqueue. With
// OPAL_AUTH_PUBLIC_KEY set (Options.Auth), the three /opal-server/connectivity
// routes need a JWT of peer_type "listener", as in the Python client
// (auth.go); without one they are open to anyone who reaches the port. The
// triggers are open in both cases, as in the Python client; health, ready
// and metrics are always open.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/opal-go/opal-client/internal/status"
)

// DefaultHealthTimeout bounds the store probe of one health request.
const DefaultHealthTimeout = 2 * time.Second

// Options wire the handlers to the agent. Nil funcs answer as documented.
type Options struct {
	// Healthy returns nil when the agent is healthy (status.Tracker.Healthy);
	// nil means never healthy.
	Healthy func(ctx context.Context) error
	// Strict is the strict view of ?strict=true (status.Tracker.Strict);
	// nil means never strictly healthy.
	Strict func(ctx context.Context) error
	// Loaded reports whether a policy is loaded however old
	// (status.Tracker.Loaded): the lenient view's offline-mode answer. Nil
	// falls back to Ready.
	Loaded func() bool
	// Ready reports readiness (status.Tracker.Ready); nil means never ready.
	Ready func() bool
	// TriggerPolicy queues a forced full policy update; nil answers 503.
	TriggerPolicy func()
	// TriggerData reloads the base data; nil (data updater disabled or not
	// wired) or an error answers 503.
	TriggerData func() error
	// OfflineMode is OPAL_OFFLINE_MODE_ENABLED (in effect: embedded OPA):
	// a ready but unhealthy agent answers the health routes 200 with
	// "online":false, and the connectivity switches are allowed.
	OfflineMode bool
	// Connectivity is the switch of the connection to the OPAL server; nil
	// (with OfflineMode) makes the switches answer 503.
	Connectivity Connectivity
	// Auth, if set, guards the connectivity routes (NewVerifier); nil
	// leaves them open.
	Auth *Verifier
	// Metrics serves GET /metrics; nil answers 404.
	Metrics http.Handler
	// HealthTimeout bounds Healthy; 0 means DefaultHealthTimeout.
	HealthTimeout time.Duration
	// Clock times the health timeout; nil means the real clock.
	Clock clock.Clock
	// Logger; nil discards.
	Logger *slog.Logger
}

// Connectivity switches the agent's connection to the OPAL server (the
// Python client's /opal-server/connectivity routes).
type Connectivity interface {
	// ServerConnectivityDisabled reports whether the agent stays away from
	// the server.
	ServerConnectivityDisabled() bool
	// SetServerConnectivity connects (true) or disconnects (false) and
	// reports whether that changed anything. It must not block on I/O.
	SetServerConnectivity(enabled bool) (changed bool)
}

var (
	okOffline   = map[string]any{"status": "ok", "online": false}
	okOnline    = map[string]any{"status": "ok", "online": true}
	ok          = map[string]any{"status": "ok"}
	unavailable = map[string]any{"status": "unavailable"}
)

// Handler returns the API's routes.
func Handler(o Options) http.Handler {
	if o.HealthTimeout <= 0 {
		o.HealthTimeout = DefaultHealthTimeout
	}
	if o.Clock == nil {
		o.Clock = clock.New()
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if o.Loaded == nil {
		o.Loaded = o.Ready
	}
	mux := http.NewServeMux()
	health := func(w http.ResponseWriter, r *http.Request) {
		check, loaded := o.Healthy, o.Loaded
		if strict, _ := strconv.ParseBool(r.URL.Query().Get("strict")); strict { // guard: mutation "strict && false" serves the lenient view to ?strict=true
			// The strict view: a policy past OPAL_POLICY_MAX_AGE is not
			// "ready" for offline mode's answer either.
			check, loaded = o.Strict, o.Ready
		}
		if check == nil {
			writeJSON(w, http.StatusServiceUnavailable, unavailable)
			return
		}
		ctx, cancel := o.Clock.WithTimeout(r.Context(), o.HealthTimeout)
		defer cancel()
		if err := check(ctx); err != nil { // guard: mutation "if err == nil {" answers 200 while unhealthy
			log.Debug("health check failed", "error", err)
			// Offline mode: serving a loaded (possibly restored) policy
			// without the server is the point, so it is not an outage.
			// An unreachable store decides nothing: an outage in any mode.
			if o.OfflineMode && !errors.Is(err, status.ErrStoreUnreachable) && loaded != nil && loaded() { // guard: mutation "if loaded != nil && loaded() {" answers online:false without offline mode
				writeJSON(w, http.StatusOK, okOffline)
				return
			}
			writeJSON(w, http.StatusServiceUnavailable, unavailable)
			return
		}
		writeJSON(w, http.StatusOK, okOnline)
	}
	mux.HandleFunc("GET /healthcheck", health)
	mux.HandleFunc("GET /healthy", health)
	mux.HandleFunc("GET /{$}", health)
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, r *http.Request) {
		if o.Ready == nil || !o.Ready() { // guard: mutation "if o.Ready == nil || o.Ready() {" inverts readiness
			writeJSON(w, http.StatusServiceUnavailable, unavailable)
			return
		}
		writeJSON(w, http.StatusOK, ok)
	})
	mux.HandleFunc("POST /policy-updater/trigger", func(w http.ResponseWriter, r *http.Request) {
		if o.TriggerPolicy == nil {
			writeJSON(w, http.StatusServiceUnavailable, unavailable)
			return
		}
		log.Info("forced full policy update requested through the API")
		o.TriggerPolicy()
		writeJSON(w, http.StatusOK, ok)
	})
	mux.HandleFunc("POST /data-updater/trigger", func(w http.ResponseWriter, r *http.Request) {
		if o.TriggerData == nil {
			writeJSON(w, http.StatusServiceUnavailable, unavailable)
			return
		}
		if err := o.TriggerData(); err != nil { // guard: mutation "if err == nil {" hides a refused trigger
			log.Warn("data update trigger refused", "error", err)
			writeJSON(w, http.StatusServiceUnavailable, unavailable)
			return
		}
		writeJSON(w, http.StatusOK, ok)
	})
	// The Python client's connectivity router requires a listener token
	// on all three routes.
	listener := func(h http.HandlerFunc) http.HandlerFunc { return o.Auth.requirePeer("listener", log, h) }
	mux.HandleFunc("GET /opal-server/connectivity", listener(func(w http.ResponseWriter, r *http.Request) {
		disabled := o.Connectivity != nil && o.Connectivity.ServerConnectivityDisabled()
		writeJSON(w, http.StatusOK, map[string]any{"opal_server_connectivity_disabled": disabled, "offline_mode_enabled": o.OfflineMode})
	}))
	connectivity := func(enable bool) http.HandlerFunc {
		verb, done := "disable", "disabled"
		if enable {
			verb, done = "enable", "enabled"
		}
		return func(w http.ResponseWriter, r *http.Request) {
			if !o.OfflineMode { // guard: mutation "if false {" lets an agent without offline mode disconnect
				writeJSON(w, http.StatusBadRequest, map[string]any{"detail": "Cannot " + verb + " OPAL server connectivity: offline mode is not enabled"})
				return
			}
			if o.Connectivity == nil {
				writeJSON(w, http.StatusServiceUnavailable, unavailable)
				return
			}
			status := done
			if !o.Connectivity.SetServerConnectivity(enable) { // guard: mutation "if false {" reports a change that did not happen
				status = "already_" + done
			}
			log.Info("OPAL server connectivity switched through the API", "status", status)
			writeJSON(w, http.StatusOK, map[string]any{"status": status})
		}
	}
	mux.HandleFunc("POST /opal-server/connectivity/disable", listener(connectivity(false))) // guard: mutation "connectivity(false))" leaves disable open with a key set
	mux.HandleFunc("POST /opal-server/connectivity/enable", listener(connectivity(true)))
	if o.Metrics != nil {
		mux.Handle("GET /metrics", o.Metrics)
	}
	return mux
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	b, _ := json.Marshal(body) // maps of strings and bools always marshal
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
