// Package store holds what the embedded and the REST policy stores share: the
// bundle semantics (which modules and data paths a bundle writes and deletes),
// the ignore rules, data ownership tracking and the compile-before-write check.
// Each store turns a Plan into writes in its own way.
package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

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

// CompileError is a bundle whose resulting module set does not parse or
// compile. Nothing was written.
type CompileError struct {
	Errors ast.Errors
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

// Ignore decides which policy ids bundles never touch: ids matching
// OPAL_POLICY_STORE_POLICY_PATHS_TO_IGNORE, and the health-check policy.
// Patterns match as in the Python client (ignore.go): "dir/**" is a prefix,
// anything else pathlib's PurePath.match, anchored from the right; a
// pattern starting with '!' is an exception that un-ignores what it
// matches, whatever the order.
type Ignore struct {
	include, exclude []string
}

// NewIgnore builds the matcher from the configured patterns.
func NewIgnore(patterns []string) *Ignore {
	ig := &Ignore{}
	for _, p := range patterns {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if strings.HasPrefix(p, "!") {
			ig.exclude = append(ig.exclude, strings.TrimPrefix(p, "!"))
		} else {
			ig.include = append(ig.include, p)
		}
	}
	return ig
}

// Match reports whether bundles must leave the policy id alone.
func (ig *Ignore) Match(id string) bool {
	if id == HealthPolicyID {
		return true
	}
	if ig == nil {
		return false
	}
	for _, p := range ig.exclude {
		if globMatch(p, id) {
			return false
		}
	}
	for _, p := range ig.include {
		if globMatch(p, id) {
			return true
		}
	}
	return false
}

// globMatch is the Python client's match of one pattern (ignore.go).
func globMatch(pattern, id string) bool { return pyIgnoreMatch(pattern, id) }

// IsSystemModule reports whether raw Rego declares a package under system
// (data.system or below); such modules are never deleted by bundles.
func IsSystemModule(m *ast.Module) bool {
	if m == nil || m.Package == nil {
		return false
	}
	p := m.Package.Path
	return len(p) >= 2 && p[1].Value.Compare(ast.String("system")) == 0
}

// DataPath splits a data module directory or a data path ("", ".", "/a/b",
// "a/b") into segments; the root is the empty path.
func DataPath(dir string) []string {
	var out []string
	for _, s := range strings.Split(dir, "/") {
		if s != "" && s != "." {
			out = append(out, s)
		}
	}
	return out
}

// Ownership records which data paths bundles wrote, and through which data
// module directory, so that removed data.json files are deleted and data the
// data updater wrote elsewhere is never touched. Keys are "/"-joined data
// paths; values the owning module directory ("." for root keys).
type Ownership map[string]string

// Clone returns an independent copy.
func (o Ownership) Clone() Ownership {
	c := make(Ownership, len(o))
	for k, v := range o {
		c[k] = v
	}
	return c
}

// Owns reports whether the data path (segments) is at or below a path owned
// by a bundle, or above one (writing there would clobber bundle data). The
// data updater consults it.
func (o Ownership) Owns(p []string) bool {
	key := strings.Join(p, "/")
	for k := range o {
		if k == key || strings.HasPrefix(key, k+"/") || strings.HasPrefix(k, key+"/") || key == "" {
			return true
		}
	}
	return false
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

// Compose folds the current value of each Keeps path into the plan's
// writes, so a delta that rewrites or deletes data.a keeps data.a.b that
// another data.json owns: a delete above a kept path becomes a write of an
// object holding only the kept data, and each kept value is set inside the
// deepest write above it (data.a = {"x":9,"b":{"y":2}}). read returns the
// current value of a path and whether it exists; call Compose before any
// write. A kept path under a write whose value is not an object there gives
// *DataError.
func (p *Plan) Compose(read func(path []string) (any, bool, error)) error {
	if len(p.Keeps) == 0 {
		return nil
	}
	below := func(k, d []string) bool { return len(d) < len(k) && slices.Equal(k[:len(d)], d) }
	deletes := p.DataDeletes[:0:0]
	for _, d := range p.DataDeletes {
		keep := false
		for _, k := range p.Keeps {
			keep = keep || below(k, d)
		}
		if keep {
			p.DataWrites = append(p.DataWrites, DataWrite{Path: d, Value: map[string]any{}})
			continue
		}
		deletes = append(deletes, d)
	}
	p.DataDeletes = deletes
	sort.SliceStable(p.DataWrites, func(i, j int) bool { return len(p.DataWrites[i].Path) < len(p.DataWrites[j].Path) })
	for _, k := range p.Keeps {
		v, ok, err := read(k)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		w := -1 // the deepest write above k
		for i := range p.DataWrites {
			if below(k, p.DataWrites[i].Path) && (w < 0 || len(p.DataWrites[i].Path) > len(p.DataWrites[w].Path)) {
				w = i
			}
		}
		if w < 0 {
			continue
		}
		obj, ok := p.DataWrites[w].Value.(map[string]any)
		rest := k[len(p.DataWrites[w].Path):]
		for _, seg := range rest[:len(rest)-1] {
			if !ok {
				break
			}
			next, has := obj[seg]
			if !has {
				next = map[string]any{}
				obj[seg] = next
			}
			obj, ok = next.(map[string]any)
		}
		if !ok {
			return &DataError{Dir: p.Owned[strings.Join(k, "/")],
				Err: fmt.Errorf("data.%s is not an object, so the data at %s cannot be kept", strings.Join(p.DataWrites[w].Path, "."), strings.Join(k, "/"))}
		}
		obj[rest[len(rest)-1]] = copyJSON(v)
	}
	return nil
}

// copyJSON deep-copies a decoded document, so a value read from a store is
// not shared with what is written back.
func copyJSON(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = copyJSON(e)
		}
		return m
	case []any:
		s := make([]any, len(x))
		for i, e := range x {
			s[i] = copyJSON(e)
		}
		return s
	}
	return v
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

// DecodeData decodes one data.json text as OPA decodes bundle data: numbers
// stay json.Number, so an integer above 2^53 (9007199254740993) keeps every
// digit, as in OPA and the Python client. The text is read in place (no copy
// of it as a []byte); anything after the one JSON value is an error.
func DecodeData(text string) (any, error) {
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("data after the JSON value")
	}
	return v, nil
}

