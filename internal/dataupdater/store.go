package dataupdater

import (
	"context"
	"fmt"
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

// PatchTopKeys returns the top-level keys a root JSON-Patch names in its
// path and from, and whether one names the whole document.
func PatchTopKeys(ops []PatchOp) (keys []string, whole bool) {
	for _, op := range ops {
		for _, p := range []string{op.Path, op.From} {
			if p == "" {
				if p == op.Path || op.Op == "move" || op.Op == "copy" {
					whole = true
				}
				continue
			}
			seg, err := pointer(p)
			if err == nil && len(seg) > 0 {
				keys = append(keys, seg[0])
			}
		}
	}
	return keys, whole
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
// data path p is at, below or above; "" if none. The root is above every
// path, so callers handle root writes key by key.
func Protected(protected []string, p []string) string {
	for _, k := range protected {
		if overlaps(SplitPath(k), p) {
			return k
		}
	}
	return ""
}
