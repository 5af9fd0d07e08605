package fetcher

import (
	"errors"
	"testing"
)

// Guards DecodeBundle's required-field check (mutation: drop the manifest case).
func TestDecodeBundleRequiresManifest(t *testing.T) {
	_, err := DecodeBundle([]byte(`{"hash":"h","data_modules":[],"policy_modules":[]}`))
	if !errors.Is(err, ErrInvalidBundle) {
		t.Fatalf("err = %v, want ErrInvalidBundle", err)
	}
}
