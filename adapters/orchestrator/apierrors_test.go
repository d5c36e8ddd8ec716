package orchestrator_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/client"
)

// noBackupStore is a backend whose snapshots are taken by other means
// (store.Maintenance): no backup (501).
type noBackupStore struct{ store.Backend }

func (noBackupStore) Backup(io.Writer) error {
	return fmt.Errorf("snapshots are the database's own: %w", errors.ErrUnsupported)
}

// failingBackupStore's backup fails before its first byte (500).
type failingBackupStore struct{ store.Backend }

func (failingBackupStore) Backup(io.Writer) error { return errors.New("the disk is on fire") }

func startWithStore(t *testing.T, wrap func(store.Backend) store.Backend, opts orchestrator.Options) *client.Client {
	t.Helper()
	bst, err := store.Open(filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	opts.Addr, opts.Store, opts.AdminToken, opts.Logger = "127.0.0.1:0", wrap(bst), adminToken, testLogger(t)
	d, err := orchestrator.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	c, err := client.New(d.DataURL(), adminToken)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestAPIErrorCodes produces every error code with a real request and
// checks its answer: the status that code stands for, a body of
// {"code", "message", "error"} (error repeating message for older
// clients), and the same code in the client's *client.Error. A code no
// request here produces fails the test.
func TestAPIErrorCodes(t *testing.T) {
	r := startAPI(t)
	c, err := client.New(r.d.DataURL(), adminToken)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[client.Code]bool{}
	// want checks a client call's error.
	want := func(what string, code client.Code, err error) {
		t.Helper()
		var ce *client.Error
		if !errors.As(err, &ce) {
			t.Errorf("%s: %v, want a *client.Error with code %s", what, err, code)
			return
		}
		if ce.Code != code || client.CodeFor(ce.Status) != code || ce.Message == "" || client.ErrorCode(err) != code {
			t.Errorf("%s: %+v, want code %s", what, ce, code)
		}
		seen[code] = true
	}
	// body checks a raw answer's body.
	body := func(what string, status int, b []byte) client.ErrorBody {
		t.Helper()
		var e client.ErrorBody
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil || e.Code != client.CodeFor(status) || e.Message == "" || e.Error != e.Message {
			t.Errorf("%s: HTTP %d body %s is not {code: %s, message, error = message} (%v)", what, status, b, client.CodeFor(status), err)
		}
		seen[e.Code] = true
		return e
	}

	_, err = c.Submit(r.ctx, "bad.yaml", []byte("name: bad\nsteps:\n  - name: a\n    bogus: 1\n"))
	want("an invalid definition", client.CodeInvalid, err)
	_, err = c.Runs(r.ctx, client.RunsOptions{Status: "done"})
	want("an unknown status filter", client.CodeInvalid, err)

	wrong, _ := client.New(r.d.DataURL(), "wrong-token")
	_, err = wrong.Workers(r.ctx)
	want("a wrong admin token", client.CodeUnauthorized, err)

	ro, err := c.CreateOperatorToken(r.ctx, "dash", true)
	if err != nil {
		t.Fatal(err)
	}
	roc, _ := client.New(r.d.DataURL(), ro.Token)
	err = roc.Cancel(r.ctx, "run-1", "")
	want("a read-only token's cancel", client.CodeForbidden, err)

	_, err = c.Run(r.ctx, "run-42")
	want("an unknown run", client.CodeNotFound, err)
	code, b := r.do("GET", "/nope", nil, nil)
	body("an unknown path", code, b)
	if code != http.StatusNotFound {
		t.Errorf("an unknown path: HTTP %d, want 404", code)
	}

	req, _ := http.NewRequestWithContext(r.ctx, "DELETE", r.d.APIURL()+"/runs", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	body("DELETE /api/runs", resp.StatusCode, b)
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD, POST" {
		t.Errorf("DELETE /api/runs: HTTP %d, Allow %q; want 405 with Allow: GET, HEAD, POST", resp.StatusCode, resp.Header.Get("Allow"))
	}

	if _, err := c.CreateToken(r.ctx, "w1", time.Hour); err != nil {
		t.Fatal(err)
	}
	_, err = c.CreateToken(r.ctx, "w1", time.Hour)
	want("a token name again", client.CodeConflict, err)

	_, err = c.Submit(r.ctx, "big.yaml", bytes.Repeat([]byte("#"), orchestrator.DefaultMaxSubmitBody+1))
	want("a definition over the limit", client.CodeTooLarge, err)

	bare := startWithStore(t, func(s store.Backend) store.Backend { return noBackupStore{s} }, orchestrator.Options{MaxEventStreams: 1})
	_, err = bare.Backup(r.ctx)
	want("a backup of a store that cannot", client.CodeUnsupported, err)
	first, err := bare.Events(r.ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = bare.Events(r.ctx, "")
	want("a live event stream over the cap", client.CodeUnavailable, err)
	first.Close()

	failing := startWithStore(t, func(s store.Backend) store.Backend { return failingBackupStore{s} }, orchestrator.Options{})
	_, err = failing.Backup(r.ctx)
	want("a backup that fails before its first byte", client.CodeInternal, err)

	// The data plane answers the same shape.
	dr := startData(t, orchestrator.Options{BodyIdleTimeout: 200 * time.Millisecond})
	w := dr.enroll("w1")
	dm := dr.lease(w, "s")
	a := dr.stalledPut("/data/slow", w.cred, dm.Lease, 64<<10, 20<<10)
	body("a stalled data write", a.status, a.body)
	dr.expect("POST", "/data/live/append", []byte("abc"), w.cred, dm.Lease, http.StatusOK)
	a = dr.expect("GET", "/data/live/append?offset=99", nil, w.cred, 0, http.StatusRequestedRangeNotSatisfiable)
	body("an offset past the stream", a.status, a.body)

	for _, code := range client.Codes {
		if !seen[code] {
			t.Errorf("no request produced code %s", code)
		}
	}
}
