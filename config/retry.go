package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/opal-go/opal-client/internal/backoff"
)

// Wait strategies of ConnRetryOptions, as the Python client spells them.
const (
	WaitFixed             = "fixed"
	WaitExponential       = "exponential"
	WaitRandomExponential = "random_exponential"
)

// maxDuration is the saturation value of every duration computed here.
const maxDuration = time.Duration(math.MaxInt64)

// ConnRetryOptions is the Python client's ConnRetryOptions model (protocol §7):
// how many attempts a retried operation makes and how long it waits between
// them. Decode it with UnmarshalJSON (or Decode): keys left out take the
// model defaults, not the variable's default.
type ConnRetryOptions struct {
	// WaitStrategy is WaitFixed, WaitExponential or WaitRandomExponential.
	WaitStrategy string
	// WaitTime is the fixed wait, or the first exponential step.
	WaitTime time.Duration
	// MaxWait caps each exponential wait; 0 means unbounded (tenacity's MAX_WAIT).
	MaxWait time.Duration
	// Attempts counts every try, the first included (>= 1).
	Attempts int
}

// DefaultConnRetryOptions returns the model defaults: fixed, 2 s, 2 attempts,
// max_wait unbounded.
func DefaultConnRetryOptions() ConnRetryOptions {
	return ConnRetryOptions{WaitStrategy: WaitFixed, WaitTime: 2 * time.Second, Attempts: 2}
}

// UnmarshalJSON decodes the model's JSON ({"wait_strategy", "wait_time",
// "attempts", "max_wait"}, times in float seconds). Missing keys take the
// model defaults; unknown keys are ignored (pydantic v1 does the same).
// Anything but one JSON object is an error, null and trailing text included
// (pydantic refuses null too; silently taking the defaults would hide a typo).
func (o *ConnRetryOptions) UnmarshalJSON(b []byte) error {
	var raw struct {
		WaitStrategy *string  `json:"wait_strategy"`
		WaitTime     *float64 `json:"wait_time"`
		Attempts     *float64 `json:"attempts"`
		MaxWait      *float64 `json:"max_wait"`
	}
	if t := bytes.TrimSpace(b); len(t) == 0 || t[0] != '{' {
		return errors.New("not a JSON object")
	}
	if err := json.Unmarshal(b, &raw); err != nil { // unlike a Decoder, refuses trailing text
		return fmt.Errorf("not a JSON object: %v", err)
	}
	v := DefaultConnRetryOptions()
	if raw.WaitStrategy != nil {
		switch s := strings.ToLower(strings.TrimSpace(*raw.WaitStrategy)); s {
		case WaitFixed, WaitExponential, WaitRandomExponential:
			v.WaitStrategy = s
		default:
			return fmt.Errorf("wait_strategy %q is not fixed, exponential or random_exponential", *raw.WaitStrategy)
		}
	}
	if raw.WaitTime != nil {
		d, err := seconds("wait_time", *raw.WaitTime)
		if err != nil {
			return err
		}
		v.WaitTime = d
	}
	if raw.MaxWait != nil {
		d, err := seconds("max_wait", *raw.MaxWait)
		if err != nil {
			return err
		}
		v.MaxWait = d
	}
	if raw.Attempts != nil {
		a := *raw.Attempts
		if a != math.Trunc(a) || a < 1 || a > math.MaxInt32 {
			return fmt.Errorf("attempts %v is not a whole number from 1 to %d", a, math.MaxInt32)
		}
		v.Attempts = int(a)
	}
	*o = v
	return nil
}

// Decode parses the JSON text of an environment variable (the method
// envconfig.Decoder names, for embedders that decode with envconfig).
func (o *ConnRetryOptions) Decode(value string) error { return o.UnmarshalJSON([]byte(value)) }

// seconds converts float seconds to a Duration, saturating huge values
// (tenacity's MAX_WAIT is ~4.6e18 s) and refusing negatives, NaN and Inf.
func seconds(name string, s float64) (time.Duration, error) {
	if math.IsNaN(s) || math.IsInf(s, 0) || s < 0 {
		return 0, fmt.Errorf("%s %v is not a number of seconds >= 0", name, s)
	}
	if s >= float64(maxDuration)/float64(time.Second) {
		return maxDuration, nil
	}
	return time.Duration(math.Round(s * float64(time.Second))), nil
}

