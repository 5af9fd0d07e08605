package dataupdater

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
)

// MaxPatchOps is the most operations one JSON-Patch may hold; a longer one
// is refused whole (*DecodeError).
const MaxPatchOps = 10000

// MaxPatchCopyNodes bounds what the copy operations of one patch may add:
// all copies together may create at most this many JSON values (objects,
// arrays and scalars each count one), or as many as the document had, if
// more. Each copy can double a document, so without a bound a few dozen ops
// exhaust memory while the store is locked.
const MaxPatchCopyNodes = 100_000

// PatchOp is one RFC 6902 operation.
type PatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	From  string `json:"from,omitempty"`
	Value any    `json:"value,omitempty"`
	// hasValue tells "value": null from a missing value (add, replace and
	// test need one).
	hasValue bool
}

// PatchError is a JSON-Patch that does not apply: the document is left as it
// was.
type PatchError struct {
	Index int // the failing operation, 0-based
	Op    string
	Path  string
	Err   error
}

func (e *PatchError) Error() string {
	return fmt.Sprintf("json patch operation %d (%s %s): %v", e.Index, e.Op, e.Path, e.Err)
}

func (e *PatchError) Unwrap() error { return e.Err }

// DecodePatch decodes a JSON-Patch document (an array of operations) and
// checks each operation's shape. Numbers stay json.Number.
func DecodePatch(b []byte) ([]PatchOp, error) {
	v, err := decodeValue(b)
	if err != nil {
		return nil, &DecodeError{What: "json patch", Err: err}
	}
	arr, ok := v.([]any)
	if !ok {
		return nil, &DecodeError{What: "json patch", Err: fmt.Errorf("not an array of operations")}
	}
	if len(arr) > MaxPatchOps {
		return nil, &DecodeError{What: "json patch", Err: fmt.Errorf("%d operations, more than %d", len(arr), MaxPatchOps)}
	}
	ops := make([]PatchOp, 0, len(arr))
	for i, x := range arr {
		m, ok := x.(map[string]any)
		if !ok {
			return nil, &DecodeError{What: "json patch", Err: fmt.Errorf("operation %d is not an object", i)}
		}
		var op PatchOp
		op.Op, _ = m["op"].(string)
		p, pok := m["path"].(string)
		op.Path = p
		op.From, _ = m["from"].(string)
		op.Value, op.hasValue = m["value"]
		bad := func(why string) error {
			return &DecodeError{What: "json patch", Err: fmt.Errorf("operation %d (%q): %s", i, op.Op, why)}
		}
		if !pok {
			return nil, bad(`no "path"`)
		}
		switch op.Op {
		case "add", "replace", "test":
			if !op.hasValue {
				return nil, bad(`no "value"`)
			}
		case "remove":
		case "move", "copy":
			if _, ok := m["from"].(string); !ok {
				return nil, bad(`no "from"`)
			}
		default:
			return nil, bad("unknown op")
		}
		ops = append(ops, op)
	}
	return ops, nil
}

// MarshalJSON writes the operation with its value, null included.
func (op PatchOp) MarshalJSON() ([]byte, error) {
	m := map[string]any{"op": op.Op, "path": op.Path}
	if op.From != "" || op.Op == "move" || op.Op == "copy" {
		m["from"] = op.From
	}
	if op.hasValue || op.Value != nil {
		m["value"] = op.Value
	}
	return json.Marshal(m)
}

// ApplyPatch applies ops to doc (RFC 6902) and returns the new document. doc
// is never modified: on any error the caller still holds the old document.
// A nil doc is a document that does not exist (only add or replace at ""
// can create it).
func ApplyPatch(doc any, ops []PatchOp) (any, error) {
	doc = deepCopy(doc)
	budget := max(MaxPatchCopyNodes, nodes(doc))
	for i, op := range ops {
		var err error
		doc, err = applyOp(doc, op, &budget)
		if err != nil {
			return nil, &PatchError{Index: i, Op: op.Op, Path: op.Path, Err: err}
		}
	}
	return doc, nil
}

