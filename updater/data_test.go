package updater_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opal-go/opal-client/fetcher"
	"github.com/opal-go/opal-client/scheduler"
	"github.com/opal-go/opal-client/updater"
)

// journal records the data works' writes and outcomes.
type journal struct {
	mu      sync.Mutex
	writes  []string
	outcome map[string][]string
}

func (j *journal) work(name string, path []string, replaces bool, prep func(context.Context) error) updater.DataWork {
	w := updater.DataWork{Name: name, Path: path}
	if replaces {
		w.Replaces = [][]string{path}
	}
	apply := func(context.Context) error {
		j.mu.Lock()
		j.writes = append(j.writes, name)
		j.mu.Unlock()
		return nil
	}
	if prep == nil {
		w.Apply = apply
	} else {
		w.Prepare = func(ctx context.Context) (*updater.Prepared, error) {
			if err := prep(ctx); err != nil {
				return nil, err
			}
			return &updater.Prepared{Apply: apply}, nil
		}
	}
	w.Done = func(err error) {
		j.mu.Lock()
		defer j.mu.Unlock()
		if j.outcome == nil {
			j.outcome = map[string][]string{}
		}
		s := "ok"
		if err != nil {
			s = err.Error()
		}
		j.outcome[name] = append(j.outcome[name], s)
	}
	return w
}

func (j *journal) written() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]string(nil), j.writes...)
}

func (j *journal) outcomes(name string) []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]string(nil), j.outcome[name]...)
}

