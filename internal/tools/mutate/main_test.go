package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestHeaderTests(t *testing.T) {
	for _, c := range []struct {
		name, header string
		want         []string
		err          string
	}{
		{"top_level_test", "rule holds (TestX)", []string{"TestX"}, ""},
		{"subtest_path", "F4 hint capped (TestF4_Wait/F4_hint_capped_at_max)", []string{"TestF4_Wait/F4_hint_capped_at_max"}, ""},
		{"several_tests", "D6 resets (TestA/sub, TestB)", []string{"TestA/sub", "TestB"}, ""},
		{"wildcard_element", "P7 (TestP7_Health/*/unhealthy_is_503)", []string{"TestP7_Health/*/unhealthy_is_503"}, ""},
		{"dots_in_subtest", "F6 fixed (TestF6/F6_fixed_0.2x5)", []string{"TestF6/F6_fixed_0.2x5"}, ""},
		{"last_parentheses_count", "a (note) rule (TestX)", []string{"TestX"}, ""},
		{"no_parentheses_is_an_error", "rule holds", nil, "names no test"},
		{"text_after_parentheses_is_an_error", "rule (TestX) holds", nil, "names no test"},
		{"a_note_in_the_list_is_an_error", "rule (TestX/sub, mask 0x20)", nil, `"mask 0x20"`},
		{"empty_parentheses_is_an_error", "rule ()", nil, "not a test name"},
		{"lower_case_name_is_an_error", "rule (testX)", nil, "not a test name"},
		{"space_in_subtest_is_an_error", "rule (TestX/two words)", nil, "not a test name"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := headerTests(c.header)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("headerTests(%q) = %v, %v; want error containing %q", c.header, got, err, c.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, c.want) {
				t.Fatalf("headerTests(%q) = %v, %v; want %v", c.header, got, err, c.want)
			}
		})
	}
}

