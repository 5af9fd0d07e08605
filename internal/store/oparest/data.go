package oparest

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sort"

	"github.com/opal-go/opal-client/internal/dataupdater"
)

var _ dataupdater.Store = (*Store)(nil)

// WriteData writes one data entry with the calls of protocol §5.1: PUT
// /v1/data{path} (204/304), or PATCH with the JSON-Patch as
// application/json-patch+json (OPA applies it all or nothing). Data owned by
// policy bundles and data.system.opal are never changed
// (*dataupdater.ProtectedPathError), checked before any call.
//
// A root PUT is always written one top-level key at a time, whatever
// SplitRoot says: a single PUT /v1/data would replace the bundles' data too.
// Keys absent from the object are left in place.
func (s *Store) WriteData(ctx context.Context, w dataupdater.Write) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	protected := make([]string, 0, len(s.owned)+1)
	for k := range s.owned {
		protected = append(protected, k)
	}
	sort.Strings(protected)
	protected = append(protected, "system/opal")

	if w.Method == dataupdater.MethodPatch {
		// Checked as OPA will resolve each path, not as written.
		paths, err := dataupdater.OPAPatchPaths(w.Patch)
		if err != nil {
			return err
		}
		if len(w.Path) == 0 {
			for _, p := range paths {
				if len(p) == 0 {
					return &dataupdater.ProtectedPathError{Path: ""}
				}
				if k, ok := dataupdater.Protected(protected, p[:1]); ok {
					return &dataupdater.ProtectedPathError{Path: k}
				}
			}
		}
	}
	if len(w.Path) > 0 {
		if k, ok := dataupdater.Protected(protected, w.Path); ok {
			return &dataupdater.ProtectedPathError{Path: k}
		}
		return s.writeData(ctx, w.Path, w.Method, w.Value, w.Patch)
	}
	if w.Method == dataupdater.MethodPatch {
		return s.writeData(ctx, nil, w.Method, nil, w.Patch)
	}
	obj, err := dataupdater.RootValue(w.Value)
	if err != nil {
		return err
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		if owner, ok := dataupdater.Protected(protected, []string{k}); ok {
			return &dataupdater.ProtectedPathError{Path: owner}
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		if err := s.writeData(ctx, []string{k}, dataupdater.MethodPut, obj[k], nil); err != nil {
			if i > 0 {
				return &PartialWriteError{Writes: i, Err: err}
			}
			return err
		}
	}
	return nil
}

func (s *Store) writeData(ctx context.Context, path []string, method string, v any, ops []dataupdater.PatchOp) error {
	var body []byte
	var err error
	ctype := "application/json"
	if method == dataupdater.MethodPatch {
		if ops == nil {
			ops = []dataupdater.PatchOp{}
		}
		body, err = json.Marshal(ops)
		ctype = "application/json-patch+json"
	} else {
		body, err = json.Marshal(v)
	}
	if err != nil {
		return &dataupdater.DecodeError{What: "data", Err: err}
	}
	_, err = s.do(ctx, method, dataURL(path), ctype, body, http.StatusNoContent, http.StatusNotModified)
	var re *RemoteError
	if method == dataupdater.MethodPatch && errors.As(err, &re) && re.Status >= 400 && re.Status < 500 {
		// OPA refused the patch as a whole (a path not found, a failed
		// test): nothing was applied.
		return &dataupdater.PatchError{Index: -1, Op: "patch", Path: "/" + joinPath(path), Err: err}
	}
	return err
}

func joinPath(p []string) string {
	out := ""
	for i, s := range p {
		if i > 0 {
			out += "/"
		}
		out += s
	}
	return out
}
