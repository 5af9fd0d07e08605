package store

import "testing"

// TestDataConflicts: the plan's own data answers the path-conflict check as
// storage.NonEmpty answers it from a store holding only that data (U3).
func TestDataConflicts(t *testing.T) {
	p := &Plan{DataWrites: []DataWrite{
		{Path: []string{"app", "rbac"}, Value: map[string]any{"allow": true, "roles": map[string]any{}}},
		{Path: []string{"flag"}, Value: 1},
	}}
	check := p.DataConflicts()
	for _, tc := range []struct {
		name string
		path []string
		want bool
	}{
		// Mutations caught: each of the three answers forced false.
		{"data_at_the_path", []string{"app", "rbac"}, true},
		{"data_below_the_path", []string{"app"}, true},
		{"data_inside_a_written_object", []string{"app", "rbac", "allow"}, true},
		{"scalar_above_the_path", []string{"flag", "x"}, true},
		{"missing_key_in_an_object", []string{"app", "rbac", "deny"}, false},
		{"unrelated_path", []string{"other"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, err := check(tc.path); err != nil || got != tc.want {
				t.Fatalf("DataConflicts(%v) = %v, %v; want %v", tc.path, got, err, tc.want)
			}
		})
	}
}
