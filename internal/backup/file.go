// Package backup keeps the embedded store's state on disk for offline mode:
// a sidecar restarted while the OPAL server is down loads its last policy and
// data from the backup instead of starting empty.
//
// A backup file is one line of JSON in the Python client's format (its
// OpaClient.full_export: {"policies": {id: rego}, "data": {...}}) with one
// key more, which the Python client ignores on import:
//
//	{"policies":{...},"data":{...},"opal_client_go":{"format":"opal-client-store-backup","version":2,"taken_at":"...","hash":"...","owned":{...},"sha256":"<hex>"}}
//
// So a rollback to the Python client restores our backup as is. The
// checksum is the SHA-256 of the file's canonical encoding with "sha256"
// empty. One of ours is accepted only if it is complete (ends with its
// newline), is the current format version (or version 1, the envelope this
// package wrote before), is byte-for-byte in canonical form and its
// checksum matches; anything else is refused with an *Error whose Kind says
// why. A file without our key is a Python client's backup: exactly
// "policies" (strings) and "data" (an object); it has no checksum, no hash
// (the first fetch is a full bundle), no data ownership, and its age is the
// file's modification time.
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

// Version is the format version this package writes; it also reads
// version 1 (the envelope of earlier releases) and the Python client's files.
const Version = 2

// versionEnvelope is the first format: {"format","version":1,"sha256","body"}.
const versionEnvelope = 1

// metaKey holds our part of a file; the Python client ignores it.
const metaKey = "opal_client_go"

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
	// FromPython is set by Read for a backup the Python client wrote (no
	// hash, no ownership; its age is the file's modification time).
	FromPython bool `json:"-"`
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

// file is a backup file: the Python client's two keys, then ours.
type file struct {
	Policies map[string]string `json:"policies"`
	Data     json.RawMessage   `json:"data"`
	Meta     *meta             `json:"opal_client_go"`
}

type meta struct {
	Format  string            `json:"format"`
	Version int               `json:"version"`
	TakenAt time.Time         `json:"taken_at"`
	Hash    string            `json:"hash"`
	Owned   map[string]string `json:"owned"`
	SHA256  string            `json:"sha256"`
}

