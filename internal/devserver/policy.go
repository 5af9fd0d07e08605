package devserver

import (
	"crypto/sha1"
	"encoding/hex"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/opal-go/opal-client/fetcher"
)

// snapshot is one state of the policy directory, standing in for a commit.
type snapshot struct {
	hash  string
	files map[string]string // slash path -> content: *.rego and data.json only
	dirs  map[string]bool   // every directory of the tree, "." included
}

// readSnapshot reads dir. The hash is sha1 over the sorted (path, content)
// pairs, 40 hex digits like a commit SHA.
func readSnapshot(dir string) (*snapshot, error) {
	s := &snapshot{files: map[string]string{}, dirs: map[string]bool{".": true}}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && rel != "." {
				return filepath.SkipDir
			}
			s.dirs[rel] = true
			return nil
		}
		if !isPolicyFile(rel) && !isDataFile(rel) {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		s.files[rel] = string(b)
		return nil
	})
	if err != nil {
		return nil, err
	}
	h := sha1.New()
	for _, p := range sortedKeys(s.files) {
		// Length-prefixed so ("ab","c") and ("a","bc") differ.
		writeLen(h, p)
		writeLen(h, s.files[p])
	}
	s.hash = hex.EncodeToString(h.Sum(nil))
	return s, nil
}

func writeLen(h interface{ Write([]byte) (int, error) }, s string) {
	var n [8]byte
	l := uint64(len(s))
	for i := range n {
		n[i] = byte(l >> (8 * i))
	}
	h.Write(n[:])
	h.Write([]byte(s))
}

func isPolicyFile(p string) bool { return strings.HasSuffix(p, ".rego") }
func isDataFile(p string) bool   { return path.Base(p) == "data.json" }

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

var packageRe = regexp.MustCompile(`(?m)^\s*package\s+([A-Za-z0-9_.\[\]"]+)`)

// packageName is the `package x.y` of a Rego file, or "" (§4.2).
func packageName(rego string) string {
	m := packageRe.FindStringSubmatch(rego)
	if m == nil {
		return ""
	}
	return m[1]
}

// normPath normalises a ?path= value like the server: leading "/" stripped,
// empty is ".".
func normPath(p string) string {
	p = strings.TrimLeft(p, "/")
	if p == "" {
		return "."
	}
	return path.Clean(p)
}

// under reports whether file lies in one of dirs.
func under(file string, dirs []string) bool {
	for _, d := range dirs {
		if d == "." || strings.HasPrefix(file, d+"/") {
			return true
		}
	}
	return false
}

// bundle builds the §4.2 bundle of cur for dirs: full when base is nil,
// else a delta from base.
func bundle(cur, base *snapshot, dirs []string) *fetcher.PolicyBundle {
	b := &fetcher.PolicyBundle{
		Manifest:      []string{},
		Hash:          cur.hash,
		DataModules:   []fetcher.DataModule{},
		PolicyModules: []fetcher.PolicyModule{},
	}
	for _, p := range sortedKeys(cur.files) {
		if !under(p, dirs) {
			continue
		}
		c := cur.files[p]
		b.Manifest = append(b.Manifest, p)
		if base != nil {
			if old, ok := base.files[p]; ok && old == c {
				continue
			}
		}
		if isDataFile(p) {
			b.DataModules = append(b.DataModules, fetcher.DataModule{Path: path.Dir(p), Data: c})
		} else {
			b.PolicyModules = append(b.PolicyModules, fetcher.PolicyModule{Path: p, PackageName: packageName(c), Rego: c})
		}
	}
	if base == nil {
		return b
	}
	old := base.hash
	b.OldHash = &old
	var del fetcher.DeletedFiles
	for _, p := range sortedKeys(base.files) {
		if _, ok := cur.files[p]; ok || !under(p, dirs) {
			continue
		}
		if isDataFile(p) {
			del.DataModules = append(del.DataModules, path.Dir(p))
		} else {
			del.PolicyModules = append(del.PolicyModules, p)
		}
	}
	if len(del.DataModules)+len(del.PolicyModules) > 0 {
		if del.DataModules == nil {
			del.DataModules = []string{}
		}
		if del.PolicyModules == nil {
			del.PolicyModules = []string{}
		}
		b.DeletedFiles = &del
	}
	return b
}

// changedDirs is the §3.2 set: every ancestor directory (with ".") of each
// .rego/.json file that differs between a and b; every directory if a == b.
func changedDirs(a, b *snapshot) []string {
	set := map[string]bool{}
	if a.hash == b.hash {
		for d := range b.dirs {
			set[d] = true
		}
	} else {
		mark := func(p string) {
			for d := path.Dir(p); ; d = path.Dir(d) {
				set[d] = true
				if d == "." {
					break
				}
			}
		}
		for p, c := range b.files {
			if old, ok := a.files[p]; !ok || old != c {
				mark(p)
			}
		}
		for p := range a.files {
			if _, ok := b.files[p]; !ok {
				mark(p)
			}
		}
	}
	out := make([]string, 0, len(set))
	for d := range set {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}
