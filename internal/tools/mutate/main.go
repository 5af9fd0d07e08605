// Command mutate proves the test suite guards the behaviour contract: it
// applies single-line mutations, one at a time, and fails unless the tests of
// the mutated package catch every one.
//
// Mutations live in files named mutations.txt anywhere in the repository:
//
//	# comments and blank lines are ignored
//	== F4 hint is capped (TestWait/F4_hint_capped_at_max)
//	file: fetcher/wait.go
//	-	if hint > max {
//	+	if hint > max+time.Hour {
//
// The "-" line must equal exactly one line of the file, white space folded
// (add "nth: K" to pick the K-th of several equal lines). Optional keys:
// "pkg: ./a ./b" (packages to test; default the file's own) and "run: Regex"
// (passed to go test -run). The tree is never modified: each mutant is built
// through go's -overlay, so mutants can run in parallel and an interrupted run
// leaves nothing behind. A mutant that does not compile is an error in the
// list, not a kill.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

type mutation struct {
	name, file, from, to, run string
	pkgs                      []string
	nth                       int
	origin                    string // where it was declared
}

type result struct {
	m      mutation
	status string // killed, SURVIVED, INVALID
	detail string
	took   time.Duration
}

func main() {
	jobs := flag.Int("j", runtime.NumCPU(), "mutants tested at once")
	filter := flag.String("filter", "", "only mutations whose name or file contains this")
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
	var sel []mutation
	for _, m := range muts {
		if *filter == "" || strings.Contains(m.name, *filter) || strings.Contains(m.file, *filter) {
			sel = append(sel, m)
		}
	}
	if *list {
		for _, m := range sel {
			fmt.Printf("%-60s %s\n", m.name, m.file)
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
	sem := make(chan struct{}, max(1, *jobs))
	for i, m := range sel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			results[i] = try(root, filepath.Join(tmp, strconv.Itoa(i)), m, *timeout)
			r := results[i]
			fmt.Printf("%-8s %5.1fs  %s  (%s)\n", r.status, r.took.Seconds(), r.m.name, r.m.file)
		}()
	}
	wg.Wait()

	bad := 0
	for _, r := range results {
		if r.status != "killed" {
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
		return fail("INVALID", err.Error())
	}
	lines := strings.Split(string(src), "\n")
	seen := 0
	idx := -1
	for i, l := range lines {
		if squash(l) == squash(m.from) {
			seen++
			if seen == m.nth {
				idx = i
			}
		}
	}
	if idx < 0 || (m.nth == 1 && seen != 1) {
		return fail("INVALID", fmt.Sprintf("line %q found %d times in %s (want exactly one, or set nth)", m.from, seen, m.file))
	}
	indent := lines[idx][:len(lines[idx])-len(strings.TrimLeft(lines[idx], " \t"))]
	lines[idx] = indent + m.to
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fail("INVALID", err.Error())
	}
	mutant := filepath.Join(dir, filepath.Base(m.file))
	if err := os.WriteFile(mutant, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		return fail("INVALID", err.Error())
	}
	overlay, _ := json.Marshal(map[string]map[string]string{"Replace": {abs: mutant}})
	ovPath := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(ovPath, overlay, 0o644); err != nil {
		return fail("INVALID", err.Error())
	}
	pkgs := m.pkgs
	if len(pkgs) == 0 {
		pkgs = []string{"./" + filepath.Dir(m.file)}
	}
	// -vet=off and a stripped link: the tree is vetted elsewhere, and linking
	// big test binaries (OPA) dominates the cost of a mutant.
	args := []string{"test", "-count=1", "-vet=off", "-ldflags=-s -w", "-overlay=" + ovPath, "-timeout=" + timeout.String()}
	if m.run != "" {
		args = append(args, "-run", m.run)
	}
	args = append(args, pkgs...)
	ctx, cancel := context.WithTimeout(context.Background(), timeout+time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	res.took = time.Since(t0)
	switch {
	case bytes.Contains(out, []byte("[build failed]")) || bytes.Contains(out, []byte("[setup failed]")):
		return fail("INVALID", "mutant does not compile:\n"+tail(out))
	case err == nil:
		return fail("SURVIVED", "go "+strings.Join(args, " ")+" passed")
	}
	res.status = "killed"
	return res
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
		ms, err := parse(root, p)
		all = append(all, ms...)
		return err
	})
	return all, err
}

func parse(root, path string) ([]mutation, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rel, _ := filepath.Rel(root, path)
	var out []mutation
	var cur *mutation
	flush := func() error {
		if cur == nil {
			return nil
		}
		if cur.file == "" || cur.from == "" {
			return fmt.Errorf("%s: mutation %q needs file: and a - line", rel, cur.name)
		}
		out = append(out, *cur)
		cur = nil
		return nil
	}
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		t := strings.TrimSpace(line)
		switch {
		case t == "" || strings.HasPrefix(t, "#"):
		case strings.HasPrefix(t, "=="):
			if err := flush(); err != nil {
				return nil, err
			}
			cur = &mutation{name: strings.TrimSpace(t[2:]), nth: 1, origin: fmt.Sprintf("%s:%d", rel, n)}
		case cur == nil:
			return nil, fmt.Errorf("%s:%d: expected a '== name' line first", rel, n)
		case strings.HasPrefix(t, "file:"):
			cur.file = strings.TrimSpace(t[5:])
		case strings.HasPrefix(t, "pkg:"):
			cur.pkgs = strings.Fields(t[4:])
		case strings.HasPrefix(t, "run:"):
			cur.run = strings.TrimSpace(t[4:])
		case strings.HasPrefix(t, "nth:"):
			cur.nth, err = strconv.Atoi(strings.TrimSpace(t[4:]))
			if err != nil || cur.nth < 1 {
				return nil, fmt.Errorf("%s:%d: bad nth", rel, n)
			}
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
