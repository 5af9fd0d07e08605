package store

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/opal-go/opal-client/fetcher"
	"github.com/opal-go/opal-client/updater"
)

func full(hash string, mods []fetcher.PolicyModule, data ...fetcher.DataModule) *fetcher.PolicyBundle {
	b := &fetcher.PolicyBundle{Hash: hash, PolicyModules: mods, DataModules: data}
	for _, m := range mods {
		b.Manifest = append(b.Manifest, m.Path)
	}
	return b
}

func delta(old, hash string, mods []fetcher.PolicyModule, data []fetcher.DataModule, delPolicies, delData []string) *fetcher.PolicyBundle {
	b := full(hash, mods, data...)
	b.OldHash = &old
	b.DeletedFiles = &fetcher.DeletedFiles{PolicyModules: delPolicies, DataModules: delData}
	return b
}

func mod(id, pkg string) fetcher.PolicyModule {
	return fetcher.PolicyModule{Path: id, Rego: "package " + pkg + "\n\nx := 1\n"}
}

func data(dir, js string) fetcher.DataModule { return fetcher.DataModule{Path: dir, Data: js} }

func parsedSet(t *testing.T, ms ...fetcher.PolicyModule) map[string]*ast.Module {
	t.Helper()
	out := map[string]*ast.Module{}
	for _, m := range ms {
		out[m.Path] = ast.MustParseModule(m.Rego)
	}
	return out
}

func TestCheckBase(t *testing.T) {
	for _, tc := range []struct {
		name    string
		b       *fetcher.PolicyBundle
		wantErr bool
	}{
		{"full_bundle_needs_no_base", full("h2", nil), false},
		{"delta_on_the_current_hash", delta("h1", "h2", nil, nil, nil, nil), false},
		// Catches: a delta applied on another base.
		{"delta_on_another_base_refused", delta("h0", "h2", nil, nil, nil, nil), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckBase("h1", tc.b)
			var bm *updater.BaseMismatchError
			if tc.wantErr != errors.As(err, &bm) || !tc.wantErr && err != nil {
				t.Fatalf("CheckBase = %v", err)
			}
			if tc.wantErr && (bm.Current != "h1" || bm.Base != "h0") {
				t.Fatalf("BaseMismatchError = %+v", bm)
			}
		})
	}
}

// Ignore-glob cases through the plan's entry point; the matcher's own
// table, pinned to Python's PurePath.match, is in ignore_test.go.
func TestIgnore(t *testing.T) {
	for _, tc := range []struct {
		name     string
		patterns []string
		id       string
		want     bool
	}{
		{"health_policy_always_ignored", nil, HealthPolicyID, true},
		{"nothing_configured_ignores_nothing", nil, "rbac/rbac.rego", false},
		{"subtree_pattern_matches_below", []string{"keep/**"}, "keep/a/b.rego", true},
		{"exception_wins_whatever_the_order", []string{"!keep/not.rego", "keep/**"}, "keep/not.rego", false},
		// As in the Python client, "dir/**" is a plain string prefix of the id.
		{"subtree_pattern_is_a_string_prefix", []string{"keep/**"}, "keeper/a.rego", true},
		{"other_ids_not_ignored", []string{"keep/**"}, "other/a.rego", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := NewIgnore(tc.patterns).Match(tc.id); got != tc.want {
				t.Fatalf("NewIgnore(%q).Match(%q) = %v, want %v", tc.patterns, tc.id, got, tc.want)
			}
		})
	}
}

func TestIsSystemModule(t *testing.T) {
	for _, tc := range []struct {
		name string
		pkg  string // "" for no module
		want bool
	}{
		{"system_itself", "system", true},
		{"below_system", "system.custom.x", true},
		{"system_prefix_is_not_system", "systemx", false},
		{"other_package", "app.rbac", false},
		{"no_module", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var m *ast.Module
			if tc.pkg != "" {
				m = ast.MustParseModule("package " + tc.pkg + "\n")
			}
			if got := IsSystemModule(m); got != tc.want {
				t.Fatalf("IsSystemModule(package %s) = %v, want %v", tc.pkg, got, tc.want)
			}
		})
	}
}

