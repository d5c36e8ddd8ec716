package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"

	"github.com/tether-run/tether/adapters/logging"
)

// Exit codes of the orchestrator binary.
const (
	exitOK      = 0
	exitError   = 1 // something went wrong: unreachable orchestrator, I/O, a store that cannot open
	exitUsage   = 2 // bad flags or arguments, a bad config file, no admin token
	exitRefused = 3 // the orchestrator refused the request (HTTP 4xx: bad admin token, invalid workflow, unknown id, wrong state)
	exitUnsound = 4 // store check found a problem: the store is unsound
)

const exitCodesHelp = `Exit codes:
  0  success
  1  error (the orchestrator cannot be reached, I/O, the store cannot be opened)
  2  usage (bad flags or arguments, a bad config file, no admin token found)
  3  refused by the orchestrator (wrong admin token, invalid workflow, unknown
     run/step/token, a request the current state does not allow)
  4  unsound store (store check found a problem)`

// exitErr carries an exit code with its error.
type exitErr struct {
	code int
	err  error
}

func (e *exitErr) Error() string { return e.err.Error() }
func (e *exitErr) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return &exitErr{code: exitUsage, err: fmt.Errorf(format, args...)}
}

func refusedErrorf(format string, args ...any) error {
	return &exitErr{code: exitRefused, err: fmt.Errorf(format, args...)}
}

// exitCode maps an error to the process's exit code.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var e *exitErr
	if errors.As(err, &e) {
		return e.code
	}
	return exitError
}

// parseInterspersed parses flags that may come before, between or after the
// positional arguments ("run logs RUN --step build"), which the flag package
// alone does not do. Everything after "--" is positional.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if i := len(args) - len(rest); i > 0 && args[i-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// printFlags lists a flag set GNU-style ("--name VALUE  usage (default …)").
func printFlags(w io.Writer, fs *flag.FlagSet) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fs.VisitAll(func(f *flag.Flag) {
		arg, usage := flag.UnquoteUsage(f)
		name := "--" + f.Name
		if arg != "" {
			name += " " + strings.ToUpper(arg)
		}
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "0s" {
			usage += " (default " + f.DefValue + ")"
		}
		fmt.Fprintf(tw, "  %s\t%s\n", name, usage)
	})
	tw.Flush()
}

// newLogger returns the structured logger on stderr (adapters/logging); a
// bad flag is a usage error.
func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	log, err := logging.New(w, format, level)
	if err != nil {
		return nil, usageErrorf("%v", err)
	}
	return log, nil
}
