package fetcher

import (
	"encoding/json"
	"errors"
	"fmt"
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

// DecodeBundle decodes and validates a bundle body. Required fields
// (manifest, hash, data_modules, policy_modules) must be present; a body that
// is truncated, not JSON, or misses one of them is an error wrapping
// ErrInvalidBundle.
func DecodeBundle(body []byte) (*PolicyBundle, error) {
	var raw struct {
		Manifest      *[]string       `json:"manifest"`
		Hash          *string         `json:"hash"`
		OldHash       *string         `json:"old_hash"`
		DataModules   *[]DataModule   `json:"data_modules"`
		PolicyModules *[]PolicyModule `json:"policy_modules"`
		DeletedFiles  *DeletedFiles   `json:"deleted_files"`
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidBundle, err)
	}
	switch {
	case raw.Manifest == nil:
		return nil, fmt.Errorf("%w: missing manifest", ErrInvalidBundle)
	case raw.Hash == nil:
		return nil, fmt.Errorf("%w: missing hash", ErrInvalidBundle)
	case raw.DataModules == nil:
		return nil, fmt.Errorf("%w: missing data_modules", ErrInvalidBundle)
	case raw.PolicyModules == nil:
		return nil, fmt.Errorf("%w: missing policy_modules", ErrInvalidBundle)
	}
	return &PolicyBundle{
		Manifest:      *raw.Manifest,
		Hash:          *raw.Hash,
		OldHash:       raw.OldHash,
		DataModules:   *raw.DataModules,
		PolicyModules: *raw.PolicyModules,
		DeletedFiles:  raw.DeletedFiles,
	}, nil
}
