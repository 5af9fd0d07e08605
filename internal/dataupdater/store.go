package dataupdater

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// Write is one entry's store write.
type Write struct {
	Path   []string // dst_path segments; empty is the root
	Method string   // MethodPut or MethodPatch
	Value  any      // PUT: the decoded document (numbers as json.Number)
	Patch  []PatchOp
	// SplitRoot is OPAL_SPLIT_ROOT_DATA: a root PUT writes the object's
	// top-level keys one by one and leaves the others alone. Without it a
	// root PUT replaces the part of the root the data updater may write.
	SplitRoot bool
}

// Store is what the data updater writes into. Each WriteData is
// all-or-nothing: on error the store is as it was. It never writes data
// owned by policy bundles (*ProtectedPathError).
type Store interface {
	WriteData(ctx context.Context, w Write) error
}

// ProtectedPathError is a write that would change data the policy bundles
// own (or the agent's own data.system.opal): the entry is refused.
type ProtectedPathError struct {
	Path string // the protected path, "/"-joined
}

func (e *ProtectedPathError) Error() string {
	return fmt.Sprintf("data path /%s is owned by the policy bundle; data updates may not change it", e.Path)
}

// RootValue checks and normalises a root PUT document: an object, or an
// array wrapped as {"items": [...]} (protocol §5.1).
func RootValue(v any) (map[string]any, error) {
	switch x := v.(type) {
	case map[string]any:
		return x, nil
	case []any:
		return map[string]any{"items": x}, nil
	}
	return nil, &DecodeError{What: "root data", Err: fmt.Errorf("must be an object or an array, got %s", kind(v))}
}

func kind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	}
	return "a number"
}

// OPAPatchPaths checks a JSON-Patch for OPA's PATCH /v1/data and returns
// the path each operation writes, relative to the patched document, as OPA
// resolves it. OPA trims slashes at both ends of a path and %-unescapes its
// segments, so "rbac", "//rbac", "/rbac/" and "/%72bac" all reach data.rbac;
// an operation whose path OPA would read differently from RFC 6901, or that
// OPA does not support (only add, remove and replace), is refused with
// *PatchError before anything is sent. An empty path is the whole document.
func OPAPatchPaths(ops []PatchOp) ([][]string, error) {
	out := make([][]string, 0, len(ops))
	for i, op := range ops {
		bad := func(err error) error { return &PatchError{Index: i, Op: op.Op, Path: op.Path, Err: err} }
		switch op.Op {
		case "add", "remove", "replace":
		default:
			return nil, bad(fmt.Errorf("OPA's PATCH /v1/data supports add, remove and replace only"))
		}
		rfc, err := pointer(op.Path)
		if err != nil {
			return nil, bad(err)
		}
		opa, ok := opaPatchPath(op.Path)
		if !ok || !slices.Equal(rfc, opa) {
			return nil, bad(fmt.Errorf("OPA would read this path as %q, not as the JSON pointer %q", "/"+strings.Join(opa, "/"), op.Path))
		}
		out = append(out, rfc)
	}
	return out, nil
}

// opaPatchPath is a patch path as OPA's server resolves it (prepareV1PatchSlice
// and patch.ParsePatchPathEscaped in OPA v1).
func opaPatchPath(p string) ([]string, bool) {
	t := strings.Trim(p, "/")
	if t == "" {
		return nil, true
	}
	segs := strings.Split(t, "/")
	for i, s := range segs {
		u, err := url.PathUnescape(s)
		if err != nil {
			return nil, false
		}
		segs[i] = strings.ReplaceAll(strings.ReplaceAll(u, "~1", "/"), "~0", "~")
	}
	return segs, true
}

func joinPath(p []string) string { return strings.Join(p, "/") }

// RuleConflictError is a write that would put data where a loaded policy
// defines rules (OPA refuses such data too): the entry is refused.
type RuleConflictError struct {
	Detail string
}

func (e *RuleConflictError) Error() string {
	return "data conflicts with policy rules: " + e.Detail
}

// Protected reports the first protected path (each "/"-joined) that the
// data path p is at, below or above, and whether there is one. The root is
// above every path, so callers handle root writes key by key.
func Protected(protected []string, p []string) (string, bool) {
	for _, k := range protected {
		if overlaps(SplitPath(k), p) {
			return k, true
		}
	}
	return "", false
}

// overlaps reports whether one path is at or below the other; the root
// overlaps everything.
func overlaps(a, b []string) bool {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
