package embedded

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/opal-go/opal-client/internal/store"
	st "github.com/opal-go/opal-client/internal/store/storetest"
	"github.com/opal-go/opal-client/updater"
)

const (
	rbacV1 = "package app.rbac\n\ndefault allow := false\n\nallow if input.user == \"alice\"\n"
	rbacV2 = "package app.rbac\n\ndefault allow := false\n\nallow if input.user == \"bob\"\n"
	extra  = "package app.extra\n\nx := data.extra.value\n"
	broken = "package app.rbac\n\nallow if {\n" // does not parse
	// unsafe: parses, fails to compile (unsafe variable).
	unsafe = "package app.bad\n\nallow if y > 1\n"
)

func newStore(t *testing.T, ignore ...string) (*Store, st.OPA) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := New(ctx, Options{Addr: "127.0.0.1:0", PolicyPathsToIgnore: ignore})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	return s, st.OPA{T: t, Base: "http://" + s.Addr()}
}

func decide(t *testing.T, o st.OPA, user string) string {
	t.Helper()
	code, body := o.Do("POST", "/v1/data/app/rbac/allow", `{"input":{"user":"`+user+`"}}`)
	if code != 200 {
		t.Fatalf("decision: %d %s", code, body)
	}
	return body
}

// TestBundleSequence covers full -> delta -> full with deleted policy and data
// files, the hash kept by the store and exposed in OPA.
func TestBundleSequence(t *testing.T) {
	s, o := newStore(t)
	ctx := context.Background()

	// Full.
	if err := s.ApplyPolicy(ctx, st.Full("h1", map[string]string{"rbac/rbac.rego": rbacV1, "extra/extra.rego": extra},
		map[string]string{"extra": `{"value": 1}`, "rbac": `{"roles": ["admin"]}`})); err != nil {
		t.Fatal(err)
	}
	if got := decide(t, o, "alice"); got != `{"result":true}` {
		t.Fatalf("after full: alice = %s", got)
	}
	if got := o.Get("/v1/data/app/extra/x"); got != `{"result":1}` {
		t.Fatalf("data via rule: %s", got)
	}
	if got := o.Get("/v1/data/system/opal/policy_hash"); got != `{"result":"h1"}` {
		t.Fatalf("hash in OPA: %s", got)
	}
	if h, _ := s.PolicyHash(ctx); h != "h1" {
		t.Fatalf("PolicyHash = %q", h)
	}

	// Delta: change rbac, delete extra's policy and data.
	if err := s.ApplyPolicy(ctx, st.Delta("h1", "h2", map[string]string{"rbac/rbac.rego": rbacV2}, nil,
		[]string{"extra/extra.rego"}, []string{"extra"})); err != nil {
		t.Fatal(err)
	}
	if got := decide(t, o, "bob"); got != `{"result":true}` {
		t.Fatalf("after delta: bob = %s", got)
	}
	if code, body := o.Do("GET", "/v1/policies/extra/extra.rego", ""); code != 404 {
		t.Fatalf("deleted policy still there: %d %s", code, body)
	}
	if got := o.Get("/v1/data/extra"); got != `{}` {
		t.Fatalf("deleted data file still there: %s", got)
	}
	if got := o.Get("/v1/data/rbac/roles"); got != `{"result":["admin"]}` {
		t.Fatalf("untouched data lost: %s", got)
	}

	// Full again, without the rbac data.json: its data goes (the Python client keeps it).
	if err := s.ApplyPolicy(ctx, st.Full("h3", map[string]string{"rbac/rbac.rego": rbacV1}, nil)); err != nil {
		t.Fatal(err)
	}
	if got := decide(t, o, "alice"); got != `{"result":true}` {
		t.Fatalf("after 2nd full: alice = %s", got)
	}
	if got := o.Get("/v1/data/rbac"); got != `{}` {
		t.Fatalf("data of a removed data.json kept: %s", got)
	}
	if got := o.Get("/v1/data/system/opal/policy_hash"); got != `{"result":"h3"}` {
		t.Fatalf("hash in OPA: %s", got)
	}
}

