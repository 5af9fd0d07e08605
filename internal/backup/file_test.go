package backup

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func example(hash string) *State {
	return &State{
		Hash:     hash,
		Policies: map[string]string{"rbac/rbac.rego": "package app.rbac\n\nallow if input.user == \"alice\"\n"},
		Data:     json.RawMessage(`{"rbac":{"roles":["admin"],"n":1.5}}`),
		Owned:    map[string]string{"rbac": "rbac"},
	}
}

func TestRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "opa.json")
	want := example("h1")
	if err := Write(path, want, t0); err != nil {
		t.Fatal(err)
	}
	got, at, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) || !at.Equal(t0) {
		t.Fatalf("got %+v at %v", got, at)
	}
}

// marshalV1 writes the version-1 envelope of earlier releases (still read).
func marshalV1(t *testing.T, state *State, now time.Time) []byte {
	t.Helper()
	b, err := json.Marshal(body{TakenAt: now.UTC(), State: state})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := encode(envelope{Format: Format, Version: versionEnvelope, SHA256: checksum(b), Body: b})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// TestReadRefuses: every damaged file of ours (the current format and the
// version-1 envelope) is refused with its kind, never a panic and never a
// partial state.
func TestReadRefuses(t *testing.T) {
	current, err := Marshal(example("h1"), t0)
	if err != nil {
		t.Fatal(err)
	}
	good := marshalV1(t, example("h1"), t0)
	for _, f := range []struct {
		name string
		raw  []byte
	}{{"v2", current}, {"v1", good}} {
		// Catches: dropping the final-newline check (the file without its
		// newline would be called corrupt, not truncated).
		t.Run(f.name+"/truncated_at_every_offset", func(t *testing.T) {
			for n := 0; n < len(f.raw); n++ {
				st, _, err := Unmarshal(f.raw[:n])
				if !errors.Is(err, ErrTruncated) || st != nil {
					t.Fatalf("cut at %d/%d: state %v, err %v", n, len(f.raw), st, err)
				}
			}
		})

		// Catches: dropping the checksum comparison (a flip inside a string
		// of the body still parses), dropping the canonical-form check (0x20
		// turns a key's letter to upper case, which encoding/json accepts)
		// and reading a file whose key of ours was damaged as the Python
		// client's.
		t.Run(f.name+"/flipped_byte_at_every_offset", func(t *testing.T) {
			for _, mask := range []byte{0x01, 0x20, 0x80} {
				for i := range f.raw {
					bad := bytes.Clone(f.raw)
					bad[i] ^= mask
					st, _, err := Unmarshal(bad)
					var e *Error
					if err == nil || !errors.As(err, &e) || st != nil {
						t.Fatalf("byte %d (%q) ^ %#x accepted: state %v, err %v", i, f.raw[i], mask, st, err)
					}
				}
			}
		})
	}

	refile := func(change func(*file)) []byte {
		var f file
		if err := json.Unmarshal(current, &f); err != nil {
			t.Fatal(err)
		}
		change(&f)
		b, err := encodeFile(f)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	keepSum := func(change func(*file)) []byte { // the change, with the old checksum
		var f file
		if err := json.Unmarshal(current, &f); err != nil {
			t.Fatal(err)
		}
		sum := f.Meta.SHA256
		change(&f)
		f.Meta.SHA256 = sum
		b, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		return append(b, '\n')
	}
	for _, tc := range []struct {
		name string
		raw  []byte
		kind error
	}{
		// guards mutation "if false {" in unmarshalV2 (version)
		{"v2_other_version", refile(func(f *file) { f.Meta.Version = 3 }), ErrVersion},
		{"v2_other_format", refile(func(f *file) { f.Meta.Format = "x" }), ErrCorrupt},
		// guards mutation "&& false" in unmarshalV2 (checksum)
		{"v2_policy_changed_checksum_kept", keepSum(func(f *file) { f.Policies["rbac/rbac.rego"] = "package mallory\n" }), ErrChecksum},
		{"v2_hash_changed_checksum_kept", keepSum(func(f *file) { f.Meta.Hash = "h2" }), ErrChecksum},
		{"v2_data_not_an_object", refile(func(f *file) { f.Data = json.RawMessage(`[1]`) }), ErrCorrupt},
		{"v2_policies_missing", refile(func(f *file) { f.Policies = nil }), ErrCorrupt},
		// guards mutation "canonical == nil" in unmarshalV2 (canonical form)
		{"v2_not_canonical", bytes.Replace(current, []byte(`{"policies"`), []byte(`{ "policies"`), 1), ErrCorrupt},
		{"v2_trailing_garbage", append(bytes.Clone(current), "{}\n"...), ErrCorrupt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, _, err := Unmarshal(tc.raw)
			if !errors.Is(err, tc.kind) || st != nil {
				t.Fatalf("state %v, err %v, want %v", st, err, tc.kind)
			}
		})
	}

	reenvelope := func(f func(*envelope)) []byte {
		var env envelope
		if err := json.Unmarshal(good, &env); err != nil {
			t.Fatal(err)
		}
		f(&env)
		b, err := encode(env)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name string
		raw  []byte
		kind error
	}{
		{"empty_file", nil, ErrTruncated},
		{"not_json", []byte("hello\n"), ErrCorrupt},
		{"other_json", []byte("{\"a\":1}\n"), ErrCorrupt},
		// Catches: not checking the format version.
		{"wrong_version", reenvelope(func(e *envelope) { e.Version = 2 }), ErrVersion},
		{"checksum_of_other_body", reenvelope(func(e *envelope) { e.SHA256 = checksum([]byte("{}")) }), ErrChecksum},
		{"body_changed_checksum_kept", reenvelope(func(e *envelope) {
			e.Body = bytes.Replace(e.Body, []byte("alice"), []byte("mallory"), 1)
		}), ErrChecksum},
		{"state_missing", reenvelope(func(e *envelope) {
			e.Body = []byte(`{"taken_at":"2026-03-01T12:00:00Z"}`)
			e.SHA256 = checksum(e.Body)
		}), ErrCorrupt},
		{"data_not_an_object", reenvelope(func(e *envelope) {
			e.Body = []byte(`{"taken_at":"2026-03-01T12:00:00Z","state":{"hash":"h","policies":{},"data":[1],"owned":{}}}`)
			e.SHA256 = checksum(e.Body)
		}), ErrCorrupt},
		{"unknown_field_in_state", reenvelope(func(e *envelope) {
			e.Body = []byte(`{"taken_at":"2026-03-01T12:00:00Z","state":{"hash":"h","policies":{},"data":{},"owned":{},"x":1}}`)
			e.SHA256 = checksum(e.Body)
		}), ErrCorrupt},
		{"trailing_garbage", append(bytes.Clone(good), "{}\n"...), ErrCorrupt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, _, err := Unmarshal(tc.raw)
			if !errors.Is(err, tc.kind) || st != nil {
				t.Fatalf("state %v, err %v, want %v", st, err, tc.kind)
			}
		})
	}

	t.Run("missing_file", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "none.json")
		_, _, err := Read(path)
		var e *Error
		if !errors.Is(err, ErrMissing) || !errors.Is(err, fs.ErrNotExist) || !errors.As(err, &e) || e.Path != path {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("read_error_names_path", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "opa.json")
		if err := os.WriteFile(path, good[:10], 0o600); err != nil {
			t.Fatal(err)
		}
		_, _, err := Read(path)
		var e *Error
		if !errors.As(err, &e) || e.Path != path || !errors.Is(err, ErrTruncated) || !strings.Contains(err.Error(), path) {
			t.Fatalf("err = %v", err)
		}
	})
}

