package store

import "strings"

// This file is OPAL_POLICY_STORE_POLICY_PATHS_TO_IGNORE's matcher, exactly
// as the Python client matches one pattern (opal_common PathUtils.
// glob_style_match_path_to_list):
//
//   - a pattern ending in "/**" is a plain string prefix: the id starts with
//     the pattern minus "/**" ("keep/**" matches "keep/a.rego" and also
//     "keeper.rego"; "/**" matches every id);
//   - any other pattern is pathlib's PurePosixPath(id).match(pattern):
//     both are split into segments (empty and "." segments dropped), a
//     relative pattern matches the id's last segments (anchored from the
//     right, so "*.rego" matches at any depth), an absolute one the whole
//     absolute id, and each segment is an fnmatch glob: '*' any run, '?' one
//     character, "[...]" a class ("[!...]" negated), case-sensitive, no
//     escapes; "**" is the same as '*' (one segment). "/" matches no
//     policy id (ids are relative).

// Ignore decides which policy ids bundles never touch: ids matching
// OPAL_POLICY_STORE_POLICY_PATHS_TO_IGNORE, and the health-check policy.
// Patterns match as in the Python client (ignore.go): "dir/**" is a prefix,
// anything else pathlib's PurePath.match, anchored from the right; a
// pattern starting with '!' is an exception that un-ignores what it
// matches, whatever the order.
type Ignore struct {
	include, exclude []string
}

// NewIgnore builds the matcher from the configured patterns.
func NewIgnore(patterns []string) *Ignore {
	ig := &Ignore{}
	for _, p := range patterns {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if strings.HasPrefix(p, "!") {
			ig.exclude = append(ig.exclude, strings.TrimPrefix(p, "!"))
		} else {
			ig.include = append(ig.include, p)
		}
	}
	return ig
}

// Match reports whether bundles must leave the policy id alone.
func (ig *Ignore) Match(id string) bool {
	if id == HealthPolicyID {
		return true
	}
	if ig == nil {
		return false
	}
	for _, p := range ig.exclude {
		if globMatch(p, id) {
			return false
		}
	}
	for _, p := range ig.include {
		if globMatch(p, id) {
			return true
		}
	}
	return false
}

// globMatch is the Python client's match of one pattern (ignore.go).
func globMatch(pattern, id string) bool { return pyIgnoreMatch(pattern, id) }

// pyIgnoreMatch reports whether the policy id matches one configured
// pattern the way the Python client decides it.
func pyIgnoreMatch(pattern, id string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "/**"); ok {
		return strings.HasPrefix(id, prefix) // guard: mutation "strings.HasSuffix" breaks the subtree patterns
	}
	return pyPathMatch(id, pattern)
}

// pyParts splits a path as pathlib does on POSIX: a leading "/" is the root
// (returned as its own first part), empty and "." segments vanish.
func pyParts(p string) (root bool, parts []string) {
	root = strings.HasPrefix(p, "/")
	if root {
		parts = append(parts, "/")
	}
	for _, s := range strings.Split(p, "/") {
		if s != "" && s != "." {
			parts = append(parts, s)
		}
	}
	return root, parts
}

// pyPathMatch is PurePosixPath(id).match(pattern). An empty pattern (which
// Python refuses with a ValueError) matches nothing.
func pyPathMatch(id, pattern string) bool {
	patRoot, pat := pyParts(pattern)
	if len(pat) == 0 {
		return false
	}
	idRoot, parts := pyParts(id)
	if patRoot {
		if !idRoot || len(pat) != len(parts) { // guard: mutation "if !idRoot {" lets an absolute pattern match a longer id
			return false
		}
		pat = pat[1:]
	} else if len(pat) > len(parts) {
		return false
	}
	// From the right: the id's last segments against the pattern's.
	for i := 1; i <= len(pat); i++ {
		if !fnmatch(parts[len(parts)-i], pat[len(pat)-i]) {
			return false
		}
	}
	return true
}

// fnmatch is Python's fnmatch.fnmatchcase for one segment.
func fnmatch(name, pat string) bool {
	n, p := []rune(name), []rune(pat)
	// Backtracking over the last '*': linear enough for short segments.
	ni, pi, starP, starN := 0, 0, -1, 0
	for ni < len(n) {
		if pi < len(p) {
			switch p[pi] {
			case '*':
				starP, starN = pi, ni
				pi++
				continue
			case '?':
				ni, pi = ni+1, pi+1
				continue
			case '[':
				if ok, next, isClass := matchClass(p, pi, n[ni]); isClass {
					if ok {
						ni, pi = ni+1, next
						continue
					}
				} else if n[ni] == '[' { // an unclosed '[' is a literal
					ni, pi = ni+1, pi+1
					continue
				}
			default:
				if p[pi] == n[ni] {
					ni, pi = ni+1, pi+1
					continue
				}
			}
		}
		if starP < 0 {
			return false
		}
		starN++
		ni, pi = starN, starP+1
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}

// matchClass matches c against the class starting at p[at] == '['. It
// returns whether c is in it, the index after the class, and false for
// isClass when the '[' is not closed (then it is a literal '[').
func matchClass(p []rune, at int, c rune) (ok bool, next int, isClass bool) {
	j := at + 1
	neg := j < len(p) && p[j] == '!'
	if neg {
		j++
	}
	start := j
	if j < len(p) && p[j] == ']' { // a ']' first is a member
		j++
	}
	for j < len(p) && p[j] != ']' {
		j++
	}
	if j >= len(p) {
		return false, 0, false
	}
	members := p[start:j]
	in := false
	for k := 0; k < len(members); k++ {
		if k+2 < len(members) && members[k+1] == '-' {
			if members[k] <= c && c <= members[k+2] {
				in = true
			}
			k += 2
			continue
		}
		if members[k] == c {
			in = true
		}
	}
	return in != neg, j + 1, true
}
