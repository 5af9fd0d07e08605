package testutil

import (
	"os"
	"testing"
)

// OPABinaryEnv names the variable that points the tests at a real `opa`
// binary. `make test` installs one (pinned, from the Go module proxy) and sets
// it; a plain `go test` without it skips the tests that need a real OPA.
const OPABinaryEnv = "OPAL_TEST_OPA"

// OPABinary returns the path of the real `opa` binary for end-to-end tests
// against `opa run`, or skips t when none is configured. Under CI (CI=true)
// a missing binary fails the test instead: CI must never pass by skipping
// the real-part tests.
func OPABinary(t testing.TB) string {
	t.Helper()
	p := os.Getenv(OPABinaryEnv)
	if p == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set under CI: run the tests through `make test`", OPABinaryEnv)
		}
		t.Skipf("%s not set: no real OPA for this test (make test installs one)", OPABinaryEnv)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s=%s: %v", OPABinaryEnv, p, err)
	}
	return p
}
