// Package commit is the write-ahead discipline of core/doc.go, shared by the
// real orchestrator driver and the simulator so that both run the same code:
// a group of batches is made durable in one call, and only then does anything
// of it leave — messages in order, then answers.
package commit

import (
	"slices"

	"github.com/tether-run/tether/core"
)

// Group is the batches stepped since the last commit (group commit).
type Group struct {
	readys []core.Ready
	nrecs  int
	recs   []core.Record  // records' result, reused
	last   map[string]int // records' index of each key's last record, reused
}

// Add appends one batch to the group.
func (g *Group) Add(rd core.Ready) {
	g.readys = append(g.readys, rd)
	g.nrecs += len(rd.Records)
}

// records returns the group's records, the last of each key, in a slice
// the group reuses after Reset.
func (g *Group) records() []core.Record {
	switch len(g.readys) {
	case 0:
		return nil
	case 1:
		return g.readys[0].Records // one batch has each key once
	}
	recs := slices.Grow(g.recs[:0], g.nrecs)
	for _, rd := range g.readys {
		recs = append(recs, rd.Records...)
	}
	g.recs = recs
	if g.last == nil {
		g.last = make(map[string]int, len(recs))
	}
	last := g.last
	for i, r := range recs {
		last[r.Key] = i
	}
	if len(last) == len(recs) {
		return recs
	}
	out := recs[:0]
	for i, r := range recs {
		if last[r.Key] == i {
			out = append(out, r)
		}
	}
	return out
}

// Len is the number of batches in the group.
func (g *Group) Len() int { return len(g.readys) }

// Readys returns the group's batches, in the order they were added.
func (g *Group) Readys() []core.Ready { return g.readys }

// Reset empties the group for reuse, keeping its arrays: a driver that
// makes a group per commit spends less on them (SPEC §12, the loop's longest step).
func (g *Group) Reset() {
	clear(g.readys)
	g.readys = g.readys[:0]
	clear(g.recs)
	g.recs = g.recs[:0]
	clear(g.last)
	g.nrecs = 0
}

// Commit is duties 3 and 4: every record of the group is handed to persist
// in one call, which must make them durable atomically; only if it succeeds
// are the messages sent, in order, and then the answers returned. If persist
// fails, nothing leaves and the error is returned.
//
// A record is a whole snapshot of its entity, so when several batches of
// the group write the same key only the last one's record is persisted
// (where the key last appeared): the store ends in the same state, with
// less to write. A step that is granted, started and reported within one
// group writes its step and lease records three times.
func (g *Group) Commit(persist func([]core.Record) error, send func(core.Envelope), answer func(core.APIAnswer)) error {
	if err := g.Persist(persist); err != nil {
		return err
	}
	g.Release(send, answer)
	return nil
}

// Persist is Commit's first half: it hands every record of the group to
// persist in one call; persist must not keep the slice (the group reuses
// it after Reset). It reads only the group, so it may run on another
// goroutine while the caller steps the next group into another Group (a
// pipelined driver, SPEC §12).
func (g *Group) Persist(persist func([]core.Record) error) error {
	return persist(g.records())
}

// Release is Commit's second half, to be called only after Persist returned
// nil: the group's messages in order, then its answers.
func (g *Group) Release(send func(core.Envelope), answer func(core.APIAnswer)) {
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
}
