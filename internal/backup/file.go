// Package backup keeps the embedded store's state on disk for offline mode:
// a sidecar restarted while the OPAL server is down loads its last policy and
// data from the backup instead of starting empty.
//
// A backup file is one line of JSON:
//
//	{"format":"opal-client-store-backup","version":1,"sha256":"<hex>","body":{"taken_at":"...","state":{...}}}
//
// The checksum is the SHA-256 of the body's bytes exactly as written. A file
// is accepted only if it is complete (ends with its newline), is the current
// format version, is byte-for-byte in canonical form and its checksum
// matches; anything else is refused with an *Error whose Kind says why.
//
// Write replaces the file atomically (temporary file in the same directory,
// fsync, rename, fsync of the directory), so a crash at any instant leaves
// either the old or the new backup, never a torn one. Files are 0600.
//
// Writer coalesces backups after store transactions (at most one per
// interval, one more on Close). Restore loads a backup at startup and logs
// the outcome once. See docs/offline.md.
package backup

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// DefaultPath is OPAL_STORE_BACKUP_PATH's default, as in the Python client.
const DefaultPath = "/opal/backup/opa.json"

// Format is the magic string in every backup file.
const Format = "opal-client-store-backup"

// Version is the format version this package writes and the only one it reads.
const Version = 1

// State is what a backup holds: the embedded store's bundle-managed policy
// modules, its data document and policy hash, and which data paths bundles
// own. embedded.Store.Export produces it and Import loads it.
type State struct {
	// Hash is the policy hash (commit) the state is at; restored, it is the
	// base_hash of the first fetch, so that fetch can be a delta.
	Hash string `json:"hash"`
	// Policies are the managed modules: policy id -> raw Rego.
	Policies map[string]string `json:"policies"`
	// Data is the whole data document (a JSON object) except the hash the
	// store keeps at data.system.opal.policy_hash.
	Data json.RawMessage `json:"data"`
	// Owned maps data paths ("/"-joined) to the data.json directory of the
	// bundle that wrote them (store.Ownership).
	Owned map[string]string `json:"owned"`
}

// Kinds of read failure, matched with errors.Is.
var (
	// ErrMissing: there is no backup file (normal on a first start).
	ErrMissing = errors.New("no backup")
	// ErrTruncated: the file ends early (empty, or cut anywhere).
	ErrTruncated = errors.New("backup truncated")
	// ErrCorrupt: the file is not a backup, or not in canonical form.
	ErrCorrupt = errors.New("backup corrupt")
	// ErrChecksum: the body does not match its SHA-256.
	ErrChecksum = errors.New("backup checksum mismatch")
	// ErrVersion: a backup of another format version.
	ErrVersion = errors.New("backup of another format version")
)

// Error is every Read failure. Kind is one of ErrMissing, ErrTruncated,
// ErrCorrupt, ErrChecksum, ErrVersion; errors.Is matches both Kind and Err.
type Error struct {
	Path string
	Kind error
	Err  error // the cause, may be nil
}

func (e *Error) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("%s: %v", e.Path, e.Kind)
	}
	return fmt.Sprintf("%s: %v: %v", e.Path, e.Kind, e.Err)
}

// Unwrap returns Kind and the cause.
func (e *Error) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Err}
}

// envelope is the file; Body is checksummed byte for byte.
type envelope struct {
	Format  string          `json:"format"`
	Version int             `json:"version"`
	SHA256  string          `json:"sha256"`
	Body    json.RawMessage `json:"body"`
}

type body struct {
	TakenAt time.Time `json:"taken_at"`
	State   *State    `json:"state"`
}