// TestU3_AllOrNothing: a bundle that fails leaves every decision byte-identical.
func TestU3_AllOrNothing(t *testing.T) {
	s, o := newStore(t)
	ctx := context.Background()
	if err := s.ApplyPolicy(ctx, st.Full("h1", map[string]string{"rbac/rbac.rego": rbacV1, "extra/extra.rego": extra},
		map[string]string{"extra": `{"value": 1}`})); err != nil {
		t.Fatal(err)
	}
	before := o.Snapshot()

	for _, tc := range []struct {
		name    string
		bundle  func() error
		wantErr func(error) bool
	}{
		{"U3_parse_error", func() error {
			return s.ApplyPolicy(ctx, st.Full("h2", map[string]string{"rbac/rbac.rego": broken}, map[string]string{"extra": `{"value": 2}`}))
		}, isCompile},
		// Catches: dropping the c.Failed() check in store.Compile.
		{"U3_compile_error", func() error {
			return s.ApplyPolicy(ctx, st.Full("h2", map[string]string{"rbac/rbac.rego": rbacV2, "bad/bad.rego": unsafe}, map[string]string{"extra": `{"value": 2}`}))
		}, isCompile},
		// Catches: compiling without the data path-conflict check.
		{"U3_rule_data_conflict", func() error {
			return s.ApplyPolicy(ctx, st.Full("h2", map[string]string{"rbac/rbac.rego": rbacV2}, map[string]string{"app/rbac": `{"allow": true}`}))
		}, isCompile},
		// Catches: skipping invalid data JSON instead of rejecting the bundle.
		{"U3_invalid_data_json", func() error {
			return s.ApplyPolicy(ctx, st.Full("h2", map[string]string{"rbac/rbac.rego": rbacV2}, map[string]string{"extra": `{"value": `}))
		}, isData},
		// Catches: root data keys taken as ownership keys whatever they hold
		// ("a/b" would read as the path a.b, "" as the root).
		// Catches: data.json text after the first JSON value ignored (the
		// decoder reads one value; json.Unmarshal refused the rest).
		{"data_trailing_text_refused", func() error {
			return s.ApplyPolicy(ctx, st.Full("h2", map[string]string{"rbac/rbac.rego": rbacV2}, map[string]string{"extra": `{"value": 2} {"value": 3}`}))
		}, isData},
		{"F6_root_key_with_slash_refused", func() error {
			return s.ApplyPolicy(ctx, st.Full("h2", map[string]string{"rbac/rbac.rego": rbacV1}, map[string]string{".": `{"a/b": 1}`}))
		}, isData},
		{"F6_root_key_empty_refused", func() error {
			return s.ApplyPolicy(ctx, st.Full("h2", map[string]string{"rbac/rbac.rego": rbacV1}, map[string]string{".": `{"": 1}`}))
		}, isData},
		{"U3_delta_compile_error", func() error {
			return s.ApplyPolicy(ctx, st.Delta("h1", "h2", map[string]string{"bad/bad.rego": unsafe}, map[string]string{"extra": `{"value": 3}`}, []string{"rbac/rbac.rego"}, nil))
		}, isCompile},
		// Catches: a delta no longer checked against the current hash.
		{"delta_wrong_base_refused", func() error {
			return s.ApplyPolicy(ctx, st.Delta("h0", "h2", map[string]string{"rbac/rbac.rego": rbacV2}, nil, nil, nil))
		}, isBase},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.bundle()
			if err == nil || !tc.wantErr(err) {
				t.Fatalf("err = %v (%T)", err, err)
			}
			if after := o.Snapshot(); after != before {
				t.Fatalf("store changed:\nbefore %s\nafter  %s", before, after)
			}
			if h, _ := s.PolicyHash(ctx); h != "h1" {
				t.Fatalf("hash = %q", h)
			}
		})
	}
}

func isCompile(err error) bool { var e *store.CompileError; return errors.As(err, &e) }
func isData(err error) bool    { var e *store.DataError; return errors.As(err, &e) }
func isBase(err error) bool {
	var e *updater.BaseMismatchError
	return errors.As(err, &e) && e.Current == "h1" && e.Base == "h0"
}

