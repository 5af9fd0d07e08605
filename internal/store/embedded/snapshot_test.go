package embedded

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/storage"

	"github.com/opal-go/opal-client/internal/backup"
	"github.com/opal-go/opal-client/internal/store"
	st "github.com/opal-go/opal-client/internal/store/storetest"
)

var taken = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// loaded is a store with a bundle (policy, bundle data with awkward numbers)
// and data written through OPA's REST API as the data updater would.
func loaded(t *testing.T) (*Store, st.OPA) {
	t.Helper()
	s, o := newStore(t)
	if err := s.ApplyPolicy(context.Background(), st.Full("h1",
		map[string]string{"rbac/rbac.rego": rbacV1, "extra/extra.rego": extra},
		map[string]string{"extra": `{"value": 1e20}`, "rbac": `{"roles": ["admin"], "n": [1.5, 12345678901234567890, 0.1, -0, 1e-7]}`})); err != nil {
		t.Fatal(err)
	}
	o.Must("PUT", "/v1/data/users", `{"big": 12345678901234567890, "f": 1e20, "s": "<&>"}`, 204)
	// Bundle data and OPA's REST API decode numbers as json.Number; a Go
	// float64 in the store must still export as OPA prints it (1e+20).
	ctx := context.Background()
	txn, err := s.opa.NewTransaction(ctx, storage.WriteParams)
	if err != nil {
		t.Fatal(err)
	}
	if err := put(ctx, s.opa, txn, storage.Path{"floats"}, map[string]any{"f": 1e20, "g": 0.1}); err != nil {
		t.Fatal(err)
	}
	if err := s.opa.Commit(ctx, txn); err != nil {
		t.Fatal(err)
	}
	return s, o
}

// TestBackupRoundTrip: Export -> Write -> Read -> Import in a fresh store
// decides byte for byte the same and continues from the restored hash.
func TestBackupRoundTrip(t *testing.T) {
	ctx := context.Background()
	s1, o1 := loaded(t)
	state, err := s1.Export(ctx)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "opa.json")
	if err := backup.Write(path, state, taken); err != nil {
		t.Fatal(err)
	}
	restored, _, err := backup.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	s2, o2 := newStore(t)
	if err := s2.Import(ctx, restored); err != nil {
		t.Fatal(err)
	}

	// Catches: exporting float64 numbers in encoding/json's form.
	t.Run("decisions_byte_identical", func(t *testing.T) {
		if a, b := o1.Snapshot(), o2.Snapshot(); a != b {
			t.Fatalf("restored store differs:\nbefore %s\nafter  %s", a, b)
		}
		if got := decide(t, o2, "alice"); got != `{"result":true}` {
			t.Fatalf("alice = %s", got)
		}
	})
	// Catches: dropping the store's own documents from Import's new root.
	t.Run("opa_version_document_kept", func(t *testing.T) {
		if got := o2.Get("/v1/data/system/version/version"); !strings.Contains(got, `"result":"`) {
			t.Fatalf("system.version lost: %s", got)
		}
	})
	t.Run("hash_not_duplicated_in_data", func(t *testing.T) {
		if strings.Contains(string(state.Data), "policy_hash") || strings.Contains(string(state.Data), "system") {
			t.Fatalf("exported data holds the hash: %s", state.Data)
		}
	})
	// Catches: Import not setting the store's hash (the first fetch
	// could not be a delta on it).
	t.Run("restored_hash_is_delta_base", func(t *testing.T) {
		if h, _ := s2.PolicyHash(ctx); h != "h1" {
			t.Fatalf("PolicyHash = %q", h)
		}
		if err := s2.ApplyPolicy(ctx, st.Delta("h1", "h2", map[string]string{"rbac/rbac.rego": rbacV2}, nil, nil, nil)); err != nil {
			t.Fatal(err)
		}
		if got := decide(t, o2, "bob"); got != `{"result":true}` {
			t.Fatalf("bob = %s", got)
		}
	})
	// Catches: Import not restoring data ownership (a later full bundle
	// without a data.json would leave its data behind).
	t.Run("ownership_restored", func(t *testing.T) {
		if err := s2.ApplyPolicy(ctx, st.Full("h3", map[string]string{"rbac/rbac.rego": rbacV1}, nil)); err != nil {
			t.Fatal(err)
		}
		if got := o2.Get("/v1/data/rbac"); got != `{}` {
			t.Fatalf("owned data kept: %s", got)
		}
		if got := o2.Get("/v1/data/users/s"); got != `{"result":"\u003c\u0026\u003e"}` && got != `{"result":"<&>"}` {
			t.Fatalf("unowned data lost: %s", got)
		}
	})
}