func TestParse(t *testing.T) {
	if ms, err := parse("m.txt", strings.NewReader("== nil check (TestX)\nfile: a.go\nexpect: panic\n- x\n+ y\n")); err != nil || !ms[0].expectPanic {
		t.Fatalf("expect: panic not read: %+v %v", ms, err)
	}
	list := `# comment

== F4 hint capped (TestF4_Wait/capped, TestF1)
file: fetcher/fetcher.go
pkg: ./fetcher ./updater
run: TestF4_Wait
nth: 2
-	if hint > max {
+	if false {
`
	ms, err := parse("fetcher/mutations.txt", strings.NewReader(list))
	if err != nil {
		t.Fatal(err)
	}
	want := mutation{
		name: "F4 hint capped (TestF4_Wait/capped, TestF1)", file: "fetcher/fetcher.go",
		from: "if hint > max {", to: "if false {", run: "TestF4_Wait",
		tests: []string{"TestF4_Wait/capped", "TestF1"}, pkgs: []string{"./fetcher", "./updater"},
		nth: 2, origin: "fetcher/mutations.txt:3",
	}
	if len(ms) != 1 || !equalMutation(ms[0], want) {
		t.Fatalf("parse = %+v\nwant %+v", ms, want)
	}

	for _, c := range []struct{ name, list, err string }{
		{"header_without_test", "== rule\nfile: a.go\n- x\n+ y\n", "m.txt:1: the header names no test"},
		{"missing_file", "== rule (TestX)\n- x\n+ y\n", "needs file:"},
		{"missing_minus_line", "== rule (TestX)\nfile: a.go\n+ y\n", "needs file:"},
		{"nth_zero", "== rule (TestX)\nfile: a.go\nnth: 0\n- x\n+ y\n", "m.txt:3: bad nth"},
		{"key_before_header", "file: a.go\n", "m.txt:1: expected a '== name' line first"},
		{"unknown_expect", "== rule (TestX)\nfile: a.go\nexpect: failure\n", `unknown expect: "failure"`},
		{"unknown_key", "== rule (TestX)\nfile: a.go\nwhen: always\n", `unknown line "when: always"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := parse("m.txt", strings.NewReader(c.list))
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Fatalf("parse error = %v, want one containing %q", err, c.err)
			}
		})
	}
}

func equalMutation(a, b mutation) bool {
	return a.name == b.name && a.file == b.file && a.from == b.from && a.to == b.to && a.run == b.run &&
		slices.Equal(a.tests, b.tests) && slices.Equal(a.pkgs, b.pkgs) && a.nth == b.nth && a.origin == b.origin
}

func TestApplyNth(t *testing.T) {
	src := "func f() {\n\tx := 1\n\t\tx  :=  1\n\tx := 1\n\ty := 2\n}"
	for _, c := range []struct {
		name     string
		from     string
		nth      int
		wantLine int // the line replaced, -1 for an error
		err      string
	}{
		{"unique_line_without_nth", "y := 2", 0, 4, ""},
		{"white_space_folded", "y   :=   2", 0, 4, ""},
		{"nth_1_is_the_first_of_several", "x := 1", 1, 1, ""},
		{"nth_2_is_the_second", "x := 1", 2, 2, ""},
		{"nth_3_is_the_third", "x := 1", 3, 3, ""},
		{"several_without_nth_is_an_error", "x := 1", 0, -1, "found 3 times"},
		{"nth_past_the_count_is_an_error", "x := 1", 4, -1, "nth: 4, but"},
		{"missing_line_is_an_error", "z := 3", 0, -1, "found 0 times"},
		{"missing_line_with_nth_is_an_error", "z := 3", 1, -1, "found 0 times"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := apply(src, mutation{from: c.from, to: "MUTANT", nth: c.nth})
			if c.wantLine < 0 {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("apply error = %v, want one containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := strings.Split(src, "\n")
			indent := want[c.wantLine][:len(want[c.wantLine])-len(strings.TrimLeft(want[c.wantLine], " \t"))]
			want[c.wantLine] = indent + "MUTANT"
			if got != strings.Join(want, "\n") {
				t.Fatalf("apply =\n%s\nwant\n%s", got, strings.Join(want, "\n"))
			}
		})
	}
}

func TestNames(t *testing.T) {
	for _, c := range []struct {
		patterns []string
		got      string
		want     bool
	}{
		{[]string{"TestX"}, "TestX", true},
		{[]string{"TestX"}, "TestX/sub", false}, // the parent's own fail event counts, not the child's
		{[]string{"TestX/sub"}, "TestX", false},
		{[]string{"TestX/sub"}, "TestX/sub", true},
		{[]string{"TestX/sub"}, "TestX/sub2", false},
		{[]string{"TestX/sub"}, "TestXY/sub", false},
		{[]string{"TestA", "TestX/sub"}, "TestX/sub", true},
		{[]string{"TestX/*/sub"}, "TestX/embedded/sub", true},
		{[]string{"TestX/*/sub"}, "TestX/embedded/other", false},
		{[]string{"TestX/*/sub"}, "TestX/sub", false},
	} {
		if got := names(c.patterns, c.got); got != c.want {
			t.Errorf("names(%v, %q) = %v, want %v", c.patterns, c.got, got, c.want)
		}
	}
}

// Event streams as go test -json writes them (go 1.26), cut to the lines
// the verdict reads.
const (
	evPass = `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestX"}
{"Action":"run","Package":"p","Test":"TestX/a"}
{"Action":"pass","Package":"p","Test":"TestX/a"}
{"Action":"run","Package":"p","Test":"TestX/b"}
{"Action":"pass","Package":"p","Test":"TestX/b"}
{"Action":"pass","Package":"p","Test":"TestX"}
{"Action":"pass","Package":"p"}
`
	evFailA = `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestX"}
{"Action":"run","Package":"p","Test":"TestX/a"}
{"Action":"output","Package":"p","Test":"TestX/a","Output":"    x_test.go:4: got 1, want 2\n"}
{"Action":"output","Package":"p","Test":"TestX/a","Output":"--- FAIL: TestX/a (0.00s)\n"}
{"Action":"fail","Package":"p","Test":"TestX/a"}
{"Action":"run","Package":"p","Test":"TestX/b"}
{"Action":"pass","Package":"p","Test":"TestX/b"}
{"Action":"fail","Package":"p","Test":"TestX"}
{"Action":"output","Package":"p","Output":"FAIL\tp\t0.006s\n"}
{"Action":"fail","Package":"p"}
`
	evPanic = `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestX"}
{"Action":"run","Package":"p","Test":"TestX/a"}
{"Action":"output","Package":"p","Test":"TestX/a","Output":"--- FAIL: TestX/a (0.00s)\n"}
{"Action":"fail","Package":"p","Test":"TestX/a"}
{"Action":"output","Package":"p","Test":"TestX","Output":"panic: assignment to entry in nil map [recovered, repanicked]\n"}
{"Action":"output","Package":"p","Test":"TestX","Output":"goroutine 7 [running]:\n"}
{"Action":"fail","Package":"p","Test":"TestX"}
{"Action":"output","Package":"p","Output":"FAIL\tp\t0.006s\n"}
{"Action":"fail","Package":"p"}
`
	evTimeout = `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestX"}
{"Action":"run","Package":"p","Test":"TestX/a"}
{"Action":"output","Package":"p","Test":"TestX/a","Output":"panic: test timed out after 3m0s\n"}
{"Action":"output","Package":"p","Test":"TestX/a","Output":"\trunning tests:\n"}
{"Action":"output","Package":"p","Test":"TestX/a","Output":"\t\tTestX/a (3m0s)\n"}
{"Action":"output","Package":"p","Output":"FAIL\tp\t180.009s\n"}
{"Action":"fail","Package":"p"}
`
	// A synctest bubble: the subtest's assertion fails, its test ends with
	// goroutines still blocked, and synctest panics afterwards.
	evBubbleAfterAssert = `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestX"}
{"Action":"run","Package":"p","Test":"TestX/a"}
{"Action":"output","Package":"p","Test":"TestX/a","Output":"    client_test.go:233: answer\n"}
{"Action":"output","Package":"p","Test":"TestX/a","Output":"--- FAIL: TestX/a (0.00s)\n"}
{"Action":"fail","Package":"p","Test":"TestX/a"}
{"Action":"output","Package":"p","Test":"TestX","Output":"--- FAIL: TestX (0.12s)\n"}
{"Action":"output","Package":"p","Test":"TestX","Output":"panic: deadlock: main bubble goroutine has exited but blocked goroutines remain [recovered, repanicked]\n"}
{"Action":"fail","Package":"p","Test":"TestX"}
{"Action":"fail","Package":"p"}
`
	// A bubble that deadlocks: no assertion, synctest panics.
	evDeadlock = `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestX"}
{"Action":"output","Package":"p","Test":"TestX","Output":"--- FAIL: TestX (0.00s)\n"}
{"Action":"fail","Package":"p","Test":"TestX"}
{"Action":"output","Package":"p","Test":"TestX","Output":"panic: deadlock: all goroutines in bubble are blocked [recovered, repanicked]\n"}
{"Action":"fail","Package":"p"}
`
	evBuild = `{"ImportPath":"p [p.test]","Action":"build-output","Output":"./b.go:2:12: undefined: undefined\n"}
{"ImportPath":"p [p.test]","Action":"build-fail"}
{"Action":"start","Package":"p"}
{"Action":"output","Package":"p","Output":"FAIL\tp [build failed]\n"}
{"Action":"fail","Package":"p","FailedBuild":"p [p.test]"}
`
	evNoTest = `go: ./nowhere: directory not found
`
)

func TestVerdict(t *testing.T) {
	for _, c := range []struct {
		name   string
		tests  []string
		events string
		passed bool
		status string
		by     []string
		detail string
	}{
		{"named_subtest_fails_is_a_kill", []string{"TestX/a"}, evFailA, false, killed, []string{"TestX/a"}, ""},
		{"named_parent_fails_is_a_kill_by_the_subtest", []string{"TestX"}, evFailA, false, killed, []string{"TestX"}, ""},
		{"one_of_several_named_fails", []string{"TestY", "TestX/a"}, evFailA, false, killed, []string{"TestX/a"}, ""},
		{"wildcard_names_the_failing_subtest", []string{"TestX/*"}, evFailA, false, killed, []string{"TestX/a"}, ""},
		{"another_subtest_failing_is_no_kill", []string{"TestX/b"}, evFailA, false, wrongTest, []string{"TestX/a"}, "failed: TestX/a; the header names TestX/b"},
		{"all_passing_survives", []string{"TestX/a"}, evPass, true, survived, nil, ""},
		{"a_named_test_that_never_ran_is_invalid", []string{"TestX/c"}, evPass, true, invalid, nil, "no test named in the header ran: TestX/c"},
		{"a_panic_is_no_kill", []string{"TestX/a"}, evPanic, false, panicked, nil, "in TestX: panic: assignment to entry in nil map"},
		{"an_assertion_before_a_bubble_panic_is_a_kill", []string{"TestX/a"}, evBubbleAfterAssert, false, killed, []string{"TestX/a"}, ""},
		{"a_bubble_deadlock_is_no_kill", []string{"TestX"}, evDeadlock, false, panicked, nil, "deadlock: all goroutines in bubble are blocked"},
		{"a_failure_elsewhere_is_reported_with_its_message", []string{"TestX/b"}, evFailA, false, wrongTest, []string{"TestX/a"}, "x_test.go:4: got 1, want 2"},
		{"a_crash_before_the_named_test_is_a_panic", []string{"TestX/c"}, evPanic, false, panicked, nil, "in TestX: panic"},
		{"an_expected_panic_in_a_named_test_is_a_kill", []string{"TestX"}, evPanic, false, killed, []string{"TestX"}, "panicked as the header expects"},
		{"an_expected_panic_elsewhere_is_a_panic", []string{"TestY"}, evPanic + `{"Action":"run","Package":"p","Test":"TestY"}` + "\n", false, panicked, nil, "in TestX"},
		{"an_expected_panic_that_is_a_timeout_is_a_timeout", []string{"TestX/a"}, evTimeout, false, timedOut, nil, "timed out"},
		{"a_timeout_is_no_kill", []string{"TestX/a"}, evTimeout, false, timedOut, nil, "panic: test timed out after 3m0s"},
		{"a_build_failure_is_invalid", []string{"TestX"}, evBuild, false, invalid, nil, "undefined: undefined"},
		{"a_go_command_error_is_invalid", []string{"TestX"}, evNoTest, false, invalid, nil, "directory not found"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := verdict(mutation{tests: c.tests, expectPanic: strings.Contains(c.name, "expected_panic")}, []byte(c.events), c.passed)
			if r.status != c.status || !slices.Equal(r.by, c.by) || !strings.Contains(r.detail, c.detail) {
				t.Fatalf("verdict = %s by %v (%q), want %s by %v (detail containing %q)", r.status, r.by, r.detail, c.status, c.by, c.detail)
			}
		})
	}
}

func TestTestArgs(t *testing.T) {
	m := mutation{file: "fetcher/fetcher.go", tests: []string{"TestF4_Wait/a.b", "TestF4_Wait/c", "TestF1"}}
	got := strings.Join(testArgs(m, "/tmp/o.json", time.Minute), " ")
	for _, want := range []string{" -json ", " -overlay=/tmp/o.json ", " -timeout=1m0s ", ` -run ^(TestF4_Wait|TestF1)$ ./fetcher`} {
		if !strings.Contains(got, want) {
			t.Errorf("testArgs = %q, want it to contain %q", got, want)
		}
	}
	m.run, m.pkgs = "TestF4_", []string{"./a", "./b"}
	if got := strings.Join(testArgs(m, "o", time.Minute), " "); !strings.HasSuffix(got, " -run TestF4_ ./a ./b") {
		t.Errorf("testArgs with run: and pkg: = %q", got)
	}
}
