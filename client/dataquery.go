package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/tether-run/tether/adapters/dataplane"
)

// DataQueryAnswer answers GET /api/data?…: versions sorted by (id,
// version) and the cursor of the next page ("" at the end).
type DataQueryAnswer = dataplane.Query

// DataQuery selects data versions (SPEC §14): every field set must match.
type DataQuery struct {
	Prefix       string            // id prefix
	Run, Step    string            // the writer's run, and step ("run-1/build")
	Since, Until time.Time         // created in [Since, Until)
	Attrs        map[string]string // each attribute must be the version's
	Limit        int               // 1..1000; 0: the server's default (100)
	After        string            // the previous page's Next
}

// QueryData asks one page of a query.
func (c *Client) QueryData(ctx context.Context, q DataQuery) (*DataQueryAnswer, error) {
	v := url.Values{}
	set := func(k, val string) {
		if val != "" {
			v.Set(k, val)
		}
	}
	set("prefix", q.Prefix)
	set("run", q.Run)
	set("step", q.Step)
	set("after", q.After)
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if !q.Until.IsZero() {
		v.Set("until", q.Until.UTC().Format(time.RFC3339Nano))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	for k, val := range q.Attrs {
		v.Set("attr."+k, val)
	}
	path := "/data"
	if len(v) > 0 {
		path += "?" + v.Encode()
	}
	var out DataQueryAnswer
	if err := c.call(ctx, http.MethodGet, path, nil, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}
