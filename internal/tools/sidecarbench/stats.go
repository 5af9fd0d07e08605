package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// median of xs (mean of the two middle values for an even count); 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// percentile is the nearest-rank percentile (p in [0,100], p0 the minimum): the smallest
// value with at least p% of the samples at or below it, so p99 of 200 samples
// is the 198th smallest, a value that was actually measured.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	rank = max(rank, 1)
	rank = min(rank, len(s))
	return s[rank-1]
}

// procMem is a process's resident memory from /proc/<pid>/status, in bytes.
type procMem struct {
	RSS, HWM uint64 // VmRSS (now), VmHWM (peak)
}

// parseStatus reads VmRSS and VmHWM ("VmRSS:\t  12345 kB") from a
// /proc/<pid>/status text. A missing field is an error: a zero would read as
// a process that uses no memory.
func parseStatus(r io.Reader) (procMem, error) {
	var m procMem
	var seenRSS, seenHWM bool
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(val)
		if len(f) != 2 || f[1] != "kB" {
			continue
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return procMem{}, fmt.Errorf("%s: %w", key, err)
		}
		switch key {
		case "VmRSS":
			m.RSS, seenRSS = kb*1024, true
		case "VmHWM":
			m.HWM, seenHWM = kb*1024, true
		}
	}
	if err := sc.Err(); err != nil {
		return procMem{}, err
	}
	if !seenRSS || !seenHWM {
		return procMem{}, fmt.Errorf("VmRSS or VmHWM missing")
	}
	return m, nil
}

func readProcMem(pid int) (procMem, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procMem{}, err
	}
	defer f.Close()
	return parseStatus(f)
}

// Generated bundle: the same shape as the embedded store's perf test
// (internal/store/embedded/perf_test.go): 1,000 policy modules, each iterating
// over one of 100 data documents of about 100 kB (10 MB of data JSON).
const (
	genModules  = 1000
	genDataDocs = 100
	genDocBytes = 100_000
)

// genModule is module i of the generated bundle. The package is gen.mNNNN and
// the file lives in gen/mNNNN/policy.rego.
func genModule(i int) string {
	return fmt.Sprintf(
		"package gen.m%04d\n\ndefault allow := false\n\nallow if {\n\tinput.user == %q\n\tsome r in data.d%02d.records\n\tr.owner == input.user\n}\n\nnames contains r.name if some r in data.d%02d.records\n",
		i, fmt.Sprintf("user%d", i), i%genDataDocs, i%genDataDocs)
}

// genData is data document d (served at data.dNN): records until the text
// passes genDocBytes.
func genData(d int) string {
	var b strings.Builder
	b.WriteString(`{"records":[`)
	for r := 0; b.Len() < genDocBytes; r++ {
		if r > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"rec-%d-%d","owner":"user%d","tags":["a","b","c"],"n":%d}`, d, r, r%genModules, r)
	}
	b.WriteString("]}")
	return b.String()
}

// writeGenBundle writes the generated bundle as a policy directory, which is
// both what the dev server serves and what `opa run --bundle` loads: *.rego
// files are modules, dNN/data.json is data.dNN in both. It returns the bytes
// of data JSON written.
func writeGenBundle(dir string) (int, error) {
	for i := range genModules {
		p := filepath.Join(dir, "gen", fmt.Sprintf("m%04d", i), "policy.rego")
		if err := writeFile(p, genModule(i)); err != nil {
			return 0, err
		}
	}
	n := 0
	for d := range genDataDocs {
		s := genData(d)
		n += len(s)
		if err := writeFile(filepath.Join(dir, fmt.Sprintf("d%02d", d), "data.json"), s); err != nil {
			return 0, err
		}
	}
	return n, nil
}

func writeFile(p, content string) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, []byte(content), 0o644)
}

// copyTree copies the regular files under src to dst (the example policy,
// which the latency run edits in a scratch copy, never in place).
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		if d.IsDir() || !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return writeFile(filepath.Join(dst, rel), string(b))
	})
}

func mb(b uint64) string { return fmt.Sprintf("%.1f MB", float64(b)/1e6) }

func ms(d time.Duration) string {
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}
