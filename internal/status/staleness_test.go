package status

import (
	"testing"
	"time"

	"github.com/benbjohnson/clock"
)

// TestStaleness pins the staleness gauge: seconds since the last success
// (or start) while an update is pending or failing, 0 while current.
func TestStaleness(t *testing.T) {
	t.Run("pending_from_start_until_first_success", func(t *testing.T) {
		clk := clock.NewMock()
		s := NewStaleness(clk)
		clk.Add(30 * time.Second)
		if got := s.Stale(); got != 30*time.Second {
			t.Fatalf("stale %v, want 30s", got)
		}
		s.Success(clk.Now())
		clk.Add(time.Hour)
		// guards mutation "if s.behind {" in Stale
		if got := s.Stale(); got != 0 {
			t.Fatalf("current policy reads stale %v", got)
		}
	})
	t.Run("failing_counts_from_last_success", func(t *testing.T) {
		clk := clock.NewMock()
		s := NewStaleness(clk)
		s.Success(clk.Now())
		clk.Add(10 * time.Minute)
		s.FailedWith("503")
		clk.Add(5 * time.Second)
		st := s.State()
		if st.Stale != 10*time.Minute+5*time.Second || st.LastError != "503" || st.LastSuccess.IsZero() {
			t.Fatalf("state %+v", st)
		}
		s.Success(clk.Now())
		if st := s.State(); st.Stale != 0 || st.LastError != "" {
			t.Fatalf("after success %+v", st)
		}
	})
	// Offline mode: a restored backup's policy is as old as the backup.
	t.Run("restored_counts_from_backup_time", func(t *testing.T) {
		clk := clock.NewMock()
		taken := clk.Now()
		clk.Add(time.Hour) // the agent starts an hour after the backup
		s := NewStaleness(clk)
		s.Restored(taken)
		clk.Add(time.Minute)
		st := s.State()
		if st.Stale != time.Hour+time.Minute || !st.LastSuccess.Equal(taken) {
			t.Fatalf("state %+v, want stale 1h1m from the backup time", st)
		}
		s.Success(clk.Now())
		if s.Stale() != 0 {
			t.Fatal("a success ends the staleness of a restored policy")
		}
	})
	t.Run("restored_after_success_is_ignored", func(t *testing.T) {
		clk := clock.NewMock()
		s := NewStaleness(clk)
		s.Success(clk.Now())
		s.Restored(clk.Now().Add(-time.Hour))
		// guards mutation "if false {" in Restored
		if got := s.Stale(); got != 0 {
			t.Fatalf("a backup restored late made a current policy stale %v", got)
		}
	})
	// A lost or disabled connection makes the policy
	// possibly behind, counted from the loss, until the next success.
	t.Run("lost_counts_from_the_loss_not_the_last_success", func(t *testing.T) {
		clk := clock.NewMock()
		s := NewStaleness(clk)
		s.Success(clk.Now())
		clk.Add(time.Hour) // a quiet server: the policy is current
		s.Lost(clk.Now())
		clk.Add(5 * time.Second)
		// guards mutation "s.behind, s.from = true, s.since" in Lost
		if got := s.Stale(); got != 5*time.Second {
			t.Fatalf("stale %v, want 5s since the loss", got)
		}
		s.Success(clk.Now()) // the reconnect's full update
		if got := s.Stale(); got != 0 {
			t.Fatalf("stale %v after the reconnect's success", got)
		}
	})
	t.Run("lost_while_failing_keeps_counting", func(t *testing.T) {
		clk := clock.NewMock()
		s := NewStaleness(clk)
		s.Success(clk.Now())
		clk.Add(10 * time.Minute)
		s.FailedWith("503")
		clk.Add(time.Minute)
		s.Lost(clk.Now()) // guards mutation "if false {" in Lost
		clk.Add(time.Minute)
		if got := s.Stale(); got != 12*time.Minute {
			t.Fatalf("stale %v, want 12m since the last success", got)
		}
	})
	t.Run("failure_after_loss_keeps_the_loss_time", func(t *testing.T) {
		clk := clock.NewMock()
		s := NewStaleness(clk)
		s.Success(clk.Now())
		clk.Add(time.Hour)
		s.Lost(clk.Now())
		clk.Add(5 * time.Second)
		s.FailedWith("connection refused") // guards mutation "if true {" in failLocked
		if got := s.Stale(); got != 5*time.Second {
			t.Fatalf("stale %v, want 5s since the loss", got)
		}
	})
	t.Run("nil_is_safe", func(t *testing.T) {
		var s *Staleness
		s.Lost(time.Time{})
		s.Failing()
		if s.Stale() != 0 {
			t.Fatal("nil stale")
		}
	})
}
