package backup

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/benbjohnson/clock"
)

// DefaultInterval is OPAL_STORE_BACKUP_INTERVAL's default, as in the Python client.
const DefaultInterval = 60 * time.Second

// WriterOptions configure a Writer.
type WriterOptions struct {
	// Path is the backup file (OPAL_STORE_BACKUP_PATH); "" = DefaultPath.
	Path string
	// Interval is the least time between two backups
	// (OPAL_STORE_BACKUP_INTERVAL); <= 0 = DefaultInterval.
	Interval time.Duration
	// Export reads the store's state, consistently (embedded.Store.Export).
	Export func(context.Context) (*State, error)
	// Clock is the time source; nil = the real clock.
	Clock clock.Clock
	// Logger receives failures (WARN) and successes (DEBUG); nil = slog.Default().
	Logger *slog.Logger
}

// Writer writes a backup after store transactions, coalesced: the first
// Notify after a quiet interval writes at once, later ones within Interval of
// the last write are folded into one write when the interval ends. A failed
// export or write is logged and tried again an interval later. Close writes
// what is still pending, once.
type Writer struct {
	path     string
	interval time.Duration
	export   func(context.Context) (*State, error)
	clock    clock.Clock
	log      *slog.Logger

	kick   chan struct{} // capacity 1: "something is pending"
	stop   chan struct{}
	done   chan struct{}
	ctx    context.Context // cancelled if Close gives up waiting
	cancel context.CancelFunc

	mu     sync.Mutex
	dirty  bool // a transaction happened since the last good backup
	closed bool
}

// NewWriter starts a Writer; stop it with Close.
func NewWriter(opts WriterOptions) *Writer {
	w := &Writer{
		path:     opts.Path,
		interval: opts.Interval,
		export:   opts.Export,
		clock:    opts.Clock,
		log:      opts.Logger,
		kick:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	if w.path == "" {
		w.path = DefaultPath
	}
	if w.interval <= 0 {
		w.interval = DefaultInterval
	}
	if w.clock == nil {
		w.clock = clock.New()
	}
	if w.log == nil {
		w.log = slog.Default()
	}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	go w.run()
	return w
}

// Notify records that the store changed. It never blocks; after Close it
// does nothing.
func (w *Writer) Notify() {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.dirty = true
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default: // already pending
	}
}

func (w *Writer) run() {
	defer close(w.done)
	var last time.Time // of the last attempt; zero = none yet
	for {
		select {
		case <-w.kick:
		case <-w.stop:
			return
		}
		select {
		case <-w.stop: // Close flushes what is pending
			return
		default:
		}
		if !last.IsZero() {
			if wait := last.Add(w.interval).Sub(w.clock.Now()); wait > 0 {
				t := w.clock.Timer(wait)
				select {
				case <-t.C:
				case <-w.stop:
					t.Stop()
					return
				}
			}
		}
		last = w.clock.Now()
		if !w.flush(w.ctx) {
			// Try again an interval later, even without a new Notify.
			select {
			case w.kick <- struct{}{}:
			default:
			}
		}
	}
}

// flush writes a backup if one is pending; it reports whether nothing is
// pending any more.
func (w *Writer) flush(ctx context.Context) bool {
	w.mu.Lock()
	if !w.dirty {
		w.mu.Unlock()
		return true
	}
	w.dirty = false
	w.mu.Unlock()
	err := w.write(ctx)
	if err == nil {
		return true
	}
	w.log.Warn("store backup failed", "path", w.path, "err", err)
	w.mu.Lock()
	w.dirty = true
	w.mu.Unlock()
	return false
}

func (w *Writer) write(ctx context.Context) error {
	st, err := w.export(ctx)
	if err != nil {
		return err
	}
	now := w.clock.Now()
	if err := Write(w.path, st, now); err != nil {
		return err
	}
	w.log.Debug("store backup written", "path", w.path, "hash", st.Hash)
	return nil
}

// Close stops the Writer and, if a transaction is not yet backed up, writes
// one last backup (call it before the store shuts down). It waits for a
// backup in progress within ctx. Later calls return nil.
func (w *Writer) Close(ctx context.Context) error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	w.mu.Unlock()
	close(w.stop)
	select {
	case <-w.done:
	case <-ctx.Done():
		w.cancel()
		<-w.done
	}
	defer w.cancel()
	w.mu.Lock()
	pending := w.dirty
	w.mu.Unlock()
	if !pending {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := w.write(ctx); err != nil {
		w.log.Warn("store backup on shutdown failed", "path", w.path, "err", err)
		return err
	}
	return nil
}

// Restore loads the backup at path with load (embedded.Store.Import) and
// logs the outcome once: INFO when restored or when there is no backup, WARN
// when the backup is refused (truncated, corrupt, wrong version, checksum,
// or load failed, e.g. it does not compile). It never panics; on any error
// the store is as load left it (Import changes nothing on error), and the
// agent should go on as without offline mode. It returns the restored state
// and when it was taken.
func Restore(ctx context.Context, path string, load func(context.Context, *State) error, log *slog.Logger) (*State, time.Time, error) {
	if log == nil {
		log = slog.Default()
	}
	if path == "" {
		path = DefaultPath
	}
	st, at, err := Read(path)
	if err == nil {
		err = load(ctx, st)
	}
	switch {
	case err == nil && st.FromPython:
		log.Info("store restored from the Python client's backup; the first fetch is a full bundle", "path", path, "file_time", at)
		return st, at, nil
	case err == nil:
		log.Info("store restored from backup", "path", path, "hash", st.Hash, "taken_at", at)
		return st, at, nil
	case errors.Is(err, ErrMissing):
		log.Info("no store backup to restore", "path", path)
	default:
		log.Warn("store backup ignored; starting empty", "path", path, "err", err)
	}
	return nil, time.Time{}, err
}