// TestImportRefused: a backup that cannot be loaded leaves the store exactly
// as it was (here: empty), with no hash (U3).
func TestImportRefused(t *testing.T) {
	ctx := context.Background()
	s1, _ := loaded(t)
	good, err := s1.Export(ctx)
	if err != nil {
		t.Fatal(err)
	}
	with := func(f func(*backup.State)) *backup.State {
		c := *good
		c.Policies = map[string]string{}
		for k, v := range good.Policies {
			c.Policies[k] = v
		}
		f(&c)
		return &c
	}
	s, o := newStore(t)
	empty := o.Snapshot()
	for _, tc := range []struct {
		name  string
		state *backup.State
		want  func(error) bool
	}{
		{"nil", nil, func(err error) bool { return err != nil }},
		{"parse_error", with(func(b *backup.State) { b.Policies["rbac/rbac.rego"] = broken }), isCompile},
		// Catches: Import committing without the compile.
		{"compile_error", with(func(b *backup.State) { b.Policies["bad/bad.rego"] = unsafe }), isCompile},
		{"rule_data_conflict", with(func(b *backup.State) { b.Data = json.RawMessage(`{"app":{"rbac":{"allow":true}}}`) }), isCompile},
		{"data_not_object", with(func(b *backup.State) { b.Data = json.RawMessage(`[1]`) }), isData},
		{"data_not_json", with(func(b *backup.State) { b.Data = json.RawMessage(`{`) }), isData},
		{"empty_policy_id", with(func(b *backup.State) { b.Policies[""] = rbacV1 }), func(err error) bool { return err != nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := s.Import(ctx, tc.state); !tc.want(err) {
				t.Fatalf("err = %v (%T)", err, err)
			}
			if after := o.Snapshot(); after != empty {
				t.Fatalf("store changed:\n%s", after)
			}
			if h, _ := s.PolicyHash(ctx); h != "" {
				t.Fatalf("hash = %q", h)
			}
		})
	}
}

// TestExportLeavesUnmanaged: ignored ids and the health policy are not in a
// backup, and Import neither writes nor removes them; other modules are
// replaced by the backup's.
func TestExportLeavesUnmanaged(t *testing.T) {
	ctx := context.Background()
	s1, o1 := newStore(t, "keep/**")
	if err := s1.SetHealthPolicy(ctx, "package system.opal\n\nready := true\n"); err != nil {
		t.Fatal(err)
	}
	o1.Must("PUT", "/v1/policies/keep/mine.rego", "package keep.mine\n\nx := 1\n", 200)
	if err := s1.ApplyPolicy(ctx, st.Full("h1", map[string]string{"rbac/rbac.rego": rbacV1}, nil)); err != nil {
		t.Fatal(err)
	}
	state, err := s1.Export(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Catches: exporting ignored modules.
	t.Run("ignored_and_health_not_exported", func(t *testing.T) {
		if len(state.Policies) != 1 || state.Policies["rbac/rbac.rego"] != rbacV1 {
			t.Fatalf("policies = %v", state.Policies)
		}
	})

	s2, o2 := newStore(t, "keep/**")
	o2.Must("PUT", "/v1/policies/keep/other.rego", "package keep.other\n\nx := 2\n", 200)
	o2.Must("PUT", "/v1/policies/stale.rego", "package stale\n\nx := 3\n", 200)
	if err := s2.Import(ctx, state); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, id string
		code     int
	}{
		{"ignored_kept", "keep/other.rego", 200},
		// Catches: Import only upserting (the state would not be the backup's).
		{"unmanaged_removed", "stale.rego", 404},
		{"restored", "rbac/rbac.rego", 200},
		{"health_not_restored", store.HealthPolicyID, 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code, body := o2.Do("GET", "/v1/policies/"+tc.id, ""); code != tc.code {
				t.Fatalf("%s: %d %s", tc.id, code, body)
			}
		})
	}
}

// TestShutDownStore: Export and Import of a stopped store fail cleanly.
func TestShutDownStore(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t)
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Export(ctx); err == nil {
		t.Fatal("export after shutdown")
	}
	if err := s.Import(ctx, &backup.State{Data: json.RawMessage(`{}`)}); err == nil {
		t.Fatal("import after shutdown")
	}
}
