package agent

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/opal-go/opal-client/internal/backup"
	"github.com/opal-go/opal-client/internal/status"
)

// offline is offline mode's state (docs/offline.md): the backup writer
// and the switch of the connection to the OPAL
// server (the Python client's /opal-server/connectivity routes).
type offline struct {
	enabled bool // OPAL_OFFLINE_MODE_ENABLED with the embedded OPA (restored or not: status.Tracker)

	writer atomic.Pointer[backup.Writer] // set by Run before the queue starts

	switchMu sync.Mutex // one connectivity switch at a time
	mu       sync.Mutex
	disabled bool               // connectivity disabled: no pub/sub socket
	stopped  bool               // Run is shutting down: never connect again
	dataOff  bool               // the data updater instance is stopped
	psCancel context.CancelFunc // nil while the socket is not running
	psDone   chan struct{}
}

// setupOffline decides whether offline mode is in effect and, if it is,
// restores the backup into the embedded store (one transaction, compiled
// first; a bad backup is logged once by backup.Restore and changes nothing).
// It runs in New, before anything connects.
func (a *Agent) setupOffline(ctx context.Context) {
	cfg := a.cfg
	if !cfg.OfflineModeEnabled {
		if cfg.DefaultOPALServerConnectivityDisabled {
			a.log.Warn("OPAL_DEFAULT_OPAL_SERVER_CONNECTIVITY_DISABLED is ignored without OPAL_OFFLINE_MODE_ENABLED")
		}
		return
	}
	if a.emb == nil { // guard: mutation "if false {" turns offline mode on without a store to restore into
		// As in the Python client: the backup belongs to a store this
		// process runs; an external OPA keeps its own state.
		a.log.Warn("offline mode is ignored with an external OPA (OPAL_INLINE_OPA_ENABLED=false)")
		return
	}
	a.off.enabled = true
	st, takenAt, err := backup.Restore(ctx, cfg.StoreBackupPath, a.emb.Import, a.log)
	restored := err == nil
	if restored { // guard: mutation "if !restored {" leaves a valid backup unused
		a.tracker.Restored(takenAt)
		a.metrics.Restored(st.Hash)
	}
	if cfg.DefaultOPALServerConnectivityDisabled {
		if restored {
			a.off.disabled = true
			a.log.Info("not connecting to the OPAL server until POST /opal-server/connectivity/enable",
				"backup_taken_at", takenAt.UTC().Format(time.RFC3339))
		} else {
			// Staying away from the server with an empty store would deny
			// everything forever.
			a.log.Warn("OPAL server connectivity is disabled by default but no backup was restored; connecting")
		}
	}
}

// serving reports readiness (/ready, opal_client_ready): a policy loaded
// from the server or restored from a backup, and, with OPAL_POLICY_MAX_AGE,
// not behind for longer than that (status.Tracker.Serving).
func (a *Agent) serving() bool { return a.tracker.Serving() }

// notifyBackup tells the backup writer the store changed (a successful
// policy or data transaction). It never blocks.
func (a *Agent) notifyBackup(success bool) {
	if w := a.off.writer.Load(); w != nil && success { // guard: mutation "w != nil {" backs up after failures too
		w.Notify()
	}
}

// recordData is the data updater's Record: readiness and health, then the
// backup.
func (a *Agent) recordData(tx status.Transaction) {
	a.tracker.Record(tx)
	a.notifyBackup(tx.Success)
}

// startBackups starts the coalescing backup writer (Run, before the queue).
func (a *Agent) startBackups() {
	if !a.off.enabled {
		return
	}
	a.off.writer.Store(backup.NewWriter(backup.WriterOptions{
		Path:     a.cfg.StoreBackupPath,
		Interval: a.cfg.StoreBackupInterval,
		Export:   a.emb.Export,
		Clock:    a.clk,
		Logger:   a.log,
	}))
}

// stopBackups writes what is not yet backed up, once (Run, after the last
// transaction and before the store shuts down).
func (a *Agent) stopBackups(ctx context.Context) {
	if w := a.off.writer.Load(); w != nil {
		if err := w.Close(ctx); err != nil {
			a.log.Warn("last backup on shutdown failed", "path", a.cfg.StoreBackupPath, "error", err)
		}
	}
}

