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
	"net"
	"net/http"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/logging"
	"github.com/open-policy-agent/opa/v1/plugins"
	"github.com/open-policy-agent/opa/v1/server"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"

	"github.com/opal-go/opal-client/fetcher"
	"github.com/opal-go/opal-client/internal/store"
	"github.com/opal-go/opal-client/updater"
)

// DefaultAddr is where the REST API listens unless configured. Unlike the
// Python client's inline OPA (0.0.0.0:8181) it is loopback only: a sidecar's
// PDP should not be reachable from the network unless asked for.
const DefaultAddr = "127.0.0.1:8181"

// HashPath is the OPA data path of the current policy hash
// (data.system.opal.policy_hash), written in the same transaction as the bundle.
var HashPath = storage.Path{"system", "opal", "policy_hash"}

// Options configure the embedded store.
type Options struct {
	// Addr is the REST API's listen address (host:port); "" = DefaultAddr.
	// Use "127.0.0.1:0" for an ephemeral port (see Store.Addr).
	Addr string
	// PolicyPathsToIgnore are OPAL_POLICY_STORE_POLICY_PATHS_TO_IGNORE.
	PolicyPathsToIgnore []string
	// Logger receives the store's logs; nil = slog.Default().
	Logger *slog.Logger
}

// Store is the embedded OPA. Its methods are safe for concurrent use; writes
// are serialised.
type Store struct {
	log    *slog.Logger
	opa    storage.Store
	mgr    *plugins.Manager
	srv    *server.Server
	http   *http.Server
	ln     net.Listener
	served chan error

	mu       sync.Mutex // serialises writes and guards the fields below
	ignore   *store.Ignore
	parser   store.Parser
	hash     string
	owned    store.Ownership
	shutdown bool

	// releasing is set while releaseMemory's goroutine runs; releaseAgain
	// asks it for one more round.
	releasing, releaseAgain atomic.Bool
	freeOSMemory            func() // nil: debug.FreeOSMemory (tests count the calls)
}

var _ updater.Store = (*Store)(nil)

// New starts OPA and its REST API. The listener is bound when New returns.
func New(ctx context.Context, opts Options) (*Store, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	addr := opts.Addr
	if addr == "" {
		addr = DefaultAddr
	}
	opa := inmem.NewWithOpts(inmem.OptRoundTripOnWrite(false))
	mgr, err := plugins.New(nil, "opal-client", opa,
		plugins.Logger(logging.NewNoOpLogger()), plugins.ConsoleLogger(logging.NewNoOpLogger()))
	if err != nil {
		return nil, fmt.Errorf("embedded opa: %w", err)
	}
	if err := mgr.Init(ctx); err != nil {
		return nil, fmt.Errorf("embedded opa: %w", err)
	}
	srv, err := server.New().WithStore(opa).WithManager(mgr).WithAddresses([]string{"http://" + addr}).Init(ctx)
	if err != nil {
		return nil, fmt.Errorf("embedded opa server: %w", err)
	}
	if err := mgr.Start(ctx); err != nil {
		return nil, fmt.Errorf("embedded opa: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		mgr.Stop(ctx)
		return nil, fmt.Errorf("embedded opa listen: %w", err)
	}
	s := &Store{
		log:    log,
		opa:    opa,
		mgr:    mgr,
		srv:    srv,
		ln:     ln,
		http:   &http.Server{Handler: srv.Handler, ReadHeaderTimeout: 32e9},
		served: make(chan error, 1),
		ignore: store.NewIgnore(opts.PolicyPathsToIgnore),
		owned:  store.Ownership{},
	}
	s.parser.Options = mgr.ParserOptions()
	mgr.ServerInitialized()
	go func() { s.served <- s.http.Serve(ln) }()
	log.Info("embedded OPA serving", "addr", ln.Addr().String())
	return s, nil
}

// Addr returns the REST API's bound address (host:port).
func (s *Store) Addr() string { return s.ln.Addr().String() }

// Shutdown stops the REST API (waiting for requests in flight, within ctx)
// and OPA. The store is unusable afterwards.
func (s *Store) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.shutdown {
		s.mu.Unlock()
		return nil
	}
	s.shutdown = true
	s.mu.Unlock()
	err := s.http.Shutdown(ctx)
	if serr := <-s.served; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	err = errors.Join(err, s.srv.Shutdown(ctx))
	s.mgr.Stop(ctx)
	return err
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
		return fmt.Errorf("embedded opa: not serving: %w", err)
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
	c, err := store.Compile(result, storage.NonEmpty(ctx, s.opa, txn))
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