// encode is the one canonical form of a file; Read re-encodes what it
// decoded and compares, so no byte outside the body can change unnoticed.
func encode(env envelope) ([]byte, error) {
	b, err := json.Marshal(env)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

func checksum(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Marshal returns the bytes of a backup file of state taken at now.
func Marshal(state *State, now time.Time) ([]byte, error) {
	if state == nil {
		return nil, errors.New("backup: nil state")
	}
	b, err := json.Marshal(body{TakenAt: now.UTC(), State: state})
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	return encode(envelope{Format: Format, Version: Version, SHA256: checksum(b), Body: b})
}

// Unmarshal checks and decodes the bytes of a backup file. Errors are
// *Error (Path empty).
func Unmarshal(raw []byte) (*State, time.Time, error) {
	fail := func(kind, err error) (*State, time.Time, error) {
		return nil, time.Time{}, &Error{Kind: kind, Err: err}
	}
	// Every prefix of a file lacks the final newline.
	if len(raw) == 0 || raw[len(raw)-1] != '\n' {
		return fail(ErrTruncated, nil)
	}
	// Format and version first, leniently: a newer version may have a
	// layout this one would call corrupt.
	var head struct {
		Format  string `json:"format"`
		Version int    `json:"version"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		if isEOF(err) {
			return fail(ErrTruncated, err)
		}
		return fail(ErrCorrupt, err)
	}
	if head.Format != Format {
		return fail(ErrCorrupt, fmt.Errorf("format %q, want %q", head.Format, Format))
	}
	if head.Version != Version {
		return fail(ErrVersion, fmt.Errorf("version %d, want %d", head.Version, Version))
	}
	var env envelope
	if err := strictDecode(raw, &env); err != nil {
		return fail(ErrCorrupt, err)
	}
	canon, err := encode(env)
	if err != nil || !bytes.Equal(canon, raw) {
		return fail(ErrCorrupt, errors.New("not in canonical form"))
	}
	if checksum(env.Body) != env.SHA256 {
		return fail(ErrChecksum, nil)
	}
	var b body
	if err := strictDecode(env.Body, &b); err != nil {
		return fail(ErrCorrupt, err)
	}
	if b.State == nil || b.State.Policies == nil || !isObject(b.State.Data) {
		return fail(ErrCorrupt, errors.New("state incomplete"))
	}
	if b.State.Owned == nil {
		b.State.Owned = map[string]string{}
	}
	return b.State, b.TakenAt, nil
}

func strictDecode(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("trailing data")
	}
	return nil
}

func isEOF(err error) bool {
	var se *json.SyntaxError
	return errors.Is(err, io.ErrUnexpectedEOF) ||
		(errors.As(err, &se) && strings.Contains(se.Error(), "unexpected end"))
}

func isObject(raw json.RawMessage) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal(raw, &m) == nil && m != nil
}

// Read loads and checks the backup at path. It returns the state and when it
// was taken, or an *Error: ErrMissing if there is no file, ErrTruncated,
// ErrCorrupt, ErrChecksum or ErrVersion otherwise (other I/O errors are
// ErrCorrupt with the cause).
func Read(path string) (*State, time.Time, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		kind := ErrCorrupt
		if errors.Is(err, fs.ErrNotExist) {
			kind = ErrMissing
		}
		return nil, time.Time{}, &Error{Path: path, Kind: kind, Err: err}
	}
	st, at, err := Unmarshal(raw)
	if e, ok := err.(*Error); ok {
		e.Path = path
	}
	return st, at, err
}

// testHookBeforeRename runs after the temporary file is written and synced
// and before it is renamed over the backup (tests kill the process there).
var testHookBeforeRename func(tmp string)

// Write replaces the backup at path with state, taken at now, atomically:
// a temporary file in the same directory (mode 0600) is written and
// fsynced, renamed over path, and the directory fsynced. A crash at any
// point leaves the old file or the new one. Missing directories are created
// (0700). Temporary files a crashed writer left behind are removed; one
// path must have one writer.
func Write(path string, state *State, now time.Time) error {
	data, err := Marshal(state, now)
	if err != nil {
		return err
	}
	dir, base := filepath.Dir(path), filepath.Base(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	prefix := "." + base + ".tmp-"
	removeStale(dir, prefix)
	f, err := os.CreateTemp(dir, prefix)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	tmp := f.Name()
	done := false
	defer func() {
		if !done {
			f.Close()
			os.Remove(tmp)
		}
	}()
	// CreateTemp uses 0600 today; the backup holds policy and data, so
	// say it rather than rely on it.
	if err := f.Chmod(0o600); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if testHookBeforeRename != nil {
		testHookBeforeRename(tmp)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	done = true
	// The rename is durable only once the directory is.
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("backup: sync directory: %w", err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// removeStale deletes temporary files of earlier writers that crashed.
func removeStale(dir, prefix string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() && strings.HasPrefix(e.Name(), prefix) {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}
