package main

import (
	"context"
	"testing"

	"github.com/open-policy-agent/opa/v1/tester"
)

// TestExamplePolicy runs the example policy's rego tests (opa test
// examples/policy): `make run` serves it, so it must keep passing, with the
// runtime accounts the data updater writes included.
func TestExamplePolicy(t *testing.T) {
	res, err := tester.Run(context.Background(), "../../../examples/policy")
	if err != nil {
		t.Fatal(err)
	}
	if len(res) < 6 {
		t.Fatalf("%d rego tests found, want at least 6", len(res))
	}
	for _, r := range res {
		if r.Fail || r.Error != nil {
			t.Errorf("%s.%s failed: %v", r.Package, r.Name, r.Error)
		}
	}
}
