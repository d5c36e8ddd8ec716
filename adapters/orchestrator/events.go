package orchestrator

// Live streams (SPEC §17): Server-Sent Events of one run
// (GET /api/runs/{id}/events) and of the whole server (GET /api/events).
//
// The loop publishes what each group carried only once the group is durable
// and released (Driver.land, SPEC §11), to a broker. Every stream is a
// subscriber with a bounded queue; one that falls behind is dropped (its
// stream is closed and its client resumes by Last-Event-ID), so the loop
// never waits for a client. With nobody subscribed the loop only numbers
// the batch's server events and runs' ends (the server stream resumes from
// them); any other record is decoded only when a stream wants it (a run
// stream: its own run's records, found by key).
//
// A stream subscribes inside a Driver.Snapshot: it reads the state it
// starts from and joins the broker in the same step of the loop, so the
// snapshot and the live events that follow neither overlap nor leave a
// hole between them.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/client"
	"github.com/tether-run/tether/core"
)

// Limits of the live streams (SPEC §17).
const (
	// DefaultMaxEventStreams caps the live streams open at once, of both
	// kinds, when Options.MaxEventStreams is zero; beyond it a new stream
	// is refused with 503.
	DefaultMaxEventStreams = 256
	// StreamQueue is how many events may wait for one stream's client:
	// a stream whose client let this many pile up, over more than one
	// publish, is closed when more are published (it resumes by
	// Last-Event-ID on reconnect). One publish is queued whole whatever
	// its size (a worker's batch of log lines may hold thousands), so a
	// client that reads as fast as it can is never closed for a burst,
	// nor while it reads one.
	StreamQueue = 1024
	// ServerEventRing is how many of the latest server events the server
	// stream can resume from (they are kept in memory, numbered).
	ServerEventRing = 4096
	// streamRetryMillis is the reconnection delay a stream suggests.
	streamRetryMillis = 2000
)

// streamHeartbeat is the period of the ": ping" comment lines (a variable
// for a test).
var streamHeartbeat = 15 * time.Second

// ---- event data (the "data:" JSON of each event type) ----

// The events' data are package client's types (one definition for the
// server and its clients).
type (
	StreamStep        = client.StreamStep
	StreamRun         = client.StreamRun
	StreamServerEvent = client.StreamServerEvent
	StreamLine        = client.StreamLine
	StreamWorker      = client.StreamWorker
	StreamEnd         = client.StreamEnd
	StreamLost        = client.StreamLost
)

// ---- the broker ----

// streamEvent is one event on its way to a stream.
type streamEvent struct {
	kind  string // step, run, server, log, gap, worker, end
	data  any
	seq   int          // kind server: the event's sequence in its run
	n     uint64       // its number on the server stream (numbered), 0 if none
	lease core.LeaseID // kinds log, gap
	index int
}

// subscriber is one open stream.
type subscriber struct {
	ch      chan []streamEvent // one publish's events a value; closed by the loop only (dropped, or the run ended)
	queued  atomic.Int64       // events in ch: added by the loop before it sends, taken by the handler
	dropped bool               // it fell behind; set before ch is closed
	left    bool               // its handler returned: never register it
	run     core.RunID         // "" for the server stream
}

// runTopic is a run with subscribers.
type runTopic struct {
	subs      map[*subscriber]bool
	workerOf  map[core.LeaseID]core.WorkerID // every lease of the run seen so far
	stepLease map[core.StepID]core.LeaseID   // each step's latest lease
}

// numbered is a server stream event that a reconnecting client must not
// miss: a server event, or a run's end (its final "run" event). They are
// numbered from 1 since this process started.
type numbered struct {
	n uint64
	e streamEvent
}

// broker fans events out to the streams. Its state is guarded by mu; it is
// changed by the loop (publish, subscribe) and by handlers (reserve, leave).
type broker struct {
	max      int
	boot     string        // the server stream's id prefix: this process's start
	stop     chan struct{} // closed when the HTTP server shuts down
	stopOnce sync.Once

	mu      sync.Mutex
	open    int // streams holding one of the max places
	runs    map[core.RunID]*runTopic
	runOf   map[core.LeaseID]core.RunID // leases of subscribed runs
	server  map[*subscriber]bool
	seq     uint64     // numbered events published since start
	ring    []numbered // the latest of them, at least ServerEventRing when there were as many
	workers map[core.WorkerID]StreamWorker
	leaseOf map[core.LeaseID]core.WorkerID // current leases (server stream view)
}

