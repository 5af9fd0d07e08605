// Package store holds what the embedded and the REST policy stores share: the
// bundle semantics (which modules and data paths a bundle writes and deletes),
// the ignore rules, data ownership tracking and the compile-before-write check.
// Each store turns a Plan into writes in its own way.
package store

import (
	"fmt"
	"path"
	"sort"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/opal-go/opal-client/fetcher"
	"github.com/opal-go/opal-client/updater"
)

// HealthPolicyID is the policy id of the system.opal health-check module, the
// same id the Python client uses. It is never touched by bundles.
const HealthPolicyID = "engine/healthcheck/opal.rego"

// DataError is a data module whose text is not usable JSON; the whole bundle
// is rejected (the Python client skips it silently).
type DataError struct {
	Dir string // the data module's directory ("." = root)
	Err error
}

func (e *DataError) Error() string {
	return fmt.Sprintf("data module %q: %v", e.Dir, e.Err)
}

func (e *DataError) Unwrap() error { return e.Err }

// PolicyIDError is a bundle module whose path is not a clean policy id
// ("/x.rego", "a//b.rego", "./x.rego", "../x.rego"): OPA's REST API cleans
// such paths, so the module would land under another id and the next full
// bundle would delete it. The whole bundle is refused; nothing is written.
type PolicyIDError struct {
	ID string
}

func (e *PolicyIDError) Error() string {
	return fmt.Sprintf("policy module path %q is not a clean relative path", e.ID)
}

// cleanID reports whether id is a clean, relative, slash-separated path.
func cleanID(id string) bool {
	return id != "" && id == path.Clean(id) && !strings.HasPrefix(id, "/") && id != ".." && !strings.HasPrefix(id, "../") &&
		!strings.ContainsRune(id, 0) // guard: mutation "&& true" accepts a NUL byte in a policy id
}

func (e *CompileError) Error() string { return "policy does not compile: " + e.Errors.Error() }

// CheckBase refuses a delta bundle whose old_hash is not current (the delta
// would be applied on the wrong base).
func CheckBase(current string, b *fetcher.PolicyBundle) error {
	if b.IsDelta() && *b.OldHash != current {
		return &updater.BaseMismatchError{Current: current, Base: *b.OldHash}
	}
	return nil
}

// IsSystemModule reports whether raw Rego declares a package under system
// (data.system or below); such modules are never deleted by bundles.
func IsSystemModule(m *ast.Module) bool {
	if m == nil || m.Package == nil {
		return false
	}
	p := m.Package.Path
	return len(p) >= 2 && p[1].Value.Compare(ast.String("system")) == 0
}

// DataWrite is one data document a bundle writes.
type DataWrite struct {
	Path  []string
	Value any
}

// Plan is what applying one bundle does, in order: delete the stale data
// paths, write the data, upsert the modules, delete the modules.
type Plan struct {
	Hash        string
	DataDeletes [][]string
	DataWrites  []DataWrite
	Upserts     []fetcher.PolicyModule // manifest order, the rest after
	Deletes     []string
	Owned       Ownership // ownership after the bundle
	// Keeps are owned data paths this delta does not write but that lie
	// below one it deletes or rewrites: replacing data.a would remove
	// data.a.b. Compose folds their current values into the writes.
	Keeps [][]string
}

