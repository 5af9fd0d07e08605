package storetest

import (
	"context"
	"errors"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/opal-go/opal-client/fetcher"
	"github.com/opal-go/opal-client/internal/dataupdater"
	"github.com/opal-go/opal-client/internal/store"
	"github.com/opal-go/opal-client/updater"
)

// Store is what the conformance suite drives: the updater's policy store
// with the data updater's writes.
type Store interface {
	updater.Store
	WriteData(ctx context.Context, w dataupdater.Write) error
}

// Kinds of store the suite knows, for the documented differences.
const (
	Embedded = "embedded" // internal/store/embedded
	REST     = "oparest"  // internal/store/oparest
)

// Subject is one fresh store under test and the OPA it loads.
type Subject struct {
	Store Store
	// OPA reads the OPA the store loads, directly (not through the store).
	OPA OPA
	// Writes counts the write calls that reached OPA through the store; nil
	// for a store that writes in-process (a refused bundle is then checked by
	// the snapshot alone).
	Writes func() int
	// Down makes the store's OPA unreachable.
	Down func()
}

// Harness runs the suite against one store.
type Harness struct {
	Kind string // Embedded or REST
	// New returns a fresh store ignoring the given policy ids
	// (OPAL_POLICY_STORE_POLICY_PATHS_TO_IGNORE); it registers its cleanup on t.
	New func(t *testing.T, ignore ...string) Subject
}

// differs skips t when the store behaves otherwise by design: why names the
// documentation section that says so.
func (h Harness) differs(t *testing.T, kinds map[string]string) {
	t.Helper()
	if why, ok := kinds[h.Kind]; ok {
		t.Skipf("%s store differs by design: %s", h.Kind, why)
	}
}

// Policies and modules the cases load.
const (
	RbacV1 = "package app.rbac\n\ndefault allow := false\n\nallow if input.user == \"alice\"\n"
	RbacV2 = "package app.rbac\n\ndefault allow := false\n\nallow if input.user == \"bob\"\n"
	extra  = "package app.extra\n\nx := data.extra.value\n"
	broken = "package app.rbac\n\nallow if {\n" // does not parse
	// unsafe: parses, fails to compile (unsafe variable).
	unsafe = "package app.bad\n\nallow if y > 1\n"
	// uses needs lib, which comes after it in the manifest.
	uses = "package a.uses\n\nimport data.z.lib\n\nok if lib.f(1)\n"
	lib  = "package z.lib\n\nf(x) := x + 1\n"
)

// Run runs every conformance case against the store of h. Each case names
// the rule it guards; a store that differs by design skips the case with the
// reason and the documentation section.
func Run(t *testing.T, h Harness) {
	newSubject := h.New
	h.New = func(t *testing.T, ignore ...string) Subject {
		s := newSubject(t, ignore...)
		s.Store = guarded{t: t, s: s.Store}
		return s
	}
	t.Run("BundleSequence", func(t *testing.T) { bundleSequence(t, h) })
	t.Run("U3_AllOrNothing", func(t *testing.T) { allOrNothing(t, h) })
	t.Run("FullBundleLeavesUnmanaged", func(t *testing.T) { leavesUnmanaged(t, h) })
	t.Run("RootData", func(t *testing.T) { rootData(t, h) })
	t.Run("U3_DeltaRewriteKeepsNestedOwnedData", func(t *testing.T) { deltaRewrite(t, h) })
	t.Run("PolicyIDs", func(t *testing.T) { policyIDs(t, h) })
	t.Run("Health", func(t *testing.T) { health(t, h) })
	t.Run("DataWrite", func(t *testing.T) { dataWrite(t, h) })
}

// guarded fails the case when a store call panics: a panic is a failure of
// the rule the case guards, not a crash of the whole test binary.
type guarded struct {
	t *testing.T
	s Store
}

func (g guarded) fatalOnPanic(call string) {
	if r := recover(); r != nil {
		g.t.Fatalf("%s panicked: %v\n%s", call, r, debug.Stack())
	}
}

func (g guarded) PolicyHash(ctx context.Context) (string, error) {
	defer g.fatalOnPanic("PolicyHash")
	return g.s.PolicyHash(ctx)
}