func newBroker(max int) *broker {
	return &broker{
		max: max, boot: strconv.FormatInt(time.Now().UnixNano(), 36), stop: make(chan struct{}),
		runs: map[core.RunID]*runTopic{}, runOf: map[core.LeaseID]core.RunID{}, server: map[*subscriber]bool{},
	}
}

func (b *broker) shutdown() { b.stopOnce.Do(func() { close(b.stop) }) }

// reserve takes one of the max places for a new stream; nil when they are
// all taken.
func (b *broker) reserve(run core.RunID) *subscriber {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open >= b.max {
		return nil
	}
	b.open++
	// Fewer than StreamQueue events wait when a publish is queued, each
	// publish at least one, or one publish alone: StreamQueue+2 places
	// never fill first.
	return &subscriber{ch: make(chan []streamEvent, StreamQueue+2), run: run}
}

// leave gives the place back and unregisters s (its handler returned).
func (b *broker) leave(s *subscriber) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.open--
	s.left = true
	b.remove(s)
}

// remove unregisters s (mu held).
func (b *broker) remove(s *subscriber) {
	if s.run == "" {
		delete(b.server, s)
		if len(b.server) == 0 {
			b.workers, b.leaseOf = nil, nil // rebuilt by the next server subscriber
		}
		return
	}
	t := b.runs[s.run]
	if t == nil || !t.subs[s] {
		return
	}
	delete(t.subs, s)
	if len(t.subs) == 0 {
		for l := range t.workerOf {
			delete(b.runOf, l)
		}
		delete(b.runs, s.run)
	}
}

// send queues one publish's events for s without waiting (mu held). A
// stream whose client still has StreamQueue events waiting from more than
// one earlier publish is dropped; otherwise the publish is queued whole.
// evs is shared by the subscribers: nobody changes it after.
func (b *broker) send(s *subscriber, evs []streamEvent) {
	if len(evs) == 0 || s.dropped {
		return
	}
	if s.queued.Load() < StreamQueue || len(s.ch) <= 1 {
		s.queued.Add(int64(len(evs)))
		select {
		case s.ch <- evs:
			return
		default:
		}
	}
	s.dropped = true
	b.remove(s)
	close(s.ch)
}

// subscribeRun registers s for run id's events (loop goroutine, inside a
// snapshot); leases are the run's leases now, by id. False if s's handler
// already left.
func (b *broker) subscribeRun(s *subscriber, id core.RunID, leases []core.LeaseRecord) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s.left {
		return false
	}
	t := b.runs[id]
	if t == nil {
		t = &runTopic{subs: map[*subscriber]bool{}, workerOf: map[core.LeaseID]core.WorkerID{}, stepLease: map[core.StepID]core.LeaseID{}}
		for _, l := range leases {
			t.addLease(l.ID, l.Step, l.Worker)
			b.runOf[l.ID] = id
		}
		b.runs[id] = t
	}
	t.subs[s] = true
	return true
}

func (t *runTopic) addLease(id core.LeaseID, step core.StepID, w core.WorkerID) {
	t.workerOf[id] = w
	if id > t.stepLease[step] {
		t.stepLease[step] = id
	}
}

// serverStart is what a server stream starts from.
type serverStart struct {
	ok      bool // false: its handler already left
	runs    []StreamRun
	workers []StreamWorker
	replay  []numbered // numbered events after the client's cursor
	lost    string     // why the cursor could not be resumed from; "" if it could (or there was none)
	n       uint64     // the server stream's position
}

// subscribeServer registers s for the server stream (loop goroutine,
// inside a snapshot), resuming after server event number after of boot
// (after 0 and boot "": a fresh stream).
func (b *broker) subscribeServer(s *subscriber, o *core.Orchestrator, boot string, after uint64) serverStart {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s.left {
		return serverStart{}
	}
	st := serverStart{ok: true, n: b.seq}
	for _, id := range o.RunIDs() {
		r, status, _ := o.Run(id)
		st.runs = append(st.runs, StreamRun{Run: string(id), Status: status, Finished: r.Finished})
	}
	if len(b.server) == 0 {
		b.workers, b.leaseOf = map[core.WorkerID]StreamWorker{}, map[core.LeaseID]core.WorkerID{}
		for _, l := range o.Leases() {
			if l.Current {
				b.leaseOf[l.ID] = l.Worker
			}
		}
		for _, w := range o.Workers() {
			b.workers[w.ID] = workerView(w.WorkerRecord)
		}
	}
	st.workers = b.workerList()
	switch {
	case boot == "":
	case boot != b.boot:
		st.lost = "the orchestrator restarted since the last event id"
	case after > b.seq:
		st.lost = "the last event id is ahead of this orchestrator's events"
	case after < b.seq:
		i := sort.Search(len(b.ring), func(i int) bool { return b.ring[i].n > after })
		if i == len(b.ring) || b.ring[i].n != after+1 {
			st.lost = fmt.Sprintf("more than %d events passed since the last event id", ServerEventRing)
			break
		}
		st.replay = append(st.replay, b.ring[i:]...)
	}
	b.server[s] = true
	return st
}