func gated(g chan struct{}) func(context.Context) error {
	return func(ctx context.Context) error {
		select {
		case <-g:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// TestU1_DataQueue: the queue keyed by target. Each case names the rule it
// guards.
func TestU1_DataQueue(t *testing.T) {
	p := func(s string) []string { return strings.Split(strings.Trim(s, "/"), "/") }
	t.Run("U1_latest_put_wins", func(t *testing.T) {
		// Catches: no supersession (every queued PUT written).
		bubble(t, func(t *testing.T) {
			r := newRig(t, rigOpt{})
			var j journal
			for i := 1; i <= 3; i++ {
				r.u.Data(j.work(fmt.Sprint("a", i), p("/a"), true, nil))
			}
			r.start()
			settle()
			if got := j.written(); !slices.Equal(got, []string{"a3"}) {
				t.Fatalf("written %v, want [a3]", got)
			}
			if got := j.outcomes("a1"); len(got) != 1 || got[0] != updater.ErrSuperseded.Error() {
				t.Fatalf("a1 outcome %v, want superseded", got)
			}
		})
	})
	t.Run("U1_parent_put_supersedes_child", func(t *testing.T) {
		bubble(t, func(t *testing.T) {
			r := newRig(t, rigOpt{})
			var j journal
			r.u.Data(j.work("child", p("/a/b"), true, nil))
			r.u.Data(j.work("parent", p("/a"), true, nil))
			r.u.Data(j.work("other", p("/ab"), true, nil))
			r.start()
			settle()
			if got := j.written(); !slices.Equal(got, []string{"parent", "other"}) {
				t.Fatalf("written %v, want [parent other]", got)
			}
		})
	})
	t.Run("U1_overlapping_keep_arrival_order", func(t *testing.T) {
		// Catches: a child written before its slower parent (overlapsAny).
		bubble(t, func(t *testing.T) {
			r := newRig(t, rigOpt{})
			var j journal
			g := make(chan struct{})
			r.start()
			r.u.Data(j.work("parent", p("/a"), true, gated(g)))
			r.u.Data(j.work("child", p("/a/b"), true, nil))
			r.u.Data(j.work("disjoint", p("/z"), true, nil))
			settle()
			if got := j.written(); !slices.Equal(got, []string{"disjoint"}) {
				t.Fatalf("written %v before the parent's fetch ended, want [disjoint]", got)
			}
			close(g)
			settle()
			if got := j.written(); !slices.Equal(got, []string{"disjoint", "parent", "child"}) {
				t.Fatalf("written %v", got)
			}
		})
	})
	t.Run("U1_patch_supersedes_nothing", func(t *testing.T) {
		bubble(t, func(t *testing.T) {
			r := newRig(t, rigOpt{})
			var j journal
			r.u.Data(j.work("put", p("/a"), true, nil))
			r.u.Data(j.work("patch", p("/a"), false, nil))
			r.start()
			settle()
			if got := j.written(); !slices.Equal(got, []string{"put", "patch"}) {
				t.Fatalf("written %v", got)
			}
		})
	})
	t.Run("U1_nothing_dropped_for_lack_of_room", func(t *testing.T) {
		// A 3,000-entry update: every entry is written.
		bubble(t, func(t *testing.T) {
			r := newRig(t, rigOpt{})
			var j journal
			for i := 0; i < 3000; i++ {
				if err := r.u.Data(j.work(fmt.Sprint(i), []string{"e", fmt.Sprint(i)}, true, func(context.Context) error { return nil })); err != nil {
					t.Fatal(err)
				}
			}
			r.start()
			settle()
			if n := len(j.written()); n != 3000 {
				t.Fatalf("%d of 3000 written", n)
			}
		})
	})
	t.Run("U1_fetch_pool_bounded", func(t *testing.T) {
		bubble(t, func(t *testing.T) {
			r := newRig(t, rigOpt{workers: 3})
			var j journal
			var mu sync.Mutex
			running, peak := 0, 0
			g := make(chan struct{})
			for i := 0; i < 10; i++ {
				r.u.Data(j.work(fmt.Sprint(i), []string{fmt.Sprint(i)}, true, func(ctx context.Context) error {
					mu.Lock()
					running++
					peak = max(peak, running)
					mu.Unlock()
					err := gated(g)(ctx)
					mu.Lock()
					running--
					mu.Unlock()
					return err
				}))
			}
			r.start()
			settle()
			mu.Lock()
			p1 := peak
			mu.Unlock()
			if p1 != 3 {
				t.Fatalf("%d fetches at once, want the pool's 3", p1)
			}
			close(g)
			settle()
			if n := len(j.written()); n != 10 {
				t.Fatalf("%d of 10 written", n)
			}
		})
	})
	t.Run("U1_stop_drops_the_queue", func(t *testing.T) {
		// Catches: Stop keeping the data works (they stay queued).
		bubble(t, func(t *testing.T) {
			r := newRig(t, rigOpt{})
			var j journal
			r.u.Data(j.work("a", p("/a"), true, nil))
			r.u.Stop()
			if n := r.u.Len(); n != 0 {
				t.Fatalf("%d works queued after Stop", n)
			}
			r.u.Data(j.work("b", p("/b"), true, nil))
			if n := r.u.Len(); n != 0 {
				t.Fatalf("a work admitted after Stop")
			}
			if got := j.written(); len(got) != 0 {
				t.Fatalf("written %v after Stop", got)
			}
		})
	})
	t.Run("U1_coalesce_latest_wins", func(t *testing.T) {
		// The health-check policy: one write for a burst.
		bubble(t, func(t *testing.T) {
			r := newRig(t, rigOpt{})
			var j journal
			for i := 0; i < 100; i++ {
				w := j.work(fmt.Sprint("h", i), nil, false, nil)
				w.Key, w.Unordered, w.Coalesce = "health", true, true
				r.u.Data(w)
			}
			r.start()
			settle()
			if got := j.written(); !slices.Equal(got, []string{"h99"}) {
				t.Fatalf("written %v, want the latest only", got)
			}
		})
	})
}

// TestD1_DataDeferral: at most one deferral per key, deleted when it
// succeeds or when newer work for its path supersedes it.
func TestD1_DataDeferral(t *testing.T) {
	down := &fetcher.RetryableError{Status: 503, Exhausted: true}
	type step struct {
		path   string
		fail   bool // the source answers 503
		inline bool // no fetch
		patch  bool // replaces nothing
	}
	cases := []struct {
		name      string
		steps     []step
		deferrals int      // after the steps
		afterFire []string // written after every timer had time to fire
	}{
		{"D1_failure_arms_one_deferral", []step{{path: "/a", fail: true}, {path: "/a", fail: true}}, 1, nil},
		{"D8_deterministic_failure_not_deferred", []step{{path: "/a"}}, 0, nil},
		{"U1_newer_put_supersedes_deferral", []step{{path: "/a", fail: true}, {path: "/a", inline: true}}, 0, []string{"/a#1"}},
		{"U1_parent_put_supersedes_child_deferral", []step{{path: "/a/b", fail: true}, {path: "/a", inline: true}}, 0, []string{"/a#1"}},
		{"U1_child_put_keeps_parent_deferral", []step{{path: "/a", fail: true}, {path: "/a/b", inline: true}}, 1, []string{"/a/b#1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				r := newRig(t, rigOpt{})
				var j journal
				r.start()
				for i, s := range tc.steps {
					name := fmt.Sprintf("%s#%d", s.path, i)
					var prep func(context.Context) error
					switch {
					case s.fail:
						prep = func(context.Context) error { return down }
					case s.inline:
					default:
						prep = func(context.Context) error { return errors.New("not JSON") }
					}
					w := j.work(name, strings.Split(strings.Trim(s.path, "/"), "/"), !s.patch, prep)
					w.Defer = func(fire func()) *scheduler.Scheduler {
						return scheduler.New(scheduler.Options{Enabled: true, MaxRetryAfter: time.Minute, MaxRounds: 3,
							Clock: r.clk, Jitter: func(d time.Duration) time.Duration { return d }, Fire: fire})
					}
					r.u.Data(w)
					settle()
				}
				if keys, timers := r.u.DataDeferrals(); keys != tc.deferrals || timers != tc.deferrals {
					t.Fatalf("deferrals %d timers %d, want %d", keys, timers, tc.deferrals)
				}
				before := len(j.written())
				r.clk.Add(time.Minute)
				settle()
				if got := j.written(); tc.afterFire != nil && !slices.Equal(got, tc.afterFire) {
					t.Fatalf("written %v, want %v (an older deferral overwrote newer data?)", got, tc.afterFire)
				} else if tc.afterFire == nil && len(got) != before {
					t.Fatalf("written %v", got)
				}
			})
		})
	}
	t.Run("U1_newer_pending_work_supersedes_deferral", func(t *testing.T) {
		// The deferral would fire while a newer patch of its path is still
		// being fetched: the older PUT must not run after the patch.
		// Catches: a deferral kept until the newer work ends.
		bubble(t, func(t *testing.T) {
			r := newRig(t, rigOpt{})
			var j journal
			var mu sync.Mutex
			fail := true
			r.start()
			old := j.work("old", []string{"a"}, true, func(context.Context) error {
				mu.Lock()
				defer mu.Unlock()
				if fail {
					return down
				}
				return nil
			})
			old.Defer = func(fire func()) *scheduler.Scheduler {
				return scheduler.New(scheduler.Options{Enabled: true, MaxRetryAfter: time.Minute, MaxRounds: 3, Clock: r.clk,
					Jitter: func(d time.Duration) time.Duration { return d }, Fire: fire})
			}
			r.u.Data(old)
			settle()
			mu.Lock()
			fail = false
			mu.Unlock()
			g := make(chan struct{})
			r.u.Data(j.work("patch", []string{"a"}, false, gated(g)))
			settle()
			r.clk.Add(5 * time.Second)
			settle()
			close(g)
			settle()
			if got := j.written(); !slices.Equal(got, []string{"patch"}) {
				t.Fatalf("written %v, want [patch]: the older deferral ran", got)
			}
		})
	})
	t.Run("D5_success_deletes_the_deferral", func(t *testing.T) {
		// Catches: a success keeping the key's deferral (its scheduler and
		// rounds), which would accumulate one per failing source.
		bubble(t, func(t *testing.T) {
			r := newRig(t, rigOpt{})
			var j journal
			var mu sync.Mutex
			fail := true
			r.start()
			w := j.work("/a", []string{"a"}, true, func(context.Context) error {
				mu.Lock()
				defer mu.Unlock()
				if fail {
					return down
				}
				return nil
			})
			w.Defer = func(fire func()) *scheduler.Scheduler {
				return scheduler.New(scheduler.Options{Enabled: true, MaxRetryAfter: time.Minute, MaxRounds: 3, Clock: r.clk,
					Jitter: func(d time.Duration) time.Duration { return d }, Fire: fire})
			}
			r.u.Data(w)
			settle()
			if keys, _ := r.u.DataDeferrals(); keys != 1 {
				t.Fatalf("%d deferrals after a failure, want 1", keys)
			}
			mu.Lock()
			fail = false
			mu.Unlock()
			r.clk.Add(5 * time.Second)
			settle()
			if got := j.written(); !slices.Equal(got, []string{"/a"}) {
				t.Fatalf("written %v after the deferral fired", got)
			}
			if keys, timers := r.u.DataDeferrals(); keys != 0 || timers != 0 {
				t.Fatalf("deferrals %d timers %d after a success, want 0 0", keys, timers)
			}
		})
	})
}

// storeErr is a store failure; transient and partial as the REST store's.
type storeErr struct{ transient, partial bool }

func (e *storeErr) Error() string      { return fmt.Sprintf("store failed (transient %v)", e.transient) }
func (e *storeErr) Transient() bool    { return e.transient }
func (e *storeErr) PartialWrite() bool { return e.partial }

// TestU2_StoreFailureRearms: a store write that fails transiently re-arms
// the deferred re-fetch under the fetches' escalation (the rounds go on);
// a deterministic one does not retry; the log says what the store holds.
func TestU2_StoreFailureRearms(t *testing.T) {
	t.Run("U2_transient_store_failure_rearms_escalating", func(t *testing.T) {
		// Catches: a transient store failure arming nothing (the store
		// stays broken until the next notification).
		bubble(t, func(t *testing.T) {
			r := newRig(t, rigOpt{})
			r.st.FailWrites(&storeErr{transient: true, partial: true})
			r.start()
			r.u.Connect()
			settle()
			if a := r.lastArm(t); a.round != 1 || a.delay != 5*time.Second {
				t.Fatalf("armed %+v, want round 1 (5s)", a)
			}
			if !strings.Contains(r.log.String(), "partly written") {
				t.Fatalf("log does not say the store was partly written:\n%s", r.log.String())
			}
			r.clk.Add(5 * time.Second)
			settle()
			if a := r.lastArm(t); a.round != 2 || a.delay != 10*time.Second {
				t.Fatalf("armed %+v, want round 2 (10s): the rounds were reset", a)
			}
			r.st.FailWrites(nil)
			r.clk.Add(10 * time.Second)
			settle()
			if h, _ := r.st.PolicyHash(t.Context()); h != "h1" {
				t.Fatalf("store hash %q after the re-fetch, want h1", h)
			}
			if r.s.Pending() || r.s.Round() != 0 {
				t.Fatal("a success did not reset the scheduler")
			}
		})
	})
	t.Run("U3_deterministic_store_failure_not_retried", func(t *testing.T) {
		bubble(t, func(t *testing.T) {
			r := newRig(t, rigOpt{})
			r.st.FailWrites(&storeErr{transient: false})
			r.start()
			r.u.Connect()
			settle()
			if r.nArms() != 0 || r.s.Pending() {
				t.Fatal("a deterministic store failure armed a re-fetch")
			}
			if !strings.Contains(r.log.String(), "store=unchanged") {
				t.Fatalf("log does not say the store is unchanged:\n%s", r.log.String())
			}
		})
	})
}