func (g guarded) ApplyPolicy(ctx context.Context, b *fetcher.PolicyBundle) error {
	defer g.fatalOnPanic("ApplyPolicy")
	return g.s.ApplyPolicy(ctx, b)
}

func (g guarded) Health(ctx context.Context) error {
	defer g.fatalOnPanic("Health")
	return g.s.Health(ctx)
}

func (g guarded) WriteData(ctx context.Context, w dataupdater.Write) error {
	defer g.fatalOnPanic("WriteData")
	return g.s.WriteData(ctx, w)
}

// Decide asks OPA for data.app.rbac.allow with input.user.
func Decide(t *testing.T, o OPA, user string) string {
	t.Helper()
	code, body := o.Do("POST", "/v1/data/app/rbac/allow", `{"input":{"user":"`+user+`"}}`)
	if code != 200 {
		t.Fatalf("decision: %d %s", code, body)
	}
	return body
}

func isCompile(err error) bool  { var e *store.CompileError; return errors.As(err, &e) }
func isData(err error) bool     { var e *store.DataError; return errors.As(err, &e) }
func isPolicyID(err error) bool { var e *store.PolicyIDError; return errors.As(err, &e) }
func isBase(err error) bool {
	var e *updater.BaseMismatchError
	return errors.As(err, &e) && e.Current == "h1" && e.Base == "h0"
}

// hashInOPA: only the embedded store writes its hash into OPA.
var hashInOPA = map[string]string{REST: "the REST store keeps the policy hash in the agent; only the embedded OPA exposes data.system.opal.policy_hash (docs/stores.md, Embedded OPA)"}

func hashInOPAIs(t *testing.T, h Harness, o OPA, want string) {
	h.differs(t, hashInOPA)
	if got := o.Get("/v1/data/system/opal/policy_hash"); got != `{"result":"`+want+`"}` {
		t.Fatalf("hash in OPA: %s, want %s", got, want)
	}
}

// bundleSequence covers full -> delta -> full with deleted policy and data
// files, a module uploaded before the one it imports, and the hash kept by
// the store.
func bundleSequence(t *testing.T, h Harness) {
	s := h.New(t)
	o := s.OPA
	ctx := context.Background()

	// Full. Dependents first in the manifest: the REST store postpones uses
	// until lib is uploaded.
	if err := s.Store.ApplyPolicy(ctx, Full("h1", map[string]string{"rbac/rbac.rego": RbacV1, "extra/extra.rego": extra, "a/uses.rego": uses, "z/lib.rego": lib},
		map[string]string{"extra": `{"value": 1}`, "rbac": `{"roles": ["admin"]}`})); err != nil {
		t.Fatal(err)
	}
	if got := Decide(t, o, "alice"); got != `{"result":true}` {
		t.Fatalf("after full: alice = %s", got)
	}
	if got := o.Get("/v1/data/app/extra/x"); got != `{"result":1}` {
		t.Fatalf("data via rule: %s", got)
	}
	if got := o.Get("/v1/data/a/uses/ok"); got != `{"result":true}` {
		t.Fatalf("module importing a later one: %s", got)
	}
	t.Run("hash_in_opa_after_full", func(t *testing.T) { hashInOPAIs(t, h, o, "h1") })
	if h, _ := s.Store.PolicyHash(ctx); h != "h1" {
		t.Fatalf("PolicyHash = %q", h)
	}

	// Delta: change rbac, delete extra's policy and data, and uses and lib.
	if err := s.Store.ApplyPolicy(ctx, Delta("h1", "h2", map[string]string{"rbac/rbac.rego": RbacV2}, nil,
		[]string{"extra/extra.rego", "a/uses.rego", "z/lib.rego"}, []string{"extra"})); err != nil {
		t.Fatal(err)
	}
	if got := Decide(t, o, "bob"); got != `{"result":true}` {
		t.Fatalf("after delta: bob = %s", got)
	}
	for _, id := range []string{"extra/extra.rego", "a/uses.rego", "z/lib.rego"} {
		if code, body := o.Do("GET", "/v1/policies/"+id, ""); code != 404 {
			t.Fatalf("deleted policy %s still there: %d %s", id, code, body)
		}
	}
	if got := o.Get("/v1/data/extra"); got != `{}` {
		t.Fatalf("deleted data file still there: %s", got)
	}
	if got := o.Get("/v1/data/rbac/roles"); got != `{"result":["admin"]}` {
		t.Fatalf("untouched data lost: %s", got)
	}

	// Full again, without the rbac data.json: its data goes (the Python client keeps it).
	if err := s.Store.ApplyPolicy(ctx, Full("h3", map[string]string{"rbac/rbac.rego": RbacV1}, nil)); err != nil {
		t.Fatal(err)
	}
	if got := Decide(t, o, "alice"); got != `{"result":true}` {
		t.Fatalf("after 2nd full: alice = %s", got)
	}
	if got := o.Get("/v1/data/rbac"); got != `{}` {
		t.Fatalf("data of a removed data.json kept: %s", got)
	}
	t.Run("hash_in_opa_after_second_full", func(t *testing.T) { hashInOPAIs(t, h, o, "h3") })
	if h, _ := s.Store.PolicyHash(ctx); h != "h3" {
		t.Fatalf("PolicyHash = %q", h)
	}
}