// workerView is a worker as the server stream shows it, with its lease
// count from the broker's view (mu held).
func workerView(w core.WorkerRecord) StreamWorker {
	v := StreamWorker{Worker: string(w.ID), Name: w.Name, Slots: w.Slots, Ahead: w.Ahead}
	switch {
	case w.Revoked:
		v.State = "revoked"
	case !w.Active:
		v.State = "inactive"
	case w.DisconnectedAt.IsZero():
		v.State = "connected"
	default:
		v.State = "disconnected"
	}
	return v
}

// workerList is every worker of the view with its current lease count,
// sorted by id (mu held).
func (b *broker) workerList() []StreamWorker {
	count := map[core.WorkerID]int{}
	for _, w := range b.leaseOf {
		count[w]++
	}
	out := make([]StreamWorker, 0, len(b.workers))
	for _, w := range b.workers {
		w.Leases = count[core.WorkerID(w.Worker)]
		out = append(out, w)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Worker < out[j].Worker })
	return out
}

// publish hands one released batch to the streams (loop goroutine, from
// Driver.land: the batch is durable).
func (b *broker) publish(rd core.Ready) {
	b.mu.Lock()
	defer b.mu.Unlock()
	from := len(b.ring)
	for _, ev := range rd.Events {
		b.seq++
		b.ring = append(b.ring, numbered{n: b.seq, e: serverEvent(ev, b.seq)})
	}
	for _, rec := range keyRange(rd.Records, core.KindHistory+"/") {
		if hd, ok := historyHead(rec); ok {
			b.seq++
			b.ring = append(b.ring, numbered{n: b.seq, e: streamEvent{kind: "run", n: b.seq,
				data: StreamRun{Run: string(hd.Run), Status: hd.Status, Finished: true}}})
		}
	}
	if len(b.runs) > 0 {
		b.publishRuns(rd)
	}
	if len(b.server) > 0 {
		b.publishServer(rd, b.ring[from:])
	}
	if len(b.ring) >= 2*ServerEventRing {
		b.ring = append(make([]numbered, 0, 2*ServerEventRing), b.ring[len(b.ring)-ServerEventRing:]...)
	}
}

// keyRange returns the records of rd whose key starts with prefix (the
// records are sorted by key).
func keyRange(recs []core.Record, prefix string) []core.Record {
	i := sort.Search(len(recs), func(i int) bool { return recs[i].Key >= prefix })
	j := i
	for j < len(recs) && strings.HasPrefix(recs[j].Key, prefix) {
		j++
	}
	return recs[i:j]
}

// record returns rd's record under key, if any.
func record(recs []core.Record, key string) (core.Record, bool) {
	i := sort.Search(len(recs), func(i int) bool { return recs[i].Key >= key })
	if i < len(recs) && recs[i].Key == key {
		return recs[i], true
	}
	return core.Record{}, false
}

