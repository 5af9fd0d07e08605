package backup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/benbjohnson/clock"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeStore counts exports; each export's state carries the count as hash,
// so the file on disk says which export it holds.
type fakeStore struct {
	mu      sync.Mutex
	exports int
	fail    error
	block   chan struct{} // if set, Export waits on it
}

func (f *fakeStore) Export(ctx context.Context) (*State, error) {
	if f.block != nil {
		select {
		case <-f.block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return nil, f.fail
	}
	f.exports++
	return example(fmt.Sprint(f.exports)), nil
}

func (f *fakeStore) count() int { f.mu.Lock(); defer f.mu.Unlock(); return f.exports }

type rig struct {
	w     *Writer
	clk   *clock.Mock
	store *fakeStore
	path  string
	logs  *bytes.Buffer
}

// newRig starts a Writer with a 60 s interval on a mock clock. Call it
// inside a synctest bubble: synctest.Wait lets the writer's goroutine run to
// its next block, and the mock's internal settling sleeps are virtual.
func newRig(t *testing.T) *rig {
	r := &rig{clk: clock.NewMock(), store: &fakeStore{}, path: filepath.Join(t.TempDir(), "opa.json"), logs: &bytes.Buffer{}}
	r.clk.Set(t0)
	r.w = NewWriter(WriterOptions{Path: r.path, Interval: time.Minute, Export: r.store.Export, Clock: r.clk,
		Logger: slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	// A failed assertion must not leave the writer's goroutine blocked: the
	// bubble would then panic and hide the failure.
	t.Cleanup(func() { _ = r.w.Close(context.Background()) })
	return r
}

// onDisk returns the hash in the backup file ("" if there is none).
func (r *rig) onDisk(t *testing.T) string {
	t.Helper()
	st, _, err := Read(r.path)
	if errors.Is(err, ErrMissing) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return st.Hash
}

func (r *rig) close(t *testing.T) {
	t.Helper()
	if err := r.w.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestWriterCoalesces(t *testing.T) {
	// Catches: writing on every Notify (no wait for the interval).
	t.Run("at_most_one_write_per_interval", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newRig(t)
			r.w.Notify()
			synctest.Wait()
			if n := r.store.count(); n != 1 {
				t.Fatalf("first notify after quiet: %d exports, want 1 at once", n)
			}
			for range 5 {
				r.clk.Add(10 * time.Second)
				r.w.Notify()
				synctest.Wait()
			}
			if n := r.store.count(); n != 1 {
				t.Fatalf("within the interval: %d exports", n)
			}
			r.clk.Add(10 * time.Second) // 60 s after the first write
			synctest.Wait()
			if n, disk := r.store.count(), r.onDisk(t); n != 2 || disk != "2" {
				t.Fatalf("after the interval: %d exports, on disk %q", n, disk)
			}
			r.clk.Add(5 * time.Minute) // nothing pending: nothing written
			synctest.Wait()
			if n := r.store.count(); n != 2 {
				t.Fatalf("idle: %d exports", n)
			}
			r.close(t)
		})
	})

	// Catches: waiting a full interval after every Notify instead of
	// measuring it from the last write.
	t.Run("quiet_after_interval_writes_at_once", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newRig(t)
			r.w.Notify()
			synctest.Wait()
			r.clk.Add(2 * time.Minute)
			r.w.Notify()
			synctest.Wait()
			if n := r.store.count(); n != 2 {
				t.Fatalf("%d exports, want 2", n)
			}
			r.close(t)
		})
	})

	t.Run("notify_never_blocks", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newRig(t)
			r.store.block = make(chan struct{})
			r.w.Notify()
			synctest.Wait() // the writer is stuck in Export
			for range 1000 {
				r.w.Notify()
			}
			close(r.store.block)
			synctest.Wait()
			r.clk.Add(time.Minute)
			synctest.Wait()
			if n := r.store.count(); n != 2 {
				t.Fatalf("%d exports, want 2 (the stuck one, then one for all the rest)", n)
			}
			r.close(t)
		})
	})

	// Catches: forgetting a failed backup (it must be retried an interval later).
	t.Run("failure_retried_after_interval", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newRig(t)
			r.store.fail = errors.New("boom")
			r.w.Notify()
			synctest.Wait()
			if !strings.Contains(r.logs.String(), "store backup failed") {
				t.Fatalf("failure not logged: %s", r.logs)
			}
			r.store.mu.Lock()
			r.store.fail = nil
			r.store.mu.Unlock()
			r.clk.Add(time.Minute)
			synctest.Wait()
			if disk := r.onDisk(t); disk != "1" {
				t.Fatalf("on disk %q, want the retried backup", disk)
			}
			r.close(t)
		})
	})
}

func TestWriterClose(t *testing.T) {
	// Catches: Close not flushing what is pending.
	t.Run("flushes_pending_once", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newRig(t)
			r.w.Notify()
			synctest.Wait()
			r.w.Notify() // pending: the interval has not passed
			synctest.Wait()
			r.close(t)
			if n, disk := r.store.count(), r.onDisk(t); n != 2 || disk != "2" {
				t.Fatalf("%d exports, on disk %q", n, disk)
			}
			r.close(t) // a second Close does nothing
			r.w.Notify()
			synctest.Wait()
			if n := r.store.count(); n != 2 {
				t.Fatalf("after Close: %d exports", n)
			}
		})
	})
	// Catches: Close writing when nothing changed.
	t.Run("nothing_pending_nothing_written", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newRig(t)
			r.close(t)
			if n := r.store.count(); n != 0 {
				t.Fatalf("%d exports", n)
			}
			if _, err := os.Stat(r.path); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("backup written: %v", err)
			}
		})
	})
	t.Run("gives_up_with_ctx", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newRig(t)
			r.store.block = make(chan struct{})
			r.w.Notify()
			synctest.Wait()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if err := r.w.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err = %v", err)
			}
		})
	})
}

func TestRestore(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	if err := Write(good, example("h1"), t0); err != nil {
		t.Fatal(err)
	}
	torn := filepath.Join(dir, "torn.json")
	raw, _ := os.ReadFile(good)
	if err := os.WriteFile(torn, raw[:len(raw)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	loadErr := errors.New("does not compile")
	for _, tc := range []struct {
		name, path string
		loadErr    error
		wantErr    error
		wantLog    string
		loads      int
	}{
		{"restored", good, nil, nil, "level=INFO msg=\"store restored from backup\"", 1},
		{"missing", filepath.Join(dir, "none.json"), nil, ErrMissing, "level=INFO msg=\"no store backup to restore\"", 0},
		{"truncated", torn, nil, ErrTruncated, "level=WARN msg=\"store backup ignored; starting empty\"", 0},
		{"load_refused", good, loadErr, loadErr, "level=WARN msg=\"store backup ignored; starting empty\"", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			loads := 0
			st, at, err := Restore(context.Background(), tc.path, func(_ context.Context, st *State) error {
				loads++
				return tc.loadErr
			}, slog.New(slog.NewTextHandler(&logs, nil)))
			if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if (err == nil) != (st != nil) || (err == nil && !at.Equal(t0)) {
				t.Fatalf("state %v at %v", st, at)
			}
			if loads != tc.loads {
				t.Fatalf("load called %d times", loads)
			}
			if lines := strings.Count(logs.String(), "\n"); lines != 1 || !strings.Contains(logs.String(), tc.wantLog) {
				t.Fatalf("logs (want exactly one line %s):\n%s", tc.wantLog, logs.String())
			}
		})
	}
}