// TestPermissions: the backup holds policy and data; only the agent's user
// may read it, also when it replaces a file that was wider.
func TestPermissions(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "backup")
	path := filepath.Join(dir, "opa.json")
	// Catches: chmod of the temporary file to 0644.
	t.Run("new_file_0600", func(t *testing.T) {
		if err := Write(path, example("h1"), t0); err != nil {
			t.Fatal(err)
		}
		mode(t, path, 0o600)
		mode(t, dir, 0o700)
	})
	t.Run("replaced_file_0600", func(t *testing.T) {
		if err := os.Chmod(path, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := Write(path, example("h2"), t0); err != nil {
			t.Fatal(err)
		}
		mode(t, path, 0o600)
	})
}

func mode(t *testing.T, path string, want fs.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != want {
		t.Fatalf("%s: mode %v, want %v", path, got, want)
	}
}

// crashEnv makes TestCrashHelper a writer that is killed between writing the
// temporary file and renaming it.
const crashEnv = "OPAL_BACKUP_TEST_CRASH_PATH"

// TestCrashHelper is the process TestCrashBetweenWriteAndRename kills; run
// alone it does nothing.
func TestCrashHelper(t *testing.T) {
	path := os.Getenv(crashEnv)
	if path == "" {
		t.Skip("helper process only")
	}
	testHookBeforeRename = func(string) {
		p, _ := os.FindProcess(os.Getpid())
		p.Kill() // SIGKILL: no deferred cleanup runs, as in a crash
		select {}
	}
	_ = Write(path, example("h2"), t0)
	t.Fatal("not killed")
}

// TestCrashBetweenWriteAndRename: a writer killed after writing the new
// backup and before the rename leaves the old backup loadable, and the next
// write succeeds and removes the leftover temporary file.
// Catches: writing the backup in place instead of to a temporary file.
func TestCrashBetweenWriteAndRename(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "opa.json")
	if err := Write(path, example("h1"), t0); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashEnv+"="+path)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Exited() {
		t.Fatalf("helper was not killed: %v\n%s", err, out)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Fatalf("want the backup and a leftover temporary file, got %v", entries)
	}
	t.Run("old_backup_loads", func(t *testing.T) {
		st, _, err := Read(path)
		if err != nil || st.Hash != "h1" {
			t.Fatalf("state %v, err %v", st, err)
		}
	})
	t.Run("next_write_cleans_up", func(t *testing.T) {
		if err := Write(path, example("h3"), t0); err != nil {
			t.Fatal(err)
		}
		st, _, err := Read(path)
		if err != nil || st.Hash != "h3" {
			t.Fatalf("state %v, err %v", st, err)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 1 {
			t.Fatalf("leftovers: %v", entries)
		}
	})
}

