package main

// Secrets (SPEC §14a): secret put|list|rm.

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"text/tabwriter"

	flag "github.com/spf13/pflag"

	"github.com/tether-run/tether/client"
	"github.com/tether-run/tether/core"
)

func secretCommands() []*command {
	return []*command{
		{
			path: "secret put", args: "NAME", nargs: 1,
			short: "store a secret: its value from stdin or --from-file, never from the command line",
			long: `Store a secret under NAME (letters, digits, '_', not starting with a digit;
at most 64 bytes), replacing its value if it exists. The value is read from
stdin, or from --from-file (at most 64 KiB, not empty, taken byte for byte:
a final newline is part of it), never from an argument, which ps and shell
histories show. The orchestrator keeps it sealed at rest (AES-256-GCM, with
the key in <data-dir>/tether.db.secrets-key or serve --secrets-key-file), and
gives it only to steps that name it in secrets:. The change is audited as
secret.put; nothing prints the value again.` + clientHelp,
			example: `  printf %s "$DB_PASSWORD" | orchestrator secret put DB_PASSWORD
  orchestrator secret put DEPLOY_KEY --from-file ~/.ssh/deploy_ed25519`,
			flags: clientFlags(func(fs *flag.FlagSet, o *options) {
				fs.StringVar(&o.fromFile, "from-file", "", "read the value from this `file` instead of stdin")
			}),
			run: secretPut,
		},
		{
			path: "secret list", nargs: 0,
			short: "list secrets: names, sizes, times (never values)",
			long: `List the stored secrets: name, size in bytes, when and by whom (an operator
token, or a step with put_secrets:) each was last set. Never a value.` + clientHelp,
			example: "  orchestrator secret list\n  orchestrator secret list -o json",
			flags:   clientFlags(nil),
			run:     secretList,
		},
		{
			path: "secret rm", args: "NAME", nargs: 1,
			short: "remove a secret",
			long: `Remove a secret (audited as secret.rm). A step that names it afterwards
fails before its process starts.` + clientHelp,
			example: "  orchestrator secret rm DB_PASSWORD",
			flags:   clientFlags(nil),
			run:     secretRemove,
		},
	}
}

func secretPut(ctx context.Context, e *env, args []string) error {
	if err := core.CheckSecretName(args[0]); err != nil {
		return usageErrorf("%v", err)
	}
	src, from := io.Reader(os.Stdin), "stdin"
	if e.opts.fromFile != "" {
		f, err := os.Open(e.opts.fromFile)
		if err != nil {
			return usageErrorf("--from-file: %v", err)
		}
		defer f.Close()
		src, from = f, e.opts.fromFile
	}
	value, err := io.ReadAll(io.LimitReader(src, core.MaxSecretBytes+1))
	switch {
	case err != nil:
		return fmt.Errorf("reading the value from %s: %w", from, err)
	case len(value) == 0:
		return usageErrorf("the value from %s is empty", from)
	case len(value) > core.MaxSecretBytes:
		return usageErrorf("the value from %s is longer than %d bytes", from, core.MaxSecretBytes)
	}
	return withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		out, err := c.PutSecret(ctx, args[0], value)
		if err != nil {
			return err
		}
		return e.print(out, func() error {
			fmt.Fprintf(e.stdout, "secret %s stored (%d bytes)\n", cell(out.Name), out.Size)
			return nil
		})
	})
}

func secretList(ctx context.Context, e *env, _ []string) error {
	return withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		out, err := c.Secrets(ctx)
		if err != nil {
			return err
		}
		return e.print(out, func() error {
			tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSIZE\tUPDATED\tBY")
			for _, s := range out.Secrets {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", cell(s.Name), strconv.Itoa(s.Size), fmtTime(s.UpdatedAt), cell(orDash(s.UpdatedBy)))
			}
			return tw.Flush()
		})
	})
}

func secretRemove(ctx context.Context, e *env, args []string) error {
	return withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		if err := c.RemoveSecret(ctx, args[0]); err != nil {
			return err
		}
		return e.print(client.RemovedSecret{Removed: args[0]}, func() error {
			fmt.Fprintf(e.stdout, "secret %s removed\n", cell(args[0]))
			return nil
		})
	})
}
