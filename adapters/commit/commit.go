// Package commit is the write-ahead discipline of core/doc.go, shared by the
// real orchestrator driver and the simulator so that both run the same code:
// a group of batches is made durable in one call, and only then does anything
// of it leave — messages in order, then answers.
package commit

import "github.com/tether-run/tether/core"

// Group is the batches stepped since the last commit (group commit).
type Group struct {
	readys []core.Ready
	nrecs  int
}

// Add appends one batch to the group.
func (g *Group) Add(rd core.Ready) {
	g.readys = append(g.readys, rd)
	g.nrecs += len(rd.Records)
}

// Len is the number of batches in the group.
func (g *Group) Len() int { return len(g.readys) }

// Readys returns the group's batches, in the order they were added.
func (g *Group) Readys() []core.Ready { return g.readys }

// Reset empties the group for reuse.
func (g *Group) Reset() {
	clear(g.readys)
	g.readys = g.readys[:0]
	g.nrecs = 0
}

// Commit is duties 3 and 4: every record of the group is handed to persist
// in one call, which must make them durable atomically; only if it succeeds
// are the messages sent, in order, and then the answers returned. If persist
// fails, nothing leaves and the error is returned.
func (g *Group) Commit(persist func([]core.Record) error, send func(core.Envelope), answer func(core.APIAnswer)) error {
	recs := make([]core.Record, 0, g.nrecs)
	for _, rd := range g.readys {
		recs = append(recs, rd.Records...)
	}
	if err := persist(recs); err != nil {
		return err
	}
	for _, rd := range g.readys {
		for _, e := range rd.Messages {
			send(e)
		}
	}
	for _, rd := range g.readys {
		for _, a := range rd.Answers {
			answer(a)
		}
	}
	return nil
}
