// Package redact is the one redaction of secrets in URLs used by every log
// line, error text, metric and print-config output of the agent: the whole
// user info (a token is often the user name, which url.URL.Redacted keeps),
// every query value and the fragment.
package redact

import (
	"errors"
	"net/url"
	"strconv"
	"strings"
)

// Mask replaces a hidden part of a URL, as in url.URL.Redacted.
const Mask = "xxxxx"

// URL hides what in s may be a secret. A value that does not parse into a
// URL with a host is cut by hand: from the first '?' or '#', and everything
// from the scheme to the last '@'.
func URL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return raw(s)
	}
	if u.User != nil {
		u.User = url.User(Mask)
	}
	if u.RawQuery != "" || u.ForceQuery {
		q, err := url.ParseQuery(u.RawQuery)
		if err != nil {
			q = url.Values{} // malformed pairs are dropped, which hides them too
		}
		for _, vs := range q {
			for i := range vs {
				vs[i] = Mask
			}
		}
		u.RawQuery = q.Encode()
		if u.RawQuery == "" {
			u.RawQuery = Mask
		}
	}
	if u.Fragment != "" || u.RawFragment != "" {
		u.Fragment, u.RawFragment = Mask, ""
	}
	return u.String()
}

func raw(s string) string {
	if i := strings.IndexAny(s, "?#"); i >= 0 {
		s = s[:i] + "?" + Mask
	}
	if i := strings.LastIndex(s, "@"); i >= 0 {
		start := 0
		if j := strings.Index(s, "://"); j >= 0 && j < i {
			start = j + len("://")
		}
		s = s[:start] + Mask + s[i:]
	}
	return s
}

// URLs redacts each of urls.
func URLs(urls []string) []string {
	out := make([]string, len(urls))
	for i, u := range urls {
		out[i] = URL(u)
	}
	return out
}

// Error returns err with the URL of the *url.Error in its chain redacted
// in its text (a transport error names the URL it failed on, a redirect's
// included); errors.As and errors.Is still see the chain. An error without
// one is returned as it is.
func Error(err error) error {
	var ue *url.Error
	if err == nil || !errors.As(err, &ue) {
		return err
	}
	r := URL(ue.URL)
	if r == ue.URL {
		return err
	}
	text := strings.ReplaceAll(err.Error(), ue.URL, r)
	// The text quotes the URL (%q): its escaped form too.
	text = strings.ReplaceAll(text, strings.Trim(strconv.Quote(ue.URL), `"`), r)
	return &redactedError{text: text, err: err}
}

type redactedError struct {
	text string
	err  error
}

func (e *redactedError) Error() string { return e.text }
func (e *redactedError) Unwrap() error { return e.err }
