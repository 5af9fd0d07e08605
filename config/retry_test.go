package config

import (
	"testing"
	"time"
)

// F4: Bounded raises a wait below the floor and lowers attempts above the
// cap, naming each change; a configuration within them is unchanged.
func TestBounded(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      ConnRetryOptions
		want    ConnRetryOptions
		changes int
	}{
		{"zero_wait_raised", ConnRetryOptions{WaitStrategy: WaitFixed, Attempts: 5},
			ConnRetryOptions{WaitStrategy: WaitFixed, WaitTime: MinWait, Attempts: 5}, 1},
		{"attempts_lowered", ConnRetryOptions{WaitStrategy: WaitFixed, WaitTime: time.Second, Attempts: 5000},
			ConnRetryOptions{WaitStrategy: WaitFixed, WaitTime: time.Second, Attempts: MaxAttempts}, 1},
		{"tiny_max_wait_raised", ConnRetryOptions{WaitStrategy: WaitExponential, WaitTime: time.Second, MaxWait: time.Millisecond, Attempts: 3},
			ConnRetryOptions{WaitStrategy: WaitExponential, WaitTime: time.Second, MaxWait: MinWait, Attempts: 3}, 1},
		{"defaults_unchanged", DefaultPolicyUpdaterConnRetry(), DefaultPolicyUpdaterConnRetry(), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, changes := tc.in.Bounded()
			if got != tc.want || len(changes) != tc.changes {
				t.Fatalf("Bounded() = %+v, %q; want %+v with %d changes", got, changes, tc.want, tc.changes)
			}
		})
	}
}
