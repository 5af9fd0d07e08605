// Package embedded is the default policy store: OPA v1 as a library, with an
// in-memory storage and OPA's own REST API served on a local address.
//
// Applying a bundle is one OPA storage transaction: the complete resulting
// module set is compiled first (inside the transaction, after the data
// writes, so rule/data conflicts are caught too); modules are upserted and
// deleted and data written in the same transaction, and the compiler is
// handed to OPA with the commit so the REST API decides with the new policy
// as soon as Commit returns. Any error aborts the transaction: policy and
// data stay exactly as they were (U3).
//
// The current policy hash is also readable in OPA at data.system.opal.policy_hash.
package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/plugins"
	"github.com/open-policy-agent/opa/v1/runtime"
	"github.com/open-policy-agent/opa/v1/storage"

	"github.com/opal-go/opal-client/config"
	"github.com/opal-go/opal-client/fetcher"
	"github.com/opal-go/opal-client/internal/dataupdater"
	"github.com/opal-go/opal-client/internal/store"
	"github.com/opal-go/opal-client/updater"
)

// DefaultAddr is where the REST API listens unless configured. Unlike the
// Python client's inline OPA (0.0.0.0:8181) it is loopback only: a sidecar's
// PDP should not be reachable from the network unless asked for.
const DefaultAddr = "127.0.0.1:8181"

// PluginName is the agent's plugin status on OPA's manager: NOT_READY until
// a policy is loaded (or restored from a backup), OK after, so OPA's own
// readiness probe (GET /health?plugins) tells the truth.
const PluginName = "opal"

// HashPath is the OPA data path of the current policy hash
// (data.system.opal.policy_hash), written in the same transaction as the bundle.
var HashPath = storage.Path{"system", "opal", "policy_hash"}

// Options configure the embedded store.
type Options struct {
	// Addr is the REST API's listen address; "" = OPA.Addr, or DefaultAddr.
	// Use "127.0.0.1:0" for an ephemeral port (see Store.Addr).
	Addr string
	// OPA is OPAL_INLINE_OPA_CONFIG: authentication, authorization, TLS,
	// the OPA configuration file, the files loaded at start, the log level.
	OPA config.InlineOPAConfig
	// V0Compatible runs OPA as `opa run --v0-compatible` (OPAL_OPA_V0_COMPAT
	// or OPA.V0Compatible).
	V0Compatible bool
	// LogFormat is OPAL_INLINE_OPA_LOG_FORMAT (LogFormatNone, ...); "" = none.
	LogFormat string
	// PolicyPathsToIgnore are OPAL_POLICY_STORE_POLICY_PATHS_TO_IGNORE.
	PolicyPathsToIgnore []string
	// Logger receives the store's logs and OPA's; nil = slog.Default().
	Logger *slog.Logger
}

// Store is the embedded OPA. Its methods are safe for concurrent use; writes
// are serialised.
type Store struct {
	log    *slog.Logger
	rt     *runtime.Runtime
	opa    storage.Store
	mgr    *plugins.Manager
	addr   string
	cancel context.CancelFunc
	served chan error // Serve's result, once

	fileData []string // data paths the configured files loaded: never changed
	print    bool     // print() statements compiled in, as OPA does

	mu       sync.Mutex // serialises writes and guards the fields below
	ignore   *store.Ignore
	parser   store.Parser
	hash     string
	owned    store.Ownership
	loaded   bool // a policy was applied or imported (the plugin status is OK)
	shutdown bool

	// releasing is set while releaseMemory's goroutine runs; releaseAgain
	// asks it for one more round.
	releasing, releaseAgain atomic.Bool
	freeOSMemory            func() // nil: debug.FreeOSMemory (tests count the calls)
}

var _ updater.Store = (*Store)(nil)

