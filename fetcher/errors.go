package fetcher

import (
	"fmt"
	"time"
)

// RetryableError is an answer worth asking again (F1): 503 and 429 (with the
// server's Retry-After hint, if it gave a usable one), any other unexpected
// status (Status set, no hint), or a connection error, timeout or bad body
// (Status 0 for transport failures, 200 for an undecodable body).
type RetryableError struct {
	Status        int           // HTTP status, 0 when no response was received
	RetryAfter    time.Duration // parsed Retry-After, valid when HasRetryAfter
	HasRetryAfter bool
	Message       string // the server's message or a description; never the token
	Exhausted     bool   // set on the error a whole fetch ends with (F8)
	Err           error  // the underlying transport or decode error, if any
}

func (e *RetryableError) Error() string {
	s := "retryable"
	if e.Exhausted {
		s = "exhausted retries"
	}
	if e.Status != 0 {
		s += fmt.Sprintf(": status %d", e.Status)
	}
	if e.HasRetryAfter {
		s += fmt.Sprintf(" (retry after %s)", e.RetryAfter)
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *RetryableError) Unwrap() error { return e.Err }

// NonRetryableError is an answer that asking again cannot change (F1): 409
// (branch unresolved), 404 (as *BundlePathNotFound) or a body over the size
// limit. A fetch that meets one ends after that single request.
type NonRetryableError struct {
	Status  int
	Message string
	Err     error
}

func (e *NonRetryableError) Error() string {
	s := "non-retryable"
	if e.Status != 0 {
		s += fmt.Sprintf(": status %d", e.Status)
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *NonRetryableError) Unwrap() error { return e.Err }

// BundlePathNotFound is the 404 answer: a requested path is not in the
// repository. It is a non-retryable error too: errors.As with a
// **NonRetryableError target matches it.
type BundlePathNotFound struct {
	NonRetryableError
}

func (e *BundlePathNotFound) Error() string {
	return "bundle path not found: " + e.NonRetryableError.Error()
}

// As lets errors.As(err, &nonRetryable) see a 404 as a *NonRetryableError.
func (e *BundlePathNotFound) As(target any) bool {
	if t, ok := target.(**NonRetryableError); ok {
		*t = &e.NonRetryableError
		return true
	}
	return false
}

// Request names what to fetch: the directories (repeated path= params; none
// means the whole repository) and the base hash for a delta ("" = full).
type Request struct {
	Paths    []string
	BaseHash string
	// Attempts, when > 0, overrides Options.Retry.Attempts for this fetch. A
	// deferred re-fetch uses 1: the scheduler is its backoff, and a full
	// retry policy inside each deferred round would multiply its requests.
	Attempts int
}

// Result describes one whole fetch, successful or not.
type Result struct {
	Bundle     *PolicyBundle // nil unless the fetch succeeded
	Attempts   int
	Elapsed    time.Duration
	LastStatus int // status of the last answer, 0 if none was received
}
