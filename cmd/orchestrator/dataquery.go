package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	flag "github.com/spf13/pflag"

	"github.com/tether-run/tether/client"
)

// dataQueryCmd is `data query` (SPEC §14: queryData, for operators). Its
// own flags are read back from the command's flag set.
var dataQueryCmd = &command{
	path: "data query", nargs: 0,
	short: "list data versions by id prefix, writer, time or attribute",
	long: `List the data versions that match every filter given, sorted by id and
version, tombstones of deleted ids included: --prefix of the id, --run and
--step that wrote them, --since and --until (RFC 3339) their creation, and
--attr KEY=VALUE (repeatable) the attributes a PUT set. One page of --limit
versions; the next page's cursor is printed last, for --after.` + clientHelp,
	example: "  orchestrator data query --prefix build.\n  orchestrator data query --step run-7/build --attr kind=report -o json",
	flags: clientFlags(func(fs *flag.FlagSet, o *options) {
		fs.String("prefix", "", "only ids starting with this `text`")
		fs.String("run", "", "only versions written by this `run`")
		fs.String("step", "", "only versions written by this `step` (RUN/NAME)")
		fs.String("since", "", "only versions created at or after this RFC 3339 `time`")
		fs.String("until", "", "only versions created before this RFC 3339 `time`")
		fs.StringArray("attr", nil, "only versions with this attribute (`KEY=VALUE`; repeatable)")
		fs.Int("limit", 100, "at most this many versions (1 to 1000)")
		fs.String("after", "", "start after this `cursor` (the last page's next)")
	}),
	run: dataQuery,
}

func dataQuery(ctx context.Context, e *env, _ []string) error {
	fs := e.flags
	str := func(name string) string { v, _ := fs.GetString(name); return v }
	q := client.DataQuery{Prefix: str("prefix"), Run: str("run"), Step: str("step"), After: str("after")}
	q.Limit, _ = fs.GetInt("limit")
	if q.Limit < 1 || q.Limit > 1000 {
		return usageErrorf("--limit %d: want 1 to 1000", q.Limit)
	}
	for _, name := range []string{"since", "until"} {
		if v := str(name); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return usageErrorf("--%s %q: want an RFC 3339 time (2026-01-02T15:04:05Z)", name, v)
			}
			if name == "since" {
				q.Since = t
			} else {
				q.Until = t
			}
		}
	}
	attrs, _ := fs.GetStringArray("attr")
	for _, kv := range attrs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return usageErrorf("--attr %q: want KEY=VALUE", kv)
		}
		if q.Attrs == nil {
			q.Attrs = map[string]string{}
		}
		q.Attrs[k] = v
	}
	return withClient(ctx, e, func(ctx context.Context, c *client.Client) error {
		out, err := c.QueryData(ctx, q)
		if err != nil {
			return err
		}
		if ok, err := e.printStructured(out); ok {
			return err
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tVERSION\tSIZE\tCREATED\tSTEP\tATTRIBUTES")
		for _, v := range out.Items {
			size := fmt.Sprint(v.Size)
			if v.Deleted {
				size = "deleted"
			}
			var as []string
			for k, val := range v.Attributes {
				as = append(as, k+"="+val)
			}
			sort.Strings(as)
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", cell(v.ID), v.Version, size, fmtTime(v.Created), cell(orDash(v.Step)), cell(orDash(strings.Join(as, ","))))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if out.Next != "" {
			fmt.Fprintf(e.stdout, "next: %s (--after %s)\n", out.Next, out.Next)
		}
		return nil
	})
}