// publishRuns sends the subscribed runs their part of rd: server events
// and log lines first, then step states, the run's status, and the end
// (mu held).
func (b *broker) publishRuns(rd core.Ready) {
	out := map[core.RunID][]streamEvent{}
	for _, ev := range rd.Events {
		if b.runs[ev.Run] != nil {
			out[ev.Run] = append(out[ev.Run], serverEvent(ev, 0))
		}
	}
	steps := map[core.RunID][]streamEvent{}
	grants := map[core.RunID][]streamEvent{} // leases new to a run: before its lines
	for id, t := range b.runs {
		for _, rec := range keyRange(rd.Records, core.KindStep+"/"+string(id)+"/") {
			if rec.Delete {
				continue
			}
			var s core.StepRecord
			if json.Unmarshal(rec.Value, &s) != nil {
				continue
			}
			if s.Lease != 0 {
				if _, known := t.workerOf[s.Lease]; !known {
					// Granted in this batch: its lease record is here too.
					var w core.WorkerID
					if lr, ok := record(rd.Records, fmt.Sprintf("%s/%020d", core.KindLease, s.Lease)); ok && !lr.Delete {
						var l core.LeaseRecord
						if json.Unmarshal(lr.Value, &l) == nil {
							w = l.Worker
						}
					}
					t.addLease(s.Lease, s.ID, w)
					b.runOf[s.Lease] = id
					grants[id] = append(grants[id], streamEvent{kind: "lease", lease: s.Lease})
				}
			}
			steps[id] = append(steps[id], streamEvent{kind: "step", data: t.step(s)})
		}
	}
	for _, rec := range keyRange(rd.Records, core.KindLog+"/") {
		if rec.Delete || len(rec.Key) < len(core.KindLog)+21 {
			continue
		}
		lease, err := strconv.ParseUint(rec.Key[len(core.KindLog)+1:len(core.KindLog)+21], 10, 64)
		run := b.runOf[core.LeaseID(lease)]
		if err != nil || run == "" {
			continue
		}
		var l core.StepLogLine
		if json.Unmarshal(rec.Value, &l) != nil {
			continue
		}
		out[run] = append(out[run], lineEvent(run, l))
	}
	// A lease whose log closed (its length final, SPEC §3) after its lines:
	// a cursor then counts it done and stops naming it (runCursor).
	closes := map[core.RunID][]streamEvent{}
	for _, rec := range keyRange(rd.Records, core.KindLease+"/") {
		lease, err := strconv.ParseUint(strings.TrimPrefix(rec.Key, core.KindLease+"/"), 10, 64)
		run := b.runOf[core.LeaseID(lease)]
		if err != nil || run == "" || rec.Delete {
			continue
		}
		var l core.LeaseRecord
		if json.Unmarshal(rec.Value, &l) == nil && !l.LogOpen() {
			closes[run] = append(closes[run], streamEvent{kind: "closed", lease: l.ID})
		}
	}
	for id, t := range b.runs {
		evs := append(append(append(grants[id], out[id]...), closes[id]...), steps[id]...)
		ended := false
		if rec, ok := record(rd.Records, core.KindRun+"/"+string(id)); ok && !rec.Delete {
			var r core.RunRecord
			if json.Unmarshal(rec.Value, &r) == nil {
				evs = append(evs, streamEvent{kind: "run", data: StreamRun{Run: string(id), Status: r.LiveStatus(), Finished: r.Finished}})
			}
		}
		if rec, ok := record(rd.Records, core.HistoryKey(id)); ok && !rec.Delete {
			var h core.RunHistory
			if json.Unmarshal(rec.Value, &h) == nil {
				for _, l := range h.Leases {
					t.addLease(l.ID, l.Step, l.Worker)
				}
				for _, s := range h.Steps {
					evs = append(evs, streamEvent{kind: "step", data: t.step(s)})
				}
				evs = append(evs, streamEvent{kind: "run", data: StreamRun{Run: string(id), Status: h.Status, Finished: true}},
					streamEvent{kind: "end", data: StreamEnd{Run: string(id), Status: h.Status}})
				ended = true
			}
		}
		for s := range t.subs {
			b.send(s, evs)
		}
		if ended { // the run left the core: its streams end
			for s := range t.subs {
				b.remove(s)
				close(s.ch)
			}
		}
	}
}

// step is a step's event, with its latest lease and that lease's worker.
func (t *runTopic) step(s core.StepRecord) StreamStep {
	v := StreamStep{Run: string(s.Run), Step: string(s.ID), State: s.State.String(), Attempts: s.Attempts,
		StartedAt: s.StartedAt, FinishedAt: s.FinishedAt}
	if l := t.stepLease[s.ID]; l != 0 {
		v.Lease, v.Worker = uint64(l), string(t.workerOf[l])
	}
	if s.Outcome != nil && (s.Outcome.Status == core.OutcomeSuccess || s.Outcome.Status == core.OutcomeFailure) {
		code := s.Outcome.ExitCode
		v.Exit = &code
	}
	return v
}

func serverEvent(ev core.ServerEvent, n uint64) streamEvent {
	return streamEvent{kind: "server", seq: ev.Seq, n: n, data: StreamServerEvent{Run: string(ev.Run),
		Event: APIEvent{Seq: ev.Seq, At: ev.At, Step: string(ev.Step), Kind: ev.Kind, Message: ev.Message}}}
}

