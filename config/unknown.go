package config

import (
	"sort"
	"strings"
)

// Warning is a variable set in the environment that does nothing: a name no
// row of the settings table knows, a Python client setting this agent does
// not read, or a setting accepted without effect. Message is one line that
// names the variable and never quotes its value (it may be a secret).
type Warning struct {
	Var     string // the variable, e.g. OPAL_POLICY_SUBSCRIPTION_DIR
	Message string
	// Suggest is the nearest known name for an unknown variable, or "".
	Suggest string
}

// UnknownVariables returns a warning for each OPAL_ variable of environ
// (os.Environ's form, "NAME=value") that is not read: one no row names,
// with the nearest known name when one is close ("OPAL_X is not a setting;
// did you mean OPAL_Y?"), and each Python client setting this agent does not
// read, with what happens instead. Sorted by name.
func UnknownVariables(environ []string) []Warning {
	known := map[string]*setting{}
	for i := range settings {
		known[settings[i].name] = &settings[i]
	}
	seen := map[string]bool{}
	var out []Warning
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, Prefix) || seen[name] {
			continue
		}
		seen[name] = true
		s, ok := known[name]
		switch {
		case !ok:
			w := Warning{Var: name, Message: name + " is not a setting", Suggest: nearest(name)}
			if w.Suggest != "" {
				w.Message += "; did you mean " + w.Suggest + "?"
			}
			out = append(out, w)
		case s.origin == pythonNotRead:
			out = append(out, Warning{Var: name, Message: name + " is a Python client setting this agent does not read: " + instead(s)})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Var < out[j].Var })
	return out
}

// instead is a not-read row's "what happens instead", with a leading
// "as `OTHER`" replaced by OTHER's text, so a warning reads on its own.
func instead(s *setting) string {
	doc := s.doc
	for range settings { // bounded: a chain of "as" rows cannot be longer
		rest, ok := strings.CutPrefix(doc, "as `")
		if !ok {
			break
		}
		ref, tail, _ := strings.Cut(rest, "`")
		found := false
		for i := range settings {
			if settings[i].name == ref {
				doc, found = settings[i].doc+tail, true
				break
			}
		}
		if !found {
			break
		}
	}
	return doc
}

// nearest is the known variable closest to name by edit distance, if it is
// close enough to be a typo: at most 3 edits and under a third of the name
// (without the prefix), so OPAL_FOO suggests nothing. Ties go to the
// earlier row.
func nearest(name string) string {
	base := strings.TrimPrefix(name, Prefix)
	best, bestD := "", -1
	for _, s := range settings {
		if !strings.HasPrefix(s.name, Prefix) {
			continue
		}
		d := levenshtein(base, strings.TrimPrefix(s.name, Prefix))
		if bestD < 0 || d < bestD {
			best, bestD = s.name, d
		}
	}
	if bestD < 0 || bestD > 3 || 3*bestD >= len(base) {
		return ""
	}
	return best
}

// levenshtein is the edit distance (insert, delete, substitute) of a and b,
// by bytes: variable names are ASCII.
func levenshtein(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
