package store

import (
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/tether-run/tether/core"
)

func auditRec(t *testing.T, seq uint64, at time.Time, actor, action string) core.Record {
	t.Helper()
	b, err := json.Marshal(core.AuditEntry{Seq: seq, At: at, Actor: actor, Action: action, Outcome: core.OutcomeAccepted})
	if err != nil {
		t.Fatal(err)
	}
	return core.Record{Key: core.AuditKey(seq), Value: b}
}

// TestAudit: the audit log is kept apart from the state (Load does not
// return it), read newest first with its filters and cursor, and pruned
// of what is older than the cutoff, in bounded transactions, keeping the
// rest.
func TestAudit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	s := open(t, path)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var recs []core.Record
	for i := uint64(1); i <= 25; i++ {
		actor := "alice"
		if i%2 == 0 {
			actor = "bob"
		}
		recs = append(recs, auditRec(t, i, t0.Add(time.Duration(i)*time.Hour), actor, core.ActionSubmit))
	}
	recs = append(recs, core.Record{Key: core.KindMeta, Value: []byte(`{"RunSeq":0,"LeaseSeq":0,"NextSweep":"0001-01-01T00:00:00Z","AuditSeq":25}`)})
	if err := s.Apply(recs); err != nil {
		t.Fatal(err)
	}
	loaded, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range loaded {
		if core.IsAuditKey(r.Key) {
			t.Fatalf("Load returned audit entry %s: the audit log is not state", r.Key)
		}
	}
	seqs := func(es []core.AuditEntry) (out []uint64) {
		for _, e := range es {
			out = append(out, e.Seq)
		}
		return out
	}
	page, next, err := s.Audit(AuditQuery{Limit: 3})
	if err != nil || len(page) != 3 || page[0].Seq != 25 || page[2].Seq != 23 || next != 23 {
		t.Fatalf("first page %v next %d err %v; want 25 24 23, next 23", seqs(page), next, err)
	}
	page, next, _ = s.Audit(AuditQuery{Limit: 3, Before: next})
	if len(page) != 3 || page[0].Seq != 22 || next != 20 {
		t.Fatalf("second page %v next %d; want 22 21 20, next 20", seqs(page), next)
	}
	page, next, _ = s.Audit(AuditQuery{Actor: "bob", Since: t0.Add(20 * time.Hour)})
	if got := seqs(page); len(got) != 3 || got[0] != 24 || got[2] != 20 || next != 0 {
		t.Fatalf("bob since +20h: %v next %d; want 24 22 20, no next", got, next)
	}
	if page, _, _ = s.Audit(AuditQuery{Action: core.ActionCancel}); len(page) != 0 {
		t.Fatalf("no cancel was recorded, got %v", seqs(page))
	}

	st, err := s.PruneAudit(t0.Add(10*time.Hour+time.Minute), 4)
	if err != nil {
		t.Fatal(err)
	}
	if st.Audit != 10 || st.Transactions < 3 {
		t.Fatalf("pruned %d entries in %d transactions; want 10 in at least 3 (budget 4)", st.Audit, st.Transactions)
	}
	page, _, _ = s.Audit(AuditQuery{Limit: 1000})
	if len(page) != 15 || page[len(page)-1].Seq != 11 {
		t.Fatalf("after pruning: %v; want 25..11", seqs(page))
	}
	s.Close()
	if rep, err := Check(path); err != nil || !rep.Sound() || rep.Counted["audit entries"] != 15 {
		t.Fatalf("check: %v %+v", err, rep)
	}
}
