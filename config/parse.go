package config

import (
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Accepted-value phrases, shared by the error lines and the docs.
const (
	acceptBool      = "true, false, 1 or 0 (any case)"
	acceptSeconds   = "a number of seconds >= 0"
	acceptPositive  = "a number of seconds > 0"
	acceptRetry     = `a JSON object like {"wait_strategy":"fixed|exponential|random_exponential","wait_time":2,"attempts":2,"max_wait":10}`
	acceptCallbacks = `{"callbacks":["url", ...]} or a ','-separated list of URLs`
)

// parser turns the raw strings into typed values, keeping the first error.
// name is the variable of the row being parsed; raw holds every variable
// read, for the rows whose meaning depends on another's (nil = unset).
type parser struct {
	name     string
	raw      map[string]*string
	err      error
	warnings []Warning
}

func (p *parser) fail(value, accepted, reason string) {
	if p.err == nil {
		p.err = newError(p.name, value, accepted, reason, false)
	}
}

// failSecret is fail for a value that may hold a secret (a callback's
// headers): the line shows *** and only the reason.
func (p *parser) failSecret(value, accepted, reason string) {
	if p.err == nil {
		p.err = newError(p.name, value, accepted, reason, true)
	}
}

// warn records a setting that is accepted but has no effect.
func (p *parser) warn(msg string) {
	p.warnings = append(p.warnings, Warning{Var: p.name, Message: msg})
}

// isSet reports whether the variable name is set to a non-blank value.
func (p *parser) isSet(name string) bool { return get(p.raw[name], "") != "" }

// get returns the value of a variable, or def when it is unset or empty.
func get(v *string, def string) string {
	if v == nil || strings.TrimSpace(*v) == "" {
		return def
	}
	return strings.TrimSpace(*v)
}

func (p *parser) boolean(v *string, def bool) bool {
	s := get(v, "")
	if s == "" {
		return def
	}
	switch strings.ToLower(s) {
	case "true", "1":
		return true
	case "false", "0":
		return false
	}
	p.fail(s, acceptBool, "")
	return def
}

// duration parses float seconds; positive demands > 0 instead of >= 0.
func (p *parser) duration(v *string, def time.Duration, positive bool) time.Duration {
	s := get(v, "")
	if s == "" {
		return def
	}
	accepted := acceptSeconds
	if positive {
		accepted = acceptPositive
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 || (positive && f == 0) {
		p.fail(s, accepted, "")
		return def
	}
	if f >= float64(maxDuration)/float64(time.Second) {
		p.fail(s, accepted, "too large")
		return def
	}
	return time.Duration(math.Round(f * float64(time.Second)))
}

// integer parses a whole number in [lo, hi].
func (p *parser) integer(v *string, def, lo, hi int64) int64 {
	s := get(v, "")
	if s == "" {
		return def
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < lo || n > hi {
		p.fail(s, fmt.Sprintf("a whole number from %d to %d", lo, hi), "")
		return def
	}
	return n
}

func (p *parser) retry(v *string, def ConnRetryOptions) ConnRetryOptions {
	s := get(v, "")
	if s == "" {
		return def
	}
	var o ConnRetryOptions
	if err := o.Decode(s); err != nil {
		p.fail(s, acceptRetry, err.Error())
		return def
	}
	return o
}

func (p *parser) url(v *string, def string) string {
	s := get(v, def)
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" || u.Host == "" {
		p.fail(redactURL(s), "an absolute URL such as http://host:port", "")
		return def
	}
	return strings.TrimRight(s, "/")
}

// list splits on sep, trims items, drops surrounding quotes and empty items.
func list(s, sep string) []string {
	var out []string
	for _, item := range strings.Split(s, sep) {
		item = strings.TrimSpace(item)
		if len(item) >= 2 && (item[0] == '"' || item[0] == '\'') && item[len(item)-1] == item[0] {
			item = strings.TrimSpace(item[1 : len(item)-1])
		}
		if item != "" {
			out = append(out, item)
		}
	}
	return out
}

func notSupported(v string, known ...string) string {
	for _, k := range known {
		if strings.EqualFold(v, k) {
			return v + " is a Python client option this agent does not support"
		}
	}
	return ""
}

// callbacks reads the Python UpdateCallback model, {"callbacks":[url or
// [url, config], ...]}, keeping the URLs; a plain ','-list of URLs is
// accepted too.
func (p *parser) callbacks(v *string, def []string) []string {
	s := get(v, "")
	if s == "" {
		return def
	}
	if !strings.HasPrefix(s, "{") {
		return list(s, ",")
	}
	var m struct {
		Callbacks []json.RawMessage `json:"callbacks"`
	}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		p.failSecret(s, acceptCallbacks, err.Error())
		return def
	}
	out := []string{}
	for _, raw := range m.Callbacks {
		var u string
		var pair []json.RawMessage
		if json.Unmarshal(raw, &u) != nil {
			if json.Unmarshal(raw, &pair) != nil || len(pair) == 0 || json.Unmarshal(pair[0], &u) != nil {
				p.failSecret(s, acceptCallbacks, "a callback is neither a URL nor [URL, config]")
				return def
			}
		}
		out = append(out, u)
	}
	return out
}

func (p *parser) inlineOPA(v *string) InlineOPAConfig {
	s := get(v, "")
	c, err := ParseInlineOPAConfig(s)
	if err != nil && p.err == nil {
		e := newError(p.name, s, acceptInlineOPA, err.Error(), false)
		e.Err = err
		p.err = e
	}
	return c
}

// wsURL derives the WebSocket URL from the server URL (§2.1). Only the scheme
// is rewritten: Python replaces the substrings anywhere, which would also
// mangle a host such as "http-gw".
func wsURL(server string) string {
	switch {
	case strings.HasPrefix(server, "https"):
		return "wss" + strings.TrimPrefix(server, "https")
	case strings.HasPrefix(server, "http"):
		return "ws" + strings.TrimPrefix(server, "http")
	}
	return server
}

// NormalizeDirs normalises subscription directories like Python's pathlib
// (trailing and repeated '/' removed, "./x" -> "x", "" -> "."; ".." is kept)
// and drops every entry that another entry contains ("." contains every
// relative path), as §3.1 describes. The result is sorted and duplicate-free.
func NormalizeDirs(dirs []string) []string {
	set := map[string]bool{}
	for _, d := range dirs {
		set[normalizeDir(strings.TrimSpace(d))] = true
	}
	var out []string
	for d := range set {
		covered := false
		for other := range set {
			if other != d && isAncestor(other, d) {
				covered = true
				break
			}
		}
		if !covered {
			out = append(out, d)
		}
	}
	sort.Strings(out)
	return out
}

func normalizeDir(d string) string {
	abs := strings.HasPrefix(d, "/")
	var parts []string
	for _, part := range strings.Split(d, "/") {
		if part != "" && part != "." {
			parts = append(parts, part)
		}
	}
	s := strings.Join(parts, "/")
	switch {
	case abs:
		return "/" + s
	case s == "":
		return "."
	}
	return s
}

// isAncestor reports whether a contains b (both normalised).
func isAncestor(a, b string) bool {
	if a == "." {
		return !strings.HasPrefix(b, "/")
	}
	if a == "/" {
		return strings.HasPrefix(b, "/")
	}
	return strings.HasPrefix(b, a+"/")
}
