package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/tether-run/tether/adapters/logging"
)

// Exit codes of the orchestrator binary.
const (
	exitOK      = 0
	exitError   = 1 // something went wrong: unreachable orchestrator, I/O, a store that cannot open
	exitUsage   = 2 // bad flags or arguments, a bad config file, no admin token
	exitRefused = 3 // the orchestrator refused the request (HTTP 4xx: bad admin token, invalid workflow, unknown id, wrong state)
	exitUnsound = 4 // store check found a problem: the store is unsound
	// exitDeposed (75, serveha.go): serve stopped leading a PostgreSQL store.

	// A run's outcome, with run show --exit-status, run watch and run
	// submit --wait (a run that succeeded exits 0).
	exitRunFailed     = 10
	exitRunCancelled  = 11
	exitRunUnfinished = 12 // run show --exit-status: the run has not ended yet
)

const exitCodesHelp = `Exit codes:
  0  success (with run show --exit-status, run watch, run logs --follow,
     run submit --wait, run rerun --wait: the run succeeded)
  1  error (the orchestrator cannot be reached, I/O, the store cannot be opened)
  2  usage (bad flags or arguments, a bad config file, no admin token found)
  3  refused by the orchestrator (wrong admin token, invalid workflow, unknown
     run/step/token, a request the current state does not allow)
  4  unsound store (store check found a problem)
  10 the run failed      (run show --exit-status, run watch, run logs --follow,
                         run submit --wait, run rerun --wait)
  11 the run was cancelled                     (the same commands)
  12 the run has not ended yet                 (run show --exit-status)
  75 serve stopped leading a PostgreSQL store: another orchestrator took the
     lead, or a commit's outcome is unknown; restart it (it comes back as a
     standby, SPEC §11)`

// exitErr carries an exit code with its error; an empty error prints
// nothing (the command has said what it had to).
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

// ranErr marks an error a command's own code returned; any other error out
// of cobra is a usage error of its parsing (unknown command or flag, a bad
// flag value), exit 2.
type ranErr struct{ err error }

func (e *ranErr) Error() string { return e.err.Error() }
func (e *ranErr) Unwrap() error { return e.err }

// run runs the command line and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	o := &options{}
	root := newRoot(o, stdout, stderr, getenv)
	root.SetArgs(args)
	c, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	var re *ranErr
	if !errors.As(err, &re) {
		err = &exitErr{code: exitUsage, err: err}
	}
	code := exitCode(err)
	if msg := err.Error(); msg != "" {
		fmt.Fprintf(stderr, "%s: %s\n", c.CommandPath(), msg)
	}
	switch {
	case code != exitUsage || c.HasSubCommands() && c.HasParent():
		// a group has listed its commands
	case !c.HasParent():
		fmt.Fprintf(stderr, "Run 'orchestrator --help' for the commands.\n")
	case re == nil: // cobra's: a flag, the arguments
		fmt.Fprintf(stderr, "Usage: %s   (%s --help for more)\n", c.UseLine(), c.CommandPath())
	}
	return code
}

// newRoot builds the cobra command tree from the command table: a group
// command for each first word ("run", "token", …), a leaf for each command.
func newRoot(o *options, stdout, stderr io.Writer, getenv func(string) string) *cobra.Command {
	root := &cobra.Command{
		Use:           "orchestrator",
		Short:         "Tether's orchestrator, and the operator's client for it",
		SilenceErrors: true,
		SilenceUsage:  true,
		// No arguments: the help, on stderr, exit 2. An unknown command
		// is cobra's error (exit 2).
		RunE: func(c *cobra.Command, args []string) error {
			fmt.Fprintf(stderr, topHelp, commandList())
			return &exitErr{code: exitUsage, err: errors.New("no command given")}
		},
	}
	root.CompletionOptions.DisableDefaultCmd = true // completion is a command of the table
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return &exitErr{code: exitUsage, err: err} })
	root.SetHelpFunc(printHelp)
	pf := root.PersistentFlags()
	pf.StringVar(&o.logFormat, "log-format", "text", "log `format` on stderr: text or json")
	pf.StringVar(&o.logLevel, "log-level", "info", "log `level`: debug, info, warn or error")

	groups := map[string]*cobra.Command{}
	for _, cmd := range commands {
		words := strings.Fields(cmd.path)
		parent := root
		if len(words) == 2 {
			g, ok := groups[words[0]]
			if !ok {
				g = groupCommand(words[0])
				groups[words[0]] = g
				root.AddCommand(g)
			}
			parent = g
		}
		parent.AddCommand(leafCommand(cmd, o, root, stdout, stderr, getenv))
	}
	return root
}

