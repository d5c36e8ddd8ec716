package pgstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/pgstore"
	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/core"
)

// SPEC §11: sessions commit with synchronous_commit on; off in the URL is
// refused however PostgreSQL would read it (OFF, false, no, 0); and no
// session runs with it off whatever else the URL says (an options=-c
// parameter: the store's own "on" wins, or Open refuses).
func TestSyncCommitOffRefusedHoweverSpelled(t *testing.T) {
	dsn := database(t)
	for _, v := range []string{"off", "OFF", "false", "no", "0"} {
		s, err := pgstore.Open(context.Background(), dsn+"&synchronous_commit="+v, pgstore.Options{})
		if err == nil {
			s.Close()
			t.Errorf("synchronous_commit=%s: Open accepted it", v)
			continue
		}
		if !strings.Contains(err.Error(), "synchronous_commit=off") {
			t.Errorf("synchronous_commit=%s: refused with %v, want the reason named", v, err)
		}
	}
	if s, err := pgstore.Open(context.Background(), dsn+"&options=-c%20synchronous_commit%3Doff", pgstore.Options{}); err == nil {
		var got string
		if err := s.Pool().QueryRow(context.Background(), "SHOW synchronous_commit").Scan(&got); err != nil || got == "off" {
			t.Errorf("options=-c synchronous_commit=off: sessions commit with synchronous_commit=%s (%v)", got, err)
		}
		s.Close()
	}
	s := open(t, dsn+"&synchronous_commit=remote_apply", pgstore.Options{}) // more is allowed
	s.Close()
}

// SPEC §11: a batch the tables cannot hold is refused at Apply, never
// acknowledged and then failed at its fold (which failed every read, every
// later commit and every Open after): a key that is not UTF-8, an audit
// entry's actor holding NUL.
func TestApplyRefusesWhatTheTablesCannotHold(t *testing.T) {
	dsn := database(t)
	s := open(t, dsn, pgstore.Options{})
	for name, rec := range map[string]core.Record{
		"a key not UTF-8":    {Key: "worker/\xff\xfe", Value: []byte("v")},
		"an audit actor NUL": {Key: core.AuditKey(1), Value: []byte(`{"seq":1,"at":"2024-01-01T00:00:00Z","actor":"a\u0000b","action":"x"}`)},
	} {
		if err := s.Apply([]core.Record{rec}); err == nil {
			t.Errorf("%s: Apply acknowledged it", name)
		}
	}
	if _, err := s.Load(); err != nil {
		t.Fatalf("Load after the refused batches: %v", err)
	}
	if err := s.Apply([]core.Record{{Key: "worker/ok", Value: []byte("v")}}); err != nil {
		t.Fatalf("a later Apply: %v", err)
	}
	s.Close()
	open(t, dsn, pgstore.Options{})
}

// SPEC §7a: retention deletes the streams last appended before the cutoff;
// an append acknowledged while it runs stays. An uncommitted chunk row
// holds the append between its read of the stream row (FOR UPDATE) and
// its writes, so that PruneData's scan runs while it is in flight and its
// DELETE waits for the stream row.
func TestPruneKeepsAStreamAppendedDuringIt(t *testing.T) {
	dsn := database(t)
	s := open(t, dsn, pgstore.Options{})
	ctx := context.Background()
	now := time.Now()
	if _, err := s.ApplyWithData(nil, []store.DataOp{{Kind: store.OpAppend, ID: "s", Body: []byte("old"), At: now.Add(-2 * time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO tether_stream_chunk (id, off, bytes) VALUES ('s', 3, 'x')"); err != nil {
		t.Fatal(err)
	}
	type res struct {
		r   []store.DataResult
		err error
	}
	appended := make(chan res, 1)
	go func() {
		r, err := s.ApplyWithData(nil, []store.DataOp{{Kind: store.OpAppend, ID: "s", Body: []byte("new"), At: now}})
		appended <- res{r, err}
	}()
	time.Sleep(500 * time.Millisecond) // the append holds the stream row, waits on the chunk
	pruned := make(chan error, 1)
	go func() {
		_, err := s.PruneData(now.Add(-time.Hour), nil, 0)
		pruned <- err
	}()
	time.Sleep(500 * time.Millisecond) // the prune's scan ran; its DELETE waits on the stream row
	tx.Rollback(ctx)
	a := <-appended
	if a.err != nil || a.r[0].Err != nil {
		t.Fatalf("the append: %v %v", a.err, a.r)
	}
	if err := <-pruned; err != nil {
		t.Fatalf("prune: %v", err)
	}
	m, err := s.Stream("s")
	if err != nil || m.Length != 6 {
		t.Fatalf("the stream after an append acknowledged during retention (after its cutoff): %+v, %v; want its 6 bytes", m, err)
	}
}

// The pipeline keeps no place once its call returned: 3,000 places
// reserved and committed leave at most the last one reachable.
func TestPipelineKeepsNoReturnedPlace(t *testing.T) {
	s := open(t, database(t), pgstore.Options{Pipeline: 4})
	for i := range 3000 {
		var recs []core.Record
		if i%2 == 0 {
			recs = []core.Record{{Key: "worker/x", Value: []byte("v")}}
		}
		if err := s.Reserve()(recs); err != nil {
			t.Fatal(err)
		}
	}
	if n := pgstore.PlacesKept(s); n > 1 {
		t.Fatalf("%d places reachable after 3,000 returned, want at most 1", n)
	}
}
