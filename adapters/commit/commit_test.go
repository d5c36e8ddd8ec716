package commit

import (
	"errors"
	"fmt"
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

// TestCommitPersistsTheLastRecordOfAKey: batches of a group that write the
// same key persist only the last record of it, where it last appeared.
func TestCommitPersistsTheLastRecordOfAKey(t *testing.T) {
	var g Group
	v := func(s string) []byte { return []byte(s) }
	g.Add(core.Ready{Records: []core.Record{{Key: "lease/1", Value: v("granted")}, {Key: "meta", Value: v("1")}, {Key: "step/a", Value: v("queued")}}})
	g.Add(core.Ready{Records: []core.Record{{Key: "lease/1", Value: v("started")}, {Key: "step/a", Value: v("running")}}})
	g.Add(core.Ready{Records: []core.Record{{Key: "lease/2", Value: v("granted")}, {Key: "step/a", Delete: true}}})
	var got []string
	err := g.Commit(func(recs []core.Record) error {
		for _, r := range recs {
			got = append(got, fmt.Sprintf("%s=%s/%v", r.Key, r.Value, r.Delete))
		}
		return nil
	}, func(core.Envelope) {}, func(core.APIAnswer) {})
	want := []string{"meta=1/false", "lease/1=started/false", "lease/2=granted/false", "step/a=/true"}
	if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("persisted %v (err %v), want %v", got, err, want)
	}
}

// TestGroupReusedAfterReset: a group reset and filled again persists its
// own records only, each key's last, whatever the group before held.
func TestGroupReusedAfterReset(t *testing.T) {
	var g Group
	v := func(s string) []byte { return []byte(s) }
	persisted := func() string {
		var got []string
		if err := g.Persist(func(recs []core.Record) error {
			for _, r := range recs {
				got = append(got, fmt.Sprintf("%s=%s", r.Key, r.Value))
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(got)
	}
	g.Add(core.Ready{Records: []core.Record{{Key: "x", Value: v("1")}, {Key: "a", Value: v("1")}, {Key: "b", Value: v("1")}}})
	g.Add(core.Ready{Records: []core.Record{{Key: "c", Value: v("1")}, {Key: "a", Value: v("2")}}})
	if got, want := persisted(), "[x=1 b=1 c=1 a=2]"; got != want {
		t.Fatalf("first group persisted %s, want %s", got, want)
	}
	g.Reset()
	if g.Len() != 0 {
		t.Fatalf("a reset group holds %d batches", g.Len())
	}
	g.Add(core.Ready{Records: []core.Record{{Key: "a", Value: v("3")}}})
	g.Add(core.Ready{Records: []core.Record{{Key: "b", Value: v("3")}}})
	if got, want := persisted(), "[a=3 b=3]"; got != want {
		t.Fatalf("the group reused persisted %s, want %s", got, want)
	}
	// Four records of two keys, the groups before having held four keys:
	// their stale indexes would make every key look written once.
	g.Reset()
	g.Add(core.Ready{Records: []core.Record{{Key: "a", Value: v("4")}, {Key: "b", Value: v("4")}}})
	g.Add(core.Ready{Records: []core.Record{{Key: "a", Value: v("5")}, {Key: "b", Value: v("5")}}})
	if got, want := persisted(), "[a=5 b=5]"; got != want {
		t.Fatalf("the group reused persisted %s, want %s", got, want)
	}
	g.Reset()
	g.Add(core.Ready{Records: []core.Record{{Key: "y", Value: v("4")}}})
	if got, want := persisted(), "[y=4]"; got != want {
		t.Fatalf("one batch after reuse persisted %s, want %s", got, want)
	}
}
