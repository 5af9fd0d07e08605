package config

import (
	"fmt"
	"net/url"
	"strings"
)

// Error is a bad configuration value. Its text is one line that names the
// variable, quotes the value (masked for secrets, shortened when long) and
// says what is accepted, so startup can print it as is.
type Error struct {
	Var      string // the full variable name, e.g. OPAL_POLICY_UPDATER_MAX_RETRY_AFTER
	Value    string // the offending value, already masked/shortened
	Accepted string // what the variable accepts
	Reason   string // optional detail, e.g. "not supported" or a JSON error
	Err      error  // the typed cause, if any (e.g. *InlineOPAError)
}

// Unwrap returns the typed cause, for errors.As.
func (e *Error) Unwrap() error { return e.Err }

func (e *Error) Error() string {
	s := fmt.Sprintf("invalid %s=%q: accepted: %s", e.Var, e.Value, e.Accepted)
	if e.Reason != "" {
		s += " (" + e.Reason + ")"
	}
	return s
}

// maxShownValue keeps an error line readable when a JSON blob is wrong.
const maxShownValue = 80

// newError builds the error line of the variable name (its full name).
func newError(name, value, accepted, reason string, secret bool) *Error {
	switch {
	case secret:
		value = mask(value)
	case len(value) > maxShownValue:
		value = value[:maxShownValue] + "..."
	}
	return &Error{Var: name, Value: value, Accepted: accepted, Reason: oneLine(reason)}
}

func mask(s string) string {
	if s == "" {
		return ""
	}
	return "***"
}

func oneLine(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == '\n' || c == '\r' {
			b[i] = ' '
		}
	}
	return string(b)
}

// redactURL hides what in a URL may be a secret, for error lines and Masked:
// the whole user info (a token is often the user name, which
// url.URL.Redacted keeps), every query value and the fragment. A value that
// does not parse into a URL with a host is cut by hand.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return redactRawURL(s)
	}
	if u.User != nil {
		u.User = url.User(redacted)
	}
	if u.RawQuery != "" {
		q := u.Query() // malformed pairs are dropped, which hides them too
		for _, vs := range q {
			for i := range vs {
				vs[i] = redacted
			}
		}
		u.RawQuery = q.Encode()
		if u.RawQuery == "" {
			u.RawQuery = redacted
		}
	}
	if u.Fragment != "" {
		u.Fragment, u.RawFragment = redacted, ""
	}
	return u.String()
}

// redactRawURL cuts an unparsable URL at the first '?' or '#' and replaces
// everything from the scheme to the last '@' (user info, maybe mangled).
func redactRawURL(s string) string {
	if i := strings.IndexAny(s, "?#"); i >= 0 {
		s = s[:i] + "?" + redacted
	}
	if i := strings.LastIndex(s, "@"); i >= 0 {
		start := 0
		if j := strings.Index(s, "://"); j >= 0 && j < i {
			start = j + len("://")
		}
		s = s[:start] + redacted + s[i:]
	}
	return s
}

func redactURLs(urls []string) []string {
	out := make([]string, len(urls))
	for i, u := range urls {
		out[i] = redactURL(u)
	}
	return out
}

// redacted replaces a hidden part of a URL, as in url.URL.Redacted.
const redacted = "xxxxx"