// lineEvent is a stored line's event: a gap marker (sequence 0, not an
// event) is a "gap", as GET /api/runs/{id}/logs flags it.
func lineEvent(run core.RunID, l core.StepLogLine) streamEvent {
	kind := "log"
	if l.Line.Seq == 0 && !l.Event {
		kind = "gap"
	}
	return streamEvent{kind: kind, lease: l.Lease, index: l.Index, data: StreamLine{
		Run: string(run), Step: string(l.Step), Lease: uint64(l.Lease), Index: l.Index, Seq: l.Line.Seq,
		At: l.Line.At, Text: l.Line.Text, Event: l.Event}}
}

// publishServer sends the server streams rd's run states, its numbered
// events (server events, runs' ends) and worker changes (mu held).
func (b *broker) publishServer(rd core.Ready, nums []numbered) {
	var evs []streamEvent
	for _, rec := range keyRange(rd.Records, core.KindRun+"/") {
		var r core.RunRecord
		if !rec.Delete && json.Unmarshal(rec.Value, &r) == nil {
			evs = append(evs, streamEvent{kind: "run", data: StreamRun{Run: string(r.ID), Status: r.LiveStatus(), Finished: r.Finished}})
		}
	}
	for _, nb := range nums {
		evs = append(evs, nb.e)
	}
	changed := map[core.WorkerID]bool{}
	for _, rec := range keyRange(rd.Records, core.KindLease+"/") {
		id, err := strconv.ParseUint(strings.TrimPrefix(rec.Key, core.KindLease+"/"), 10, 64)
		if err != nil {
			continue
		}
		if old, ok := b.leaseOf[core.LeaseID(id)]; ok {
			changed[old] = true
			delete(b.leaseOf, core.LeaseID(id))
		}
		var l core.LeaseRecord
		if !rec.Delete && json.Unmarshal(rec.Value, &l) == nil && l.Current {
			b.leaseOf[l.ID] = l.Worker
			changed[l.Worker] = true
		}
	}
	removed := map[core.WorkerID]bool{}
	for _, rec := range keyRange(rd.Records, core.KindWorker+"/") {
		id := core.WorkerID(strings.TrimPrefix(rec.Key, core.KindWorker+"/"))
		var w core.WorkerRecord
		switch {
		case rec.Delete:
			if v, ok := b.workers[id]; ok {
				delete(b.workers, id)
				v.State, v.Leases = "removed", 0
				evs = append(evs, streamEvent{kind: "worker", data: v})
				removed[id] = true
			}
		case json.Unmarshal(rec.Value, &w) == nil:
			b.workers[id] = workerView(w)
			changed[id] = true
		}
	}
	if len(changed) > 0 {
		for _, w := range b.workerList() {
			if changed[core.WorkerID(w.Worker)] && !removed[core.WorkerID(w.Worker)] {
				evs = append(evs, streamEvent{kind: "worker", data: w})
			}
		}
	}
	for s := range b.server {
		b.send(s, evs)
	}
}

// historyHead decodes only the head of a history record.
func historyHead(rec core.Record) (core.HistoryHead, bool) {
	if rec.Delete {
		return core.HistoryHead{}, false
	}
	hd, ok, err := store.DecodeHead(rec.Value)
	return hd, ok && err == nil
}

// ---- cursors (the events' ids) ----

// runCursor is how far a run stream has gone: its server events up to
// sequence events, and each lease's log. A lease is *done* once its log is
// closed (core.LeaseRecord.LogOpen: its length is final) and all of it was
// sent; the cursor keeps only the leases that are not, so its text stays
// as short as the run's current leases (SPEC §17; and those a version 1
// worker committed, whose logs stay open). Its text (an event id)
// is "<events>:<below>:" then, by lease id, "<lease>.<count>" separated by
// commas: "3:12:9.4,13.2" (lease 9 has sent 4 lines, 13 two; every other
// lease under 12 is done; every other at or over 12 has sent nothing). The
// id of earlier releases, "<events>:<lease>.<count>,...", reads as below 0.
type runCursor struct {
	events int
	below  core.LeaseID         // every lease under it that count does not hold is done
	count  map[core.LeaseID]int // lines sent of each lease that is not done (0 for some under below)
}

// maxCursorLeases bounds the leases a Last-Event-ID may name.
const maxCursorLeases = 100000

