package updater

import (
	"container/list"
	"context"
	"errors"
	"strings"
	"time"

	"github.com/opal-go/opal-client/fetcher"
	"github.com/opal-go/opal-client/scheduler"
)

// DefaultFetchWorkers is the number of data works prepared (fetched) at once
// when Options.FetchWorkers is 0 (OPAL_DATA_UPDATER_FETCH_CONCURRENCY).
const DefaultFetchWorkers = 8

// dataWindow is how many queued data works, from the head, the writer looks
// at for one that may be written now. A work beyond it waits a little longer;
// nothing is reordered across an overlapping work either way.
const dataWindow = 64

// ErrSuperseded is the outcome of data work that newer work for the same
// target replaced before it was written: it was never written.
var ErrSuperseded = errors.New("updater: superseded by a newer update")

// DataWork is one unit of data work, keyed by its target (U1): the data path
// it writes, or a Key for a target that is not a data path (the base data
// load, the health-check policy).
//
// The queue admits it on arrival. Prepare (the fetch) runs in a bounded
// worker pool; Apply (the store write) runs alone on the queue's goroutine,
// after every earlier work on an overlapping path. A newer work whose
// Replaces covers this one's path supersedes it while it is pending (Done sees
// ErrSuperseded), and supersedes the deferral of that path and the paths under
// it. A work whose Prepare or Apply fails transiently arms its key's deferral
// (at most one per key, made by Defer), which admits it again when it fires.
type DataWork struct {
	// Name labels the work in logs.
	Name string
	// Key identifies a target that is not a data path; "" means Path.
	Key string
	// Path is the data path written: overlapping paths keep arrival order.
	Path []string
	// Unordered work orders against nothing (the health-check policy).
	Unordered bool
	// Replaces are the paths this work overwrites whole: older pending work
	// and deferrals at or under each are superseded. Nil for a patch.
	Replaces [][]string
	// Coalesce: a newer work with the same Key replaces this one while it is
	// pending (latest wins).
	Coalesce bool
	// Prepare, if set, runs in the worker pool and returns the write. Nil
	// means Apply is the write.
	Prepare func(ctx context.Context) (*Prepared, error)
	Apply   func(ctx context.Context) error
	// Done sees every run's outcome: nil, the error of Prepare or Apply, or
	// ErrSuperseded. It runs without the queue's lock; keep it short.
	Done func(err error)
	// Defer makes the key's deferral scheduler, whose Fire must call fire.
	// Nil: the work is never deferred.
	Defer func(fire func()) *scheduler.Scheduler
}

// Prepared is what a Prepare produced: a write, or works that take the
// preparing work's place in the queue (the entries of the base data load,
// admitted where the load was admitted: on connect).
type Prepared struct {
	Apply  func(ctx context.Context) error
	Expand []*DataWork
}

// TransientError is implemented by store errors a later retry may fix (an
// unreachable store, a 5xx, a write that failed half-way); such a failure
// arms the deferral like an exhausted fetch. Deterministic failures (a bundle
// that does not compile) do not implement it, or answer false.
type TransientError interface {
	error
	Transient() bool
}

// IsTransient reports whether err is a transient store failure.
func IsTransient(err error) bool {
	var t TransientError
	return errors.As(err, &t) && t.Transient()
}

// retryLater reports whether a failed work should be deferred, and the
// server's hint.
func retryLater(err error) (hint time.Duration, has, ok bool) {
	var re *fetcher.RetryableError
	if errors.As(err, &re) {
		return re.RetryAfter, re.HasRetryAfter, re.Exhausted
	}
	return 0, false, IsTransient(err)
}

// Work states.
const (
	stQueued    = iota // waiting for a worker
	stPreparing        // in a worker
	stReady            // may be written once nothing earlier overlaps
	stWriting
)

type dataItem struct {
	w      *DataWork
	key    string
	seq    uint64 // admission order
	origin uint64 // what it is newer than: seq, or its deferral's origin
	state  int
	el     *list.Element // in u.data
	node   *node         // at w.Path
	repl   []*node       // at w.Replaces
	apply  func(ctx context.Context) error
	cancel context.CancelFunc
	gone   bool // superseded or finished
}

// deferral is the one deferred re-run of a key.
type deferral struct {
	key    string
	s      *scheduler.Scheduler
	w      *DataWork
	origin uint64
	node   *node // nil for a non-path key
}