// groupCommand is "orchestrator run": it only names its subcommands; run
// on its own, or with an unknown subcommand, it is a usage error.
func groupCommand(word string) *cobra.Command {
	return &cobra.Command{
		Use:   word + " COMMAND",
		Short: word + " commands",
		Args:  cobra.ArbitraryArgs,
		RunE: func(c *cobra.Command, args []string) error {
			groupUsage(c.ErrOrStderr(), c)
			if len(args) == 0 {
				return &exitErr{code: exitUsage, err: errors.New("no command given")}
			}
			return &exitErr{code: exitUsage, err: fmt.Errorf("unknown command %q", args[0])}
		},
	}
}

func leafCommand(cmd *command, o *options, root *cobra.Command, stdout, stderr io.Writer, getenv func(string) string) *cobra.Command {
	words := strings.Fields(cmd.path)
	c := &cobra.Command{
		Use:     strings.TrimSpace(words[len(words)-1] + " " + cmd.args),
		Short:   cmd.short,
		Long:    cmd.long,
		Example: cmd.example,
		Args: func(c *cobra.Command, pos []string) error {
			switch {
			case cmd.nargs < 0 || len(pos) == cmd.nargs:
				return nil
			case cmd.nargs == 0:
				return usageErrorf("takes no arguments, got %q", pos)
			}
			return usageErrorf("want %d argument%s (%s), got %d: %q", cmd.nargs, plural(cmd.nargs), strings.TrimSpace(cmd.args), len(pos), pos)
		},
		RunE: func(c *cobra.Command, pos []string) error {
			e := &env{stdout: stdout, stderr: stderr, getenv: getenv, opts: o, flags: c.Flags(), root: root}
			if err := cmd.run(c.Context(), e, pos); err != nil {
				return &ranErr{err}
			}
			return nil
		},
	}
	if cmd.flags != nil {
		cmd.flags(c.Flags(), o)
	}
	c.Flags().SortFlags = false
	if c.Flags().Lookup("output") != nil {
		c.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json", "yaml"}, cobra.ShellCompDirectiveNoFileComp))
	}
	if cmd == completionCmd {
		c.ValidArgs = []string{"bash", "zsh", "fish"}
	}
	return c
}

// commandList lists the leaf commands in the table's order.
func commandList() string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s %s\t%s\n", c.path, c.args, c.short)
	}
	tw.Flush()
	return b.String()
}

// groupUsage lists a group's commands.
func groupUsage(w io.Writer, g *cobra.Command) {
	fmt.Fprintf(w, "Usage: %s COMMAND [ARGS] [flags]\n\nCommands:\n", g.CommandPath())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range g.Commands() {
		if c.IsAvailableCommand() {
			fmt.Fprintf(tw, "  %s %s\t%s\n", g.CommandPath(), c.Use, c.Short)
		}
	}
	tw.Flush()
	fmt.Fprintf(w, "\nRun '%s COMMAND --help' for details.\n", g.CommandPath())
}

// printHelp is every command's --help (and 'orchestrator help COMMAND'),
// on stdout.
func printHelp(c *cobra.Command, _ []string) {
	w := c.OutOrStdout()
	switch {
	case !c.HasParent():
		fmt.Fprintf(w, topHelp, commandList())
		return
	case c.HasAvailableSubCommands():
		groupUsage(w, c)
		return
	}
	fmt.Fprintf(w, "Usage: %s\n\n%s\n", c.UseLine(), strings.TrimSpace(c.Long))
	if c.Example != "" {
		fmt.Fprintf(w, "\nExample:\n%s\n", strings.TrimRight(c.Example, "\n"))
	}
	fmt.Fprintf(w, "\nFlags:\n%s", c.LocalFlags().FlagUsages())
	if in := c.InheritedFlags(); in.HasAvailableFlags() {
		fmt.Fprintf(w, "\nGlobal flags:\n%s", in.FlagUsages())
	}
	fmt.Fprintf(w, "\n%s\n", exitCodesHelp)
}

// completionCmd prints a shell's completion script (cobra's).
var completionCmd = &command{
	path: "completion", args: "SHELL", nargs: 1,
	short: "print the shell completion script for bash, zsh or fish",
	long: `Print the completion script of SHELL (bash, zsh or fish) for orchestrator's
commands and flags. Load it in the current shell, or install it where the
shell looks for completions.`,
	example: `  source <(orchestrator completion bash)
  orchestrator completion zsh > "${fpath[1]}/_orchestrator"
  orchestrator completion fish > ~/.config/fish/completions/orchestrator.fish`,
	run: func(_ context.Context, e *env, args []string) error {
		switch args[0] {
		case "bash":
			return e.root.GenBashCompletionV2(e.stdout, true)
		case "zsh":
			return e.root.GenZshCompletion(e.stdout)
		case "fish":
			return e.root.GenFishCompletion(e.stdout, true)
		}
		return usageErrorf("unknown shell %q: want bash, zsh or fish", args[0])
	},
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
