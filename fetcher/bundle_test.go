package fetcher

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
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
	// The streaming decoder reads to the end: as json.Unmarshal, text after
	// the object refuses the body, and null is no list.
	{"trailing_text", okBundle + ` {}`, false},
	{"trailing_space", okBundle + " \n", true},
	{"null_policy_modules", `{"manifest":[],"hash":"h","data_modules":[],"policy_modules":null}`, false},
	{"null_hash", `{"manifest":[],"hash":null,"data_modules":[],"policy_modules":[]}`, false},
	{"not_an_object", `[1,2]`, false},
	{"unknown_fields_skipped", `{"x":{"deep":[1,{"y":null}]},"manifest":[],"hash":"h","data_modules":[],"policy_modules":[],"z":1}`, true},
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

// refDecodeBundle is the decoder as it was before it streamed: the whole
// body through json.Unmarshal into pointer fields. The streaming decoder
// must accept and reject the same bodies, with the same result.
func refDecodeBundle(body []byte) (*PolicyBundle, error) {
	var raw struct {
		Manifest      *[]string       `json:"manifest"`
		Hash          *string         `json:"hash"`
		OldHash       *string         `json:"old_hash"`
		DataModules   *[]DataModule   `json:"data_modules"`
		PolicyModules *[]PolicyModule `json:"policy_modules"`
		DeletedFiles  *DeletedFiles   `json:"deleted_files"`
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, err
	}
	if raw.Manifest == nil || raw.Hash == nil || raw.DataModules == nil || raw.PolicyModules == nil {
		return nil, errors.New("missing field")
	}
	return &PolicyBundle{Manifest: *raw.Manifest, Hash: *raw.Hash, OldHash: raw.OldHash,
		DataModules: *raw.DataModules, PolicyModules: *raw.PolicyModules, DeletedFiles: raw.DeletedFiles}, nil
}

// hasRepeatedKey reports whether some object of the JSON text repeats a key:
// json.Unmarshal then merges the second value into the first (fields the
// second omits survive), the streaming decoder takes the second alone.
func hasRepeatedKey(body []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(body))
	var seen []map[string]bool
	var inObj []bool
	expectKey := func() bool { return len(inObj) > 0 && inObj[len(inObj)-1] }
	afterKey := false
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		switch tok {
		case json.Delim('{'):
			seen, inObj, afterKey = append(seen, map[string]bool{}), append(inObj, true), false
			continue
		case json.Delim('['):
			seen, inObj, afterKey = append(seen, nil), append(inObj, false), false
			continue
		case json.Delim('}'), json.Delim(']'):
			seen, inObj = seen[:len(seen)-1], inObj[:len(inObj)-1]
			afterKey = false
			continue
		}
		if expectKey() && !afterKey {
			k := strings.ToLower(tok.(string))
			if seen[len(seen)-1][k] {
				return true
			}
			seen[len(seen)-1][k] = true
			afterKey = true
			continue
		}
		afterKey = false
	}
}

// FuzzDecodeBundle: never a panic; a decoded bundle has its required lists;
// the streaming decoder agrees with json.Unmarshal on every body (but for
// repeated keys, see hasRepeatedKey), and with itself whatever the reads'
// sizes (one byte at a time).
func FuzzDecodeBundle(f *testing.F) {
	for _, tc := range bundleCases {
		f.Add([]byte(tc.body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		b, err := DecodeBundle(body)
		if err == nil && (b == nil || b.Manifest == nil || b.DataModules == nil || b.PolicyModules == nil) {
			t.Fatalf("accepted a bundle without its required fields: %+v", b)
		}
		if err != nil && !errors.Is(err, ErrInvalidBundle) {
			t.Fatalf("err %v does not wrap ErrInvalidBundle", err)
		}
		sb, serr := DecodeBundleFrom(iotest.OneByteReader(bytes.NewReader(body)))
		if (serr == nil) != (err == nil) || !reflect.DeepEqual(sb, b) {
			t.Fatalf("one byte at a time: %+v, %v; whole: %+v, %v", sb, serr, b, err)
		}
		if hasRepeatedKey(body) {
			return
		}
		rb, rerr := refDecodeBundle(body)
		if (rerr == nil) != (err == nil) {
			t.Fatalf("streaming err = %v, json.Unmarshal err = %v", err, rerr)
		}
		if err == nil && !reflect.DeepEqual(rb, b) {
			t.Fatalf("streaming %+v, json.Unmarshal %+v", b, rb)
		}
	})
}