// encodeFile is the one canonical form of a file: the checksum is over it
// with "sha256" empty, then it is written with the checksum.
func encodeFile(f file) ([]byte, error) {
	m := *f.Meta
	m.SHA256 = ""
	unsummed, err := json.Marshal(file{Policies: f.Policies, Data: f.Data, Meta: &m})
	if err != nil {
		return nil, err
	}
	m.SHA256 = checksum(unsummed)
	b, err := json.Marshal(file{Policies: f.Policies, Data: f.Data, Meta: &m})
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Marshal returns the bytes of a backup file of state taken at now.
func Marshal(state *State, now time.Time) ([]byte, error) {
	if state == nil {
		return nil, errors.New("backup: nil state")
	}
	owned := state.Owned
	if owned == nil {
		owned = map[string]string{}
	}
	b, err := encodeFile(file{Policies: state.Policies, Data: state.Data, Meta: &meta{
		Format: Format, Version: Version, TakenAt: now.UTC(), Hash: state.Hash, Owned: owned,
	}})
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	return b, nil
}

func fail(kind, err error) (*State, time.Time, error) {
	return nil, time.Time{}, &Error{Kind: kind, Err: err}
}

// Unmarshal checks and decodes the bytes of a backup file: ours (version 2
// or 1) or the Python client's. Errors are *Error (Path empty). A Python
// client's backup has no time: the zero time is returned (Read uses the
// file's modification time).
func Unmarshal(raw []byte) (*State, time.Time, error) {
	if len(raw) == 0 {
		return fail(ErrTruncated, nil)
	}
	// A decoder, not Unmarshal: a cut anywhere (even inside an escape) is
	// io.ErrUnexpectedEOF, i.e. truncated, for files without a checksum too.
	var top map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&top); err != nil {
		if isEOF(err) || errors.Is(err, io.EOF) {
			return fail(ErrTruncated, err)
		}
		return fail(ErrCorrupt, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fail(ErrCorrupt, errors.New("trailing data"))
	}
	_, ours := top[metaKey]
	_, v1 := top["format"]
	if !ours && !v1 { // guard: mutation "!ours && v1 == v1" reads a version-1 file as the Python client's
		return unmarshalPython(top)
	}
	// Every prefix of one of our files lacks the final newline.
	if raw[len(raw)-1] != '\n' {
		return fail(ErrTruncated, nil)
	}
	if ours {
		return unmarshalV2(raw)
	}
	return unmarshalV1(raw)
}

// unmarshalV2 reads the current format.
func unmarshalV2(raw []byte) (*State, time.Time, error) {
	// Format and version first, leniently: a newer version may have a
	// layout this one would call corrupt.
	var head struct {
		Meta struct {
			Format  string `json:"format"`
			Version int    `json:"version"`
		} `json:"opal_client_go"`
	}
	if err := json.Unmarshal(raw, &head); err != nil || head.Meta.Format != Format {
		return fail(ErrCorrupt, fmt.Errorf("not an opal-client store backup: format %q: %v", head.Meta.Format, err))
	}
	if head.Meta.Version != Version { // guard: mutation "if false {" reads a file of another version
		return fail(ErrVersion, fmt.Errorf("version %d, want %d", head.Meta.Version, Version))
	}
	var f file
	if err := strictDecode(raw, &f); err != nil || f.Meta == nil {
		return fail(ErrCorrupt, err)
	}
	m := *f.Meta
	m.SHA256 = ""
	unsummed, err := json.Marshal(file{Policies: f.Policies, Data: f.Data, Meta: &m})
	if err != nil {
		return fail(ErrCorrupt, err)
	}
	if checksum(unsummed) != f.Meta.SHA256 { // guard: mutation "&& false" skips the checksum
		return fail(ErrChecksum, nil)
	}
	canonical, err := encodeFile(f)
	if err != nil || !bytes.Equal(canonical, raw) { // guard: mutation "canonical == nil" accepts a file not in canonical form
		return fail(ErrCorrupt, errors.New("not in canonical form"))
	}
	if f.Policies == nil || !isObject(f.Data) {
		return fail(ErrCorrupt, errors.New("state incomplete"))
	}
	owned := f.Meta.Owned
	if owned == nil {
		owned = map[string]string{}
	}
	return &State{Hash: f.Meta.Hash, Policies: f.Policies, Data: f.Data, Owned: owned}, f.Meta.TakenAt, nil
}

// unmarshalPython reads a backup of the Python client: exactly "policies"
// (id -> rego) and "data" (an object).
func unmarshalPython(top map[string]json.RawMessage) (*State, time.Time, error) {
	pol, okP := top["policies"]
	data, okD := top["data"]
	if !okP || !okD || len(top) != 2 { // guard: mutation "|| false" accepts a file with other keys
		return fail(ErrCorrupt, errors.New(`neither an opal-client backup nor the Python client's {"policies","data"}`))
	}
	var policies map[string]string
	if err := json.Unmarshal(pol, &policies); err != nil || policies == nil {
		return fail(ErrCorrupt, fmt.Errorf("policies: want an object of strings: %v", err))
	}
	if !isObject(data) {
		return fail(ErrCorrupt, errors.New("data: want an object"))
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, data); err != nil {
		return fail(ErrCorrupt, err)
	}
	return &State{Policies: policies, Data: compact.Bytes(), Owned: map[string]string{}, FromPython: true}, time.Time{}, nil
}

// unmarshalV1 reads the envelope of earlier releases.
func unmarshalV1(raw []byte) (*State, time.Time, error) {
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
	if head.Version != versionEnvelope {
		return fail(ErrVersion, fmt.Errorf("version %d, want %d or %d", head.Version, Version, versionEnvelope))
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
	if err == nil && st.FromPython {
		// The Python client records no time: the file's is the best age.
		if fi, serr := os.Stat(path); serr == nil {
			at = fi.ModTime().UTC()
		}
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
