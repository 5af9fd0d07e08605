// Package testutil holds helpers shared by the project's tests.
package testutil

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
)

// LogRecorder is a slog.Handler that keeps every record, so a test can count
// the warnings a rule allows (F9, D7). It is safe for concurrent use.
type LogRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

// Enabled records every level.
func (l *LogRecorder) Enabled(context.Context, slog.Level) bool { return true }

// Handle keeps r.
func (l *LogRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r)
	return nil
}

// WithAttrs returns l itself: tests count records, not their attributes.
func (l *LogRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }

// WithGroup returns l itself.
func (l *LogRecorder) WithGroup(string) slog.Handler { return l }

// Count is the number of records at level.
func (l *LogRecorder) Count(level slog.Level) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.recs {
		if r.Level == level {
			n++
		}
	}
	return n
}

// Records returns a copy of the records so far.
func (l *LogRecorder) Records() []slog.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]slog.Record(nil), l.recs...)
}

// String renders every record as one "LEVEL msg key=value ..." line, so a
// test can grep what was logged (secrets, the store's state).
func (l *LogRecorder) String() string {
	var b strings.Builder
	for _, r := range l.Records() {
		fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
		r.Attrs(func(a slog.Attr) bool {
			fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
			return true
		})
		b.WriteByte('\n')
	}
	return b.String()
}
