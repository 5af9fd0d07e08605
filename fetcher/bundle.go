package fetcher

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// PolicyBundle is the body of GET /policy (opal-protocol §4.2). A bundle with
// a nil OldHash is full; one with OldHash set is a delta from that commit.
type PolicyBundle struct {
	// Manifest lists the repo-relative paths of the included files in load order.
	Manifest []string `json:"manifest"`
	// Hash is the commit the bundle brings the store to.
	Hash string `json:"hash"`
	// OldHash is nil for a full bundle and the base commit for a delta.
	OldHash *string `json:"old_hash"`
	// DataModules are the data.json files, keyed by their directory.
	DataModules []DataModule `json:"data_modules"`
	// PolicyModules are the Rego files, keyed by their path (the OPA policy id).
	PolicyModules []PolicyModule `json:"policy_modules"`
	// DeletedFiles is set on deltas that removed files; nil otherwise.
	DeletedFiles *DeletedFiles `json:"deleted_files"`
}

// DataModule is one data.json file. Path is its directory ("." is the root);
// Data is the file's text as a JSON string, not a decoded value.
type DataModule struct {
	Path string `json:"path"`
	Data string `json:"data"`
}

// PolicyModule is one Rego file.
type PolicyModule struct {
	Path        string `json:"path"`
	PackageName string `json:"package_name"`
	Rego        string `json:"rego"`
}

// DeletedFiles lists what a delta bundle removed: data module directories and
// policy module paths (dependents first).
type DeletedFiles struct {
	DataModules   []string `json:"data_modules"`
	PolicyModules []string `json:"policy_modules"`
}

// IsDelta reports whether the bundle is a delta (old_hash set).
func (b *PolicyBundle) IsDelta() bool { return b != nil && b.OldHash != nil }

// ErrInvalidBundle is wrapped by every DecodeBundle failure.
var ErrInvalidBundle = errors.New("invalid policy bundle")

// DecodeBundle decodes and validates a bundle body held in memory; see
// DecodeBundleFrom.
func DecodeBundle(body []byte) (*PolicyBundle, error) {
	return DecodeBundleFrom(bytes.NewReader(body))
}

// DecodeBundleFrom decodes and validates a bundle read from r, as a stream:
// the top-level object and its module lists are walked token by token and
// each module is decoded on its own, so the decoder's buffer holds one module
// at a time, never the whole body (a 100 MB bundle is not held twice, as raw
// text and as decoded strings). Required fields (manifest, hash,
// data_modules, policy_modules) must be present and not null; a body that is
// truncated, not JSON, has text after the object, or misses one of them is
// an error wrapping ErrInvalidBundle. Unknown fields are skipped; field names
// match as encoding/json matches them (exactly, else case-insensitively), and
// a repeated field's last value wins. An error of r is returned wrapped, so
// errors.Is sees it (ErrBodyTooLarge from the fetcher's limited body).
func DecodeBundleFrom(r io.Reader) (*PolicyBundle, error) {
	b, err := decodeBundle(json.NewDecoder(r))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidBundle, err)
	}
	return b, nil
}

func decodeBundle(dec *json.Decoder) (*PolicyBundle, error) {
	var (
		b                    PolicyBundle
		manifest, hash       bool
		dataMods, policyMods bool
	)
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if tok != json.Delim('{') {
		return nil, fmt.Errorf("bundle is %v, not a JSON object", tokenKind(tok))
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := tok.(string) // an object's keys are strings
		switch {
		case strings.EqualFold(key, "manifest"):
			b.Manifest = nil
			if err := dec.Decode(&b.Manifest); err != nil {
				return nil, fmt.Errorf("manifest: %w", err)
			}
			manifest = b.Manifest != nil
		case strings.EqualFold(key, "hash"):
			var h *string
			if err := dec.Decode(&h); err != nil {
				return nil, fmt.Errorf("hash: %w", err)
			}
			hash = h != nil
			if hash {
				b.Hash = *h
			}
		case strings.EqualFold(key, "old_hash"):
			b.OldHash = nil
			if err := dec.Decode(&b.OldHash); err != nil {
				return nil, fmt.Errorf("old_hash: %w", err)
			}
		case strings.EqualFold(key, "deleted_files"):
			b.DeletedFiles = nil
			if err := dec.Decode(&b.DeletedFiles); err != nil {
				return nil, fmt.Errorf("deleted_files: %w", err)
			}
		case strings.EqualFold(key, "data_modules"):
			if b.DataModules, err = decodeList[DataModule](dec); err != nil {
				return nil, fmt.Errorf("data_modules: %w", err)
			}
			dataMods = b.DataModules != nil
		case strings.EqualFold(key, "policy_modules"):
			if b.PolicyModules, err = decodeList[PolicyModule](dec); err != nil {
				return nil, fmt.Errorf("policy_modules: %w", err)
			}
			policyMods = b.PolicyModules != nil
		default:
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return nil, err
			}
		}
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		if err == nil {
			err = errors.New("text after the bundle object")
		}
		return nil, err
	}
	switch {
	case !manifest:
		return nil, errors.New("missing manifest")
	case !hash:
		return nil, errors.New("missing hash")
	case !dataMods:
		return nil, errors.New("missing data_modules")
	case !policyMods:
		return nil, errors.New("missing policy_modules")
	}
	return &b, nil
}

// decodeList decodes a JSON array of T one element at a time; null is a nil
// slice, [] an empty one.
func decodeList[T any](dec *json.Decoder) ([]T, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if tok == nil {
		return nil, nil
	}
	if tok != json.Delim('[') {
		return nil, fmt.Errorf("%v, not an array", tokenKind(tok))
	}
	out := []T{}
	for dec.More() {
		var v T
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	_, err = dec.Token() // the closing ']'
	return out, err
}

func tokenKind(tok json.Token) string {
	switch tok.(type) {
	case nil:
		return "null"
	case json.Delim:
		return fmt.Sprintf("%q", tok)
	default:
		return fmt.Sprintf("a %T", tok)
	}
}
