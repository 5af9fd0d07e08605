package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
)

// version is set at link time: go build -ldflags "-X main.version=v1.2.3".
// Empty means: ask the build info.
var version string

// buildVersion is version, else the module version the go command stamped
// (a tag or pseudo-version), else the VCS revision, else "dev".
func buildVersion() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev == "" {
		return "dev"
	}
	return rev + dirty
}

// runVersion is `opal-client version`.
func runVersion(_ context.Context, e cmdEnv) int {
	fmt.Fprintf(e.stdout, "opal-client %s %s\n", buildVersion(), runtime.Version())
	return exitOK
}