func parseRunCursor(s string) (runCursor, error) {
	c := runCursor{count: map[core.LeaseID]int{}}
	if s == "" {
		return c, nil
	}
	bad := fmt.Errorf("Last-Event-ID %s is not an id of this run stream (<events>:<below>:<lease>.<count>,...)", core.Quote(s))
	ev, rest, ok := strings.Cut(s, ":")
	n, err := strconv.Atoi(ev)
	if !ok || err != nil || n < 0 {
		return c, bad
	}
	c.events = n
	if b, list, two := strings.Cut(rest, ":"); two {
		w, err := strconv.ParseUint(b, 10, 64)
		if err != nil {
			return c, bad
		}
		c.below, rest = core.LeaseID(w), list
	}
	if rest == "" {
		return c, nil
	}
	parts := strings.Split(rest, ",")
	if len(parts) > maxCursorLeases {
		return c, bad
	}
	for _, p := range parts {
		ls, cs, ok := strings.Cut(p, ".")
		l, err1 := strconv.ParseUint(ls, 10, 64)
		k, err2 := strconv.Atoi(cs)
		if !ok || err1 != nil || err2 != nil || l == 0 || k < 0 {
			return c, bad
		}
		if _, dup := c.count[core.LeaseID(l)]; dup {
			return c, bad
		}
		c.count[core.LeaseID(l)] = k
	}
	return c, nil
}

// String is the cursor's text: the leases under below that are not done,
// and those at or over it with lines sent.
func (c *runCursor) String() string {
	order := make([]core.LeaseID, 0, len(c.count))
	for l, k := range c.count {
		if l < c.below || k > 0 {
			order = append(order, l)
		}
	}
	slices.Sort(order)
	var sb strings.Builder
	sb.WriteString(strconv.Itoa(c.events))
	sb.WriteByte(':')
	sb.WriteString(strconv.FormatUint(uint64(c.below), 10))
	sb.WriteByte(':')
	for i, l := range order {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(strconv.FormatUint(uint64(l), 10))
		sb.WriteByte('.')
		sb.WriteString(strconv.Itoa(c.count[l]))
	}
	return sb.String()
}

// done reports whether all of lease l was sent and its log is closed.
func (c *runCursor) done(l core.LeaseID) bool {
	_, open := c.count[l]
	return !open && l < c.below
}

// sent is how many of lease l's lines were sent: -1 if it is done.
func (c *runCursor) sent(l core.LeaseID) int {
	if c.done(l) {
		return -1
	}
	return c.count[l]
}

// learn notes a lease of the run: unless it is done, it is held, so the
// cursor's text names it once below passes it.
func (c *runCursor) learn(l core.LeaseID) {
	if _, held := c.count[l]; !held && !c.done(l) {
		c.count[l] = 0
	}
}

// close notes that lease l's log is closed and every line of it was sent
// (its lines come before its close on a stream). A lease the cursor never
// learned is left alone: below never passes a lease it does not hold.
func (c *runCursor) close(l core.LeaseID) {
	if _, held := c.count[l]; !held {
		return
	}
	delete(c.count, l)
	c.below = max(c.below, l+1)
}

// admit reports whether e is new to the stream, and advances the cursor
// past it. The stream's own kinds ("lease", "closed") are never written.
func (c *runCursor) admit(e streamEvent) bool {
	switch e.kind {
	case "server":
		if e.seq <= c.events {
			return false
		}
		c.events = e.seq
	case "log", "gap":
		k := c.sent(e.lease)
		if k < 0 || e.index < k {
			return false
		}
		c.count[e.lease] = e.index + 1
	case "lease":
		c.learn(e.lease)
		return false
	case "closed":
		c.close(e.lease)
		return false
	}
	return true
}

// parseServerCursor reads a server stream id, "<boot>.<n>".
func parseServerCursor(s string) (boot string, n uint64, err error) {
	if s == "" {
		return "", 0, nil
	}
	b, ns, ok := strings.Cut(s, ".")
	n, perr := strconv.ParseUint(ns, 10, 64)
	if !ok || b == "" || perr != nil {
		return "", 0, fmt.Errorf("Last-Event-ID %s is not an id of the server stream (<start>.<n>)", core.Quote(s))
	}
	return b, n, nil
}

// ---- the handlers ----

// runEvents answers GET /api/runs/{id}/events, serverEvents GET
// /api/events. A stream has no answer deadline (its route says so); the
// per-write deadlines still cut a client that stops reading (SPEC §12).
func (a *api) runEvents(w http.ResponseWriter, r *http.Request) {
	a.stream(w, r, core.RunID(r.PathValue("id")))
}

func (a *api) serverEvents(w http.ResponseWriter, r *http.Request) { a.stream(w, r, "") }

