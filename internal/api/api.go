// Package api is the client's HTTP API (opal-protocol §7) on
// OPAL_CLIENT_API_SERVER_HOST:PORT, with the Python client's routes and
// bodies, plus GET /metrics:
//
//	GET /healthcheck, /healthy, /   200 {"status":"ok","online":true} when healthy, else 503 {"status":"unavailable"}
//	GET /ready                      200 {"status":"ok"} once a policy is loaded, else 503 {"status":"unavailable"}
//	POST /policy-updater/trigger    queues a forced full policy update: 200 {"status":"ok"}
//	POST /data-updater/trigger      reloads base data: 200 {"status":"ok"}, 503 when the data updater is off
//	GET /metrics                    Prometheus text format
//
// Handlers never block on an update: triggers only enqueue.
package api

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"time"

	"github.com/benbjohnson/clock"
)

// DefaultHealthTimeout bounds the store probe of one health request.
const DefaultHealthTimeout = 2 * time.Second

// Options wire the handlers to the agent. Nil funcs answer as documented.
type Options struct {
	// Healthy returns nil when the agent is healthy (status.Tracker.Healthy);
	// nil means never healthy.
	Healthy func(ctx context.Context) error
	// Ready reports readiness (status.Tracker.Ready); nil means never ready.
	Ready func() bool
	// TriggerPolicy queues a forced full policy update; nil answers 503.
	TriggerPolicy func()
	// TriggerData reloads the base data; nil (data updater disabled or not
	// wired) or an error answers 503.
	TriggerData func() error
	// Metrics serves GET /metrics; nil answers 404.
	Metrics http.Handler
	// HealthTimeout bounds Healthy; 0 means DefaultHealthTimeout.
	HealthTimeout time.Duration
	// Clock times the health timeout; nil means the real clock.
	Clock clock.Clock
	// Logger; nil discards.
	Logger *slog.Logger
}

var (
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
	mux := http.NewServeMux()
	health := func(w http.ResponseWriter, r *http.Request) {
		if o.Healthy == nil {
			writeJSON(w, http.StatusServiceUnavailable, unavailable)
			return
		}
		ctx, cancel := o.Clock.WithTimeout(r.Context(), o.HealthTimeout)
		defer cancel()
		if err := o.Healthy(ctx); err != nil { // guard: mutation "if err == nil {" answers 200 while unhealthy
			log.Debug("health check failed", "error", err)
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
