package embedded

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/storage"

	"github.com/opal-go/opal-client/internal/dataupdater"
)

var _ dataupdater.Store = (*Store)(nil)

// WriteData writes one data entry in one OPA transaction: all of it or
// nothing (a patch that does not apply, a refused path or a rule conflict
// leaves the store as it was). Data owned by policy bundles and the agent's
// data.system.opal are never changed (*dataupdater.ProtectedPathError).
//
// A root PUT takes an object (an array becomes {"items": [...]}); with
// SplitRoot it writes the object's top-level keys and leaves the others,
// without it it also removes the other keys the data updater may write.
func (s *Store) WriteData(ctx context.Context, w dataupdater.Write) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutdown {
		return errors.New("embedded opa: shut down")
	}
	protected := s.protectedPaths()
	txn, err := s.opa.NewTransaction(ctx, storage.WriteParams)
	if err != nil {
		return fmt.Errorf("embedded opa: %w", err)
	}
	commit := false
	defer func() {
		if !commit {
			s.opa.Abort(ctx, txn)
		}
	}()
	if len(w.Path) > 0 {
		err = s.writePath(ctx, txn, protected, w)
	} else {
		err = s.writeRoot(ctx, txn, protected, w)
	}
	if err != nil {
		return err
	}
	// As OPA's PUT /v1/data: no data where a loaded policy has rules.
	if c := s.mgr.GetCompiler(); c != nil {
		if errs := ast.CheckPathConflicts(c, storage.NonEmpty(ctx, s.opa, txn)); len(errs) > 0 {
			return &dataupdater.RuleConflictError{Detail: errs.Error()}
		}
	}
	commit = true
	if err := s.opa.Commit(ctx, txn); err != nil {
		return fmt.Errorf("embedded opa commit: %w", err)
	}
	return nil
}

// protectedPaths are the data paths bundles own, the configured files'
// data, and data.system.opal.
func (s *Store) protectedPaths() []string {
	out := make([]string, 0, len(s.owned)+len(s.fileData)+1)
	for k := range s.owned {
		out = append(out, k)
	}
	sort.Strings(out)
	// The data the configured files loaded stays as the files say.
	out = append(out, s.fileData...)
	return append(out, "system/opal")
}

func (s *Store) writePath(ctx context.Context, txn storage.Transaction, protected []string, w dataupdater.Write) error {
	if k, ok := dataupdater.Protected(protected, w.Path); ok {
		return &dataupdater.ProtectedPathError{Path: k}
	}
	p := storage.Path(w.Path)
	v := w.Value
	if w.Method == dataupdater.MethodPatch {
		cur, err := s.opa.Read(ctx, txn, p)
		if err != nil && !storage.IsNotFound(err) {
			return fmt.Errorf("read data %v: %w", p, err)
		}
		if v, err = dataupdater.ApplyPatch(cur, w.Patch); err != nil {
			return err
		}
	}
	if err := put(ctx, s.opa, txn, p, v); err != nil {
		return fmt.Errorf("write data %v: %w", p, err)
	}
	return nil
}

// writeRoot computes the new root document and writes the top-level keys
// that changed, refusing any change to a protected key.
func (s *Store) writeRoot(ctx context.Context, txn storage.Transaction, protected []string, w dataupdater.Write) error {
	raw, err := s.opa.Read(ctx, txn, storage.Path{})
	if err != nil {
		return fmt.Errorf("read data: %w", err)
	}
	old, _ := raw.(map[string]any)
	isProtected := func(k string) bool { _, ok := dataupdater.Protected(protected, []string{k}); return ok }
	next := make(map[string]any, len(old))
	switch w.Method {
	case dataupdater.MethodPatch:
		v, err := dataupdater.ApplyPatch(old, w.Patch)
		if err != nil {
			return err
		}
		if next, err = dataupdater.RootValue(v); err != nil {
			return err
		}
	default:
		obj, err := dataupdater.RootValue(w.Value)
		if err != nil {
			return err
		}
		for k, v := range old {
			if w.SplitRoot || isProtected(k) {
				next[k] = v
			}
		}
		for k, v := range obj {
			next[k] = v
		}
	}
	keys := make([]string, 0, len(old)+len(next))
	for k := range old {
		keys = append(keys, k)
	}
	for k := range next {
		if _, ok := old[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		ov, had := old[k]
		nv, has := next[k]
		if had == has && (!has || dataupdater.EqualJSON(ov, nv)) {
			continue
		}
		if isProtected(k) {
			owner, _ := dataupdater.Protected(protected, []string{k})
			return &dataupdater.ProtectedPathError{Path: owner}
		}
		p := storage.Path{k}
		if !has {
			if err := s.opa.Write(ctx, txn, storage.RemoveOp, p, nil); err != nil {
				return fmt.Errorf("remove data %v: %w", p, err)
			}
			continue
		}
		if err := put(ctx, s.opa, txn, p, nv); err != nil {
			return fmt.Errorf("write data %v: %w", p, err)
		}
	}
	return nil
}
