// Command mutate proves the test suite guards the behaviour contract: it
// applies single-line mutations, one at a time, and fails unless, for every
// one, a test the mutation names fails.
//
// Mutations live in files named mutations.txt anywhere in the repository:
//
//	# comments and blank lines are ignored
//	== F4 hint is capped (TestWait/F4_hint_capped_at_max)
//	file: fetcher/wait.go
//	-	if hint > max {
//	+	if hint > max+time.Hour {
//
// The header ends with the guards in parentheses: one or more test names,
// separated by commas, each a top-level test ("TestWait") or a subtest path
// ("TestWait/F4_hint_capped_at_max", spelled the way go test prints it:
// spaces as underscores); a path element "*" matches any one subtest name. A
// header that names no test is an error in the list. A mutant is killed only
// when one of the tests it names fails on an assertion (it printed a failure
// before any crash); a failure elsewhere is reported as WRONG-TEST, a test
// binary that panics (a synctest deadlock included) as PANIC and one that
// hits the time limit as TIMEOUT, none of them a kill. The report names, for
// every kill, the test that caught it.
//
// A guard that keeps the code from crashing (a nil check) declares
// "expect: panic": its mutant is killed when the test binary panics inside
// a named test, and the report says so.
//
// The "-" line must equal exactly one line of the file, white space folded;
// "nth: K" picks the K-th of several equal lines (K from 1). Optional keys:
// "pkg: ./a ./b" (packages to test; default the file's own) and "run: Regex"
// (passed to go test -run; by default only the top-level tests the header
// names run). The tree is never modified: each mutant is built through go's
// -overlay, so mutants can run in parallel and an interrupted run leaves
// nothing behind. A mutant that does not compile is an error in the list, not
// a kill.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

type mutation struct {
	name, file, from, to, run string
	tests                     []string // the guards the header names: TestX, TestX/sub, TestX/*/sub
	pkgs                      []string
	nth                       int    // 0: the line must be unique; K: its K-th occurrence
	expectPanic               bool   // "expect: panic": the guard prevents a crash
	origin                    string // where it was declared
}

// Verdicts. Only killed counts as caught.
const (
	killed    = "killed"
	survived  = "SURVIVED"
	wrongTest = "WRONG-TEST"
	panicked  = "PANIC"
	timedOut  = "TIMEOUT"
	invalid   = "INVALID"
)

type result struct {
	m      mutation
	status string
	by     []string // the named tests that failed (killed), or the tests that did (WRONG-TEST)
	detail string
	took   time.Duration
}

func main() {
	jobs := flag.Int("j", runtime.NumCPU(), "mutants tested at once")
	filter := flag.String("filter", "", "only mutations whose name or file contains this")
	match := flag.String("match", "", "only mutations whose name or file matches this regular expression")
	timeout := flag.Duration("timeout", 3*time.Minute, "limit for one mutant's tests")
	list := flag.Bool("list", false, "list the mutations and exit")
	flag.Parse()

	root, err := os.Getwd()
	if err != nil {
		fatal(err)
	}
	muts, err := load(root)
	if err != nil {
		fatal(err)
	}
	re, err := regexp.Compile(*match)
	if err != nil {
		fatal(err)
	}
	var sel []mutation
	for _, m := range muts {
		if (*filter == "" || strings.Contains(m.name, *filter) || strings.Contains(m.file, *filter)) && (re.MatchString(m.name) || re.MatchString(m.file)) {
			sel = append(sel, m)
		}
	}
	if *list {
		for _, m := range sel {
			fmt.Printf("%-60s %s %s\n", m.name, m.file, strings.Join(m.tests, ","))
		}
		return
	}
	if len(sel) == 0 {
		fatal(fmt.Errorf("no mutations found"))
	}
	tmp, err := os.MkdirTemp("", "mutate")
	if err != nil {
		fatal(err)
	}
	defer os.RemoveAll(tmp)

	start := time.Now()
	results := make([]result, len(sel))
	var wg sync.WaitGroup
	var out sync.Mutex
	sem := make(chan struct{}, max(1, *jobs))
	for i, m := range sel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			r := try(root, filepath.Join(tmp, strconv.Itoa(i)), m, *timeout)
			results[i] = r
			out.Lock()
			defer out.Unlock()
			by := ""
			if len(r.by) > 0 {
				by = " by " + strings.Join(r.by, ", ")
			}
			fmt.Printf("%-10s %5.1fs  %s  (%s)%s\n", r.status, r.took.Seconds(), r.m.name, r.m.file, by)
		}()
	}
	wg.Wait()

	bad := 0
	for _, r := range results {
		if r.status != killed {
			bad++
			fmt.Printf("\n%s: %s\n  declared in %s\n  %s\n", r.status, r.m.name, r.m.origin, r.detail)
		}
	}
	fmt.Printf("\nmutate: %d mutations, %d killed, %d not, in %s\n", len(results), len(results)-bad, bad, time.Since(start).Round(time.Second))
	if bad > 0 {
		os.Exit(1)
	}
}

