package oparest

import (
	"context"
	"errors"
	"testing"

	"github.com/opal-go/opal-client/internal/dataupdater"
	st "github.com/opal-go/opal-client/internal/store/storetest"
)

// TestDataWrite covers the REST store's data writes (protocol §5.1) against
// a real OPA: PUT and PATCH, the root key by key, bundle data never touched,
// a patch OPA refuses leaving the data as it was (U3).
func TestDataWrite(t *testing.T) {
	isProt := func(err error) bool { var e *dataupdater.ProtectedPathError; return errors.As(err, &e) }
	isPatch := func(err error) bool { var e *dataupdater.PatchError; return errors.As(err, &e) }
	put := func(path, v string) dataupdater.Write {
		return dataupdater.Write{Path: dataupdater.SplitPath(path), Method: dataupdater.MethodPut, Value: st.Value(t, v)}
	}
	pat := func(path, ops string) dataupdater.Write {
		return dataupdater.Write{Path: dataupdater.SplitPath(path), Method: dataupdater.MethodPatch, Patch: st.Patch(t, ops)}
	}
	type step struct {
		w         dataupdater.Write
		wantErr   func(error) bool
		get, want string
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"put", []step{{w: put("/users", `{"bob":1}`), get: "/v1/data/users", want: `{"result":{"bob":1}}`}}},
		{"patch", []step{{w: put("/users", `{"bob":1}`)}, {w: pat("/users", `[{"op":"add","path":"/al","value":null}]`),
			get: "/v1/data/users", want: `{"result":{"al":null,"bob":1}}`}}},
		{"U3_bad_patch_leaves_data", []step{{w: put("/users", `{"bob":1}`)}, {w: pat("/users", `[{"op":"add","path":"/c","value":2},{"op":"remove","path":"/nobody"}]`),
			wantErr: isPatch, get: "/v1/data/users", want: `{"result":{"bob":1}}`}}},
		// Guards the ownership check (mutation: drop the Protected call).
		{"owned_refused", []step{{w: put("/rbac", `{}`), wantErr: isProt, get: "/v1/data/rbac", want: `{"result":{"roles":["admin"]}}`}}},
		{"root_put_key_by_key", []step{{w: put("/users", `1`)}, {w: dataupdater.Write{Method: dataupdater.MethodPut, Value: st.Value(t, `{"g":2}`)},
			get: "/v1/data", want: `{"result":{"app":{"rbac":{"allow":false}},"g":2,"rbac":{"roles":["admin"]},"users":1}}`}}},
		{"root_put_owned_refused", []step{{w: dataupdater.Write{Method: dataupdater.MethodPut, Value: st.Value(t, `{"g":2,"rbac":1}`)},
			wantErr: isProt, get: "/v1/data/g", want: `{}`}}},
		{"root_patch_owned_refused", []step{{w: pat("", `[{"op":"remove","path":"/rbac"}]`), wantErr: isProt, get: "/v1/data/rbac", want: `{"result":{"roles":["admin"]}}`}}},
		{"root_patch", []step{{w: pat("", `[{"op":"add","path":"/g","value":1}]`), get: "/v1/data/g", want: `{"result":1}`}}},
		// OPA trims slashes from a patch path and %-unescapes it: each of
		// these reaches data.rbac, so it is refused before the call.
		{"root_patch_unslashed_refused", []step{{w: pat("", `[{"op":"remove","path":"rbac"}]`), wantErr: isPatch, get: "/v1/data/rbac", want: `{"result":{"roles":["admin"]}}`}}},
		{"root_patch_double_slash_refused", []step{{w: pat("", `[{"op":"remove","path":"//rbac"}]`), wantErr: isPatch, get: "/v1/data/rbac", want: `{"result":{"roles":["admin"]}}`}}},
		{"root_patch_trailing_slash_refused", []step{{w: pat("", `[{"op":"remove","path":"/rbac/"}]`), wantErr: isPatch, get: "/v1/data/rbac", want: `{"result":{"roles":["admin"]}}`}}},
		{"root_patch_escaped_refused", []step{{w: pat("", `[{"op":"remove","path":"/%72bac"}]`), wantErr: isPatch, get: "/v1/data/rbac", want: `{"result":{"roles":["admin"]}}`}}},
		{"root_patch_slash_is_not_root", []step{{w: pat("", `[{"op":"add","path":"/","value":{}}]`), wantErr: isPatch, get: "/v1/data/rbac", want: `{"result":{"roles":["admin"]}}`}}},
		{"patch_unsupported_op_refused", []step{{w: put("/users", `{"a":1}`)}, {w: pat("/users", `[{"op":"copy","from":"/a","path":"/b"}]`), wantErr: isPatch, get: "/v1/data/users", want: `{"result":{"a":1}}`}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRemote(t)
			s := newStore(t, r, Options{})
			ctx := context.Background()
			if err := s.ApplyPolicy(ctx, st.Full("h1", map[string]string{"rbac/rbac.rego": rbacV1},
				map[string]string{"rbac": `{"roles":["admin"]}`})); err != nil {
				t.Fatal(err)
			}
			for i, sp := range tc.steps {
				before := r.opa.Snapshot()
				err := s.WriteData(ctx, sp.w)
				switch {
				case sp.wantErr == nil && err != nil:
					t.Fatalf("step %d: %v", i, err)
				case sp.wantErr != nil && !sp.wantErr(err):
					t.Fatalf("step %d: error %v, want another", i, err)
				case sp.wantErr != nil:
					if after := r.opa.Snapshot(); after != before {
						t.Fatalf("step %d: failed write changed OPA:\n%s\n->\n%s", i, before, after)
					}
				}
				if sp.get != "" {
					if got := r.opa.Get(sp.get); got != sp.want {
						t.Fatalf("step %d: GET %s = %s, want %s", i, sp.get, got, sp.want)
					}
				}
			}
		})
	}
}

// TestPatchNotRetried: a JSON-Patch is not idempotent (an "add" at "/-"
// appends again), so a PATCH whose answer is lost is not sent again: the
// entry fails and the data updater re-fetches or defers it.
func TestPatchNotRetried(t *testing.T) {
	r := newRemote(t)
	s := newStore(t, r, Options{Attempts: 3})
	ctx := context.Background()
	if err := s.WriteData(ctx, dataupdater.Write{Path: []string{"users"}, Method: dataupdater.MethodPut, Value: st.Value(t, `{"l":[]}`)}); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.lostPatch = true
	r.mu.Unlock()
	err := s.WriteData(ctx, dataupdater.Write{Path: []string{"users"}, Method: dataupdater.MethodPatch,
		Patch: st.Patch(t, `[{"op":"add","path":"/l/-","value":1}]`)})
	var re *RemoteError
	if !errors.As(err, &re) || re.Status != 500 {
		t.Fatalf("err = %v, want the 500", err)
	}
	// Catches: retrying a PATCH like an idempotent call.
	t.Run("patch_sent_once", func(t *testing.T) {
		r.mu.Lock()
		n := r.patches
		r.mu.Unlock()
		if n != 1 {
			t.Fatalf("%d PATCH requests, want 1", n)
		}
		if got := r.opa.Get("/v1/data/users"); got != `{"result":{"l":[1]}}` {
			t.Fatalf("users = %s", got)
		}
	})
}