// New starts OPA as `opa run --server` would with the same options (OPA's
// own runtime: its configuration file, plugins, decision logger, server
// authentication, authorization, TLS and /metrics), with the agent's plugin
// status registered, and returns once the REST API listens. A configuration
// OPA cannot run is an *OPAConfigError naming the key.
func New(ctx context.Context, opts Options) (*Store, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	params, err := runtimeParams(opts, log)
	if err != nil {
		return nil, err
	}
	rt, err := runtime.NewRuntime(ctx, params)
	if err != nil {
		return nil, newtimeError(opts, err)
	}
	ig := opts.PolicyPathsToIgnore
	s := &Store{
		log:    log,
		rt:     rt,
		opa:    rt.Store,
		mgr:    rt.Manager,
		served: make(chan error, 1),
		owned:  store.Ownership{},
		print:  rt.Manager.EnablePrintStatements(),
	}
	// The files are loaded by now (the manager's Init): bundles leave them alone.
	files, data, err := s.startState(ctx)
	if err != nil {
		return nil, err
	}
	s.ignore = store.NewIgnore(append(append([]string(nil), ig...), files...))
	s.fileData = data
	s.parser.Options = rt.Manager.ParserOptions()
	rt.Manager.Register(PluginName, &statusPlugin{s: s})

	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	go func() { s.served <- rt.Serve(sctx) }()
	if err := s.waitServing(ctx); err != nil {
		cancel()
		<-s.served
		if ctx.Err() != nil {
			return nil, ctx.Err() // asked to stop while starting
		}
		return nil, &OPAConfigError{Key: "addr", Err: err}
	}
	log.Info("embedded OPA serving", "addr", s.addr, "v0_compatible", opts.V0Compatible)
	return s, nil
}

// waitServing waits until OPA's listener is bound (the runtime binds in
// its serve loop), or Serve fails.
func (s *Store) waitServing(ctx context.Context) error {
	deadline := time.NewTimer(startTimeout)
	defer deadline.Stop()
	select {
	case <-s.rt.Manager.ServerInitializedChannel():
	case err := <-s.served:
		s.served <- err
		return fmt.Errorf("embedded opa did not start: %w", orStopped(err))
	case <-ctx.Done():
		return ctx.Err()
	case <-deadline.C:
		return errors.New("embedded opa did not start in time")
	}
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		if a := s.rt.Addrs(); len(a) > 0 {
			s.addr = a[0]
			return nil
		}
		select {
		case err := <-s.served:
			s.served <- err
			return fmt.Errorf("embedded opa did not start: %w", orStopped(err))
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return errors.New("embedded opa did not bind its address in time")
		case <-tick.C:
		}
	}
}

// startTimeout bounds OPA's start (plugins, then the listener).
const startTimeout = 30 * time.Second

func orStopped(err error) error {
	if err == nil {
		return errors.New("stopped")
	}
	return err
}

// statusPlugin publishes the agent's policy state as a plugin status.
type statusPlugin struct{ s *Store }

func (p *statusPlugin) Start(context.Context) error {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	p.s.publishStatus()
	return nil
}

func (p *statusPlugin) Stop(context.Context)             {}
func (p *statusPlugin) Reconfigure(context.Context, any) {}

// publishStatus sets the plugin status from s.loaded; s.mu is held.
func (s *Store) publishStatus() {
	st := &plugins.Status{State: plugins.StateNotReady, Message: "no policy loaded yet"}
	if s.loaded {
		st = &plugins.Status{State: plugins.StateOK}
	}
	s.mgr.UpdatePluginStatus(PluginName, st)
}

// markLoaded records that a policy is in; s.mu is held.
func (s *Store) markLoaded() {
	if !s.loaded {
		s.loaded = true
		s.publishStatus()
	}
}

// Addr returns the REST API's bound address (host:port).
func (s *Store) Addr() string { return s.addr }

// Shutdown stops the REST API (waiting for requests in flight, within OPA's
// grace period) and OPA's plugins (flushing decision logs). The store is
// unusable afterwards.
func (s *Store) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.shutdown {
		s.mu.Unlock()
		return nil
	}
	s.shutdown = true
	s.mu.Unlock()
	// The plugins first, with a live context: the runtime stops them with
	// the serve context, which is cancelled by then, and the decision
	// logger would drop what it has not uploaded yet.
	s.mgr.Stop(ctx)
	// On SIGTERM/SIGINT OPA's runtime stops by itself (as opa run does),
	// flushing with its own live context: let it finish instead of
	// cancelling it half-way.
	if s.rt.ServerStatus() != runtime.ServerStopped {
		s.cancel()
	}
	defer s.cancel()
	select {
	case err := <-s.served:
		s.served <- err
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// PolicyHash returns the hash of the bundle last applied ("" if none).
func (s *Store) PolicyHash(context.Context) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hash, nil
}