func TestDataPath(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"", nil}, {".", nil}, {"/", nil},
		{"a", []string{"a"}}, {"/a/b", []string{"a", "b"}}, {"a/b/", []string{"a", "b"}}, {"./a//b", []string{"a", "b"}},
	} {
		if got := DataPath(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("DataPath(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestOwnership(t *testing.T) {
	owned := Ownership{"rbac": "rbac", "a/b": "a/b"}
	for _, tc := range []struct {
		name string
		path []string
		want bool
	}{
		{"at_an_owned_path", []string{"rbac"}, true},
		{"below_an_owned_path", []string{"rbac", "roles"}, true},
		// Writing above owned data would clobber it.
		{"above_an_owned_path", []string{"a"}, true},
		{"the_root_holds_owned_data", nil, true},
		{"a_sibling_with_the_same_prefix_is_free", []string{"rbacx"}, false},
		{"unowned_path", []string{"users"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := owned.Owns(tc.path); got != tc.want {
				t.Fatalf("Owns(%q) = %v, want %v", tc.path, got, tc.want)
			}
		})
	}
	t.Run("nothing_owned_leaves_the_root_free", func(t *testing.T) {
		if (Ownership{}).Owns(nil) {
			t.Fatal("empty ownership owns the root")
		}
	})
	t.Run("clone_is_independent", func(t *testing.T) {
		c := owned.Clone()
		c["x"] = "x"
		if _, ok := owned["x"]; ok || len(c) != 3 {
			t.Fatalf("clone shares its map: %v %v", owned, c)
		}
	})
}

func TestNewPlan(t *testing.T) {
	rbac, other, sys := mod("rbac/rbac.rego", "app.rbac"), mod("other.rego", "other"), mod("sys.rego", "system.custom")
	kept, health := mod("keep/mine.rego", "keep.mine"), mod(HealthPolicyID, "system.opal")
	isData := func(err error) bool { var e *DataError; return errors.As(err, &e) }
	isID := func(err error) bool { var e *PolicyIDError; return errors.As(err, &e) }
	for _, tc := range []struct {
		name    string
		b       *fetcher.PolicyBundle
		current []fetcher.PolicyModule
		owned   Ownership
		wantErr func(error) bool
		check   func(t *testing.T, p *Plan)
	}{
		{name: "data_written_shallow_first_and_owned",
			b: full("h1", nil, data("b/d", `{"e":3}`), data(".", `{"b":{"c":2},"a":1}`)),
			check: func(t *testing.T, p *Plan) {
				// Numbers stay json.Number: bundle data is decoded exactly (UseNumber).
				want := []DataWrite{{Path: []string{"a"}, Value: json.Number("1")}, {Path: []string{"b"}, Value: map[string]any{"c": json.Number("2")}}, {Path: []string{"b", "d"}, Value: map[string]any{"e": json.Number("3")}}}
				if !reflect.DeepEqual(p.DataWrites, want) {
					t.Fatalf("writes %v, want %v", p.DataWrites, want)
				}
				if want := (Ownership{"a": ".", "b": ".", "b/d": "b/d"}); !reflect.DeepEqual(p.Owned, want) {
					t.Fatalf("owned %v, want %v", p.Owned, want)
				}
			}},
		// Catches: a removed data.json's data left behind.
		{name: "full_deletes_data_no_longer_in_the_bundle", b: full("h2", nil, data("x", `1`)), owned: Ownership{"x": "x", "y": "y"},
			check: func(t *testing.T, p *Plan) {
				if !reflect.DeepEqual(p.DataDeletes, [][]string{{"y"}}) {
					t.Fatalf("deletes %v, want [[y]]", p.DataDeletes)
				}
			}},
		{name: "delta_keeps_the_ownership_it_does_not_touch", b: delta("h1", "h2", nil, nil, nil, []string{"x"}), owned: Ownership{"x": "x", "y": "y"},
			check: func(t *testing.T, p *Plan) {
				if !reflect.DeepEqual(p.DataDeletes, [][]string{{"x"}}) || !reflect.DeepEqual(p.Owned, Ownership{"y": "y"}) {
					t.Fatalf("deletes %v owned %v, want [[x]] and y", p.DataDeletes, p.Owned)
				}
			}},
		{name: "delta_rewrite_above_owned_data_keeps_it", b: delta("h1", "h2", nil, []fetcher.DataModule{data("a", `{"x":9}`)}, nil, nil),
			owned: Ownership{"a": "a", "a/b": "a/b"},
			check: func(t *testing.T, p *Plan) {
				if !reflect.DeepEqual(p.Keeps, [][]string{{"a", "b"}}) {
					t.Fatalf("keeps %v, want [[a b]]", p.Keeps)
				}
			}},
		{name: "root_array_is_items", b: full("h1", nil, data(".", `[1,2]`)),
			check: func(t *testing.T, p *Plan) {
				if len(p.DataWrites) != 1 || !slices.Equal(p.DataWrites[0].Path, []string{"items"}) {
					t.Fatalf("writes %v, want data.items", p.DataWrites)
				}
			}},
		{name: "root_scalar_refused", b: full("h1", nil, data(".", `3`)), wantErr: isData},
		{name: "root_key_with_slash_refused", b: full("h1", nil, data(".", `{"a/b":1}`)), wantErr: isData},
		{name: "root_key_empty_refused", b: full("h1", nil, data(".", `{"":1}`)), wantErr: isData},
		{name: "invalid_data_json_refused", b: full("h1", nil, data("x", `{`)), wantErr: isData},
		{name: "unclean_policy_id_refused", b: full("h1", []fetcher.PolicyModule{mod("a//b.rego", "a")}), wantErr: isID},
		{name: "upserts_in_manifest_order_then_the_rest",
			b: &fetcher.PolicyBundle{Hash: "h1", Manifest: []string{"b.rego", "a.rego"}, PolicyModules: []fetcher.PolicyModule{mod("c.rego", "c"), mod("a.rego", "a"), mod("b.rego", "b")}},
			check: func(t *testing.T, p *Plan) {
				var ids []string
				for _, m := range p.Upserts {
					ids = append(ids, m.Path)
				}
				if !slices.Equal(ids, []string{"b.rego", "a.rego", "c.rego"}) {
					t.Fatalf("upserts %v", ids)
				}
			}},
		{name: "full_deletes_unmanaged_but_ignored_system_and_health",
			b:       full("h1", []fetcher.PolicyModule{rbac, mod("keep/mine.rego", "keep.mine")}),
			current: []fetcher.PolicyModule{rbac, other, sys, kept, health, mod("z.rego", "z")},
			check: func(t *testing.T, p *Plan) {
				if !slices.Equal(p.Deletes, []string{"other.rego", "z.rego"}) {
					t.Fatalf("deletes %v, want other.rego and z.rego", p.Deletes)
				}
				if len(p.Upserts) != 1 || p.Upserts[0].Path != rbac.Path {
					t.Fatalf("upserts %v, want only rbac (an ignored id is not written)", p.Upserts)
				}
			}},
		{name: "delta_deletes_only_listed_present_managed_ids",
			b:       delta("h1", "h2", []fetcher.PolicyModule{rbac}, nil, []string{"other.rego", "sys.rego", "keep/mine.rego", "gone.rego", "rbac/rbac.rego"}, nil),
			current: []fetcher.PolicyModule{rbac, other, sys, kept},
			check: func(t *testing.T, p *Plan) {
				if !slices.Equal(p.Deletes, []string{"other.rego"}) {
					t.Fatalf("deletes %v, want other.rego", p.Deletes)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			owned := tc.owned
			if owned == nil {
				owned = Ownership{}
			}
			p, err := NewPlan(tc.b, parsedSet(t, tc.current...), owned, NewIgnore([]string{"keep/**"}))
			if tc.wantErr != nil {
				if !tc.wantErr(err) {
					t.Fatalf("err = %v (%T)", err, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, p)
		})
	}
}

func TestCompose(t *testing.T) {
	current := map[string]any{"a/b": map[string]any{"y": 2.0}, "a/c": "z"}
	read := func(p []string) (any, bool, error) {
		v, ok := current[p[0]+"/"+p[1]]
		return v, ok, nil
	}
	for _, tc := range []struct {
		name    string
		plan    Plan
		read    func([]string) (any, bool, error)
		want    []DataWrite
		deletes [][]string
		wantErr bool
	}{
		{name: "nothing_kept_nothing_read", plan: Plan{DataDeletes: [][]string{{"a"}}},
			read: func([]string) (any, bool, error) { t.Fatal("read without keeps"); return nil, false, nil }, deletes: [][]string{{"a"}}},
		{name: "rewrite_keeps_nested", plan: Plan{DataWrites: []DataWrite{{Path: []string{"a"}, Value: map[string]any{"x": 9.0}}}, Keeps: [][]string{{"a", "b"}}},
			want: []DataWrite{{Path: []string{"a"}, Value: map[string]any{"x": 9.0, "b": map[string]any{"y": 2.0}}}}},
		{name: "delete_above_kept_becomes_a_write", plan: Plan{DataDeletes: [][]string{{"a"}}, Keeps: [][]string{{"a", "b"}}},
			want: []DataWrite{{Path: []string{"a"}, Value: map[string]any{"b": map[string]any{"y": 2.0}}}}},
		{name: "missing_kept_value_skipped", plan: Plan{DataWrites: []DataWrite{{Path: []string{"a"}, Value: map[string]any{}}}, Keeps: [][]string{{"a", "nope"}}},
			want: []DataWrite{{Path: []string{"a"}, Value: map[string]any{}}}},
		{name: "non_object_rewrite_refused", plan: Plan{DataWrites: []DataWrite{{Path: []string{"a"}, Value: []any{1.0}}}, Keeps: [][]string{{"a", "b"}}}, wantErr: true},
		{name: "read_error_returned", plan: Plan{DataDeletes: [][]string{{"a"}}, Keeps: [][]string{{"a", "b"}}},
			read: func([]string) (any, bool, error) { return nil, false, errors.New("down") }, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.read
			if r == nil {
				r = read
			}
			p := tc.plan
			err := p.Compose(r)
			if tc.wantErr {
				if err == nil {
					t.Fatal("no error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(p.DataWrites, tc.want) || len(p.DataDeletes) != len(tc.deletes) {
				t.Fatalf("writes %v deletes %v, want %v and %v", p.DataWrites, p.DataDeletes, tc.want, tc.deletes)
			}
		})
	}
	t.Run("kept_value_is_copied", func(t *testing.T) {
		p := Plan{DataWrites: []DataWrite{{Path: []string{"a"}, Value: map[string]any{}}}, Keeps: [][]string{{"a", "b"}}}
		if err := p.Compose(read); err != nil {
			t.Fatal(err)
		}
		p.DataWrites[0].Value.(map[string]any)["b"].(map[string]any)["y"] = 3.0
		if current["a/b"].(map[string]any)["y"] != 2.0 {
			t.Fatal("the written value shares the read one")
		}
	})
}

func TestParser(t *testing.T) {
	const v1, v2 = "package a\n\nx := 1\n", "package a\n\nx := 2\n"
	t.Run("same_text_is_parsed_once", func(t *testing.T) {
		var ps Parser
		m1, err := ps.Parse("a.rego", v1)
		if err != nil {
			t.Fatal(err)
		}
		if m2, _ := ps.Parse("a.rego", v1); m2 != m1 {
			t.Fatal("same id and text parsed again")
		}
		if m3, _ := ps.Parse("a.rego", v2); m3 == m1 || m3.Rules[0].Head.Value.String() != "2" {
			t.Fatal("new text under the same id served from the cache")
		}
	})
	t.Run("forgotten_ids_are_parsed_again", func(t *testing.T) {
		var ps Parser
		m1, _ := ps.Parse("a.rego", v1)
		ps.Forget(func(string) bool { return false })
		if m2, _ := ps.Parse("a.rego", v1); m2 == m1 {
			t.Fatal("a forgotten id served from the cache")
		}
	})
	for _, tc := range []struct{ name, rego string }{
		{"parse_error_is_a_compile_error", "package a\n\nx if {\n"},
		{"empty_module_is_a_compile_error", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ps Parser
			_, err := ps.Parse("a.rego", tc.rego)
			var ce *CompileError
			if !errors.As(err, &ce) {
				t.Fatalf("err = %v (%T), want *CompileError", err, err)
			}
		})
	}
	t.Run("result_is_current_plus_upserts_minus_deletes", func(t *testing.T) {
		var ps Parser
		current := map[string]*ast.Module{"keep.rego": ast.MustParseModule("package keep\n"), "gone.rego": ast.MustParseModule("package gone\n"), "remote.rego": nil}
		got, err := ps.Result(&Plan{Upserts: []fetcher.PolicyModule{{Path: "new.rego", Rego: v1}}, Deletes: []string{"gone.rego"}}, current)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for id := range got {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		if !slices.Equal(ids, []string{"keep.rego", "new.rego"}) {
			t.Fatalf("result ids %v", ids)
		}
	})
}

func TestCompile(t *testing.T) {
	rules := map[string]*ast.Module{"r.rego": ast.MustParseModule("package app.rbac\n\nallow := true\n")}
	isCompile := func(err error) bool { var e *CompileError; return errors.As(err, &e) }
	for _, tc := range []struct {
		name      string
		modules   map[string]*ast.Module
		conflicts func([]string) (bool, error)
		wantErr   bool
	}{
		{"compiles", rules, nil, false},
		// Catches: dropping the c.Failed() check.
		{"unsafe_rule_fails", map[string]*ast.Module{"b.rego": ast.MustParseModule("package b\n\nallow if y > 1\n")}, nil, true},
		// Catches: compiling without the rule/data conflict check.
		{"data_where_rules_are_fails", rules, func(p []string) (bool, error) { return slices.Equal(p, []string{"app", "rbac", "allow"}), nil }, true},
		{"empty_data_paths_pass", rules, func([]string) (bool, error) { return false, nil }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Compile(tc.modules, tc.conflicts)
			if tc.wantErr != isCompile(err) || !tc.wantErr && (err != nil || c == nil) {
				t.Fatalf("Compile = %v, %v", c, err)
			}
		})
	}
}