func applyOp(doc any, op PatchOp, budget *int) (any, error) {
	path, err := pointer(op.Path)
	if err != nil {
		return nil, err
	}
	switch op.Op {
	case "add":
		return add(doc, path, deepCopy(op.Value))
	case "remove":
		doc, _, err := remove(doc, path)
		return doc, err
	case "replace":
		if _, err := get(doc, path); err != nil {
			return nil, err
		}
		if len(path) == 0 {
			return deepCopy(op.Value), nil
		}
		doc, _, err := remove(doc, path)
		if err != nil {
			return nil, err
		}
		return add(doc, path, deepCopy(op.Value))
	case "test":
		v, err := get(doc, path)
		if err != nil {
			return nil, err
		}
		if !equalJSON(v, op.Value) {
			return nil, fmt.Errorf("test failed")
		}
		return doc, nil
	case "move", "copy":
		if op.From == "" {
			// Copying the whole document into itself doubles it.
			return nil, fmt.Errorf("cannot %s the whole document", op.Op)
		}
		from, err := pointer(op.From)
		if err != nil {
			return nil, err
		}
		if op.Op == "move" && isPrefix(from, path) && len(from) < len(path) {
			return nil, fmt.Errorf("cannot move %q into its own child", op.From)
		}
		var v any
		if op.Op == "move" {
			doc, v, err = remove(doc, from)
		} else {
			if v, err = get(doc, from); err == nil {
				var ok bool
				if v, ok = copyBounded(v, budget); !ok {
					err = fmt.Errorf("copies would add more than %d values (MaxPatchCopyNodes)", MaxPatchCopyNodes)
				}
			}
		}
		if err != nil {
			return nil, err
		}
		return add(doc, path, v)
	}
	return nil, fmt.Errorf("unknown op %q", op.Op)
}

// pointer parses an RFC 6901 JSON pointer.
func pointer(p string) ([]string, error) {
	if p == "" {
		return nil, nil
	}
	if !strings.HasPrefix(p, "/") {
		return nil, fmt.Errorf("path %q does not start with /", p)
	}
	segs := strings.Split(p[1:], "/")
	for i, s := range segs {
		segs[i] = strings.ReplaceAll(strings.ReplaceAll(s, "~1", "/"), "~0", "~")
	}
	return segs, nil
}

func isPrefix(a, b []string) bool {
	if len(a) > len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func get(doc any, path []string) (any, error) {
	if doc == nil && len(path) == 0 {
		return nil, fmt.Errorf("document does not exist")
	}
	cur := doc
	for _, s := range path {
		switch c := cur.(type) {
		case map[string]any:
			v, ok := c[s]
			if !ok {
				return nil, fmt.Errorf("%q not found", s)
			}
			cur = v
		case []any:
			i, err := index(s, len(c), false)
			if err != nil {
				return nil, err
			}
			cur = c[i]
		default:
			return nil, fmt.Errorf("%q not found: parent is not a container", s)
		}
	}
	return cur, nil
}

// index parses an array index; "-" (the end) only when appending.
func index(s string, n int, appending bool) (int, error) {
	if appending && s == "-" {
		return n, nil
	}
	if s == "" || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("bad array index %q", s)
	}
	i, err := strconv.Atoi(s)
	if err != nil || i < 0 {
		return 0, fmt.Errorf("bad array index %q", s)
	}
	max := n - 1
	if appending {
		max = n
	}
	if i > max {
		return 0, fmt.Errorf("array index %d out of range", i)
	}
	return i, nil
}

