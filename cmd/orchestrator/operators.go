package main

// Operator tokens and the audit log (SPEC §15a).

import (
	"context"
	"fmt"
	"text/tabwriter"

	flag "github.com/spf13/pflag"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/client"
)

func operatorCommands() []*command {
	return []*command{
		{
			path: "operator-token create", args: "NAME", nargs: 1,
			short: "create an operator token for the API and the status page",
			long: `Create a named operator token and print it (NAME.SECRET) on stdout, once:
the orchestrator keeps only its hash. It is a credential of the operator API,
the live streams and the status page, like the admin token; each of its
actions is recorded in the audit log under NAME. --read-only makes it one
that may read (every GET, the streams, /metrics) and never change anything.
A name is never reused, even after its token is revoked.` + clientHelp,
			example: `  orchestrator operator-token create alice
  orchestrator operator-token create dashboards --read-only
  TETHER_ADMIN_TOKEN=$(orchestrator operator-token create ci) ...`,
			flags: clientFlags(func(fs *flag.FlagSet, o *options) {
				fs.BoolVar(&o.readOnly, "read-only", false, "the token may read and never change anything")
			}),
			run: operatorTokenCreate,
		},
		{
			path: "operator-token list", nargs: 0,
			short: "list operator tokens (never their secrets)",
			long: `List every operator token, revoked ones too: name, whether it is read-only,
when and by whom it was created, and when it was revoked.` + clientHelp,
			example: "  orchestrator operator-token list\n  orchestrator operator-token list -o json",
			flags:   clientFlags(nil),
			run:     operatorTokenList,
		},
		{
			path: "operator-token revoke", args: "NAME", nargs: 1,
			short: "revoke an operator token; its next request is refused",
			long: `Revoke an operator token for good: its next request is answered 401 and a
status page session it opened ends.` + clientHelp,
			example: "  orchestrator operator-token revoke alice",
			flags:   clientFlags(nil),
			run:     operatorTokenRevoke,
		},
		{
			path: "audit", nargs: 0,
			short: "list the audit log: who did what, newest first",
			long: `List the audit log, newest first: each operator action (submit, cancel,
approve, reject, token and operator-token changes, backups), accepted or
refused, with when, which operator token did it, its target, and why it was
refused. --limit says how many (default 100; more than a page of the API is
fetched page by page); --actor keeps one token's actions, --action one
action (run.submit, operator-token.create, ...), --since those at or after a
time (RFC 3339) or within a duration (24h).` + clientHelp,
			example: "  orchestrator audit\n  orchestrator audit --actor alice --since 24h\n  orchestrator audit --action run.cancel -o json",
			flags: clientFlags(func(fs *flag.FlagSet, o *options) {
				fs.IntVar(&o.limit, "limit", orchestrator.DefaultRunsLimit, "list at most `N` entries")
				fs.StringVar(&o.actor, "actor", "", "only the actions of this operator token `NAME`")
				fs.StringVar(&o.action, "action", "", "only this `action`")
				fs.StringVar(&o.since, "since", "", "only entries since this `time` (RFC 3339) or within this duration (24h)")
			}),
			run: auditList,
		},
	}
}

func operatorTokenCreate(ctx context.Context, e *env, args []string) error {
	return withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		out, err := c.CreateOperatorToken(ctx, args[0], e.opts.readOnly)
		if err != nil {
			return err
		}
		if ok, err := e.printStructured(out); ok {
			return err
		}
		fmt.Fprintln(e.stdout, out.Token)
		kind := "may read and change"
		if out.ReadOnly {
			kind = "may only read"
		}
		fmt.Fprintf(e.stderr, "Operator token %q %s. It is shown only this once; use it as --admin-token or $%s.\n", out.Name, kind, adminTokenEnv)
		return nil
	})
}

func operatorTokenList(ctx context.Context, e *env, _ []string) error {
	return withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		out, err := c.OperatorTokens(ctx)
		if err != nil {
			return err
		}
		return e.print(out, func() error {
			tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tACCESS\tCREATED\tCREATED BY\tREVOKED")
			for _, t := range out.OperatorTokens {
				access := "read-write"
				if t.ReadOnly {
					access = "read-only"
				}
				revoked := "-"
				if t.Revoked {
					revoked = fmtTime(t.RevokedAt)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", cell(t.Name), access, fmtTime(t.CreatedAt), cell(orDash(t.CreatedBy)), revoked)
			}
			return tw.Flush()
		})
	})
}

func operatorTokenRevoke(ctx context.Context, e *env, args []string) error {
	return withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		if err := c.RevokeOperatorToken(ctx, args[0]); err != nil {
			return err
		}
		return e.print(client.RevokedToken{Revoked: args[0]}, func() error {
			fmt.Fprintf(e.stdout, "operator token %s revoked\n", cell(args[0]))
			return nil
		})
	})
}

// auditList pages through GET /api/audit until --limit entries or the last
// page.
func auditList(ctx context.Context, e *env, _ []string) error {
	if e.opts.limit < 1 {
		return usageErrorf("--limit %d: list at least 1 entry", e.opts.limit)
	}
	return withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		out := client.AuditList{Entries: []client.AuditEntry{}}
		q := client.AuditOptions{Actor: e.opts.actor, Action: e.opts.action, Since: e.opts.since}
		for len(out.Entries) < e.opts.limit {
			q.Limit = min(e.opts.limit-len(out.Entries), orchestrator.MaxRunsLimit)
			page, err := c.Audit(ctx, q)
			if err != nil {
				return err
			}
			out.Entries = append(out.Entries, page.Entries...)
			out.NextCursor = page.NextCursor
			if page.NextCursor == "" {
				break
			}
			q.Cursor = page.NextCursor
		}
		return e.print(out, func() error {
			tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "AT\tACTOR\tACTION\tTARGET\tOUTCOME\tWHY")
			for _, a := range out.Entries {
				why := "-"
				if a.Code != "" || a.Message != "" {
					why = escapeText(oneLine(string(a.Code)+": "+a.Message), false)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", fmtTime(a.At), cell(a.Actor), cell(a.Action), cell(orDash(a.Target)), cell(a.Outcome), why)
			}
			return tw.Flush()
		})
	})
}
