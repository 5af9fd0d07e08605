package dataupdater

import "sync"

// order keeps the writes to overlapping dst_paths in arrival order while
// entries on disjoint paths run concurrently (protocol §6.4's hierarchical
// path lock). Arrival is the call to admit, made synchronously by whoever
// receives the update, so the order is the order of the messages.
type order struct {
	mu     sync.Mutex
	active []*slot
}

type slot struct {
	path []string
	done chan struct{}
}

// admit registers a job on path and returns the jobs it must wait for (the
// earlier ones on an overlapping path) and its own slot, to be released.
func (o *order) admit(path []string) (wait []chan struct{}, s *slot) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, a := range o.active {
		if overlaps(a.path, path) {
			wait = append(wait, a.done)
		}
	}
	s = &slot{path: path, done: make(chan struct{})}
	o.active = append(o.active, s)
	return wait, s
}

func (o *order) release(s *slot) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i, a := range o.active {
		if a == s {
			o.active = append(o.active[:i], o.active[i+1:]...)
			break
		}
	}
	close(s.done)
}

// overlaps reports whether one path is at or below the other; the root
// overlaps everything.
func overlaps(a, b []string) bool {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