// stream answers a live stream: run's, or the server's when run is "".
func (a *api) stream(w http.ResponseWriter, r *http.Request, run core.RunID) {
	b := a.d.streams
	last := r.Header.Get("Last-Event-ID")
	var (
		rc   runCursor
		boot string
		n    uint64
		err  error
	)
	if run != "" {
		rc, err = parseRunCursor(last)
	} else {
		boot, n, err = parseServerCursor(last)
	}
	if err != nil {
		a.fail(w, r, errorf(http.StatusBadRequest, "%v", err))
		return
	}
	sub := b.reserve(run)
	if sub == nil {
		w.Header().Set("Retry-After", "5")
		a.fail(w, r, errorf(http.StatusServiceUnavailable, "too many live event streams are open (the limit is %d); try again later", b.max))
		return
	}
	defer b.leave(sub)
	if run != "" {
		a.runStream(w, r, sub, run, rc)
	} else {
		a.serverStream(w, r, sub, boot, n)
	}
}

// sse writes events to one stream.
type sse struct {
	w  *bufio.Writer
	rc *http.ResponseController
}

func startSSE(w http.ResponseWriter) *sse {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Accel-Buffering", "no") // proxies: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	s := &sse{w: bufio.NewWriter(w), rc: http.NewResponseController(w)}
	fmt.Fprintf(s.w, "retry: %d\n\n", streamRetryMillis)
	return s
}

func (s *sse) event(kind, id string, data any) {
	b, err := json.Marshal(data)
	if err != nil {
		b = []byte(`{}`)
	}
	fmt.Fprintf(s.w, "event: %s\nid: %s\ndata: %s\n\n", kind, id, b)
}

func (s *sse) flush() error {
	if err := s.w.Flush(); err != nil {
		return err
	}
	return s.rc.Flush()
}

// follow writes sub's live events until the stream ends, is dropped, the
// client goes or the server stops. write turns one event into frames; it
// returns true once the stream must end (after "end").
func (a *api) follow(r *http.Request, s *sse, sub *subscriber, write func(streamEvent) bool) {
	ping := time.NewTicker(streamHeartbeat)
	defer ping.Stop()
	for {
		select {
		case evs, ok := <-sub.ch:
			if !ok {
				// Dropped (it fell behind) or the run ended after an
				// "end" that did not fit: the client reconnects and resumes.
				s.flush()
				return
			}
			end := writeAll(sub, evs, write)
			for !end && len(sub.ch) > 0 { // write what is queued, then flush once
				if evs, ok = <-sub.ch; !ok {
					break
				}
				end = writeAll(sub, evs, write)
			}
			if s.flush() != nil || end {
				return
			}
		case <-ping.C:
			s.w.WriteString(": ping\n\n")
			if s.flush() != nil {
				return
			}
		case <-r.Context().Done():
			return
		case <-a.d.streams.stop:
			return
		case <-a.d.ended:
			return
		}
	}
}

// writeAll writes one publish's events until one ends the stream, and
// takes them off the subscriber's count.
func writeAll(sub *subscriber, evs []streamEvent, write func(streamEvent) bool) bool {
	defer sub.queued.Add(-int64(len(evs)))
	for _, e := range evs {
		if write(e) {
			return true
		}
	}
	return false
}

