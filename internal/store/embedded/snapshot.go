package embedded

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/storage"

	"github.com/opal-go/opal-client/internal/backup"
	"github.com/opal-go/opal-client/internal/store"
)

// Export returns the store's state for a backup, read under the write lock
// in one read transaction so policy, data, hash and ownership agree: every
// module bundles manage (all but the ignored ids and the health policy),
// the whole data document without data.system.opal.policy_hash (the hash is
// State.Hash), and the bundle data ownership. Numbers are exported in the
// form OPA prints them, so a restored store decides byte for byte the same.
func (s *Store) Export(ctx context.Context) (*backup.State, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutdown {
		return nil, errors.New("embedded opa: shut down")
	}
	txn, err := s.opa.NewTransaction(ctx)
	if err != nil {
		return nil, fmt.Errorf("embedded opa: %w", err)
	}
	defer s.opa.Abort(ctx, txn)
	ids, err := s.opa.ListPolicies(ctx, txn)
	if err != nil {
		return nil, fmt.Errorf("embedded opa: %w", err)
	}
	st := &backup.State{Hash: s.hash, Policies: map[string]string{}, Owned: map[string]string(s.owned.Clone())}
	for _, id := range ids {
		if s.ignore.Match(id) { // not the bundles': not backed up
			continue
		}
		raw, err := s.opa.GetPolicy(ctx, txn, id)
		if err != nil {
			return nil, fmt.Errorf("embedded opa: %w", err)
		}
		st.Policies[id] = string(raw)
	}
	root, err := s.opa.Read(ctx, txn, storage.Path{})
	if err != nil {
		return nil, fmt.Errorf("embedded opa: %w", err)
	}
	// Copied while the transaction is open: OPA's in-memory store
	// updates its documents in place on commit.
	data, err := exportValue(root)
	if err != nil {
		return nil, fmt.Errorf("embedded opa export: %w", err)
	}
	doc, ok := data.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("embedded opa export: data document is %T", data)
	}
	for _, p := range notExported {
		removePath(doc, p)
	}
	if st.Data, err = json.Marshal(data); err != nil {
		return nil, fmt.Errorf("embedded opa export: %w", err)
	}
	return st, nil
}

// notExported are data paths the store or OPA write themselves: the hash
// (State.Hash) and OPA's version document. A backup leaves them out and
// Import keeps the running store's, so a restore never duplicates the hash
// nor brings back an older OPA's version.
var notExported = []storage.Path{HashPath, {"system", "version"}}

// exportValue deep-copies a stored document into JSON-ready values. Numbers
// become json.Number in the text OPA's evaluator gives them
// (ast.InterfaceToValue): a float64 1e20 is "1e+20", not encoding/json's
// "100000000000000000000", which would print differently after a restore.
func exportValue(v any) (any, error) {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			c, err := exportValue(e)
			if err != nil {
				return nil, err
			}
			out[k] = c
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			c, err := exportValue(e)
			if err != nil {
				return nil, err
			}
			out[i] = c
		}
		return out, nil
	case nil, bool, string, json.Number:
		return x, nil
	default:
		// float64, ints, ast values, ...: as OPA evaluates them.
		av, err := ast.InterfaceToValue(x)
		if err != nil {
			return nil, err
		}
		j, err := ast.JSON(av) // maps, slices, json.Number, strings, bools, nil
		if err != nil {
			return nil, fmt.Errorf("value %T: %w", x, err)
		}
		return exportValue(j)
	}
}

// removePath deletes p from the copied document and the objects on the way
// that only held it, so no empty system/opal is restored as data.
func removePath(doc map[string]any, p storage.Path) {
	if len(p) == 0 {
		return
	}
	if len(p) == 1 {
		delete(doc, p[0])
		return
	}
	child, ok := doc[p[0]].(map[string]any)
	if !ok {
		return
	}
	_, had := child[p[1]]
	removePath(child, p[1:])
	if had && len(child) == 0 {
		delete(doc, p[0])
	}
}

// fileDataPaths are the data paths the configured files loaded.
func (s *Store) fileDataPaths() []storage.Path {
	out := make([]storage.Path, len(s.fileData))
	for i, k := range s.fileData {
		out[i] = storage.Path(strings.Split(k, "/"))
	}
	return out
}

// Import replaces the store's state with st in one write transaction,
// compiled first like any bundle: the managed modules become exactly
// st.Policies (ignored ids and the health policy are neither written nor
// removed), the data document becomes st.Data, and the hash and ownership
// st's. Any error (a module that does not parse or compile, data that is not
// a JSON object, a rule/data conflict) leaves the store exactly as it was
// (U3). Afterwards PolicyHash returns st.Hash.
func (s *Store) Import(ctx context.Context, st *backup.State) error {
	if st == nil {
		return errors.New("embedded opa import: nil state")
	}
	dec := json.NewDecoder(bytes.NewReader(st.Data))
	dec.UseNumber() // keep numbers in the text they were exported in
	var data map[string]any
	if err := dec.Decode(&data); err != nil || data == nil {
		return &store.DataError{Dir: ".", Err: fmt.Errorf("backup data is not a JSON object: %v", err)}
	}
	ids := make([]string, 0, len(st.Policies))
	for id := range st.Policies {
		if id == "" {
			return errors.New("embedded opa import: empty policy id")
		}
		ids = append(ids, id)
	}
	sort.Strings(ids)

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutdown {
		return errors.New("embedded opa: shut down")
	}
	err := s.txn(ctx, func(txn storage.Transaction, current map[string]*ast.Module) (map[string]*ast.Module, error) {
		result := make(map[string]*ast.Module, len(current)+len(ids))
		for id, m := range current {
			if s.ignore.Match(id) {
				result[id] = m
				continue
			}
			if _, ok := st.Policies[id]; !ok {
				if err := s.opa.DeletePolicy(ctx, txn, id); err != nil && !storage.IsNotFound(err) {
					return nil, fmt.Errorf("delete policy %s: %w", id, err)
				}
			}
		}
		for _, id := range ids {
			if s.ignore.Match(id) {
				continue
			}
			m, err := s.parser.Parse(id, st.Policies[id])
			if err != nil {
				return nil, err
			}
			result[id] = m
			if err := s.opa.UpsertPolicy(ctx, txn, id, []byte(st.Policies[id])); err != nil {
				return nil, fmt.Errorf("upsert policy %s: %w", id, err)
			}
		}
		// The store's own documents survive the replacement of the root.
		var own []store.DataWrite
		keep := append(append([]storage.Path(nil), notExported[1:]...), s.fileDataPaths()...)
		for _, p := range keep {
			if v, err := s.opa.Read(ctx, txn, p); err == nil {
				own = append(own, store.DataWrite{Path: p, Value: v})
			}
		}
		if err := put(ctx, s.opa, txn, storage.Path{}, data); err != nil {
			return nil, fmt.Errorf("write data: %w", err)
		}
		for _, w := range own {
			if err := put(ctx, s.opa, txn, w.Path, w.Value); err != nil {
				return nil, fmt.Errorf("write data %v: %w", w.Path, err)
			}
		}
		if err := put(ctx, s.opa, txn, HashPath, st.Hash); err != nil {
			return nil, fmt.Errorf("write policy hash: %w", err)
		}
		return result, nil
	})
	if err != nil {
		return err
	}
	s.hash = st.Hash
	s.owned = store.Ownership(st.Owned).Clone()
	s.markLoaded()
	s.log.Debug("store state imported", "hash", st.Hash, "policies", len(ids))
	return nil
}
