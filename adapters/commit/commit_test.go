package commit

import (
	"errors"
	"testing"

	"github.com/tether-run/tether/core"
)

// TestCommitPersistsFirst: nothing leaves before persist returns, and nothing
// at all when it fails.
func TestCommitPersistsFirst(t *testing.T) {
	var g Group
	g.Add(core.Ready{Records: []core.Record{{Key: "a"}}, Messages: []core.Envelope{{Conn: 1, Msg: core.Cancel{Lease: 1}}},
		Answers: []core.APIAnswer{{Call: 1}}})
	g.Add(core.Ready{Records: []core.Record{{Key: "b"}}, Messages: []core.Envelope{{Conn: 2, Msg: core.Cancel{Lease: 2}}}})
	var log []string
	persisted := false
	err := g.Commit(func(recs []core.Record) error {
		if len(log) != 0 {
			t.Fatal("something left before persist")
		}
		if len(recs) != 2 || recs[0].Key != "a" || recs[1].Key != "b" {
			t.Fatalf("persist got %v, want both batches' records in order", recs)
		}
		persisted = true
		return nil
	}, func(e core.Envelope) {
		if !persisted {
			t.Fatal("a message left before the records were durable")
		}
		log = append(log, "send")
	}, func(core.APIAnswer) {
		log = append(log, "answer")
	})
	if err != nil || len(log) != 3 || log[2] != "answer" {
		t.Fatalf("commit: err=%v order=%v", err, log)
	}
	boom := errors.New("disk full")
	sent := 0
	if err := g.Commit(func([]core.Record) error { return boom }, func(core.Envelope) { sent++ }, func(core.APIAnswer) { sent++ }); !errors.Is(err, boom) || sent != 0 {
		t.Fatalf("failed persist: err=%v, %d things left", err, sent)
	}
}