// startPubSub runs the pub/sub socket unless connectivity is disabled or
// Run is shutting down; a socket already running is left alone.
func (a *Agent) startPubSub() {
	a.off.mu.Lock()
	defer a.off.mu.Unlock()
	if a.ps == nil || a.off.disabled || a.off.stopped || a.off.psCancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	a.off.psCancel, a.off.psDone = cancel, done
	go func() { defer close(done); _ = a.ps.Run(ctx) }()
}

// stopPubSub closes the socket and waits for its goroutine; final (Run's
// shutdown) also forbids any later start.
func (a *Agent) stopPubSub(final bool) {
	a.off.mu.Lock()
	cancel, done := a.off.psCancel, a.off.psDone
	a.off.psCancel, a.off.psDone = nil, nil
	if final {
		a.off.stopped = true
	}
	a.off.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// dataUpdater is the current data updater instance, nil without one.
func (a *Agent) dataUpdater() DataUpdater {
	a.off.mu.Lock()
	defer a.off.mu.Unlock()
	return a.data
}

// stopData stops the data updater's fetches, polls and deferrals (disable,
// or Run's shutdown when final). The interface has no pause: an instance
// stopped by a disable is replaced by a new one on enable (startData).
func (a *Agent) stopData(final bool) {
	a.off.mu.Lock()
	d, off := a.data, a.off.dataOff
	a.off.dataOff = true
	if final {
		a.off.stopped = true
	}
	a.off.mu.Unlock()
	if d != nil && !off {
		d.Stop()
	}
}

// startData replaces a data updater stopped by a disable with a new one,
// before the socket reconnects (whose connect loads the base data).
func (a *Agent) startData() {
	a.off.mu.Lock()
	need := a.data != nil && a.off.dataOff && !a.off.stopped
	a.off.mu.Unlock()
	if !need || a.o.NewDataUpdater == nil {
		return
	}
	d, err := a.o.NewDataUpdater(a.dataDeps)
	if err != nil {
		a.log.Warn("data updater not restarted", "error", err)
		return
	}
	a.off.mu.Lock()
	if a.off.stopped { // shutdown began meanwhile
		a.off.mu.Unlock()
		d.Stop()
		return
	}
	a.data, a.off.dataOff = d, false
	a.off.mu.Unlock()
}

// fireDeferred is the scheduler's Fire: no deferred re-fetch while
// connectivity is disabled (a timer armed just before the disable, or by an
// operator trigger's failed fetch).
func (a *Agent) fireDeferred() {
	if a.ServerConnectivityDisabled() { // guard: mutation "if false {" re-fetches from a disconnected agent
		return
	}
	a.queue.Deferred()
}

// shuttingDown reports whether Run's shutdown has begun.
func (a *Agent) shuttingDown() bool {
	a.off.mu.Lock()
	defer a.off.mu.Unlock()
	return a.off.stopped
}

// ServerConnectivityDisabled reports whether the agent stays away from the
// OPAL server (api.Connectivity).
func (a *Agent) ServerConnectivityDisabled() bool {
	a.off.mu.Lock()
	defer a.off.mu.Unlock()
	return a.off.disabled
}

// SetServerConnectivity connects to (true) or disconnects from (false) the
// OPAL server and reports whether that changed anything (api.Connectivity).
// Disabling closes the pub/sub socket, cancels a pending deferred re-fetch
// and keeps any later one from firing, and stops the data updater (its
// polls and deferrals), as the Python client stops both updaters; the store
// keeps serving what it has. An update already queued still runs once, and
// so does an operator trigger, without leaving a deferral behind. Enabling
// starts a new data updater and reconnects; the connect queues a full
// update and the base-data load, as any reconnect does (D5, D6).
func (a *Agent) SetServerConnectivity(enabled bool) bool {
	a.off.switchMu.Lock()
	defer a.off.switchMu.Unlock()
	a.off.mu.Lock()
	if a.off.disabled != enabled { // guard: mutation "if false {" reports every switch as a change
		a.off.mu.Unlock()
		return false
	}
	a.off.disabled = !enabled
	a.off.mu.Unlock()
	if enabled {
		a.log.Info("OPAL server connectivity enabled")
		a.startData()
		a.startPubSub()
		return true
	}
	a.log.Info("OPAL server connectivity disabled; serving the loaded policy")
	a.stopPubSub(false)
	a.sched.Cancel()
	a.stopData(false)
	// Nothing confirms the policy is current any more (also when the
	// socket was still connecting): staleness and OPAL_POLICY_MAX_AGE count
	// from now until the first success after enable.
	a.tracker.Lost(a.clk.Now()) // guard: mutation "_ = a" keeps a disabled agent current forever
	return true
}
