package dataupdater_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
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

// TestPatchBounds: a small patch cannot blow a document up (each copy of a
// subtree into itself doubles it) nor run without end: copies are bounded
// by MaxPatchCopyNodes (or the document's size), the whole document is never
// copied, and a patch holds at most MaxPatchOps operations.
func TestPatchBounds(t *testing.T) {
	isPatch := func(err error) bool { var e *dataupdater.PatchError; return errors.As(err, &e) }
	ops := func(n int, op string) []byte {
		var b strings.Builder
		b.WriteString("[")
		for i := range n {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, op, i)
		}
		return []byte(b.String() + "]")
	}
	array := func(n int) []any {
		a := make([]any, n)
		for i := range a {
			a[i] = float64(i)
		}
		return a
	}
	cases := []struct {
		name  string
		doc   any
		patch []byte
		ok    bool
	}{
		// Catches: dropping the copy budget (1000 values doubled 10 times).
		{"copy_doubling_bounded", map[string]any{"d": map[string]any{"v": array(1000)}},
			ops(10, `{"op":"copy","from":"/d","path":"/d/c%d"}`), false},
		// Catches: copying the whole document into itself.
		{"copy_from_root_refused", map[string]any{"a": 1.0}, []byte(`[{"op":"copy","from":"","path":"/b"}]`), false},
		{"move_from_root_refused", map[string]any{"a": 1.0}, []byte(`[{"op":"move","from":"","path":""}]`), false},
		// Catches: a budget of MaxPatchCopyNodes even for a larger document.
		{"large_document_copied_once", map[string]any{"a": array(dataupdater.MaxPatchCopyNodes + 10)},
			[]byte(`[{"op":"copy","from":"/a","path":"/b"}]`), true},
		{"small_copies_fine", map[string]any{"a": array(10)}, ops(100, `{"op":"copy","from":"/a","path":"/c%d"}`), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := dataupdater.DecodePatch(tc.patch)
			if err != nil {
				t.Fatal(err)
			}
			_, err = dataupdater.ApplyPatch(tc.doc, p)
			if tc.ok && err != nil {
				t.Fatal(err)
			}
			if !tc.ok && !isPatch(err) {
				t.Fatalf("err = %v, want *PatchError", err)
			}
		})
	}
	// Catches: no cap on the number of operations.
	t.Run("too_many_ops_refused", func(t *testing.T) {
		if _, err := dataupdater.DecodePatch(ops(dataupdater.MaxPatchOps, `{"op":"test","path":"/%d","value":1}`)); err != nil {
			t.Fatalf("%d ops: %v", dataupdater.MaxPatchOps, err)
		}
		_, err := dataupdater.DecodePatch(ops(dataupdater.MaxPatchOps+1, `{"op":"test","path":"/%d","value":1}`))
		var de *dataupdater.DecodeError
		if !errors.As(err, &de) {
			t.Fatalf("err = %v, want *DecodeError", err)
		}
	})
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