// decodeDataModules decodes every data module's text, on as many cores as
// Go runs on: decoding is most of the CPU time of a large bundle's apply.
// Each module's text is emptied once decoded: the caller holds the bundle
// for the whole apply, and a large bundle's text would otherwise stay alive
// beside its decoded values (a tenth of the peak for 95 MB of data). A
// bundle is applied once; applying it again gives a *DataError. The first
// bad module in bundle order is the error.
func decodeDataModules(dms []fetcher.DataModule) ([]any, error) {
	values := make([]any, len(dms))
	errs := make([]error, len(dms))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(dms)) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(dms); i = int(next.Add(1) - 1) {
				values[i], errs[i] = DecodeData(dms[i].Data)
				dms[i].Data = ""
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, &DataError{Dir: dms[i].Path, Err: err}
		}
	}
	return values, nil
}

func pathsOf(ws []DataWrite) [][]string {
	out := make([][]string, len(ws))
	for i, w := range ws {
		out[i] = w.Path
	}
	return out
}

func isArray(v any) bool { _, ok := v.([]any); return ok }

func dirKey(dir string) string {
	if d := DataPath(dir); len(d) > 0 {
		return strings.Join(d, "/")
	}
	return "."
}

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

// Parser parses modules and keeps the parsed form of each (id, text), so a
// one-module delta re-parses one module, not the whole set.
type Parser struct {
	Options ast.ParserOptions
	cache   map[string]parsed
}

type parsed struct {
	raw string
	mod *ast.Module
}

// Parse returns the parsed module for id with the given text.
func (ps *Parser) Parse(id, raw string) (*ast.Module, error) {
	if c, ok := ps.cache[id]; ok && c.raw == raw {
		return c.mod, nil
	}
	m, err := ast.ParseModuleWithOpts(id, raw, ps.Options)
	if err != nil {
		if errs, ok := err.(ast.Errors); ok {
			return nil, &CompileError{Errors: errs}
		}
		return nil, &CompileError{Errors: ast.Errors{ast.NewError(ast.ParseErr, nil, "%s: %v", id, err)}}
	}
	if m == nil {
		return nil, &CompileError{Errors: ast.Errors{ast.NewError(ast.ParseErr, nil, "%s: empty module", id)}}
	}
	if ps.cache == nil {
		ps.cache = map[string]parsed{}
	}
	ps.cache[id] = parsed{raw: raw, mod: m}
	return m, nil
}

// Cached returns how many parsed modules the cache holds.
func (ps *Parser) Cached() int { return len(ps.cache) }

// Forget drops ids no longer in the store from the cache.
func (ps *Parser) Forget(keep func(id string) bool) {
	for id := range ps.cache {
		if !keep(id) {
			delete(ps.cache, id)
		}
	}
}

// Result returns the module set after the plan: current plus the upserts,
// minus the deletes, all parsed.
func (ps *Parser) Result(p *Plan, current map[string]*ast.Module) (map[string]*ast.Module, error) {
	out := make(map[string]*ast.Module, len(current)+len(p.Upserts))
	for id, m := range current {
		if m != nil { // a remote module that does not parse here
			out[id] = m
		}
	}
	for _, um := range p.Upserts {
		m, err := ps.Parse(um.Path, um.Rego)
		if err != nil {
			return nil, err
		}
		out[um.Path] = m
	}
	for _, id := range p.Deletes {
		delete(out, id)
	}
	return out, nil
}

// Compile compiles a complete module set as OPA's server does on PUT
// /v1/policies. conflicts, if not nil, reports data paths that are not empty
// (rule/data conflicts fail the compile).
func Compile(modules map[string]*ast.Module, conflicts func([]string) (bool, error)) (*ast.Compiler, error) {
	return CompileWith(modules, conflicts, CompileOptions{})
}

// CompileOptions are the compiler settings OPA's own loader uses.
type CompileOptions struct {
	// RegoVersion is the version of modules that declare none: ast.RegoV0
	// under --v0-compatible; the zero value is OPA's default (v1).
	RegoVersion ast.RegoVersion
	// EnablePrintStatements keeps print() calls (OPA does at log level info).
	EnablePrintStatements bool
}

// CompileWith is Compile with OPA's compiler settings.
func CompileWith(modules map[string]*ast.Module, conflicts func([]string) (bool, error), o CompileOptions) (*ast.Compiler, error) {
	c := ast.NewCompiler().WithEnablePrintStatements(o.EnablePrintStatements)
	if o.RegoVersion != ast.RegoUndefined {
		c = c.WithDefaultRegoVersion(o.RegoVersion)
	}
	if conflicts != nil {
		c = c.WithPathConflictsCheck(conflicts)
	}
	if c.Compile(modules); c.Failed() {
		return nil, &CompileError{Errors: c.Errors}
	}
	return c, nil
}
