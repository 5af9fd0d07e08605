package fetcher

import (
	"errors"
	"testing"
)

// Guards DecodeBundle's required-field check (mutation: drop the manifest case).
func TestDecodeBundleRequiresManifest(t *testing.T) {
	_, err := decodeNoPanic(t, []byte(`{"hash":"h","data_modules":[],"policy_modules":[]}`))
	if !errors.Is(err, ErrInvalidBundle) {
		t.Fatalf("err = %v, want ErrInvalidBundle", err)
	}
}

// decodeNoPanic decodes body and fails the test if the decoder panics: bad
// input gets an error, never a crash.
func decodeNoPanic(t *testing.T, body []byte) (b *PolicyBundle, err error) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("DecodeBundle(%q) panicked: %v", body, r)
		}
	}()
	return DecodeBundle(body)
}

var bundleCases = []struct {
	name string
	body string
	ok   bool
}{
	{"full", okBundle, true},
	{"delta", `{"manifest":[],"hash":"3","old_hash":"2","data_modules":[],"policy_modules":[],
	  "deleted_files":{"data_modules":["old"],"policy_modules":["rbac/legacy.rego"]}}`, true},
	{"truncated", `{"manifest":["a"],"hash":"h","data_modules":[`, false},
	{"not_json", `<html>oops</html>`, false},
	{"empty", ``, false},
	// Mutation caught: drop the hash case.
	{"missing_hash", `{"manifest":[],"data_modules":[],"policy_modules":[]}`, false},
	// Mutation caught: drop the data_modules case.
	{"missing_data_modules", `{"manifest":[],"hash":"h","policy_modules":[]}`, false},
	// Mutation caught: drop the policy_modules case.
	{"missing_policy_modules", `{"manifest":[],"hash":"h","data_modules":[]}`, false},
	// §4.2: data is the file's text as a JSON string, not a decoded object.
	{"data_must_be_string", `{"manifest":[],"hash":"h","data_modules":[{"path":".","data":{"a":1}}],"policy_modules":[]}`, false},
}

// Protocol §4.2: the decoder accepts exactly the bundle shape.
func TestDecodeBundle_Protocol42(t *testing.T) {
	for _, tc := range bundleCases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeNoPanic(t, []byte(tc.body))
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidBundle) {
				t.Errorf("err %v does not wrap ErrInvalidBundle", err)
			}
		})
	}
	b, _ := DecodeBundle([]byte(okBundle))
	if b.IsDelta() || b.DataModules[0].Data != `{"roles":{"admin":["read"]}}` || b.PolicyModules[0].PackageName != "app.rbac" {
		t.Errorf("decoded %+v", b)
	}
}

// FuzzDecodeBundle: never a panic; a decoded bundle has its required lists.
func FuzzDecodeBundle(f *testing.F) {
	for _, tc := range bundleCases {
		f.Add([]byte(tc.body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		b, err := DecodeBundle(body)
		if err == nil && (b == nil || b.Manifest == nil || b.DataModules == nil || b.PolicyModules == nil) {
			t.Fatalf("accepted a bundle without its required fields: %+v", b)
		}
	})
}
