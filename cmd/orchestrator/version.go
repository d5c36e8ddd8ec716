package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"

	flag "github.com/spf13/pflag"
)

// versionInfo is what 'orchestrator version' prints (-o json: these
// fields).
type versionInfo struct {
	Module   string `json:"module"`
	Version  string `json:"version"`            // the module's version, "(devel)" when built from a checkout
	Commit   string `json:"commit,omitempty"`   // the VCS revision, when the build recorded it
	Time     string `json:"time,omitempty"`     // the revision's commit time
	Modified bool   `json:"modified,omitempty"` // the work tree had uncommitted changes
	Go       string `json:"go"`
}

// buildInfo reads the binary's build information (runtime/debug).
func buildInfo() versionInfo {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return versionInfo{Version: "unknown", Go: runtime.Version()}
	}
	return versionOf(bi)
}

// versionOf reads the fields of a build's information.
func versionOf(bi *debug.BuildInfo) versionInfo {
	var v versionInfo
	v.Module, v.Version, v.Go = bi.Main.Path, bi.Main.Version, bi.GoVersion
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Commit = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

var versionCmd = &command{
	path: "version", nargs: 0,
	short: "print the version, VCS commit and Go version of this binary",
	long: `Print this binary's module version, the VCS commit it was built from (with
"dirty" when the work tree had uncommitted changes) and the Go version that
built it. A binary built without VCS information (go build -buildvcs=false,
or outside a checkout) shows no commit.`,
	example: "  orchestrator version\n  orchestrator version -o json",
	flags: func(fs *flag.FlagSet, o *options) {
		outputFlags(fs, o)
	},
	run: func(_ context.Context, e *env, _ []string) error {
		v := buildInfo()
		return e.print(v, func() error {
			commit := v.Commit
			if commit == "" {
				commit = "unknown (built without VCS information)"
			} else if v.Modified {
				commit += " (dirty)"
			}
			if v.Time != "" {
				commit += ", " + v.Time
			}
			fmt.Fprintf(e.stdout, "orchestrator %s\n  module  %s\n  commit  %s\n  go      %s\n", v.Version, v.Module, commit, v.Go)
			return nil
		})
	},
}