// allOrNothing: a bundle that fails leaves every decision byte-identical,
// and (REST store) never reaches OPA: it is refused before any write.
func allOrNothing(t *testing.T, h Harness) {
	s := h.New(t)
	ctx := context.Background()
	if err := s.Store.ApplyPolicy(ctx, Full("h1", map[string]string{"rbac/rbac.rego": RbacV1, "extra/extra.rego": extra},
		map[string]string{"extra": `{"value": 1}`})); err != nil {
		t.Fatal(err)
	}
	before := s.OPA.Snapshot()
	writes := 0
	if s.Writes != nil {
		writes = s.Writes()
	}
	for _, tc := range []struct {
		name    string
		bundle  func() error
		wantErr func(error) bool
		skip    map[string]string // kind -> the documented difference
	}{
		{"U3_parse_error", func() error {
			return s.Store.ApplyPolicy(ctx, Full("h2", map[string]string{"rbac/rbac.rego": broken}, map[string]string{"extra": `{"value": 2}`}))
		}, isCompile, nil},
		// Catches: dropping the c.Failed() check in store.Compile, and the
		// REST store skipping the local compile before writing.
		{"U3_compile_error", func() error {
			return s.Store.ApplyPolicy(ctx, Full("h2", map[string]string{"rbac/rbac.rego": RbacV2, "bad/bad.rego": unsafe}, map[string]string{"extra": `{"value": 2}`}))
		}, isCompile, nil},
		// Catches: compiling without the data path-conflict check.
		{"U3_rule_data_conflict", func() error {
			return s.Store.ApplyPolicy(ctx, Full("h2", map[string]string{"rbac/rbac.rego": RbacV2}, map[string]string{"app/rbac": `{"allow": true}`}))
		}, isCompile, nil},
		// Catches: skipping invalid data JSON instead of rejecting the bundle.
		{"U3_invalid_data_json", func() error {
			return s.Store.ApplyPolicy(ctx, Full("h2", map[string]string{"rbac/rbac.rego": RbacV2}, map[string]string{"extra": `{"value": `}))
		}, isData, nil},
		// Catches: data.json text after the first JSON value ignored (the
		// decoder reads one value; json.Unmarshal refused the rest).
		{"data_trailing_text_refused", func() error {
			return s.Store.ApplyPolicy(ctx, Full("h2", map[string]string{"rbac/rbac.rego": RbacV2}, map[string]string{"extra": `{"value": 2} {"value": 3}`}))
		}, isData, nil},
		{"U3_invalid_data_not_json", func() error {
			return s.Store.ApplyPolicy(ctx, Full("h2", map[string]string{"rbac/rbac.rego": RbacV2}, map[string]string{"extra": `nope`}))
		}, isData, nil},
		// Catches: root data keys taken as ownership keys whatever they hold
		// ("a/b" would read as the path a.b, "" as the root).
		{"F6_root_key_with_slash_refused", func() error {
			return s.Store.ApplyPolicy(ctx, Full("h2", map[string]string{"rbac/rbac.rego": RbacV1}, map[string]string{".": `{"a/b": 1}`}))
		}, isData, nil},
		{"F6_root_key_empty_refused", func() error {
			return s.Store.ApplyPolicy(ctx, Full("h2", map[string]string{"rbac/rbac.rego": RbacV1}, map[string]string{".": `{"": 1}`}))
		}, isData, nil},
		{"U3_delta_compile_error", func() error {
			return s.Store.ApplyPolicy(ctx, Delta("h1", "h2", map[string]string{"bad/bad.rego": unsafe}, map[string]string{"extra": `{"value": 3}`}, []string{"rbac/rbac.rego"}, nil))
		}, isCompile, nil},
		// Catches: a delta no longer checked against the current hash.
		{"delta_wrong_base_refused", func() error {
			return s.Store.ApplyPolicy(ctx, Delta("h0", "h2", map[string]string{"rbac/rbac.rego": RbacV2}, nil, nil, nil))
		}, isBase, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.differs(t, tc.skip)
			err := tc.bundle()
			if err == nil || !tc.wantErr(err) {
				t.Fatalf("err = %v (%T)", err, err)
			}
			if s.Writes != nil && s.Writes() != writes {
				t.Fatalf("%d writes reached OPA", s.Writes()-writes)
			}
			if after := s.OPA.Snapshot(); after != before {
				t.Fatalf("store changed:\nbefore %s\nafter  %s", before, after)
			}
			if h, _ := s.Store.PolicyHash(ctx); h != "h1" {
				t.Fatalf("hash = %q", h)
			}
		})
	}
}

