package scheduler

// Armed is the number of timers created and not yet stopped or fired: the
// "at most one pending timer" invariant (D1) checked from outside.
func (s *Scheduler) Armed() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.armed
}
