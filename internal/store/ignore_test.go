package store

import (
	"fmt"
	"testing"
)

// TestIgnoreMatchesAsThePythonClient pins OPAL_POLICY_STORE_POLICY_PATHS_TO_IGNORE
// to the Python client's semantics (should_ignore_path: "!" exceptions first,
// then PathUtils.glob_style_match_path_to_list, i.e. "/**" as a string prefix
// and PurePath(id).match(pattern) otherwise). The expectations were computed
// once with CPython 3.11.7's pathlib and pasted here as literals; the test
// does not run Python.
func TestIgnoreMatchesAsThePythonClient(t *testing.T) {
	for _, tc := range []struct {
		patterns []string
		id       string
		want     bool
	}{
		{[]string{"*.rego"}, "rbac.rego", true},
		{[]string{"*.rego"}, "a/b/rbac.rego", true},
		{[]string{"*.rego"}, "rbac.json", false},
		{[]string{"b/*.rego"}, "a/b/c.rego", true},
		{[]string{"b/*.rego"}, "b/c.rego", true},
		{[]string{"b/*.rego"}, "a/c.rego", false},
		{[]string{"a/*.rego"}, "a/b/c.rego", false},
		{[]string{"/a/*.rego"}, "a/b.rego", false},
		{[]string{"/a/b.rego"}, "/a/b.rego", true},
		{[]string{"/b.rego"}, "/a/b.rego", false},
		{[]string{"b.rego"}, "/a/b.rego", true},
		{[]string{"/a/b.rego"}, "a/b.rego", false},
		{[]string{"/*.rego"}, "x.rego", false},
		{[]string{"/**"}, "a/b/c.rego", true},
		{[]string{"/**"}, "x.rego", true},
		{[]string{"/"}, "x.rego", false},
		{[]string{"/"}, "a/b.rego", false},
		{[]string{"**"}, "a/b/c.rego", true},
		{[]string{"**/*.rego"}, "a/b/c.rego", true},
		{[]string{"a/**/c.rego"}, "a/b/x/c.rego", false},
		{[]string{"a/**/c.rego"}, "a/b/c.rego", true},
		{[]string{"keep/**"}, "keep/mine.rego", true},
		{[]string{"keep/**"}, "keep", true},
		{[]string{"keep/**"}, "keeper.rego", true},
		{[]string{"keep/**"}, "other/keep/x.rego", false},
		{[]string{"/keep/**"}, "keep/x.rego", false},
		{[]string{"k*/**"}, "keep/x.rego", false},
		{[]string{"?.rego"}, "a.rego", true},
		{[]string{"?.rego"}, "ab.rego", false},
		{[]string{"[ab].rego"}, "a.rego", true},
		{[]string{"[!ab].rego"}, "a.rego", false},
		{[]string{"[!ab].rego"}, "c.rego", true},
		{[]string{"[a-c]x.rego"}, "bx.rego", true},
		{[]string{"[a-c]x.rego"}, "dx.rego", false},
		{[]string{"[.rego"}, "[.rego", true},
		{[]string{"RBAC.rego"}, "rbac.rego", false},
		{[]string{"a//b.rego"}, "a/b.rego", true},
		{[]string{"./a.rego"}, "a.rego", true},
		{[]string{"a/b.rego/"}, "a/b.rego", true},
		{[]string{"*"}, "a/b.rego", true},
		{[]string{"a\\*.rego"}, "a\\x.rego", true},
		{[]string{"*.REGO"}, "x.rego", false},
		{[]string{"x.rego"}, "x.rego", true},
		{[]string{"x.rego"}, "dir/x.rego", true},
		{[]string{".hidden*"}, "d/.hidden.rego", true},
		{[]string{"a/b/c/d.rego"}, "b/c/d.rego", false},
		{[]string{"keep/**", "!keep/not-this.rego"}, "keep/not-this.rego", false},
		{[]string{"keep/**", "!keep/not-this.rego"}, "keep/mine.rego", true},
		{[]string{"!x.rego"}, "x.rego", false},
		{[]string{"!*.rego", "/**"}, "a/b.rego", false},
		{[]string{"!*.rego", "/**"}, "a/b.json", true},
	} {
		t.Run(fmt.Sprintf("%q_%s", tc.patterns, tc.id), func(t *testing.T) {
			if got := NewIgnore(tc.patterns).Match(tc.id); got != tc.want {
				t.Fatalf("NewIgnore(%q).Match(%q) = %v, Python says %v", tc.patterns, tc.id, got, tc.want)
			}
		})
	}
	t.Run("health_policy_always_ignored", func(t *testing.T) {
		if !NewIgnore(nil).Match(HealthPolicyID) {
			t.Fatal("the health-check policy must never be touched by bundles")
		}
	})
	t.Run("blank_pattern_matches_nothing", func(t *testing.T) {
		// Python raises ValueError("empty pattern"); we skip it.
		if NewIgnore([]string{" ", ""}).Match("a.rego") {
			t.Fatal("a blank pattern ignored a policy")
		}
	})
}
