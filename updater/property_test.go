package updater_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/opal-go/opal-client/scheduler"
)

// TestProperty_RandomSequences drives the real queue and scheduler through
// 10,000 seeded random event sequences (fetch outcomes, updates, reconnects,
// forced updates, time passing, stops) and checks after every event:
//   - D1: never more than one pending timer;
//   - D2/D3: every armed delay lies in [2.5 s, max(MAX_RETRY_AFTER, 5 s)];
//   - D6: the rounds only go down after a successful fetch or a genuine update;
//   - U1: no store write overlaps another.
//
// A failure names its seed and the event trace.
func TestProperty_RandomSequences(t *testing.T) {
	n := 10000
	if testing.Short() {
		n = 500
	}
	for seed := 0; seed < n; seed++ {
		bubble(t, func(t *testing.T) { runSequence(t, uint64(seed)) })
		if t.Failed() {
			return
		}
	}
}

func runSequence(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	ceilings := []time.Duration{0, 3 * time.Second, time.Minute, 90 * time.Second}
	ceiling := ceilings[rng.IntN(len(ceilings))]
	maxRounds := rng.IntN(6)
	r := newRig(t, rigOpt{maxRounds: maxRounds, ceiling: ceiling, rand: rng.Float64, exact: true})
	successes, lastOK := 0, false
	r.f.gen = func() outcome {
		lastOK = false
		switch rng.IntN(4) {
		case 0:
			successes++
			lastOK = true
			return outcome{bundle: full(fmt.Sprintf("h%d", rng.IntN(3)))}
		case 1:
			return okNR
		default:
			return hinted(time.Duration(rng.IntN(200)) * time.Second)
		}
	}
	hi := max(ceiling, scheduler.Floor)
	var trace []string
	fail := func(format string, a ...any) {
		t.Helper()
		t.Fatalf("seed %d (ceiling %v, rounds %d): %s\ntrace: %v", seed, ceiling, maxRounds, fmt.Sprintf(format, a...), trace)
	}
	r.start()
	prevRound, checkedArms := 0, 0
	for step := 0; step < 25; step++ {
		genuine := false
		succBefore := successes
		switch ev := rng.IntN(10); {
		case ev < 2:
			trace = append(trace, "connect")
			r.u.Connect()
		case ev < 4:
			trace = append(trace, "update")
			genuine = true
			r.u.PolicyUpdate([]string{"."})
		case ev < 5:
			trace = append(trace, "force")
			r.u.ForceFull()
		case ev < 9:
			d := time.Duration(rng.IntN(90)) * time.Second
			trace = append(trace, "wait "+d.String())
			r.clk.Add(d)
		default:
			trace = append(trace, "stop")
			r.u.Stop()
			r.s.Stop()
		}
		settle()
		if n := r.s.Timers(); n > 1 {
			fail("%d pending timers", n)
		}
		r.mu.Lock()
		arms := append([]armRec(nil), r.arms[checkedArms:]...)
		checkedArms = len(r.arms)
		r.mu.Unlock()
		for _, a := range arms {
			if a.delay < scheduler.Floor/2 || a.delay > hi {
				fail("delay %v outside [2.5s, %v]", a.delay, hi)
			}
		}
		round := r.s.Round()
		if round < prevRound && !genuine && successes == succBefore {
			fail("rounds went from %d to %d without a success or an update", prevRound, round)
		}
		prevRound = round
		if successes > succBefore && lastOK && (round != 0 || r.s.Pending()) {
			fail("the step's last fetch succeeded but round %d, pending %v", round, r.s.Pending())
		}
		if r.st.Overlaps() != 0 {
			fail("overlapping store writes")
		}
	}
	r.u.Stop()
	r.s.Stop()
	if r.s.Timers() != 0 {
		fail("a timer survived Stop")
	}
}
