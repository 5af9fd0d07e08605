package embedded

import (
	"context"
	"errors"
	"testing"

	"github.com/opal-go/opal-client/internal/dataupdater"
	st "github.com/opal-go/opal-client/internal/store/storetest"
)

// TestDataWrite covers the embedded store's data writes (issue 7 item 4):
// PUT and PATCH at a path and at the root, split or not, and U3 for data: a
// write that fails leaves the store exactly as it was.
func TestDataWrite(t *testing.T) {
	type step struct {
		w       dataupdater.Write
		wantErr func(error) bool
		get     string // path to read after the step
		want    string // its body
	}
	put := func(path, v string) dataupdater.Write {
		return dataupdater.Write{Path: dataupdater.SplitPath(path), Method: dataupdater.MethodPut, Value: st.Value(t, v)}
	}
	rootPut := func(v string, split bool) dataupdater.Write {
		return dataupdater.Write{Method: dataupdater.MethodPut, Value: st.Value(t, v), SplitRoot: split}
	}
	pat := func(path, ops string) dataupdater.Write {
		return dataupdater.Write{Path: dataupdater.SplitPath(path), Method: dataupdater.MethodPatch, Patch: st.Patch(t, ops)}
	}
	isPatch := func(err error) bool { var e *dataupdater.PatchError; return errors.As(err, &e) }
	isProt := func(err error) bool { var e *dataupdater.ProtectedPathError; return errors.As(err, &e) }
	isConflict := func(err error) bool { var e *dataupdater.RuleConflictError; return errors.As(err, &e) }
	isDecode := func(err error) bool { var e *dataupdater.DecodeError; return errors.As(err, &e) }
	users := put("/users", `{"bob":{"role":"admin"}}`)
	cases := []struct {
		name  string
		steps []step
	}{
		{"put_path", []step{{w: users, get: "/v1/data/users", want: `{"result":{"bob":{"role":"admin"}}}`}}},
		{"put_deep_creates_parents", []step{{w: put("/a/b/c", `1`), get: "/v1/data/a", want: `{"result":{"b":{"c":1}}}`}}},
		{"patch_path", []step{{w: users}, {w: pat("/users", `[{"op":"add","path":"/alice","value":{"role":"viewer"}}]`),
			get: "/v1/data/users", want: `{"result":{"alice":{"role":"viewer"},"bob":{"role":"admin"}}}`}}},
		// U3 for data: the first op applies, the second does not; nothing lands.
		// Guards "write the partly patched document" (mutation: ignore the ApplyPatch error).
		{"U3_bad_patch_leaves_data", []step{{w: users}, {w: pat("/users", `[{"op":"add","path":"/carol","value":1},{"op":"remove","path":"/nobody"}]`),
			wantErr: isPatch, get: "/v1/data/users", want: `{"result":{"bob":{"role":"admin"}}}`}}},
		// Bundle-owned data is never clobbered, at, below or above it.
		// Guards the ownership check (mutation: drop the Protected call).
		{"owned_path_refused", []step{{w: put("/rbac/roles", `[]`), wantErr: isProt, get: "/v1/data/rbac", want: `{"result":{"roles":["admin"]}}`}}},
		{"above_owned_path_refused", []step{{w: put("/rbac", `{}`), wantErr: isProt, get: "/v1/data/rbac", want: `{"result":{"roles":["admin"]}}`}}},
		{"system_opal_refused", []step{{w: put("/system/opal/policy_hash", `"x"`), wantErr: isProt, get: "/v1/data/system/opal/policy_hash", want: `{"result":"h1"}`}}},
		// OPA refuses data where rules are; so does the store.
		// Guards the conflict check (mutation: skip CheckPathConflicts).
		{"rule_conflict_refused", []step{{w: put("/app/rbac/allow", `true`), wantErr: isConflict, get: "/v1/data/app/rbac/allow", want: `{"result":false}`}}},
		// Root, split: the object's keys are written, the others left alone.
		{"root_put_split_keeps_others", []step{{w: users}, {w: rootPut(`{"groups":{"g":1}}`, true), get: "/v1/data",
			want: `{"result":{"app":{"rbac":{"allow":false}},"groups":{"g":1},"rbac":{"roles":["admin"]},"users":{"bob":{"role":"admin"}}}}`}}},
		// Root, not split: the data updater's part of the root is replaced;
		// bundle data and system.opal stay (GET /v1/data never shows system). Guards the SplitRoot branch
		// (mutation: keep every old key).
		{"root_put_replaces_unowned", []step{{w: users}, {w: rootPut(`{"groups":{"g":1}}`, false), get: "/v1/data",
			want: `{"result":{"app":{"rbac":{"allow":false}},"groups":{"g":1},"rbac":{"roles":["admin"]}}}`},
			{w: put("/z", `1`), get: "/v1/data/system/opal/policy_hash", want: `{"result":"h1"}`}}},
		{"root_put_owned_key_refused", []step{{w: users}, {w: rootPut(`{"rbac":{},"groups":1}`, true), wantErr: isProt, get: "/v1/data/groups", want: `{}`}}},
		{"root_array_is_items", []step{{w: rootPut(`[1,2]`, true), get: "/v1/data/items", want: `{"result":[1,2]}`}}},
		{"root_scalar_refused", []step{{w: rootPut(`3`, true), wantErr: isDecode, get: "/v1/data/rbac", want: `{"result":{"roles":["admin"]}}`}}},
		{"root_patch", []step{{w: users}, {w: pat("", `[{"op":"remove","path":"/users/bob"},{"op":"add","path":"/x","value":1}]`),
			get: "/v1/data/users", want: `{"result":{}}`}}},
		{"root_patch_owned_refused", []step{{w: pat("", `[{"op":"add","path":"/x","value":1},{"op":"remove","path":"/rbac"}]`),
			wantErr: isProt, get: "/v1/data/x", want: `{}`}}},
		// Paths as OPA's PATCH would read them are RFC 6901 errors here.
		{"root_patch_unslashed_refused", []step{{w: pat("", `[{"op":"remove","path":"rbac"}]`), wantErr: isPatch, get: "/v1/data/rbac", want: `{"result":{"roles":["admin"]}}`}}},
		{"root_patch_double_slash_refused", []step{{w: pat("", `[{"op":"remove","path":"//rbac"}]`), wantErr: isPatch, get: "/v1/data/rbac", want: `{"result":{"roles":["admin"]}}`}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, o := newStore(t)
			ctx := context.Background()
			if err := s.ApplyPolicy(ctx, st.Full("h1", map[string]string{"rbac/rbac.rego": rbacV1},
				map[string]string{"rbac": `{"roles":["admin"]}`})); err != nil {
				t.Fatal(err)
			}
			for i, sp := range tc.steps {
				before := o.Snapshot()
				err := s.WriteData(ctx, sp.w)
				switch {
				case sp.wantErr == nil && err != nil:
					t.Fatalf("step %d: %v", i, err)
				case sp.wantErr != nil && !sp.wantErr(err):
					t.Fatalf("step %d: error %v, want another", i, err)
				case sp.wantErr != nil:
					if after := o.Snapshot(); after != before {
						t.Fatalf("step %d: failed write changed the store:\n%s\n->\n%s", i, before, after)
					}
				}
				if sp.get != "" {
					if got := o.Get(sp.get); got != sp.want {
						t.Fatalf("step %d: GET %s = %s, want %s", i, sp.get, got, sp.want)
					}
				}
			}
			// A later bundle still applies: data writes never break it.
			if err := s.ApplyPolicy(ctx, st.Full("h2", map[string]string{"rbac/rbac.rego": rbacV2},
				map[string]string{"rbac": `{"roles":["viewer"]}`})); err != nil {
				t.Fatalf("bundle after data writes: %v", err)
			}
		})
	}
}
