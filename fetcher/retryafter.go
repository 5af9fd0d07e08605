package fetcher

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// maxDuration is the largest wait this package ever computes.
const maxDuration = time.Duration(math.MaxInt64)

// dateLayouts are the three HTTP-date forms of RFC 9110 §5.6.7 (IMF-fixdate,
// obsolete RFC 850, asctime), then the same without a zone, read as UTC.
var dateLayouts = []string{
	time.RFC1123,                     // Sun, 06 Nov 1994 08:49:37 GMT
	"Monday, 02-Jan-06 15:04:05 MST", // RFC 850
	time.ANSIC,                       // Sun Nov  6 08:49:37 1994
	"Mon, 02 Jan 2006 15:04:05",      // IMF-fixdate without a zone
	"Monday, 02-Jan-06 15:04:05",     // RFC 850 without a zone
	time.RFC1123Z,                    // numeric zone, which some servers send
}

// ParseRetryAfter reads a Retry-After header value (F3): delta-seconds or an
// HTTP-date in any of the three RFC 9110 forms; a date without a zone is UTC.
// A date in the past or a negative number gives (0, true). Anything else
// (empty, garbage, nan, inf, a value too large for a Duration) gives
// (0, false): no hint. It never panics and never returns a negative wait.
func ParseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		// ParseFloat accepts "nan", "inf" and "0x1p3"; only plain decimals count.
		if math.IsNaN(f) || math.IsInf(f, 0) || strings.ContainsAny(v, "xXpP_nN") {
			return 0, false
		}
		if f <= 0 {
			return 0, true
		}
		if f >= float64(maxDuration)/float64(time.Second) {
			return 0, false
		}
		return time.Duration(math.Round(f * float64(time.Second))), true
	}
	for _, layout := range dateLayouts {
		t, err := time.Parse(layout, v)
		if err != nil {
			continue
		}
		if t.Before(now) || t.Equal(now) {
			return 0, true
		}
		d := t.Sub(now) // saturates at maxDuration for far-future dates
		if d == maxDuration {
			return 0, false
		}
		return d, true
	}
	return 0, false
}
