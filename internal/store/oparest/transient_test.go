package oparest

import (
	"errors"
	"strings"
	"testing"

	"github.com/opal-go/opal-client/internal/store"
	"github.com/opal-go/opal-client/updater"
)

// TestTransientClass: which store failures re-arm the deferred re-fetch
// (updater.IsTransient) and which say the store holds part of a write.
func TestTransientClass(t *testing.T) {
	cases := []struct {
		name               string
		err                error
		transient, partial bool
	}{
		{"U2_unreachable_is_transient", &RemoteError{Method: "GET", Path: "/v1/policies", Err: errors.New("connection refused")}, true, false},
		{"U2_5xx_is_transient", &RemoteError{Method: "PUT", Path: "/v1/policies/x", Status: 500}, true, false},
		{"U3_4xx_is_final", &RemoteError{Method: "PUT", Path: "/v1/policies/x", Status: 400}, false, false},
		{"U2_partial_write_is_transient_and_partial", &PartialWriteError{Writes: 1, Err: &RemoteError{Status: 500}}, true, true},
		{"U3_compile_error_is_final", &store.CompileError{}, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := updater.IsTransient(tc.err); got != tc.transient {
				t.Fatalf("IsTransient = %v, want %v", got, tc.transient)
			}
			if got := updater.IsPartial(tc.err); got != tc.partial {
				t.Fatalf("IsPartial = %v, want %v", got, tc.partial)
			}
		})
	}
}

// TestStoreURLSecretNotInErrors: OPAL_POLICY_STORE_URL's user info (a token
// as user name too, which Go's client keeps) never reaches an error text.
func TestStoreURLSecretNotInErrors(t *testing.T) {
	const secret = "ST0RE-S3CRET"
	s, err := New(Options{URL: "http://" + secret + ":" + secret + "@127.0.0.1:1", Attempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Health(t.Context())
	if err == nil || strings.Contains(err.Error(), secret) {
		t.Fatalf("health error %v holds the secret", err)
	}
	if _, err := New(Options{URL: "ftp://" + secret + "@h/?t=" + secret}); err == nil || strings.Contains(err.Error(), secret) {
		t.Fatalf("bad-URL error %v holds the secret", err)
	}
}
