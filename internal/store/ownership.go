// This file is data ownership: which data paths bundles wrote, through which
// data module directory, and how a delta keeps owned data below what it
// rewrites, so removed data.json files are deleted and the data updater's
// writes are never touched.

package store

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// DataPath splits a data module directory or a data path ("", ".", "/a/b",
// "a/b") into segments; the root is the empty path.
func DataPath(dir string) []string {
	var out []string
	for _, s := range strings.Split(dir, "/") {
		if s != "" && s != "." {
			out = append(out, s)
		}
	}
	return out
}

// Ownership records which data paths bundles wrote, and through which data
// module directory, so that removed data.json files are deleted and data the
// data updater wrote elsewhere is never touched. Keys are "/"-joined data
// paths; values the owning module directory ("." for root keys).
type Ownership map[string]string

// Clone returns an independent copy.
func (o Ownership) Clone() Ownership {
	c := make(Ownership, len(o))
	for k, v := range o {
		c[k] = v
	}
	return c
}

// Owns reports whether the data path (segments) is at or below a path owned
// by a bundle, or above one (writing there would clobber bundle data). The
// data updater consults it.
func (o Ownership) Owns(p []string) bool {
	key := strings.Join(p, "/")
	for k := range o {
		if k == key || strings.HasPrefix(key, k+"/") || strings.HasPrefix(k, key+"/") || key == "" {
			return true
		}
	}
	return false
}

// Compose folds the current value of each Keeps path into the plan's
// writes, so a delta that rewrites or deletes data.a keeps data.a.b that
// another data.json owns: a delete above a kept path becomes a write of an
// object holding only the kept data, and each kept value is set inside the
// deepest write above it (data.a = {"x":9,"b":{"y":2}}). read returns the
// current value of a path and whether it exists; call Compose before any
// write. A kept path under a write whose value is not an object there gives
// *DataError.
func (p *Plan) Compose(read func(path []string) (any, bool, error)) error {
	if len(p.Keeps) == 0 {
		return nil
	}
	below := func(k, d []string) bool { return len(d) < len(k) && slices.Equal(k[:len(d)], d) }
	deletes := p.DataDeletes[:0:0]
	for _, d := range p.DataDeletes {
		keep := false
		for _, k := range p.Keeps {
			keep = keep || below(k, d)
		}
		if keep {
			p.DataWrites = append(p.DataWrites, DataWrite{Path: d, Value: map[string]any{}})
			continue
		}
		deletes = append(deletes, d)
	}
	p.DataDeletes = deletes
	sort.SliceStable(p.DataWrites, func(i, j int) bool { return len(p.DataWrites[i].Path) < len(p.DataWrites[j].Path) })
	for _, k := range p.Keeps {
		v, ok, err := read(k)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		w := -1 // the deepest write above k
		for i := range p.DataWrites {
			if below(k, p.DataWrites[i].Path) && (w < 0 || len(p.DataWrites[i].Path) > len(p.DataWrites[w].Path)) {
				w = i
			}
		}
		if w < 0 {
			continue
		}
		obj, ok := p.DataWrites[w].Value.(map[string]any)
		rest := k[len(p.DataWrites[w].Path):]
		for _, seg := range rest[:len(rest)-1] {
			if !ok {
				break
			}
			next, has := obj[seg]
			if !has {
				next = map[string]any{}
				obj[seg] = next
			}
			obj, ok = next.(map[string]any)
		}
		if !ok {
			return &DataError{Dir: p.Owned[strings.Join(k, "/")],
				Err: fmt.Errorf("data.%s is not an object, so the data at %s cannot be kept", strings.Join(p.DataWrites[w].Path, "."), strings.Join(k, "/"))}
		}
		obj[rest[len(rest)-1]] = copyJSON(v)
	}
	return nil
}

// copyJSON deep-copies a decoded document, so a value read from a store is
// not shared with what is written back.
func copyJSON(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = copyJSON(e)
		}
		return m
	case []any:
		s := make([]any, len(x))
		for i, e := range x {
			s[i] = copyJSON(e)
		}
		return s
	}
	return v
}

func dirKey(dir string) string {
	if d := DataPath(dir); len(d) > 0 {
		return strings.Join(d, "/")
	}
	return "."
}
