// Package memstore is an in-memory updater.Store for tests and the fleet
// simulator: full and delta bundles per protocol §5.2 (simplified), applied
// all-or-nothing (U3), with injectable read, write and health failures and a
// detector of overlapping transactions (U1).
package memstore

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"sync"

	"github.com/opal-go/opal-client/fetcher"
	"github.com/opal-go/opal-client/updater"
)

var _ updater.Store = (*Store)(nil)

// Store holds policies by path, policy data by directory, and the hash of
// the last bundle applied. It is safe for concurrent use.
type Store struct {
	mu       sync.Mutex
	hash     string
	policies map[string]string // path -> rego
	data     map[string]any    // data module dir or data path -> decoded value

	readErr, writeErr, healthErr error

	// BeforeWrite, if set, runs inside every write transaction before it
	// changes anything; tests block in it to hold a transaction open.
	BeforeWrite func(ctx context.Context)

	active   int // write transactions in progress
	overlaps int // times a write began while another was in progress
	writes   int // write transactions begun
	applied  []string
}

// New returns an empty store (no hash: the first update fetches a full bundle).
func New() *Store {
	return &Store{policies: map[string]string{}, data: map[string]any{}}
}

// FailReads makes PolicyHash return err (nil clears it), for F11.
func (s *Store) FailReads(err error) { s.mu.Lock(); s.readErr = err; s.mu.Unlock() }

// FailWrites makes every write return err and change nothing (nil clears it).
func (s *Store) FailWrites(err error) { s.mu.Lock(); s.writeErr = err; s.mu.Unlock() }

// FailHealth makes Health return err (nil clears it).
func (s *Store) FailHealth(err error) { s.mu.Lock(); s.healthErr = err; s.mu.Unlock() }

// PolicyHash returns the hash of the last bundle applied.
func (s *Store) PolicyHash(context.Context) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.readErr != nil {
		return "", s.readErr
	}
	return s.hash, nil
}

// Health returns the injected health error, if any.
func (s *Store) Health(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.healthErr
}

// begin and end bracket a write transaction and count overlaps.
func (s *Store) begin(ctx context.Context) {
	s.mu.Lock()
	s.writes++
	s.active++
	if s.active > 1 {
		s.overlaps++
	}
	hook := s.BeforeWrite
	s.mu.Unlock()
	if hook != nil {
		hook(ctx)
	}
}

func (s *Store) end() {
	s.mu.Lock()
	s.active--
	s.mu.Unlock()
}

// ApplyPolicy applies b all-or-nothing. A delta whose OldHash is not the
// current hash is refused with *updater.BaseMismatchError. Unlike OPA, which
// skips a data module that is not JSON, this store refuses the whole bundle,
// so tests can exercise U3 with a bad bundle.
func (s *Store) ApplyPolicy(ctx context.Context, b *fetcher.PolicyBundle) error {
	s.begin(ctx)
	defer s.end()
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.writeErr != nil {
		return s.writeErr
	}
	if b == nil {
		return fmt.Errorf("memstore: nil bundle")
	}
	if b.IsDelta() && *b.OldHash != s.hash {
		return &updater.BaseMismatchError{Current: s.hash, Base: *b.OldHash}
	}
	// Build the new state on copies, then swap: all-or-nothing (U3).
	pol := maps.Clone(s.policies)
	data := maps.Clone(s.data)
	if !b.IsDelta() {
		pol = map[string]string{}
	}
	for _, m := range b.DataModules {
		var v any
		if err := json.Unmarshal([]byte(m.Data), &v); err != nil {
			return fmt.Errorf("memstore: data module %q: %w", m.Path, err)
		}
		data[m.Path] = v
	}
	if b.DeletedFiles != nil {
		for _, d := range b.DeletedFiles.DataModules {
			delete(data, d)
		}
		for _, p := range b.DeletedFiles.PolicyModules {
			delete(pol, p)
		}
	}
	for _, m := range b.PolicyModules {
		pol[m.Path] = m.Rego
	}
	s.policies, s.data, s.hash = pol, data, b.Hash
	s.applied = append(s.applied, b.Hash)
	return nil
}

// SetData writes value at path in one transaction (the data updater's
// writes, serialised on the update queue).
func (s *Store) SetData(ctx context.Context, path string, value any) error {
	s.begin(ctx)
	defer s.end()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.writeErr != nil {
		return s.writeErr
	}
	s.data[path] = value
	return nil
}

// Policies returns a copy of the policies by path.
func (s *Store) Policies() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.policies)
}

// Data returns the value stored for a data module directory or data path.
func (s *Store) Data(path string) (any, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.data[path]
	return v, ok
}

// Applied lists the hashes of the bundles applied, in order.
func (s *Store) Applied() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.applied...)
}

// Writes is the number of write transactions begun, failed ones included.
func (s *Store) Writes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writes
}

// Overlaps is the number of write transactions that began while another was
// still in progress; the serial update queue keeps it 0 (U1).
func (s *Store) Overlaps() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.overlaps
}