// NewPlan computes the plan of bundle b against the current state (and
// consumes b's data text, see decodeDataModules): the ids
// and parsed modules currently in the store (all of them; the plan leaves
// ignored and system.* ones alone) and the current ownership. It checks data
// JSON but does not compile.
func NewPlan(b *fetcher.PolicyBundle, current map[string]*ast.Module, owned Ownership, ig *Ignore) (*Plan, error) {
	p := &Plan{Hash: b.Hash}

	// Data: parse everything first, so bad JSON rejects the bundle.
	var next Ownership
	if b.IsDelta() {
		next = owned.Clone()
		gone := map[string]bool{}
		if b.DeletedFiles != nil {
			for _, d := range b.DeletedFiles.DataModules {
				gone[dirKey(d)] = true
			}
		}
		for _, dm := range b.DataModules {
			gone[dirKey(dm.Path)] = true // rewritten: its old keys are recomputed
		}
		for k, src := range next {
			if gone[src] {
				delete(next, k)
			}
		}
	} else {
		next = Ownership{}
	}
	values, err := decodeDataModules(b.DataModules)
	if err != nil {
		return nil, err
	}
	for i, dm := range b.DataModules {
		v := values[i]
		dp := DataPath(dm.Path)
		if len(dp) == 0 {
			obj, ok := v.(map[string]any)
			switch {
			case ok:
			case isArray(v):
				// As the Python client: a root array becomes {"items": [...]}.
				obj = map[string]any{"items": v}
			default:
				return nil, &DataError{Dir: dm.Path, Err: fmt.Errorf("root data must be an object or an array, got %T", v)}
			}
			keys := make([]string, 0, len(obj))
			for k := range obj {
				// Ownership keys are "/"-joined paths: "a/b" or "" as one
				// key would read as another path.
				if k == "" || strings.Contains(k, "/") {
					return nil, &DataError{Dir: dm.Path, Err: fmt.Errorf("root data key %q is empty or holds a \"/\"", k)}
				}
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				p.DataWrites = append(p.DataWrites, DataWrite{Path: []string{k}, Value: obj[k]})
				next[k] = "."
			}
			continue
		}
		p.DataWrites = append(p.DataWrites, DataWrite{Path: dp, Value: v})
		next[strings.Join(dp, "/")] = dirKey(dm.Path)
	}
	// Shallow paths first, so a deeper data.json lands inside a root key.
	sort.SliceStable(p.DataWrites, func(i, j int) bool { return len(p.DataWrites[i].Path) < len(p.DataWrites[j].Path) })
	var stale []string
	for k := range owned {
		if _, ok := next[k]; !ok {
			stale = append(stale, k)
		}
	}
	sort.Strings(stale)
	for _, k := range stale {
		p.DataDeletes = append(p.DataDeletes, strings.Split(k, "/"))
	}
	p.Owned = next
	if b.IsDelta() {
		// Owned paths the delta leaves alone but would wipe from above.
		written := map[string]bool{}
		for _, w := range p.DataWrites {
			written[strings.Join(w.Path, "/")] = true
		}
		var keeps []string
		for k := range next {
			if written[k] {
				continue
			}
			for _, top := range append(append([][]string(nil), p.DataDeletes...), pathsOf(p.DataWrites)...) {
				t := strings.Join(top, "/")
				if strings.HasPrefix(k, t+"/") {
					keeps = append(keeps, k)
					break
				}
			}
		}
		sort.Strings(keeps)
		for _, k := range keeps {
			p.Keeps = append(p.Keeps, strings.Split(k, "/"))
		}
	}

	// Policies.
	inBundle := map[string]bool{}
	for _, m := range orderModules(b) {
		if !cleanID(m.Path) {
			return nil, &PolicyIDError{ID: m.Path}
		}
		if ig.Match(m.Path) {
			continue
		}
		inBundle[m.Path] = true
		p.Upserts = append(p.Upserts, m)
	}
	if b.IsDelta() {
		if b.DeletedFiles != nil {
			for _, id := range b.DeletedFiles.PolicyModules {
				if ig.Match(id) || inBundle[id] || IsSystemModule(current[id]) {
					continue
				}
				if _, ok := current[id]; ok {
					p.Deletes = append(p.Deletes, id)
				}
			}
		}
	} else {
		for id, m := range current {
			if inBundle[id] || ig.Match(id) || IsSystemModule(m) {
				continue
			}
			p.Deletes = append(p.Deletes, id)
		}
		sort.Strings(p.Deletes)
	}
	return p, nil
}

func pathsOf(ws []DataWrite) [][]string {
	out := make([][]string, len(ws))
	for i, w := range ws {
		out[i] = w.Path
	}
	return out
}

func isArray(v any) bool { _, ok := v.([]any); return ok }

// orderModules returns the bundle's modules in manifest order, the ones the
// manifest does not list after them (§5.2).
func orderModules(b *fetcher.PolicyBundle) []fetcher.PolicyModule {
	pos := make(map[string]int, len(b.Manifest))
	for i, m := range b.Manifest {
		if _, ok := pos[m]; !ok {
			pos[m] = i
		}
	}
	out := append([]fetcher.PolicyModule(nil), b.PolicyModules...)
	sort.SliceStable(out, func(i, j int) bool {
		pi, iok := pos[out[i].Path]
		pj, jok := pos[out[j].Path]
		switch {
		case iok && jok:
			return pi < pj
		default:
			return iok && !jok
		}
	})
	return out
}