// runStream is GET /api/runs/{id}/events.
func (a *api) runStream(w http.ResponseWriter, r *http.Request, sub *subscriber, id core.RunID, cur runCursor) {
	ctx, cancel := context.WithTimeout(r.Context(), apiTimeout)
	defer cancel()
	var (
		src   runSource
		lines [][]core.StepLogLine // a view of each lease's log (by lease id), shared with the core
		found bool
	)
	err := a.d.Snapshot(ctx, func(o *core.Orchestrator) {
		if src, found = liveSource(o, id); !found {
			return
		}
		for _, l := range src.leases {
			// Nothing of a log is copied on the loop: a view of what the
			// cursor has not seen, read below, off the loop.
			if k := cur.sent(l.ID); k >= 0 {
				if v := o.LeaseLogsView(l.ID, k); len(v) > 0 {
					lines = append(lines, v)
				}
			}
		}
		a.d.streams.subscribeRun(sub, id, src.leases)
	})
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if !found {
		h, ok, err := a.history(id)
		if err == nil && ok {
			src = archivedSource(h) // its lines are read a page at a time, below
		}
		if err != nil {
			a.fail(w, r, err)
			return
		}
		if !ok {
			a.fail(w, r, errorf(http.StatusNotFound, "unknown run %q", id))
			return
		}
	}
	s := startSSE(w)
	// The snapshot: every step's state, the run's status, then the server
	// events and stored lines the client has not seen.
	t := &runTopic{workerOf: map[core.LeaseID]core.WorkerID{}, stepLease: map[core.StepID]core.LeaseID{}}
	for _, l := range src.leases {
		t.addLease(l.ID, l.Step, l.Worker)
	}
	for _, l := range src.leases { // by id
		cur.learn(l.ID)
	}
	for _, st := range src.steps {
		s.event("step", cur.String(), t.step(st))
	}
	s.event("run", cur.String(), StreamRun{Run: string(id), Status: src.status, Finished: src.run.Finished})
	for _, ev := range src.events {
		if e := serverEvent(ev, 0); cur.admit(e) {
			s.event(e.kind, cur.String(), e.data)
		}
	}
	// The lines come lease by lease, by id; a lease whose log is closed is
	// done after its last (so the ids name only the leases not done).
	k := 0
	for _, l := range src.leases {
		if !found {
			break // archived: below
		}
		if k < len(lines) && lines[k][0].Lease == l.ID {
			for _, ln := range lines[k] {
				if e := lineEvent(id, ln); cur.admit(e) {
					s.event(e.kind, cur.String(), e.data)
				}
			}
			k++
		}
		if !l.LogOpen() {
			cur.close(l.ID)
		}
	}
	if !found { // archived: its lines, a page at a time, then its end
		if err := a.archivedStream(&src, &cur, s); err != nil { // the client resumes from what it heard
			a.d.log.Warn("archived run stream cut", "run", string(id), "err", err)
			return
		}
		s.event("end", cur.String(), StreamEnd{Run: string(id), Status: src.status})
		s.flush()
		return
	}
	if s.flush() != nil {
		return
	}
	a.follow(r, s, sub, func(e streamEvent) bool {
		if cur.admit(e) {
			s.event(e.kind, cur.String(), e.data)
		}
		return e.kind == "end"
	})
}

// archivedStream writes an archived run's lines the cursor has not seen, a
// page at a time, lease by lease in id order: every lease is done after
// its last line (an archived run's logs are closed).
func (a *api) archivedStream(src *runSource, cur *runCursor, s *sse) error {
	var ids []core.LeaseID
	for _, l := range src.leases {
		if !cur.done(l.ID) {
			ids = append(ids, l.ID)
		}
	}
	k := 0 // ids[:k] are done
	for after := ""; len(ids) > 0; {
		page, next, err := a.d.st.HistoryLogs(ids, after, store.MaxLogPage)
		if err != nil {
			return err
		}
		for _, l := range page {
			for ; k < len(ids) && ids[k] < l.Lease; k++ {
				cur.close(ids[k])
			}
			if e := lineEvent(src.run.ID, l); cur.admit(e) {
				s.event(e.kind, cur.String(), e.data)
			}
		}
		if err := s.flush(); err != nil {
			return err
		}
		if next == "" {
			break
		}
		after = next
	}
	for ; k < len(ids); k++ {
		cur.close(ids[k])
	}
	return nil
}

// serverStream is GET /api/events.
func (a *api) serverStream(w http.ResponseWriter, r *http.Request, sub *subscriber, boot string, after uint64) {
	ctx, cancel := context.WithTimeout(r.Context(), apiTimeout)
	defer cancel()
	var st serverStart
	err := a.d.Snapshot(ctx, func(o *core.Orchestrator) { st = a.d.streams.subscribeServer(sub, o, boot, after) })
	if err == nil && !st.ok {
		err = context.Canceled
	}
	if err != nil {
		a.fail(w, r, err)
		return
	}
	pos := after // the client's position until the replay catches up
	if st.lost != "" || boot == "" {
		pos = st.n
	}
	b := a.d.streams
	id := func() string { return b.boot + "." + strconv.FormatUint(pos, 10) }
	s := startSSE(w)
	for _, v := range st.runs {
		s.event("run", id(), v)
	}
	for _, v := range st.workers {
		s.event("worker", id(), v)
	}
	if st.lost != "" {
		s.event("lost", id(), StreamLost{Reason: st.lost})
	}
	for _, nb := range st.replay {
		pos = nb.n
		s.event(nb.e.kind, id(), nb.e.data)
	}
	if s.flush() != nil {
		return
	}
	a.follow(r, s, sub, func(e streamEvent) bool {
		if e.n != 0 { // numbered
			if e.n <= pos {
				return false
			}
			pos = e.n
		}
		s.event(e.kind, id(), e.data)
		return false
	})
}