// add sets path to v (RFC 6902 4.1): the parent must exist; an array index
// inserts.
func add(doc any, path []string, v any) (any, error) {
	if len(path) == 0 {
		return v, nil
	}
	parent, err := get(doc, path[:len(path)-1])
	if err != nil {
		return nil, err
	}
	last := path[len(path)-1]
	switch p := parent.(type) {
	case map[string]any:
		p[last] = v
		return doc, nil
	case []any:
		i, err := index(last, len(p), true)
		if err != nil {
			return nil, err
		}
		n := append(p[:i:i], append([]any{v}, p[i:]...)...)
		return setAt(doc, path[:len(path)-1], n)
	}
	return nil, fmt.Errorf("parent of %q is not a container", last)
}

// remove deletes path and returns the new document and the removed value.
func remove(doc any, path []string) (any, any, error) {
	if len(path) == 0 {
		return nil, nil, fmt.Errorf("cannot remove the whole document")
	}
	parent, err := get(doc, path[:len(path)-1])
	if err != nil {
		return nil, nil, err
	}
	last := path[len(path)-1]
	switch p := parent.(type) {
	case map[string]any:
		v, ok := p[last]
		if !ok {
			return nil, nil, fmt.Errorf("%q not found", last)
		}
		delete(p, last)
		return doc, v, nil
	case []any:
		i, err := index(last, len(p), false)
		if err != nil {
			return nil, nil, err
		}
		v := p[i]
		n := append(p[:i:i], p[i+1:]...)
		doc, err = setAt(doc, path[:len(path)-1], n)
		return doc, v, err
	}
	return nil, nil, fmt.Errorf("parent of %q is not a container", last)
}

// setAt replaces the value at an existing path (slices change identity when
// they grow or shrink).
func setAt(doc any, path []string, v any) (any, error) {
	if len(path) == 0 {
		return v, nil
	}
	parent, err := get(doc, path[:len(path)-1])
	if err != nil {
		return nil, err
	}
	last := path[len(path)-1]
	switch p := parent.(type) {
	case map[string]any:
		p[last] = v
	case []any:
		i, err := index(last, len(p), false)
		if err != nil {
			return nil, err
		}
		p[i] = v
	}
	return doc, nil
}

// copyBounded deep-copies v, spending one unit of *budget per value; it
// stops (false) as soon as the budget is spent, before the copy grows further.
func copyBounded(v any, budget *int) (any, bool) {
	if *budget--; *budget < 0 {
		return nil, false
	}
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			c, ok := copyBounded(e, budget)
			if !ok {
				return nil, false
			}
			m[k] = c
		}
		return m, true
	case []any:
		s := make([]any, len(x))
		for i, e := range x {
			c, ok := copyBounded(e, budget)
			if !ok {
				return nil, false
			}
			s[i] = c
		}
		return s, true
	}
	return v, true
}

// nodes counts the values of a document (containers and scalars).
func nodes(v any) int {
	n := 1
	switch x := v.(type) {
	case map[string]any:
		for _, e := range x {
			n += nodes(e)
		}
	case []any:
		for _, e := range x {
			n += nodes(e)
		}
	}
	return n
}

func deepCopy(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = deepCopy(e)
		}
		return m
	case []any:
		s := make([]any, len(x))
		for i, e := range x {
			s[i] = deepCopy(e)
		}
		return s
	}
	return v
}

// equalJSON compares decoded JSON; numbers by value (1 equals 1.0), whether
// decoded as json.Number or float64 (bundle data is float64).
func equalJSON(a, b any) bool {
	if an, ok := number(a); ok {
		bn, ok := number(b)
		return ok && an == bn
	}
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			w, ok := y[k]
			if !ok || !equalJSON(v, w) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !equalJSON(x[i], y[i]) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(a, b)
}

func number(v any) (float64, bool) {
	switch x := v.(type) {
	case json.Number:
		f, err := x.Float64()
		return f, err == nil
	case float64:
		return x, true
	case int:
		return float64(x), true
	}
	return 0, false
}

// EqualJSON reports whether two decoded JSON values are equal (numbers by
// value). Stores use it to check that a write left protected data alone.
func EqualJSON(a, b any) bool { return equalJSON(a, b) }