// TestFullBundleLeavesUnmanaged: ignored ids and system.* modules survive a full bundle.
func TestFullBundleLeavesUnmanaged(t *testing.T) {
	s, o := newStore(t, "keep/**", "!keep/not-this.rego")
	ctx := context.Background()
	o.Must("PUT", "/v1/policies/keep/mine.rego", "package keep.mine\n\nx := 1\n", 200)
	o.Must("PUT", "/v1/policies/keep/not-this.rego", "package keep.not\n\nx := 1\n", 200)
	o.Must("PUT", "/v1/policies/sys.rego", "package system.custom\n\nx := 1\n", 200)
	o.Must("PUT", "/v1/policies/other.rego", "package other\n\nx := 1\n", 200)
	if err := s.ApplyPolicy(ctx, st.Full("h1", map[string]string{"rbac/rbac.rego": rbacV1, "keep/mine.rego": "package keep.mine\n\nx := 2\n"}, nil)); err != nil {
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
	t.Run("ignored_id_not_overwritten", func(t *testing.T) {
		if got := o.Get("/v1/data/keep/mine/x"); got != `{"result":1}` {
			t.Fatalf("ignored module overwritten: %s", got)
		}
	})
}

// TestRootData: a root data.json replaces only the keys bundles own.
func TestRootData(t *testing.T) {
	s, o := newStore(t)
	ctx := context.Background()
	o.Must("PUT", "/v1/data/users", `{"bob": "admin"}`, 204)
	if err := s.ApplyPolicy(ctx, st.Full("h1", map[string]string{"rbac/rbac.rego": rbacV1},
		map[string]string{".": `{"a": 1, "b": {"c": 2}}`, "b/d": `{"e": 3}`})); err != nil {
		t.Fatal(err)
	}
	if got := o.Get("/v1/data/b"); got != `{"result":{"c":2,"d":{"e":3}}}` {
		t.Fatalf("root + nested: %s", got)
	}
	if err := s.ApplyPolicy(ctx, st.Full("h2", map[string]string{"rbac/rbac.rego": rbacV1},
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
		if err := s.ApplyPolicy(ctx, st.Full("h3", nil, map[string]string{".": `[1,2]`})); err != nil {
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

func TestHealthAndShutdown(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	if err := s.Health(ctx); err != nil {
		t.Fatalf("healthy store: %v", err)
	}
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Health(ctx); err == nil {
		t.Fatal("shut down store reports healthy")
	}
}

// TestU3_DeltaRewriteKeepsNestedOwnedData: a delta that rewrites or deletes
// data.a keeps data.a.b, which another data.json owns and the delta leaves
// alone (a replace at data.a would remove it).
func TestU3_DeltaRewriteKeepsNestedOwnedData(t *testing.T) {
	for _, tc := range []struct {
		name    string
		delta   map[string]string
		deleted []string
		want    string // GET /v1/data/a
		wantErr bool
	}{
		// Catches: not composing the kept data into the rewrite.
		{"rewrite_keeps_nested", map[string]string{"a": `{"x":9}`}, nil, `{"result":{"b":{"y":2},"x":9}}`, false},
		// Catches: deleting data.a with data.a.b still owned.
		{"delete_keeps_nested", nil, []string{"a"}, `{"result":{"b":{"y":2}}}`, false},
		{"rewrite_nested_too", map[string]string{"a": `{"x":9}`, "a/b": `{"y":3}`}, nil, `{"result":{"b":{"y":3},"x":9}}`, false},
		{"rewrite_not_object_refused", map[string]string{"a": `[1]`}, nil, `{"result":{"b":{"y":2},"x":1}}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, o := newStore(t)
			ctx := context.Background()
			if err := s.ApplyPolicy(ctx, st.Full("h1", nil, map[string]string{"a": `{"x":1}`, "a/b": `{"y":2}`})); err != nil {
				t.Fatal(err)
			}
			err := s.ApplyPolicy(ctx, st.Delta("h1", "h2", nil, tc.delta, nil, tc.deleted))
			if tc.wantErr != isData(err) || !tc.wantErr && err != nil {
				t.Fatalf("err = %v", err)
			}
			if got := o.Get("/v1/data/a"); got != tc.want {
				t.Fatalf("data.a = %s, want %s", got, tc.want)
			}
		})
	}
}