func try(root, dir string, m mutation, timeout time.Duration) result {
	t0 := time.Now()
	res := result{m: m}
	fail := func(status, detail string) result {
		res.status, res.detail, res.took = status, detail, time.Since(t0)
		return res
	}
	abs := filepath.Join(root, m.file)
	src, err := os.ReadFile(abs)
	if err != nil {
		return fail(invalid, err.Error())
	}
	mutated, err := apply(string(src), m)
	if err != nil {
		return fail(invalid, fmt.Sprintf("%s: %v", m.file, err))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fail(invalid, err.Error())
	}
	mutant := filepath.Join(dir, filepath.Base(m.file))
	if err := os.WriteFile(mutant, []byte(mutated), 0o644); err != nil {
		return fail(invalid, err.Error())
	}
	overlay, _ := json.Marshal(map[string]map[string]string{"Replace": {abs: mutant}})
	ovPath := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(ovPath, overlay, 0o644); err != nil {
		return fail(invalid, err.Error())
	}
	args := testArgs(m, ovPath, timeout)
	// The go command's own limit sits a minute above the test binary's, so
	// the binary reports its timeout (with the running tests) first.
	ctx, cancel := context.WithTimeout(context.Background(), timeout+time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	r := verdict(m, out, err == nil)
	if ctx.Err() != nil {
		r = result{status: timedOut, detail: fmt.Sprintf("go test did not end within %s", timeout+time.Minute)}
	}
	if r.status == survived {
		r.detail = "go " + strings.Join(args, " ") + " passed"
	}
	r.m, r.took = m, time.Since(t0)
	return r
}

// testArgs is the go test command line for one mutant. -vet=off and a
// stripped link: the tree is vetted elsewhere, and linking big test binaries
// (OPA) dominates the cost of a mutant. Without a run: key only the named
// top-level tests run: the verdict reads nothing else.
func testArgs(m mutation, overlay string, timeout time.Duration) []string {
	args := []string{"test", "-json", "-count=1", "-vet=off", "-ldflags=-s -w", "-overlay=" + overlay, "-timeout=" + timeout.String()}
	run := m.run
	if run == "" {
		run = runPattern(m.tests)
	}
	args = append(args, "-run", run)
	pkgs := m.pkgs
	if len(pkgs) == 0 {
		pkgs = []string{"./" + filepath.Dir(m.file)}
	}
	return append(args, pkgs...)
}

// runPattern selects the top-level tests of the named guards. Subtests are
// not narrowed: a subtest may depend on the ones before it.
func runPattern(tests []string) string {
	var tops []string
	for _, t := range tests {
		top, _, _ := strings.Cut(t, "/")
		if q := regexp.QuoteMeta(top); !slices.Contains(tops, q) {
			tops = append(tops, q)
		}
	}
	return "^(" + strings.Join(tops, "|") + ")$"
}

// apply replaces the mutation's line in src, keeping its indentation.
func apply(src string, m mutation) (string, error) {
	lines := strings.Split(src, "\n")
	var at []int
	for i, l := range lines {
		if squash(l) == squash(m.from) {
			at = append(at, i)
		}
	}
	var idx int
	switch {
	case m.nth == 0 && len(at) == 1:
		idx = at[0]
	case m.nth == 0:
		return "", fmt.Errorf("line %q found %d times (want exactly one, or set nth)", m.from, len(at))
	case m.nth > len(at):
		return "", fmt.Errorf("nth: %d, but line %q found %d times", m.nth, m.from, len(at))
	default:
		idx = at[m.nth-1]
	}
	indent := lines[idx][:len(lines[idx])-len(strings.TrimLeft(lines[idx], " \t"))]
	lines[idx] = indent + m.to
	return strings.Join(lines, "\n"), nil
}

// testEvent is the part of a go test -json event the verdict reads.
type testEvent struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// assertion is a line t.Error, t.Fatal (or t.Log) prints: indented
// "file.go:12: ...".
var assertion = regexp.MustCompile(`^\s{4,}\S+\.go:\d+: `)

// verdict reads the go test -json stream of one mutant. passed is whether
// the go command exited zero.
//
// A named test kills the mutant when it fails and it, or one of its
// subtests, printed a failure before the test binary crashed: an assertion
// caught the mutant. A test that fails only because the binary panicked or
// hit the time limit (testing marks every running test failed) is PANIC or
// TIMEOUT. A synctest bubble that deadlocks panics, so it is a PANIC too;
// one that panics because its test ended on a failed assertion with
// goroutines left blocked comes after that assertion, which counts.
func verdict(m mutation, out []byte, passed bool) result {
	var (
		ran, failed []string
		asserted    = map[string]bool{} // tests that printed a line before any crash
		crashAt     string              // the test running when the binary crashed
		crash       string              // the panic line
		timeout     bool
		raw         bytes.Buffer // lines that are not events: go command errors
		build       bytes.Buffer
		buildFailed bool
		lines       = map[string][]string{} // output per test, for the report
	)
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		var e testEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			raw.Write(sc.Bytes())
			raw.WriteByte('\n')
			continue
		}
		switch {
		case e.Action == "build-output":
			build.WriteString(e.Output)
		case e.Action == "build-fail":
			buildFailed = true
		case e.Action == "run":
			ran = append(ran, e.Test)
		case e.Action == "fail" && e.Test != "":
			failed = append(failed, e.Test)
		case e.Action == "output":
			if strings.Contains(e.Output, "[build failed]") || strings.Contains(e.Output, "[setup failed]") {
				buildFailed = true
			}
			switch {
			case crash != "":
			case strings.HasPrefix(e.Output, "panic: "):
				crash, crashAt = strings.TrimSpace(e.Output), e.Test
				timeout = strings.HasPrefix(e.Output, "panic: test timed out after")
				if crashAt == "" {
					crashAt = e.Package
				}
			case e.Test != "" && assertion.MatchString(e.Output):
				asserted[e.Test] = true
				if len(lines[e.Test]) < 20 {
					lines[e.Test] = append(lines[e.Test], strings.TrimRight(e.Output, "\n"))
				}
			}
		}
	}
	// caught: the test, or a subtest of it, printed a failure before the crash.
	caught := func(test string) bool {
		for t := range asserted {
			if t == test || strings.HasPrefix(t, test+"/") {
				return true
			}
		}
		return false
	}
	res := result{m: m}
	var by, others []string
	for _, f := range failed {
		switch {
		case !caught(f):
		case names(m.tests, f):
			by = append(by, f)
		default:
			others = append(others, f)
		}
	}
	ranNamed := slices.ContainsFunc(ran, func(r string) bool { return names(m.tests, r) })
	switch {
	case buildFailed || (!passed && len(ran) == 0 && crash == ""):
		res.status, res.detail = invalid, "mutant does not build or the tests cannot start:\n"+tail(append(build.Bytes(), raw.Bytes()...))
	case len(by) > 0:
		res.status, res.by = killed, deepest(by)
	case m.expectPanic && crash != "" && !timeout && within(m.tests, crashAt):
		res.status, res.by, res.detail = killed, []string{crashAt}, "panicked as the header expects: "+crash
	case timeout:
		res.status, res.detail = timedOut, crash+" in "+crashAt
	case crash != "":
		res.status, res.detail = panicked, "in "+crashAt+": "+crash
	case !ranNamed:
		res.status, res.detail = invalid, fmt.Sprintf("no test named in the header ran: %s (misspelled, renamed, or excluded by run:)", strings.Join(m.tests, ", "))
	case len(others) > 0:
		res.status, res.by = wrongTest, deepest(others)
		res.detail = fmt.Sprintf("failed: %s; the header names %s", strings.Join(res.by, ", "), strings.Join(m.tests, ", "))
		for _, t := range res.by {
			res.detail += "\n  " + strings.Join(lines[t], "\n  ")
		}
	case !passed:
		res.status, res.detail = wrongTest, "the package failed with no test failing:\n"+tail(raw.Bytes())
	default:
		res.status = survived
	}
	return res
}

