package fetcher

import (
	"testing"
	"time"
)

var raNow = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

var retryAfterCases = []struct {
	name string
	in   string
	want time.Duration
	ok   bool
}{
	{"delta_seconds", "30", 30 * time.Second, true},
	{"delta_with_spaces", " 5 ", 5 * time.Second, true},
	{"delta_fraction", "1.5", 1500 * time.Millisecond, true},
	// Mutation caught: "if f <= 0" -> "if f < 0" (0 would still be 0, so the negative case guards).
	{"zero", "0", 0, true},
	{"negative_is_zero", "-5", 0, true},
	{"imf_fixdate", "Fri, 02 Jan 2026 03:05:05 GMT", time.Minute, true},
	{"rfc850_date", "Friday, 02-Jan-26 03:05:05 GMT", time.Minute, true},
	{"asctime_date", "Fri Jan  2 03:05:05 2026", time.Minute, true},
	{"zoneless_date_is_utc", "Fri, 02 Jan 2026 03:05:05", time.Minute, true},
	// Mutation caught: "if t.Before(now) || t.Equal(now)" -> "if t.Equal(now)".
	{"past_date_is_zero", "Thu, 01 Jan 2026 00:00:00 GMT", 0, true},
	{"empty", "", 0, false},
	{"garbage", "soon", 0, false},
	{"nan", "nan", 0, false},
	{"NaN", "NaN", 0, false},
	{"inf", "inf", 0, false},
	{"minus_inf", "-Infinity", 0, false},
	{"hex_float", "0x1p4", 0, false},
	// Mutation caught: drop the overflow check (the duration then overflows negative).
	{"overflowing_delta", "99999999999999999999", 0, false},
	{"huge_exponent", "1e400", 0, false},
	{"far_future_date_overflows", "Fri, 31 Dec 9999 23:59:59 GMT", 0, false},
	{"hostile_but_valid", "99999", 99999 * time.Second, true},
}

// F3: every Retry-After form, and every bad value gives "no hint".
func TestF3_RetryAfter(t *testing.T) {
	for _, tc := range retryAfterCases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ParseRetryAfter(tc.in, raNow)
			if got != tc.want || ok != tc.ok {
				t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
			}
		})
	}
}

// FuzzParseRetryAfter: never a panic, never a negative wait, "no hint" is 0.
func FuzzParseRetryAfter(f *testing.F) {
	for _, tc := range retryAfterCases {
		f.Add(tc.in)
	}
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := ParseRetryAfter(v, raNow)
		if d < 0 || (!ok && d != 0) {
			t.Fatalf("ParseRetryAfter(%q) = %v, %v", v, d, ok)
		}
	})
}