// leavesUnmanaged: ignored ids and system.* modules survive a full bundle,
// and a root data.json leaves the keys no bundle owns.
func leavesUnmanaged(t *testing.T, h Harness) {
	// Ignore globs: keep these few cases in step with the ignore matcher's
	// semantics (docs/stores.md, Never touched).
	s := h.New(t, "keep/**", "!keep/not-this.rego")
	o := s.OPA
	o.Must("PUT", "/v1/policies/keep/mine.rego", "package keep.mine\n\nx := 1\n", 200)
	o.Must("PUT", "/v1/policies/keep/not-this.rego", "package keep.not\n\nx := 1\n", 200)
	o.Must("PUT", "/v1/policies/sys.rego", "package system.custom\n\nx := 1\n", 200)
	o.Must("PUT", "/v1/policies/other.rego", "package other\n\nx := 1\n", 200)
	o.Must("PUT", "/v1/data/users", `{"bob": "admin"}`, 204)
	if err := s.Store.ApplyPolicy(context.Background(), Full("h1", map[string]string{"rbac/rbac.rego": RbacV1, "keep/mine.rego": "package keep.mine\n\nx := 2\n"},
		map[string]string{".": `{"a": 1}`})); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, id string
		code     int
	}{
		// Catches: dropping the ignore check on deletes.
		{"ignored_id_survives", "keep/mine.rego", 200},
		{"ignore_exception_is_managed", "keep/not-this.rego", 404},
		// Catches: dropping the system.* check on deletes.
		{"system_package_survives", "sys.rego", 200},
		{"unmanaged_other_deleted", "other.rego", 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code, body := o.Do("GET", "/v1/policies/"+tc.id, ""); code != tc.code {
				t.Fatalf("%s: %d %s", tc.id, code, body)
			}
		})
	}
	for _, tc := range []struct{ name, path, want string }{
		{"ignored_id_not_overwritten", "/v1/data/keep/mine/x", `{"result":1}`},
		{"system_package_still_evaluates", "/v1/data/system/custom/x", `{"result":1}`},
		{"unmanaged_other_not_evaluated", "/v1/data/other/x", `{}`},
		{"root_data_key_written", "/v1/data/a", `{"result":1}`},
		{"root_data_keeps_other_keys", "/v1/data/users", `{"result":{"bob":"admin"}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := o.Get(tc.path); got != tc.want {
				t.Fatalf("%s = %s, want %s", tc.path, got, tc.want)
			}
		})
	}
}

// rootData: a root data.json replaces only the keys bundles own.
func rootData(t *testing.T, h Harness) {
	s := h.New(t)
	o := s.OPA
	ctx := context.Background()
	o.Must("PUT", "/v1/data/users", `{"bob": "admin"}`, 204)
	if err := s.Store.ApplyPolicy(ctx, Full("h1", map[string]string{"rbac/rbac.rego": RbacV1},
		map[string]string{".": `{"a": 1, "b": {"c": 2}}`, "b/d": `{"e": 3}`})); err != nil {
		t.Fatal(err)
	}
	if got := o.Get("/v1/data/b"); got != `{"result":{"c":2,"d":{"e":3}}}` {
		t.Fatalf("root + nested: %s", got)
	}
	if err := s.Store.ApplyPolicy(ctx, Full("h2", map[string]string{"rbac/rbac.rego": RbacV1},
		map[string]string{".": `{"b": {"c": 5}}`})); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, path, want string }{
		{"root_key_dropped_is_deleted", "/v1/data/a", `{}`},
		{"root_key_replaced", "/v1/data/b", `{"result":{"c":5}}`},
		// Catches: a root data.json that replaces the whole document.
		{"data_updater_key_kept", "/v1/data/users", `{"result":{"bob":"admin"}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := o.Get(tc.path); got != tc.want {
				t.Fatalf("%s = %s, want %s", tc.path, got, tc.want)
			}
		})
	}
	t.Run("root_array_wrapped_as_items", func(t *testing.T) {
		if err := s.Store.ApplyPolicy(ctx, Full("h3", nil, map[string]string{".": `[1,2]`})); err != nil {
			t.Fatal(err)
		}
		if got := o.Get("/v1/data/items"); got != `{"result":[1,2]}` {
			t.Fatalf("items = %s", got)
		}
		if !strings.Contains(o.Get("/v1/data/users"), "bob") {
			t.Fatal("data updater key lost")
		}
	})
}