// TestWriteFailureKeepsOld: a write that cannot complete leaves the old
// backup and no temporary file.
func TestWriteFailureKeepsOld(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "opa.json")
	if err := Write(path, example("h1"), t0); err != nil {
		t.Fatal(err)
	}
	bad := example("h2")
	bad.Data = json.RawMessage(`{"a":`) // cannot be marshalled
	if err := Write(path, bad, t0); err == nil {
		t.Fatal("invalid state written")
	}
	if err := Write(path, nil, t0); err == nil {
		t.Fatal("nil state written")
	}
	if st, _, err := Read(path); err != nil || st.Hash != "h1" {
		t.Fatalf("state %v, err %v", st, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("leftovers: %v", entries)
	}
}

// pythonBackup is what the Python client's OpaClient.full_export writes
// (json.dumps({"policies": ..., "data": ...}), its default separators, no
// newline); produced once with CPython's json.dumps and pasted here.
const pythonBackup = `{"policies": {"rbac/rbac.rego": "package app.rbac\n\nallow if input.user == \"alice\"\n"}, "data": {"rbac": {"roles": ["admin"], "n": 1.5}}}`

// TestPythonClientBackup pins the two directions of a switch: a backup the
// Python client wrote restores (no hash: the first fetch is full; no
// ownership; its age is the file's), and ours is one the Python client's
// full_import reads (its "policies" and "data" keys; it ignores ours).
func TestPythonClientBackup(t *testing.T) {
	t.Run("python_backup_restores", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "opa.json")
		if err := os.WriteFile(path, []byte(pythonBackup), 0o600); err != nil {
			t.Fatal(err)
		}
		mtime := t0.Add(-time.Hour)
		if err := os.Chtimes(path, mtime, mtime); err != nil {
			t.Fatal(err)
		}
		st, at, err := Read(path)
		if err != nil {
			t.Fatal(err)
		}
		want := example("")
		want.Owned, want.FromPython = map[string]string{}, true
		if !reflect.DeepEqual(st, want) {
			t.Fatalf("state %+v, want %+v", st, want)
		}
		if !at.Equal(mtime) {
			t.Fatalf("taken at %v, want the file's time %v", at, mtime)
		}
	})
	for _, tc := range []struct {
		name, raw string
		kind      error
	}{
		// guards mutation "|| false" in unmarshalPython
		{"python_with_another_key_refused", `{"policies": {}, "data": {}, "x": 1}`, ErrCorrupt},
		{"python_without_data_refused", `{"policies": {}}`, ErrCorrupt},
		{"python_policy_not_a_string_refused", `{"policies": {"a.rego": 1}, "data": {}}`, ErrCorrupt},
		{"python_data_not_an_object_refused", `{"policies": {}, "data": [1]}`, ErrCorrupt},
		{"python_truncated_refused", pythonBackup[:len(pythonBackup)-3], ErrTruncated},
		{"v1_envelope_is_not_python", `{"format":"x","version":1,"sha256":"","body":{}}` + "\n", ErrCorrupt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, _, err := Unmarshal([]byte(tc.raw))
			if !errors.Is(err, tc.kind) || st != nil {
				t.Fatalf("state %v, err %v, want %v", st, err, tc.kind)
			}
		})
	}
	// guards mutation "!ours && v1 == v1" in Unmarshal: a version-1 file of an
	// earlier release is still ours, not the Python client's.
	t.Run("v1_file_still_restores", func(t *testing.T) {
		st, at, err := Unmarshal(marshalV1(t, example("h1"), t0))
		if err != nil || !reflect.DeepEqual(st, example("h1")) || !at.Equal(t0) {
			t.Fatalf("state %+v at %v, err %v", st, at, err)
		}
	})
	t.Run("ours_is_read_by_the_python_client", func(t *testing.T) {
		raw, err := Marshal(example("h1"), t0)
		if err != nil {
			t.Fatal(err)
		}
		// What full_import does: json.loads, then import_data["policies"]
		// (id -> raw rego, each set_policy) and import_data["data"] (the
		// root document); any other key is ignored.
		var imported struct {
			Policies map[string]string `json:"policies"`
			Data     map[string]any    `json:"data"`
		}
		if err := json.Unmarshal(raw, &imported); err != nil {
			t.Fatal(err)
		}
		var want map[string]any
		_ = json.Unmarshal(example("h1").Data, &want)
		if !reflect.DeepEqual(imported.Policies, example("h1").Policies) || !reflect.DeepEqual(imported.Data, want) {
			t.Fatalf("the Python client would import %+v", imported)
		}
	})
}