// node is a path trie of the pending data works and deferrals, so that
// superseding the paths under one costs what it supersedes.
type node struct {
	parent *node
	seg    string
	kids   map[string]*node
	items  []*dataItem // pending works at this path (few: a slice is smaller than a map)
	repl   []*dataItem // pending works that replace this path
	def    *deferral
}

// without returns s without it (order kept: arrival order).
func without(s []*dataItem, it *dataItem) []*dataItem {
	for i, o := range s {
		if o == it {
			copy(s[i:], s[i+1:])
			s[len(s)-1] = nil
			s = s[:len(s)-1]
			if len(s) == 0 {
				return nil
			}
			return s
		}
	}
	return s
}

func (n *node) child(seg string) *node {
	if n.kids == nil {
		n.kids = map[string]*node{}
	}
	c := n.kids[seg]
	if c == nil {
		c = &node{parent: n, seg: seg}
		n.kids[seg] = c
	}
	return c
}

func (n *node) at(p []string) *node {
	for _, s := range p {
		n = n.child(s)
	}
	return n
}

// find returns the node at p without creating it.
func (n *node) find(p []string) *node {
	for _, s := range p {
		if n = n.kids[s]; n == nil {
			return nil
		}
	}
	return n
}

// prune removes empty nodes upwards.
func (n *node) prune() {
	for n != nil && n.parent != nil && len(n.kids) == 0 && len(n.items) == 0 && len(n.repl) == 0 && n.def == nil {
		delete(n.parent.kids, n.seg)
		n = n.parent
	}
}

// walk calls f for n and every node under it.
func (n *node) walk(f func(*node)) {
	f(n)
	for _, c := range n.kids {
		c.walk(f)
	}
}

func pathKey(p []string) string { return "/" + strings.Join(p, "/") }

