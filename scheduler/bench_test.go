package scheduler_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/opal-go/opal-client/scheduler"
)

// Delay is O(1) at any round: the doubling saturates instead of looping.
func BenchmarkDelay(b *testing.B) {
	for _, round := range []int{1, 20, 1_000_000} {
		b.Run(fmt.Sprint("round_", round), func(b *testing.B) {
			for b.Loop() {
				scheduler.Delay(round, 30*time.Second, true, time.Minute, 20)
			}
		})
	}
}
