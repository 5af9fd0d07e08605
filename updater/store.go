package updater

import (
	"context"
	"errors"
	"fmt"

	"github.com/opal-go/opal-client/fetcher"
)

// Store is the policy store an Updater writes: embedded OPA, OPA over REST, or
// an in-memory fake in tests. Only the Updater's single goroutine calls the
// write methods (U1).
type Store interface {
	// PolicyHash returns the hash of the bundle last applied, or "" if none.
	// An error makes the update degrade to a full bundle (F11).
	PolicyHash(ctx context.Context) (string, error)
	// ApplyPolicy applies a full or delta bundle all-or-nothing (U3): on any
	// error the store is exactly as it was, except after an error for which
	// IsPartial is true (a remote store that failed half-way; the store then
	// forgets its hash so the next update is a full bundle). A delta whose
	// OldHash is not the store's current hash is refused with a
	// *BaseMismatchError. An error for which IsTransient is true re-arms the
	// deferred re-fetch.
	ApplyPolicy(ctx context.Context, b *fetcher.PolicyBundle) error
	// Health returns nil when the store is reachable and serving.
	Health(ctx context.Context) error
}

// BaseMismatchError is returned by Store.ApplyPolicy for a delta bundle built
// on a base other than the store's current hash. The Updater answers it with
// a full fetch; the delta is never applied.
type BaseMismatchError struct {
	Current string // the store's hash
	Base    string // the delta's old_hash
}

func (e *BaseMismatchError) Error() string {
	return fmt.Sprintf("delta bundle base %q does not match current policy hash %q", e.Base, e.Current)
}

// IsPartial reports whether err says the store holds part of a write (it
// has a PartialWrite method answering true).
func IsPartial(err error) bool {
	var p interface{ PartialWrite() bool }
	return errors.As(err, &p) && p.PartialWrite()
}
