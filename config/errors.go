package config

import (
	"fmt"

	"github.com/opal-go/opal-client/internal/redact"
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
// the agent's one redaction (internal/redact).
func redactURL(s string) string { return redact.URL(s) }

func redactURLs(urls []string) []string { return redact.URLs(urls) }