// step is the exponential step after the n-th failure: WaitTime*2^(n-1),
// capped at MaxWait, saturating instead of overflowing.
func (o ConnRetryOptions) step(n int) time.Duration {
	return backoff.Exponential(o.WaitTime, n, o.MaxWait)
}

// Wait is the configured backoff after the n-th failed attempt (n >= 1), F5:
// fixed is WaitTime; exponential is WaitTime*2^(n-1) capped at MaxWait;
// random_exponential draws uniformly in [0, that) with rnd, a uniform [0,1)
// source.
func (o ConnRetryOptions) Wait(n int, rnd func() float64) time.Duration {
	if n < 1 {
		n = 1
	}
	switch o.WaitStrategy {
	case WaitExponential:
		return o.step(n)
	case WaitRandomExponential:
		// backoff.Full with floor 0: a broken source cannot make the wait
		// negative or longer than the step.
		return backoff.Full(0, o.step(n), rnd())
	default:
		return o.WaitTime
	}
}

// Limits of one retried fetch (F4): no wait between attempts is shorter
// than MinWait (OPA's downloader uses the same 100 ms floor), and one fetch
// makes at most MaxAttempts attempts. Bounded raises a configuration below
// them.
const (
	MinWait     = 100 * time.Millisecond
	MaxAttempts = 20
)

// Bounded returns o within the limits (WaitTime and MaxWait at least
// MinWait, Attempts at most MaxAttempts) and one line per value it changed,
// for the warning at start.
func (o ConnRetryOptions) Bounded() (ConnRetryOptions, []string) {
	var changed []string
	if o.WaitTime < MinWait {
		changed = append(changed, fmt.Sprintf("wait_time %gs raised to %gs", o.WaitTime.Seconds(), MinWait.Seconds()))
		o.WaitTime = MinWait
	}
	if o.MaxWait > 0 && o.MaxWait < MinWait {
		changed = append(changed, fmt.Sprintf("max_wait %gs raised to %gs", o.MaxWait.Seconds(), MinWait.Seconds()))
		o.MaxWait = MinWait
	}
	if o.Attempts > MaxAttempts {
		changed = append(changed, fmt.Sprintf("attempts %d lowered to %d", o.Attempts, MaxAttempts))
		o.Attempts = MaxAttempts
	}
	return o, changed
}

// WorstCaseTotalWait is the exact sum of the Attempts-1 configured waits of one
// retried operation (F6), taking the upper bound of random draws. It
// saturates at the largest Duration and stops doubling once a step reaches
// MaxWait, so absurd attempt counts neither overflow nor loop for long.
func (o ConnRetryOptions) WorstCaseTotalWait() time.Duration {
	gaps := o.Attempts - 1
	if gaps <= 0 {
		return 0
	}
	if o.WaitStrategy != WaitExponential && o.WaitStrategy != WaitRandomExponential {
		return mulSat(o.WaitTime, gaps)
	}
	if o.WaitTime == 0 {
		return 0 // 0 * 2^i: without this, 1e9 attempts would loop 1e9 times
	}
	var total time.Duration
	d := o.WaitTime
	for i := 0; i < gaps; i++ {
		if o.MaxWait > 0 && d >= o.MaxWait {
			// Saturation: every remaining wait is MaxWait.
			return addSat(total, mulSat(o.MaxWait, gaps-i))
		}
		total = addSat(total, d)
		if total == maxDuration {
			return total
		}
		if d > maxDuration/2 {
			d = maxDuration
		} else {
			d *= 2
		}
	}
	return total
}

func addSat(a, b time.Duration) time.Duration {
	if a > maxDuration-b {
		return maxDuration
	}
	return a + b
}

func mulSat(d time.Duration, n int) time.Duration {
	if d == 0 || n == 0 {
		return 0
	}
	if d > maxDuration/time.Duration(n) {
		return maxDuration
	}
	return d * time.Duration(n)
}

// String renders the options in the model's JSON syntax.
func (o ConnRetryOptions) String() string {
	s := fmt.Sprintf(`{"wait_strategy":%q,"wait_time":%g,"attempts":%d`, o.WaitStrategy, o.WaitTime.Seconds(), o.Attempts)
	if o.MaxWait > 0 {
		s += fmt.Sprintf(`,"max_wait":%g`, o.MaxWait.Seconds())
	}
	return s + "}"
}