// deltaRewrite: a delta that rewrites or deletes data.a keeps data.a.b,
// which another data.json owns and the delta leaves alone (a replace at
// data.a would remove it); the REST store fetches it first.
func deltaRewrite(t *testing.T, h Harness) {
	for _, tc := range []struct {
		name    string
		delta   map[string]string
		deleted []string
		want    string // GET /v1/data/a
		wantErr bool
	}{
		// Catches: not composing (REST: not fetching) the kept data into the rewrite.
		{"rewrite_keeps_nested", map[string]string{"a": `{"x":9}`}, nil, `{"result":{"b":{"y":2},"x":9}}`, false},
		// Catches: deleting data.a with data.a.b still owned.
		{"delete_keeps_nested", nil, []string{"a"}, `{"result":{"b":{"y":2}}}`, false},
		{"rewrite_nested_too", map[string]string{"a": `{"x":9}`, "a/b": `{"y":3}`}, nil, `{"result":{"b":{"y":3},"x":9}}`, false},
		{"rewrite_not_object_refused", map[string]string{"a": `[1]`}, nil, `{"result":{"b":{"y":2},"x":1}}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := h.New(t)
			ctx := context.Background()
			if err := s.Store.ApplyPolicy(ctx, Full("h1", nil, map[string]string{"a": `{"x":1}`, "a/b": `{"y":2}`})); err != nil {
				t.Fatal(err)
			}
			err := s.Store.ApplyPolicy(ctx, Delta("h1", "h2", nil, tc.delta, nil, tc.deleted))
			if tc.wantErr != isData(err) || !tc.wantErr && err != nil {
				t.Fatalf("err = %v", err)
			}
			if got := s.OPA.Get("/v1/data/a"); got != tc.want {
				t.Fatalf("data.a = %s, want %s", got, tc.want)
			}
		})
	}
}

// policyIDs: a module path OPA would store under another id is refused
// before any write (the next full bundle would delete it while reporting
// success); ids with URL metacharacters reach OPA under their own name.
func policyIDs(t *testing.T, h Harness) {
	for _, tc := range []struct{ name, id string }{
		// Catches: a NUL byte taken into an id (OPA would cut or refuse it half-way).
		{"nul_refused", "a\x00b.rego"},
		// Catches: unclean ids taken as they are.
		{"leading_slash_refused", "/x.rego"},
		{"double_slash_refused", "a//b.rego"},
		{"dot_segment_refused", "./x.rego"},
		{"parent_segment_refused", "../x.rego"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := h.New(t)
			ctx := context.Background()
			if err := s.Store.ApplyPolicy(ctx, Full("h1", map[string]string{"rbac/rbac.rego": RbacV1}, nil)); err != nil {
				t.Fatal(err)
			}
			before, writes := s.OPA.Snapshot(), 0
			if s.Writes != nil {
				writes = s.Writes()
			}
			err := s.Store.ApplyPolicy(ctx, Full("h2", map[string]string{tc.id: "package x\n\ny := 1\n"}, nil))
			if !isPolicyID(err) {
				t.Fatalf("err = %v, want *store.PolicyIDError", err)
			}
			if s.Writes != nil && s.Writes() != writes || s.OPA.Snapshot() != before {
				t.Fatal("store changed")
			}
		})
	}
	// Catches: an id sent unescaped ("?" would start a query).
	t.Run("segments_escaped", func(t *testing.T) {
		s := h.New(t)
		if err := s.Store.ApplyPolicy(context.Background(), Full("h1", map[string]string{"a b/c?.rego": "package x\n\ny := 1\n"}, nil)); err != nil {
			t.Fatal(err)
		}
		if code, body := s.OPA.Do("GET", "/v1/policies/a%20b/c%3F.rego", ""); code != 200 {
			t.Fatalf("policy not under its id: %d %s", code, body)
		}
	})
}

// health: a serving store is healthy, one whose OPA is gone is not.
func health(t *testing.T, h Harness) {
	s := h.New(t)
	ctx := context.Background()
	if err := s.Store.Health(ctx); err != nil {
		t.Fatalf("healthy store: %v", err)
	}
	s.Down()
	if err := s.Store.Health(ctx); err == nil {
		t.Fatal("store without its OPA reports healthy")
	}
}

// dataWrite covers the data updater's writes (protocol §5.1): PUT and PATCH
// at a path and at the root, split or not; bundle-owned data never
// clobbered; U3 for data: a write that fails leaves the store exactly as it
// was, and a later bundle still applies.
func dataWrite(t *testing.T, h Harness) {
	type step struct {
		w       dataupdater.Write
		wantErr func(error) bool
		get     string // path to read after the step
		want    string // its body
	}
	put := func(path, v string) dataupdater.Write {
		return dataupdater.Write{Path: dataupdater.SplitPath(path), Method: dataupdater.MethodPut, Value: Value(t, v)}
	}
	rootPut := func(v string, split bool) dataupdater.Write {
		return dataupdater.Write{Method: dataupdater.MethodPut, Value: Value(t, v), SplitRoot: split}
	}
	pat := func(path, ops string) dataupdater.Write {
		return dataupdater.Write{Path: dataupdater.SplitPath(path), Method: dataupdater.MethodPatch, Patch: Patch(t, ops)}
	}
	isPatch := func(err error) bool { var e *dataupdater.PatchError; return errors.As(err, &e) }
	isProt := func(err error) bool { var e *dataupdater.ProtectedPathError; return errors.As(err, &e) }
	isConflict := func(err error) bool { var e *dataupdater.RuleConflictError; return errors.As(err, &e) }
	isDecode := func(err error) bool { var e *dataupdater.DecodeError; return errors.As(err, &e) }
	const rootSplitFalse = "docs/data.md, the store table, row \"PUT root, split false\""
	users := put("/users", `{"bob":{"role":"admin"}}`)
	cases := []struct {
		name  string
		steps []step
		skip  map[string]string // kind -> the documented difference
	}{
		{name: "put_path", steps: []step{{w: users, get: "/v1/data/users", want: `{"result":{"bob":{"role":"admin"}}}`}}},
		{name: "put_deep_creates_parents", steps: []step{{w: put("/a/b/c", `1`), get: "/v1/data/a", want: `{"result":{"b":{"c":1}}}`}}},
		{name: "patch_path", steps: []step{{w: users}, {w: pat("/users", `[{"op":"add","path":"/alice","value":{"role":"viewer"}}]`),
			get: "/v1/data/users", want: `{"result":{"alice":{"role":"viewer"},"bob":{"role":"admin"}}}`}}},
		{name: "patch_null_written_as_is", steps: []step{{w: put("/users", `{"bob":1}`)}, {w: pat("/users", `[{"op":"add","path":"/al","value":null}]`),
			get: "/v1/data/users", want: `{"result":{"al":null,"bob":1}}`}}},
		// U3 for data: the first op applies, the second does not; nothing lands.
		// Guards "write the partly patched document" (mutation: ignore the ApplyPatch error).
		{name: "U3_bad_patch_leaves_data", steps: []step{{w: users}, {w: pat("/users", `[{"op":"add","path":"/carol","value":1},{"op":"remove","path":"/nobody"}]`),
			wantErr: isPatch, get: "/v1/data/users", want: `{"result":{"bob":{"role":"admin"}}}`}}},
		// Bundle-owned data is never clobbered, at, below or above it.
		// Guards the ownership check (mutation: drop the Protected call).
		{name: "owned_path_refused", steps: []step{{w: put("/rbac/roles", `[]`), wantErr: isProt, get: "/v1/data/rbac", want: `{"result":{"roles":["admin"]}}`}}},
		{name: "above_owned_path_refused", steps: []step{{w: put("/rbac", `{}`), wantErr: isProt, get: "/v1/data/rbac", want: `{"result":{"roles":["admin"]}}`}}},
		{name: "system_opal_refused", steps: []step{{w: put("/system/opal/policy_hash", `"x"`), wantErr: isProt, get: "/v1/data/system/opal/policy_hash", want: `{"result":"h1"}`}},
			skip: hashInOPA},
		// OPA refuses data where rules are; so does the store.
		// Guards the conflict check (mutation: skip CheckPathConflicts).
		{name: "rule_conflict_refused", steps: []step{{w: put("/app/rbac/allow", `true`), wantErr: isConflict, get: "/v1/data/app/rbac/allow", want: `{"result":false}`}},
			skip: map[string]string{REST: "the remote OPA refuses data where rules are itself (docs/data.md, Bundle data is never clobbered)"}},
		// Root, split: the object's keys are written, the others left alone.
		{name: "root_put_split_keeps_others", steps: []step{{w: users}, {w: rootPut(`{"groups":{"g":1}}`, true), get: "/v1/data",
			want: `{"result":{"app":{"rbac":{"allow":false}},"groups":{"g":1},"rbac":{"roles":["admin"]},"users":{"bob":{"role":"admin"}}}}`}}},
		// Root, not split: the data updater's part of the root is replaced;
		// bundle data and system.opal stay (GET /v1/data never shows system). Guards the SplitRoot branch
		// (mutation: keep every old key).
		{name: "root_put_replaces_unowned", steps: []step{{w: users}, {w: rootPut(`{"groups":{"g":1}}`, false), get: "/v1/data",
			want: `{"result":{"app":{"rbac":{"allow":false}},"groups":{"g":1},"rbac":{"roles":["admin"]}}}`},
			{w: put("/z", `1`), get: "/v1/data/system/opal/policy_hash", want: `{"result":"h1"}`}},
			skip: map[string]string{REST: "the REST store writes a root PUT key by key and keeps the other keys: " + rootSplitFalse}},
		// Root, not split, on OPA over REST: key by key, other keys kept.
		{name: "root_put_key_by_key", steps: []step{{w: put("/users", `1`)}, {w: rootPut(`{"g":2}`, false),
			get: "/v1/data", want: `{"result":{"app":{"rbac":{"allow":false}},"g":2,"rbac":{"roles":["admin"]},"users":1}}`}},
			skip: map[string]string{Embedded: "the embedded store replaces the unowned keys: " + rootSplitFalse}},
		{name: "root_put_owned_key_refused", steps: []step{{w: users}, {w: rootPut(`{"rbac":{},"groups":1}`, true), wantErr: isProt, get: "/v1/data/groups", want: `{}`}}},
		{name: "root_put_unsplit_owned_key_refused", steps: []step{{w: rootPut(`{"g":2,"rbac":1}`, false), wantErr: isProt, get: "/v1/data/g", want: `{}`}}},
		{name: "root_array_is_items", steps: []step{{w: rootPut(`[1,2]`, true), get: "/v1/data/items", want: `{"result":[1,2]}`}}},
		{name: "root_scalar_refused", steps: []step{{w: rootPut(`3`, true), wantErr: isDecode, get: "/v1/data/rbac", want: `{"result":{"roles":["admin"]}}`}}},
		{name: "root_patch", steps: []step{{w: users}, {w: pat("", `[{"op":"remove","path":"/users/bob"},{"op":"add","path":"/x","value":1}]`),
			get: "/v1/data/users", want: `{"result":{}}`}}},
		{name: "root_patch_add", steps: []step{{w: pat("", `[{"op":"add","path":"/g","value":1}]`), get: "/v1/data/g", want: `{"result":1}`}}},
		{name: "root_patch_owned_refused", steps: []step{{w: pat("", `[{"op":"add","path":"/x","value":1},{"op":"remove","path":"/rbac"}]`),
			wantErr: isProt, get: "/v1/data/x", want: `{}`}}},
		{name: "root_patch_owned_remove_refused", steps: []step{{w: pat("", `[{"op":"remove","path":"/rbac"}]`), wantErr: isProt, get: "/v1/data/rbac", want: `{"result":{"roles":["admin"]}}`}}},
		// Paths OPA's PATCH would read differently from RFC 6901 (it trims
		// slashes and %-unescapes: each of these reaches data.rbac) are
		// refused before the call; RFC 6901 makes them errors too.
		{name: "root_patch_unslashed_refused", steps: []step{{w: pat("", `[{"op":"remove","path":"rbac"}]`), wantErr: isPatch, get: "/v1/data/rbac", want: `{"result":{"roles":["admin"]}}`}}},
		{name: "root_patch_double_slash_refused", steps: []step{{w: pat("", `[{"op":"remove","path":"//rbac"}]`), wantErr: isPatch, get: "/v1/data/rbac", want: `{"result":{"roles":["admin"]}}`}}},
		{name: "root_patch_trailing_slash_refused", steps: []step{{w: pat("", `[{"op":"remove","path":"/rbac/"}]`), wantErr: isPatch, get: "/v1/data/rbac", want: `{"result":{"roles":["admin"]}}`}}},
		{name: "root_patch_escaped_refused", steps: []step{{w: pat("", `[{"op":"remove","path":"/%72bac"}]`), wantErr: isPatch, get: "/v1/data/rbac", want: `{"result":{"roles":["admin"]}}`}}},
		{name: "root_patch_slash_is_not_root", steps: []step{{w: pat("", `[{"op":"add","path":"/","value":{}}]`), wantErr: isPatch, get: "/v1/data/rbac", want: `{"result":{"roles":["admin"]}}`}},
			skip: map[string]string{Embedded: "RFC 6901 reads \"/\" as the top-level key \"\", which the embedded store writes; only OPA's PATCH reads it as the root (docs/data.md, after the store table)"}},
		{name: "patch_unsupported_op_refused", steps: []step{{w: put("/users", `{"a":1}`)}, {w: pat("/users", `[{"op":"copy","from":"/a","path":"/b"}]`), wantErr: isPatch, get: "/v1/data/users", want: `{"result":{"a":1}}`}},
			skip: map[string]string{Embedded: "the embedded store applies every RFC 6902 operation; OPA's PATCH supports no move, copy or test (docs/data.md, after the store table)"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h.differs(t, tc.skip)
			s := h.New(t)
			ctx := context.Background()
			if err := s.Store.ApplyPolicy(ctx, Full("h1", map[string]string{"rbac/rbac.rego": RbacV1},
				map[string]string{"rbac": `{"roles":["admin"]}`})); err != nil {
				t.Fatal(err)
			}
			for i, sp := range tc.steps {
				before := s.OPA.Snapshot()
				err := s.Store.WriteData(ctx, sp.w)
				switch {
				case sp.wantErr == nil && err != nil:
					t.Fatalf("step %d: %v", i, err)
				case sp.wantErr != nil && !sp.wantErr(err):
					t.Fatalf("step %d: error %v, want another", i, err)
				case sp.wantErr != nil:
					if after := s.OPA.Snapshot(); after != before {
						t.Fatalf("step %d: failed write changed the store:\n%s\n->\n%s", i, before, after)
					}
				}
				if sp.get != "" {
					if got := s.OPA.Get(sp.get); got != sp.want {
						t.Fatalf("step %d: GET %s = %s, want %s", i, sp.get, got, sp.want)
					}
				}
			}
			// A later bundle still applies: data writes never break it.
			if err := s.Store.ApplyPolicy(ctx, Full("h2", map[string]string{"rbac/rbac.rego": RbacV2},
				map[string]string{"rbac": `{"roles":["viewer"]}`})); err != nil {
				t.Fatalf("bundle after data writes: %v", err)
			}
		})
	}
}