// Health is nil while OPA is serving.
func (s *Store) Health(ctx context.Context) error {
	s.mu.Lock()
	down := s.shutdown
	s.mu.Unlock()
	if down {
		return errors.New("embedded opa: shut down")
	}
	select {
	case err := <-s.served:
		s.served <- err
		return fmt.Errorf("embedded opa: not serving: %w", orStopped(err))
	default:
	}
	txn, err := s.opa.NewTransaction(ctx)
	if err != nil {
		return fmt.Errorf("embedded opa: %w", err)
	}
	s.opa.Abort(ctx, txn)
	return nil
}

// ApplyPolicy applies a full or delta bundle in one transaction (U3). A
// delta on another base is refused with *updater.BaseMismatchError; a bundle
// that does not compile gives *store.CompileError, bad data JSON
// *store.DataError. On any error nothing changed.
func (s *Store) ApplyPolicy(ctx context.Context, b *fetcher.PolicyBundle) error {
	if b == nil {
		return errors.New("embedded opa: nil bundle")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutdown {
		return errors.New("embedded opa: shut down")
	}
	if err := store.CheckBase(s.hash, b); err != nil {
		return err
	}
	var plan *store.Plan
	err := s.txn(ctx, func(txn storage.Transaction, current map[string]*ast.Module) (map[string]*ast.Module, error) {
		var err error
		if plan, err = store.NewPlan(b, current, s.owned, s.ignore); err != nil {
			return nil, err
		}
		if err := s.checkFileData(plan); err != nil {
			return nil, err
		}
		// Before any write: the kept values are read as they are now.
		if err := plan.Compose(func(p []string) (any, bool, error) {
			v, err := s.opa.Read(ctx, txn, storage.Path(p))
			if storage.IsNotFound(err) {
				return nil, false, nil
			}
			return v, err == nil, err
		}); err != nil {
			return nil, err
		}
		result, err := s.parser.Result(plan, current)
		if err != nil {
			return nil, err
		}
		for _, p := range plan.DataDeletes {
			if err := s.opa.Write(ctx, txn, storage.RemoveOp, p, nil); err != nil && !storage.IsNotFound(err) {
				return nil, fmt.Errorf("delete data %v: %w", p, err)
			}
		}
		for _, w := range plan.DataWrites {
			if err := put(ctx, s.opa, txn, w.Path, w.Value); err != nil {
				return nil, fmt.Errorf("write data %v: %w", w.Path, err)
			}
		}
		if err := put(ctx, s.opa, txn, HashPath, b.Hash); err != nil {
			return nil, fmt.Errorf("write policy hash: %w", err)
		}
		for _, m := range plan.Upserts {
			if err := s.opa.UpsertPolicy(ctx, txn, m.Path, []byte(m.Rego)); err != nil {
				return nil, fmt.Errorf("upsert policy %s: %w", m.Path, err)
			}
		}
		for _, id := range plan.Deletes {
			if err := s.opa.DeletePolicy(ctx, txn, id); err != nil && !storage.IsNotFound(err) {
				return nil, fmt.Errorf("delete policy %s: %w", id, err)
			}
		}
		return result, nil
	})
	if err != nil {
		return err
	}
	s.hash = b.Hash
	s.owned = plan.Owned
	s.markLoaded()
	s.log.Debug("policy bundle applied", "hash", b.Hash, "delta", b.IsDelta(),
		"upserts", len(plan.Upserts), "deletes", len(plan.Deletes), "data_writes", len(plan.DataWrites))
	return nil
}

// SetHealthPolicy writes (compiles, then upserts) the system.opal health
// policy at store.HealthPolicyID.
func (s *Store) SetHealthPolicy(ctx context.Context, rego string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutdown {
		return errors.New("embedded opa: shut down")
	}
	return s.txn(ctx, func(txn storage.Transaction, current map[string]*ast.Module) (map[string]*ast.Module, error) {
		m, err := s.parser.Parse(store.HealthPolicyID, rego)
		if err != nil {
			return nil, err
		}
		current[store.HealthPolicyID] = m
		return current, s.opa.UpsertPolicy(ctx, txn, store.HealthPolicyID, []byte(rego))
	})
}

// txn runs f in one write transaction. f gets the parsed current modules and
// returns the complete resulting module set, which is compiled (against the
// transaction's data) before the commit; the compiler goes with the commit
// so OPA does not compile again. Any error aborts.
func (s *Store) txn(ctx context.Context, f func(storage.Transaction, map[string]*ast.Module) (map[string]*ast.Module, error)) error {
	params := storage.WriteParams
	params.Context = storage.NewContext()
	txn, err := s.opa.NewTransaction(ctx, params)
	if err != nil {
		return fmt.Errorf("embedded opa: %w", err)
	}
	commit := false
	defer func() {
		if !commit {
			s.opa.Abort(ctx, txn)
		}
	}()
	current, err := s.modules(ctx, txn)
	if err != nil {
		return err
	}
	result, err := f(txn, current)
	if err != nil {
		return err
	}
	c, err := store.CompileWith(result, storage.NonEmpty(ctx, s.opa, txn), store.CompileOptions{
		RegoVersion: s.parser.Options.RegoVersion, EnablePrintStatements: s.print})
	if err != nil {
		return err
	}
	plugins.SetCompilerOnContext(params.Context, c)
	commit = true
	if err := s.opa.Commit(ctx, txn); err != nil {
		return fmt.Errorf("embedded opa commit: %w", err)
	}
	s.parser.Forget(func(id string) bool { _, ok := result[id]; return ok })
	s.releaseMemory()
	return nil
}

// checkFileData refuses a plan that writes or deletes data the configured
// files loaded (mutation: "bundle may not change file data").
func (s *Store) checkFileData(p *store.Plan) error {
	for _, w := range p.DataWrites {
		if k, ok := dataupdater.Protected(s.fileData, w.Path); ok {
			dir := p.Owned[strings.Join(w.Path, "/")]
			return &store.DataError{Dir: dir, Err: fileDataError(dir, k)}
		}
	}
	for _, d := range p.DataDeletes {
		if k, ok := dataupdater.Protected(s.fileData, d); ok {
			return &store.DataError{Dir: ".", Err: fileDataError(".", k)}
		}
	}
	return nil
}

// releaseMemory hands the heap a policy change freed (above all the
// previous compiler, as large as the new one) back to the OS, in the
// background and once per burst of changes. The Go runtime would otherwise
// keep it resident for minutes: after a series of one-module deltas the
// agent would sit at the peak of an apply rather than near its live heap.
// The decisions are served with the new policy already (it is committed).
func (s *Store) releaseMemory() {
	if !s.releasing.CompareAndSwap(false, true) {
		s.releaseAgain.Store(true)
		return
	}
	free := s.freeOSMemory
	if free == nil {
		free = debug.FreeOSMemory
	}
	go func() {
		for {
			free()
			if s.releaseAgain.Swap(false) {
				continue
			}
			s.releasing.Store(false)
			// A request between the Swap and the Store is not lost.
			if !s.releaseAgain.Swap(false) || !s.releasing.CompareAndSwap(false, true) {
				return
			}
		}
	}()
}

// modules reads and parses every module in the store (parsed forms are
// cached, so this is cheap for unchanged modules).
func (s *Store) modules(ctx context.Context, txn storage.Transaction) (map[string]*ast.Module, error) {
	ids, err := s.opa.ListPolicies(ctx, txn)
	if err != nil {
		return nil, fmt.Errorf("embedded opa: %w", err)
	}
	out := make(map[string]*ast.Module, len(ids))
	for _, id := range ids {
		raw, err := s.opa.GetPolicy(ctx, txn, id)
		if err != nil {
			return nil, fmt.Errorf("embedded opa: %w", err)
		}
		m, err := s.parser.Parse(id, string(raw))
		if err != nil {
			return nil, err
		}
		out[id] = m
	}
	return out, nil
}

// put writes value at path, creating parent objects as OPA's PUT /v1/data does.
func put(ctx context.Context, opa storage.Store, txn storage.Transaction, path storage.Path, value any) error {
	if len(path) == 0 {
		return opa.Write(ctx, txn, storage.ReplaceOp, path, value)
	}
	if _, err := opa.Read(ctx, txn, path); err == nil {
		return opa.Write(ctx, txn, storage.ReplaceOp, path, value)
	} else if !storage.IsNotFound(err) {
		return err
	}
	if err := storage.MakeDir(ctx, opa, txn, path[:len(path)-1]); err != nil {
		return err
	}
	return opa.Write(ctx, txn, storage.AddOp, path, value)
}
