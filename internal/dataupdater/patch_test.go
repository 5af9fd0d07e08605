package dataupdater_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/opal-go/opal-client/internal/dataupdater"
)

// TestPatch: RFC 6902 on decoded JSON; a failure returns an error and
// leaves the input untouched.
func TestPatch(t *testing.T) {
	cases := []struct{ name, doc, ops, want string }{
		{"add_member", `{"a":1}`, `[{"op":"add","path":"/b","value":2}]`, `{"a":1,"b":2}`},
		{"add_array_insert", `{"a":[1,3]}`, `[{"op":"add","path":"/a/1","value":2}]`, `{"a":[1,2,3]}`},
		{"add_array_end", `{"a":[1]}`, `[{"op":"add","path":"/a/-","value":2}]`, `{"a":[1,2]}`},
		{"remove", `{"a":1,"b":2}`, `[{"op":"remove","path":"/a"}]`, `{"b":2}`},
		{"remove_array", `[1,2,3]`, `[{"op":"remove","path":"/1"}]`, `[1,3]`},
		{"replace", `{"a":1}`, `[{"op":"replace","path":"/a","value":{"x":null}}]`, `{"a":{"x":null}}`},
		{"move", `{"a":{"b":1},"c":{}}`, `[{"op":"move","from":"/a/b","path":"/c/d"}]`, `{"a":{},"c":{"d":1}}`},
		{"copy", `{"a":[1]}`, `[{"op":"copy","from":"/a","path":"/b"}]`, `{"a":[1],"b":[1]}`},
		{"test_ok", `{"a":1.0}`, `[{"op":"test","path":"/a","value":1}]`, `{"a":1.0}`},
		{"escaped", `{"a/b":1,"m~n":2}`, `[{"op":"remove","path":"/a~1b"},{"op":"remove","path":"/m~0n"}]`, `{}`},
		{"whole_doc", `{"a":1}`, `[{"op":"add","path":"","value":[1]}]`, `[1]`},
		{"test_fails", `{"a":1}`, `[{"op":"test","path":"/a","value":2}]`, "error"},
		{"remove_missing", `{"a":1}`, `[{"op":"remove","path":"/b"}]`, "error"},
		{"add_no_parent", `{}`, `[{"op":"add","path":"/x/y","value":1}]`, "error"},
		{"index_out_of_range", `[1]`, `[{"op":"add","path":"/3","value":1}]`, "error"},
		{"leading_zero_index", `[1,2]`, `[{"op":"remove","path":"/01"}]`, "error"},
		{"move_into_child", `{"a":{}}`, `[{"op":"move","from":"/a","path":"/a/b"}]`, "error"},
		{"replace_missing", `{}`, `[{"op":"replace","path":"/a","value":1}]`, "error"},
		{"second_op_fails", `{"a":1}`, `[{"op":"add","path":"/b","value":2},{"op":"remove","path":"/zz"}]`, "error"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var doc any
			if err := json.Unmarshal([]byte(tc.doc), &doc); err != nil {
				t.Fatal(err)
			}
			before, _ := json.Marshal(doc)
			ops, err := dataupdater.DecodePatch([]byte(tc.ops))
			if err != nil {
				t.Fatal(err)
			}
			got, err := dataupdater.ApplyPatch(doc, ops)
			after, _ := json.Marshal(doc)
			if string(after) != string(before) {
				t.Fatalf("input changed: %s -> %s", before, after)
			}
			if tc.want == "error" {
				var pe *dataupdater.PatchError
				if !errors.As(err, &pe) {
					t.Fatalf("err = %v, want *PatchError", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var want any
			_ = json.Unmarshal([]byte(tc.want), &want)
			if !dataupdater.EqualJSON(got, want) {
				g, _ := json.Marshal(got)
				t.Fatalf("got %s, want %s", g, tc.want)
			}
		})
	}
}

// FuzzPatch: any document and patch: no panic, and the input is never changed.
func FuzzPatch(f *testing.F) {
	f.Add(`{"a":[1,2]}`, `[{"op":"move","from":"/a/0","path":"/a/-"}]`)
	f.Add(`[]`, `[{"op":"copy","from":"","path":"/0"}]`)
	f.Fuzz(func(t *testing.T, doc, patch string) {
		var d any
		if json.Unmarshal([]byte(doc), &d) != nil {
			return
		}
		ops, err := dataupdater.DecodePatch([]byte(patch))
		if err != nil {
			return
		}
		before, _ := json.Marshal(d)
		_, _ = dataupdater.ApplyPatch(d, ops)
		after, _ := json.Marshal(d)
		if string(before) != string(after) {
			t.Fatalf("input changed")
		}
	})
}
