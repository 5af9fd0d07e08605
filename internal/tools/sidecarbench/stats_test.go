package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
)

// The figures of docs/performance.md are only as right as these helpers.

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []float64
		want float64
	}{
		{"odd_count_is_middle", []float64{3, 1, 2}, 2},
		// guard: mutation "return s[n/2]" (upper middle) for an even count
		{"even_count_is_mean_of_middles", []float64{4, 1, 2, 3}, 2.5},
		{"empty_is_zero", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]float64(nil), tc.in...)
			if got := median(tc.in); got != tc.want {
				t.Fatalf("median(%v) = %v, want %v", tc.in, got, tc.want)
			}
			for i := range in {
				if in[i] != tc.in[i] {
					t.Fatalf("median sorted its input in place: %v", tc.in)
				}
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	ms200 := make([]time.Duration, 200)
	for i := range ms200 {
		ms200[len(ms200)-1-i] = time.Duration(i+1) * time.Millisecond // 200..1, unsorted
	}
	for _, tc := range []struct {
		name string
		in   []time.Duration
		p    float64
		want time.Duration
	}{
		{"p99_of_200_is_198th", ms200, 99, 198 * time.Millisecond},
		{"p50_of_200_is_100th", ms200, 50, 100 * time.Millisecond},
		{"p100_is_max", ms200, 100, 200 * time.Millisecond},
		// guard: mutation "rank := int(math.Floor(p / 100 * float64(len(s))))" (floor, not nearest rank)
		{"nearest_rank_rounds_up", []time.Duration{3, 1, 2}, 50, 2},
		// guard: mutation "rank = max(rank, 0)" (index -1 for p0)
		{"p0_is_min", []time.Duration{3, 1, 2}, 0, 1},
		{"empty_is_zero", nil, 99, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("percentile(p%v) panicked: %v", tc.p, r)
				}
			}()
			if got := percentile(tc.in, tc.p); got != tc.want {
				t.Fatalf("percentile(p%v) = %v, want %v", tc.p, got, tc.want)
			}
		})
	}
}

func TestParseStatus(t *testing.T) {
	const status = "Name:\topal-client\nVmPeak:\t 1000 kB\nVmHWM:\t   2048 kB\nVmRSS:\t   1024 kB\nThreads:\t7\n"
	t.Run("reads_rss_and_hwm_in_bytes", func(t *testing.T) {
		// guard: mutation "m.RSS, seenRSS = kb, true" (kB read as bytes)
		m, err := parseStatus(strings.NewReader(status))
		if err != nil || m.RSS != 1024*1024 || m.HWM != 2048*1024 {
			t.Fatalf("got %+v, %v", m, err)
		}
	})
	t.Run("missing_field_is_an_error", func(t *testing.T) {
		// guard: mutation "if !seenRSS && !seenHWM {": 0 bytes would pass any memory target
		if _, err := parseStatus(strings.NewReader("VmRSS:\t 1 kB\n")); err == nil {
			t.Fatal("no error without VmHWM")
		}
	})
	t.Run("bad_number_is_an_error", func(t *testing.T) {
		if _, err := parseStatus(strings.NewReader("VmRSS:\t x1 kB\nVmHWM:\t 1 kB\n")); err == nil {
			t.Fatal("no error for a bad number")
		}
	})
	t.Run("own_process", func(t *testing.T) {
		m, err := readProcMem(os.Getpid())
		if err != nil || m.RSS == 0 || m.HWM < m.RSS {
			t.Fatalf("got %+v, %v", m, err)
		}
	})
}

// TestTargets pins the three targets at their boundaries.
func TestTargets(t *testing.T) {
	for _, tc := range []struct {
		name, got, want string
	}{
		{"startup_300ms_over_opa_misses", startupVerdict(1000*time.Millisecond, 700*time.Millisecond), "MISS"},
		// guard: mutation "return verdict(ours < startupTarget)" (OPA's compile time not allowed for)
		{"startup_is_relative_to_opa", startupVerdict(900*time.Millisecond, 700*time.Millisecond), "PASS"},
		// guard: mutation "return verdict(ours*100 < opa*memTargetPct)" (exactly 1.15x is within)
		{"memory_exactly_1.15x_passes", memVerdict(115, 100), "PASS"},
		{"memory_over_1.15x_misses", memVerdict(116, 100), "MISS"},
		// guard: mutation "return verdict(p99 <= latencyTarget)" (the target is strictly under 25 ms)
		{"latency_25ms_misses", latencyVerdict(25 * time.Millisecond), "MISS"},
		{"latency_under_25ms_passes", latencyVerdict(24 * time.Millisecond), "PASS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Fatalf("got %s, want %s", tc.got, tc.want)
			}
		})
	}
}

func TestJSONEqual(t *testing.T) {
	if !jsonEqual([]byte(`{"a":1,"b":[1,2]}`), []byte(`{"b":[1,2], "a":1}`)) {
		t.Fatal("key order or spacing made equal answers differ")
	}
	// guard: mutation "return len(xa) == len(ya)" (two servers with different content would pass)
	if jsonEqual([]byte(`{"result":1}`), []byte(`{"result":2}`)) {
		t.Fatal("different answers compare equal")
	}
	if jsonEqual([]byte(`{"result":`), []byte(`{"result":`)) {
		t.Fatal("undecodable answers compare equal")
	}
}

// TestGenBundle: the generated bundle is the 1,000-module / 10 MB one, every
// module parses, and every data document is JSON.
func TestGenBundle(t *testing.T) {
	dir := t.TempDir()
	n, err := writeGenBundle(dir)
	if err != nil {
		t.Fatal(err)
	}
	if n < 10_000_000 || n > 10_200_000 {
		t.Fatalf("%d bytes of data, want about 10 MB", n)
	}
	mods, _ := filepath.Glob(filepath.Join(dir, "gen", "*", "policy.rego"))
	docs, _ := filepath.Glob(filepath.Join(dir, "d*", "data.json"))
	if len(mods) != genModules || len(docs) != genDataDocs {
		t.Fatalf("%d modules, %d data documents", len(mods), len(docs))
	}
	for _, i := range []int{0, genModules - 1} {
		m, err := ast.ParseModule(fmt.Sprintf("m%d.rego", i), genModule(i))
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("data.gen.m%04d", i); m.Package.Path.String() != want {
			t.Fatalf("package %s, want %s", m.Package.Path, want)
		}
	}
	var v struct {
		Records []map[string]any `json:"records"`
	}
	if err := json.Unmarshal([]byte(genData(genDataDocs-1)), &v); err != nil || len(v.Records) == 0 {
		t.Fatalf("data document: %v (%d records)", err, len(v.Records))
	}
}