// names reports whether one of the header's patterns is the test path got.
func names(patterns []string, got string) bool {
	g := strings.Split(got, "/")
	for _, p := range patterns {
		ps := strings.Split(p, "/")
		if len(ps) != len(g) {
			continue
		}
		match := true
		for i := range ps {
			match = match && (ps[i] == "*" || ps[i] == g[i])
		}
		if match {
			return true
		}
	}
	return false
}

// within reports whether test is a named test or runs inside one.
func within(patterns []string, test string) bool {
	for t := test; t != ""; {
		if names(patterns, t) {
			return true
		}
		i := strings.LastIndex(t, "/")
		if i < 0 {
			break
		}
		t = t[:i]
	}
	return false
}

// deepest drops the tests that failed only because a subtest in the list
// did: the report names the guard, not its parents.
func deepest(tests []string) []string {
	var out []string
	for _, t := range tests {
		if !slices.ContainsFunc(tests, func(o string) bool { return strings.HasPrefix(o, t+"/") }) && !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// squash folds runs of white space, so gofmt re-aligning a block does not
// break the lists.
func squash(s string) string { return strings.Join(strings.Fields(s), " ") }

func tail(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 1500 {
		s = "..." + s[len(s)-1500:]
	}
	return s
}

func load(root string) ([]mutation, error) {
	var all []mutation
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || d.Name() != "mutations.txt" {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		rel, _ := filepath.Rel(root, p)
		ms, err := parse(rel, f)
		all = append(all, ms...)
		return err
	})
	return all, err
}

// testName is one guard: a top-level test, then subtest names as go test
// prints them (no spaces), "*" for any one.
var testName = regexp.MustCompile(`^(Test|Fuzz|Example)[\p{L}\p{N}_]*(/[^/\s,()]+)*$`)

// headerTests reads the guards from a header: the comma-separated list in
// the parentheses that end it.
func headerTests(name string) ([]string, error) {
	open := strings.LastIndex(name, "(")
	if !strings.HasSuffix(name, ")") || open < 0 {
		return nil, errors.New("the header names no test: end it with the guards in parentheses, e.g. (TestX/sub)")
	}
	var tests []string
	for _, t := range strings.Split(name[open+1:len(name)-1], ",") {
		t = strings.TrimSpace(t)
		if !testName.MatchString(t) {
			return nil, fmt.Errorf("%q in the header's parentheses is not a test name (TestX, TestX/sub, TestX/*/sub)", t)
		}
		tests = append(tests, t)
	}
	return tests, nil
}

func parse(rel string, r io.Reader) ([]mutation, error) {
	var out []mutation
	var cur *mutation
	flush := func() error {
		if cur == nil {
			return nil
		}
		if cur.file == "" || cur.from == "" {
			return fmt.Errorf("%s: mutation %q needs file: and a - line", cur.origin, cur.name)
		}
		out = append(out, *cur)
		cur = nil
		return nil
	}
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		t := strings.TrimSpace(sc.Text())
		switch {
		case t == "" || strings.HasPrefix(t, "#"):
		case strings.HasPrefix(t, "=="):
			if err := flush(); err != nil {
				return nil, err
			}
			cur = &mutation{name: strings.TrimSpace(t[2:]), origin: fmt.Sprintf("%s:%d", rel, n)}
			tests, err := headerTests(cur.name)
			if err != nil {
				return nil, fmt.Errorf("%s: %v", cur.origin, err)
			}
			cur.tests = tests
		case cur == nil:
			return nil, fmt.Errorf("%s:%d: expected a '== name' line first", rel, n)
		case strings.HasPrefix(t, "file:"):
			cur.file = strings.TrimSpace(t[5:])
		case strings.HasPrefix(t, "pkg:"):
			cur.pkgs = strings.Fields(t[4:])
		case strings.HasPrefix(t, "run:"):
			cur.run = strings.TrimSpace(t[4:])
		case strings.HasPrefix(t, "expect:"):
			if v := strings.TrimSpace(t[7:]); v != "panic" {
				return nil, fmt.Errorf("%s:%d: unknown expect: %q (only \"panic\")", rel, n, v)
			}
			cur.expectPanic = true
		case strings.HasPrefix(t, "nth:"):
			k, err := strconv.Atoi(strings.TrimSpace(t[4:]))
			if err != nil || k < 1 {
				return nil, fmt.Errorf("%s:%d: bad nth (want a number from 1)", rel, n)
			}
			cur.nth = k
		case strings.HasPrefix(t, "-"):
			cur.from = strings.TrimSpace(t[1:])
		case strings.HasPrefix(t, "+"):
			cur.to = strings.TrimSpace(t[1:])
		default:
			return nil, fmt.Errorf("%s:%d: unknown line %q", rel, n, t)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "mutate:", err)
	os.Exit(2)
}
