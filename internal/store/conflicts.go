package store

// DataConflicts answers the compiler's path-conflict check (a rule defined
// where data is) from the plan's own data writes, as storage.NonEmpty would
// from a store that held only them. The REST store has no local copy of the
// remote's data; with this its local compile still refuses a bundle whose
// rules collide with its own data before any write, so the remote never
// holds half of it (U3). Conflicts with data the remote holds from
// elsewhere are still found by the remote.
func (p *Plan) DataConflicts() func(path []string) (bool, error) {
	return func(path []string) (bool, error) {
		for _, w := range p.DataWrites {
			if hasPrefix(w.Path, path) { // data at or below path
				return true, nil
			}
			if !hasPrefix(path, w.Path) {
				continue
			}
			v := w.Value // data above path: walk down to it
			for _, seg := range path[len(w.Path):] {
				m, ok := v.(map[string]any)
				if !ok {
					return true, nil // a value, not an object, above path
				}
				if v, ok = m[seg]; !ok {
					return false, nil // the nearest data above is an object
				}
			}
			return true, nil
		}
		return false, nil
	}
}

// hasPrefix reports whether prefix is a (not necessarily proper) prefix of p.
func hasPrefix(p, prefix []string) bool {
	if len(prefix) > len(p) {
		return false
	}
	for i := range prefix {
		if p[i] != prefix[i] {
			return false
		}
	}
	return true
}