func overlap(a, b []string) bool {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Data admits data work (U1). It never blocks and never refuses for lack of
// room: pending work is coalesced per key instead. It returns an error only
// for work that has nothing to do.
func (u *Updater) Data(w DataWork) error {
	if w.Prepare == nil && w.Apply == nil {
		return errors.New("updater: data work without Prepare or Apply")
	}
	var after []func()
	u.mu.Lock()
	if !u.stopped {
		u.admitLocked(&w, nil, 0, &after)
	}
	u.mu.Unlock()
	runAll(after)
	u.signal()
	return nil
}

func runAll(fs []func()) {
	for _, f := range fs {
		f()
	}
}

func (u *Updater) signal() {
	select {
	case u.wake <- struct{}{}:
	default:
	}
	select {
	case u.prepWake <- struct{}{}:
	default:
	}
}

func workKey(w *DataWork) string {
	if w.Key != "" {
		return w.Key
	}
	return pathKey(w.Path)
}

// admitLocked queues w at the tail, or, with at != nil, just before at (the
// expansion of a base load keeps the load's place). def is the deferral this
// is a re-run of; origin 0 means "as new". u.mu is held.
func (u *Updater) admitLocked(w *DataWork, at *dataItem, origin uint64, after *[]func()) *dataItem {
	u.seq++
	it := &dataItem{w: w, key: workKey(w), seq: u.seq, origin: u.seq}
	if at != nil {
		it.seq = at.seq
	}
	if origin != 0 {
		it.origin = origin
	}
	// Newer work supersedes older pending work and deferrals it replaces.
	for _, r := range w.Replaces {
		n := u.root.find(r)
		if n == nil {
			continue
		}
		n.walk(func(n *node) {
			for _, o := range append([]*dataItem(nil), n.items...) {
				if o.origin < it.origin && o.state != stWriting {
					u.supersedeLocked(o, after)
				}
			}
			if d := n.def; d != nil && d.origin < it.origin {
				u.dropDeferralLocked(d, after)
			}
		})
	}
	// Anything newer for a key supersedes its deferral (D5).
	if d := u.defs[it.key]; d != nil && d.origin < it.origin {
		u.dropDeferralLocked(d, after)
	}
	if w.Coalesce {
		if o := u.coalesce[it.key]; o != nil && o.state != stWriting && !o.gone {
			u.supersedeLocked(o, after)
		}
		u.coalesce[it.key] = it
	}
	if at != nil {
		it.el = u.data.InsertBefore(it, at.el)
	} else {
		it.el = u.data.PushBack(it)
	}
	if !w.Unordered {
		it.node = u.root.at(w.Path)
		it.node.items = append(it.node.items, it)
	}
	for _, r := range w.Replaces {
		n := u.root.at(r)
		n.repl = append(n.repl, it)
		it.repl = append(it.repl, n)
	}
	if w.Prepare == nil {
		it.state, it.apply = stReady, w.Apply
	} else {
		u.toPrep = append(u.toPrep, it)
	}
	return it
}

// removeLocked takes it out of the queue and the trie.
func (u *Updater) removeLocked(it *dataItem) {
	if it.gone {
		return
	}
	it.gone = true
	u.data.Remove(it.el)
	if it.node != nil {
		it.node.items = without(it.node.items, it)
		it.node.prune()
	}
	for _, n := range it.repl {
		n.repl = without(n.repl, it)
		n.prune()
	}
	if u.coalesce[it.key] == it {
		delete(u.coalesce, it.key)
	}
}

func (u *Updater) supersedeLocked(it *dataItem, after *[]func()) {
	if it.gone {
		return
	}
	u.removeLocked(it)
	if it.cancel != nil {
		it.cancel()
	}
	u.log.Debug("data work superseded", "name", it.w.Name)
	if done := it.w.Done; done != nil {
		*after = append(*after, func() { done(ErrSuperseded) })
	}
}

func (u *Updater) dropDeferralLocked(d *deferral, after *[]func()) {
	if u.defs[d.key] != d {
		return
	}
	delete(u.defs, d.key)
	if d.node != nil {
		d.node.def = nil
		d.node.prune()
	}
	// Stop waits for a firing timer, whose Fire takes u.mu: after unlock.
	*after = append(*after, d.s.Stop)
}

// newerPendingLocked reports whether work newer than it is pending for its
// key, or replaces its path.
func (u *Updater) newerPendingLocked(it *dataItem) bool { return u.newerLocked(it, false) }

// newerLocked is newerPendingLocked; replacersOnly counts only the newer
// work that replaces its path (a newer patch needs the older PUT first).
func (u *Updater) newerLocked(it *dataItem, replacersOnly bool) bool {
	if it.w.Unordered || it.w.Key != "" {
		if o := u.coalesce[it.key]; o != nil && o != it && o.origin > it.origin {
			return true
		}
		return false
	}
	n := u.root
	for i := 0; ; i++ {
		for _, o := range n.repl {
			if o != it && o.origin > it.origin {
				return true
			}
		}
		if i == len(it.w.Path) {
			break
		}
		if n = n.kids[it.w.Path[i]]; n == nil {
			return false
		}
	}
	if replacersOnly {
		return false
	}
	for _, o := range n.items {
		if o != it && o.origin > it.origin {
			return true
		}
	}
	return false
}

// finishLocked records the outcome of a work that was prepared or written:
// a success drops its key's deferral, a transient failure arms it (unless
// newer work for the key is pending), a deterministic one drops it.
func (u *Updater) finishLocked(it *dataItem, err error, after *[]func()) {
	newer := u.newerPendingLocked(it)
	u.removeLocked(it)
	d := u.defs[it.key]
	if d != nil && d.origin > it.origin {
		d = nil // a newer work's deferral: not ours to touch
	}
	hint, has, later := retryLater(err)
	switch {
	case err == nil || !later || it.w.Defer == nil || newer || u.stopped:
		if d != nil {
			u.dropDeferralLocked(d, after) // guard: mutation "_ = d" keeps a succeeded entry's deferral
		}
	default:
		if d == nil {
			d = &deferral{key: it.key}
			dd := d
			d.s = it.w.Defer(func() { u.fireDeferral(dd) })
			u.defs[it.key] = d
			if !it.w.Unordered && it.w.Key == "" {
				d.node = u.root.at(it.w.Path)
				if old := d.node.def; old != nil && old != d {
					u.dropDeferralLocked(old, after)
				}
				d.node.def = d
			}
		}
		d.w, d.origin = it.w, it.origin
		s := d.s
		*after = append(*after, func() { s.Arm(hint, has) })
	}
	if done := it.w.Done; done != nil {
		*after = append(*after, func() { done(err) })
	}
}

// fireDeferral admits the deferral's work again, as old as it was (D4).
func (u *Updater) fireDeferral(d *deferral) {
	u.mu.Lock()
	var after []func()
	if !u.stopped && u.defs[d.key] == d {
		u.admitLocked(d.w, nil, d.origin, &after)
	}
	u.mu.Unlock()
	runAll(after)
	u.signal()
}

// prepWorker runs Prepare of queued works, oldest first, until ctx ends.
func (u *Updater) prepWorker(ctx context.Context) {
	for {
		u.mu.Lock()
		var it *dataItem
		for len(u.toPrep) > 0 && it == nil {
			it, u.toPrep = u.toPrep[0], u.toPrep[1:]
			if it.gone {
				it = nil
			}
		}
		if it == nil {
			u.mu.Unlock()
			select {
			case <-u.prepWake:
				continue
			case <-ctx.Done():
				return
			}
		}
		pctx, cancel := context.WithCancel(ctx)
		it.state, it.cancel = stPreparing, cancel
		u.mu.Unlock()
		select { // another item may be waiting for another worker
		case u.prepWake <- struct{}{}:
		default:
		}

		p, err := it.w.Prepare(pctx)
		cancel()

		var after []func()
		u.mu.Lock()
		switch {
		case it.gone: // superseded meanwhile
		case ctx.Err() != nil:
			u.removeLocked(it)
		case err != nil:
			u.log.Debug("data work not prepared", "name", it.w.Name, "error", err)
			u.finishLocked(it, err, &after)
		case p != nil && p.Expand != nil:
			var news []*dataItem
			for _, w := range p.Expand {
				news = append(news, u.expandLocked(w, it, &after)...)
			}
			u.removeLocked(it)
			// The entries go first: they hold the load's place.
			u.toPrep = append(news, u.toPrep...)
			if done := it.w.Done; done != nil {
				after = append(after, func() { done(nil) })
			}
			if d := u.defs[it.key]; d != nil && d.origin <= it.origin {
				u.dropDeferralLocked(d, &after)
			}
		default:
			it.state, it.cancel = stReady, nil
			if p != nil {
				it.apply = p.Apply
			}
		}
		u.mu.Unlock()
		runAll(after)
		u.signal()
	}
}

// expandLocked admits w in place of the base load at: older than the work
// admitted after the load, newer than the work before it. A later work that
// replaces w's path supersedes it at once.
func (u *Updater) expandLocked(w *DataWork, at *dataItem, after *[]func()) []*dataItem {
	it := u.admitLocked(w, at, at.origin, after)
	if u.newerLocked(it, true) {
		u.supersedeLocked(it, after)
		return nil
	}
	if it.w.Prepare == nil {
		return nil
	}
	// admitLocked queued it at the tail of toPrep; the caller puts it first.
	u.toPrep = u.toPrep[:len(u.toPrep)-1]
	return []*dataItem{it}
}

// nextDataLocked is the first data work, in admission order within the
// window, that is ready and has no earlier pending work on an overlapping
// path.
func (u *Updater) nextDataLocked() *dataItem {
	var earlier []*dataItem
	n := 0
	for e := u.data.Front(); e != nil && n < dataWindow; e, n = e.Next(), n+1 {
		it := e.Value.(*dataItem)
		if it.state == stReady && (it.w.Unordered || !overlapsAny(it, earlier)) {
			return it
		}
		if !it.w.Unordered {
			earlier = append(earlier, it)
		}
	}
	return nil
}

func overlapsAny(it *dataItem, earlier []*dataItem) bool {
	for _, o := range earlier {
		if overlap(o.w.Path, it.w.Path) { // guard: mutation "false &&" writes a child before its slower parent
			return true
		}
	}
	return false
}

// runData writes one ready data work (U1: alone on the queue's goroutine).
func (u *Updater) runData(ctx context.Context, it *dataItem) {
	err := ctx.Err()
	if err == nil && it.apply != nil {
		err = it.apply(ctx)
	}
	if err != nil && ctx.Err() == nil {
		u.log.Debug("data write failed", "name", it.w.Name, "error", err)
	}
	var after []func()
	u.mu.Lock()
	if ctx.Err() != nil {
		u.removeLocked(it)
	} else {
		u.finishLocked(it, err, &after)
	}
	u.mu.Unlock()
	runAll(after)
	u.signal()
}

// DataDeferrals is the number of keys holding a deferral and the number of
// their pending timers (tests: at most one per key; deferrals are deleted
// when they succeed or are superseded).
func (u *Updater) DataDeferrals() (keys, timers int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, d := range u.defs {
		timers += d.s.Timers()
	}
	return len(u.defs), timers
}
