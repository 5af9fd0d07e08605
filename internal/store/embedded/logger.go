package embedded

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync/atomic"

	"github.com/open-policy-agent/opa/v1/logging"
)

// Log formats of OPA's logs (OPAL_INLINE_OPA_LOG_FORMAT), as the Python
// client pipes its OPA's output: none drops them, minimal keeps the message,
// http the message with the request's method, path and status, full every
// field.
const (
	LogFormatNone    = "none"
	LogFormatMinimal = "minimal"
	LogFormatHTTP    = "http"
	LogFormatFull    = "full"
)

// opaLogger is an OPA logging.Logger over the agent's slog logger: OPA's
// plugin, server and console (decision) logs go through the agent's handler,
// at the agent's level, shaped by the log format.
type opaLogger struct {
	log    *slog.Logger
	format string
	// console is the decision-log console: its records are the fields, so
	// they are always logged whole, whatever the format.
	console bool
	level   *atomic.Int32 // shared by the loggers WithFields derives
	fields  map[string]any
}

func newOPALogger(log *slog.Logger, format string, level logging.Level, console bool) *opaLogger {
	l := &opaLogger{log: log.With("component", "opa"), format: format, console: console, level: new(atomic.Int32)}
	l.level.Store(int32(level))
	return l
}

var _ logging.Logger = (*opaLogger)(nil)

func (l *opaLogger) Debug(f string, a ...any) { l.emit(logging.Debug, slog.LevelDebug, f, a) }
func (l *opaLogger) Info(f string, a ...any)  { l.emit(logging.Info, slog.LevelInfo, f, a) }
func (l *opaLogger) Warn(f string, a ...any)  { l.emit(logging.Warn, slog.LevelWarn, f, a) }
func (l *opaLogger) Error(f string, a ...any) { l.emit(logging.Error, slog.LevelError, f, a) }

// WithFields returns a logger adding fields to every record.
func (l *opaLogger) WithFields(fields map[string]any) logging.Logger {
	merged := make(map[string]any, len(l.fields)+len(fields))
	for k, v := range l.fields {
		merged[k] = v
	}
	for k, v := range fields {
		merged[k] = v
	}
	c := *l
	c.fields = merged
	return &c
}

// GetLevel is the level OPA logs at. With the none format only errors
// pass, so OPA does not even build the records it would drop (its
// per-request logs).
func (l *opaLogger) GetLevel() logging.Level {
	lv := logging.Level(l.level.Load())
	if l.format == LogFormatNone && !l.console && lv > logging.Error {
		return logging.Error
	}
	return lv
}

// SetLevel sets the level OPA logs at.
func (l *opaLogger) SetLevel(lv logging.Level) { l.level.Store(int32(lv)) }

func (l *opaLogger) emit(lv logging.Level, sl slog.Level, f string, a []any) {
	if lv > l.GetLevel() || !l.log.Enabled(context.Background(), sl) {
		return
	}
	msg := f
	if len(a) > 0 {
		msg = fmt.Sprintf(f, a...)
	}
	l.log.LogAttrs(context.Background(), sl, msg, l.attrs()...)
}

// attrs are the record's fields the format keeps, sorted by name.
func (l *opaLogger) attrs() []slog.Attr {
	format := l.format
	if l.console {
		format = LogFormatFull
	}
	var keep func(string) bool
	switch format {
	case LogFormatMinimal:
		return nil
	case LogFormatHTTP:
		// As the Python client: the request line when there is one,
		// every field otherwise.
		_, m := l.fields["req_method"]
		_, p := l.fields["req_path"]
		if m && p {
			keep = func(k string) bool { return k == "req_method" || k == "req_path" || k == "resp_status" }
		}
	}
	keys := make([]string, 0, len(l.fields))
	for k := range l.fields {
		if keep == nil || keep(k) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	out := make([]slog.Attr, len(keys))
	for i, k := range keys {
		v := l.fields[k]
		if err, ok := v.(error); ok {
			v = err.Error()
		}
		out[i] = slog.Any(k, v)
	}
	return out
}
