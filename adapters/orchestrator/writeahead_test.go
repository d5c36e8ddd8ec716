package orchestrator_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/adapters/wire"
	"github.com/tether-run/tether/core"
)

var errInjected = errors.New("injected store failure")

// slowStore wraps the bbolt store: it delays every Apply (widening the
// window a send-before-persist would slip through), remembers what is
// durable, and can be told to fail.
type slowStore struct {
	*store.Store
	delay   time.Duration
	fail    atomic.Bool
	dataOps atomic.Int64 // data writes made durable

	mu      sync.Mutex
	durable core.Disk
}

func (s *slowStore) Apply(recs []core.Record) error {
	if s.fail.Load() {
		return errInjected
	}
	time.Sleep(s.delay)
	if err := s.Store.Apply(recs); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.durable.Apply(recs)
	return nil
}

// ApplyWithData is Apply with data writes: the same delay and failure, and
// it counts the data writes made durable.
func (s *slowStore) ApplyWithData(recs []core.Record, ops []store.DataOp) ([]store.DataResult, error) {
	if s.fail.Load() {
		return nil, errInjected
	}
	time.Sleep(s.delay)
	res, err := s.Store.ApplyWithData(recs, ops)
	if err != nil {
		return nil, err
	}
	s.dataOps.Add(int64(len(ops)))
	s.mu.Lock()
	defer s.mu.Unlock()
	s.durable.Apply(recs)
	return res, nil
}

// get decodes the durable record under key, nil if there is none.
func (s *slowStore) get(t *testing.T, key string) any {
	t.Helper()
	s.mu.Lock()
	v, ok := s.durable[key]
	s.mu.Unlock()
	if !ok {
		return nil
	}
	rec, err := core.DecodeRecord(core.Record{Key: key, Value: v})
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func leaseKey(l core.LeaseID) string { return fmt.Sprintf("%s/%020d", core.KindLease, l) }

// rawWorker speaks the protocol by hand.
type rawWorker struct {
	t  testing.TB
	ws *websocket.Conn
}

func (w rawWorker) send(m core.Msg) {
	w.t.Helper()
	b, err := wire.Encode(m)
	if err != nil {
		w.t.Fatal(err)
	}
	if err := w.ws.WriteMessage(websocket.TextMessage, b); err != nil {
		w.t.Fatal(err)
	}
}

func (w rawWorker) recv() core.Msg {
	w.t.Helper()
	w.ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, b, err := w.ws.ReadMessage()
	if err != nil {
		w.t.Fatal(err)
	}
	m, err := wire.Decode(b)
	if err != nil {
		w.t.Fatal(err)
	}
	return m
}

// startSlow starts a Driver on a slowStore (50 ms per commit), with the
// operator API if adminToken is set.
func startSlow(t *testing.T, adminToken string) (*slowStore, *orchestrator.Driver) {
	t.Helper()
	bst, err := store.Open(filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	st := &slowStore{Store: bst, delay: 50 * time.Millisecond, durable: core.Disk{}}
	d, err := orchestrator.Start(orchestrator.Options{Addr: "127.0.0.1:0", Store: st, Logger: testLogger(t), AdminToken: adminToken})
	if err != nil {
		t.Fatal(err)
	}
	return st, d
}

// TestWriteAhead checks duty 3-4 from the outside: at the moment an answer
// or a message arrives, the batch that produced it is already durable.
func TestWriteAhead(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	st, d := startSlow(t, "")
	defer d.Close()

	tok, err := d.CreateToken(ctx, "raw", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if st.get(t, "token/raw") == nil {
		t.Fatal("CreateToken answered before its token record was durable")
	}

	ws, _, err := websocket.DefaultDialer.DialContext(ctx, d.URL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	w := rawWorker{t, ws}
	w.send(core.Hello{Version: core.ProtocolVersion, Token: tok, Worker: "raw-1", Slots: 1, MaxDelay: time.Second})
	if m, ok := w.recv().(core.Welcome); !ok || m.Credential == "" {
		t.Fatalf("want a Welcome with a credential, got %s", core.DescribeMsg(m))
	}
	if st.get(t, "worker/raw-1") == nil {
		t.Fatal("Welcome sent before the worker record was durable")
	}

	run, err := d.Submit(ctx, core.RunSpec{Name: "wa", Steps: []core.StepSpec{{Name: "only", Command: "true", Writes: true}}})
	if err != nil {
		t.Fatal(err)
	}
	if st.get(t, "run/"+string(run)) == nil {
		t.Fatal("Submit answered before its run record was durable")
	}
	dm, ok := w.recv().(core.Dispatch)
	if !ok {
		t.Fatalf("want a Dispatch, got %s", core.DescribeMsg(dm))
	}
	if l, _ := st.get(t, leaseKey(dm.Lease)).(*core.LeaseRecord); l == nil || !l.Current {
		t.Fatal("Dispatch sent before its lease grant was durable")
	}
	stepKey := "step/" + string(dm.Step)

	w.send(core.Start{Lease: dm.Lease, Request: 1})
	if m, ok := w.recv().(core.StartAck); !ok || !m.OK {
		t.Fatalf("want StartAck OK, got %s", core.DescribeMsg(m))
	}
	if s, _ := st.get(t, stepKey).(*core.StepRecord); s == nil || s.State != core.StateRunning || !s.EverStarted {
		t.Fatal("StartAck sent before START was durable (the start handshake)")
	}

	w.send(core.Report{Step: dm.Step, Lease: dm.Lease, Request: 2, Outcome: core.Outcome{Status: core.OutcomeSuccess}})
	if m, ok := w.recv().(core.Answer); !ok || m.Verdict != core.Committed {
		t.Fatalf("want Answer COMMITTED, got %s", core.DescribeMsg(m))
	}
	// The run finished with that report: it left the core in the same
	// batch (SPEC §7a), so its step is durable in the run's history record.
	if h, _ := st.get(t, core.HistoryKey(dm.Run)).(*core.RunHistory); h == nil {
		t.Fatal("COMMITTED answered before the run's history was durable")
	} else if s, ok := h.Step(dm.Step); !ok || s.State != core.StateSuccess {
		t.Fatal("COMMITTED answered before the step's success was durable")
	}

	// A store that fails stops the driver: nothing of the failed batch is
	// answered or sent, and Close reports why.
	st.fail.Store(true)
	if _, err := d.Submit(ctx, core.RunSpec{Name: "doomed", Steps: []core.StepSpec{{Name: "x", Command: "true"}}}); !errors.Is(err, orchestrator.ErrClosed) {
		t.Fatalf("Submit with a failing store: err = %v, want ErrClosed", err)
	}
	select {
	case <-d.Done():
	case <-ctx.Done():
		t.Fatal("driver did not stop after a store failure")
	}
	if err := d.Close(); !errors.Is(err, errInjected) {
		t.Fatalf("Close = %v, want the store failure", err)
	}
	ws.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, b, err := ws.ReadMessage(); err == nil {
		t.Fatalf("after the store failure the worker still received %s", strings.TrimSpace(string(b)))
	}
}

// overlapStore is slowStore that also notices two commits at once.
type overlapStore struct {
	*slowStore
	active, overlaps atomic.Int32
	applies          atomic.Int32
}

func (s *overlapStore) Apply(recs []core.Record) error {
	if s.active.Add(1) > 1 {
		s.overlaps.Add(1)
	}
	defer s.active.Add(-1)
	s.applies.Add(1)
	return s.slowStore.Apply(recs)
}

// TestPipelinedWriteAhead checks the pipeline of SPEC §11 under load: with
// a commit taking 20 ms and submissions arriving all the while, at most one
// commit runs at a time, every Submit is answered only once its run record
// is durable, a read through the loop sees only durable runs, and what
// arrives while a commit is under way shares the next one (fewer commits
// than submissions).
func TestPipelinedWriteAhead(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	bst, err := store.Open(filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	st := &overlapStore{slowStore: &slowStore{Store: bst, delay: 20 * time.Millisecond, durable: core.Disk{}}}
	d, err := orchestrator.Start(orchestrator.Options{Addr: "127.0.0.1:0", Store: st, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	st.applies.Store(0)

	const submitters, each = 8, 10
	var wg sync.WaitGroup
	errs := make(chan error, submitters*each*2)
	spec := core.RunSpec{Name: "p", Steps: []core.StepSpec{{Name: "a", Command: "true"}}}
	for range submitters {
		wg.Go(func() {
			for range each {
				id, err := d.Submit(ctx, spec)
				if err != nil {
					errs <- err
					return
				}
				if st.get(t, "run/"+string(id)) == nil {
					errs <- fmt.Errorf("Submit answered %s before its run record was durable", id)
				}
				err = d.Snapshot(ctx, func(o *core.Orchestrator) {
					for _, r := range o.RunIDs() {
						if st.get(t, "run/"+string(r)) == nil {
							errs <- fmt.Errorf("a read through the loop saw %s before its run record was durable", r)
						}
					}
				})
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := st.overlaps.Load(); n > 0 {
		t.Errorf("%d commits began while another was under way; at most one may be in flight", n)
	}
	if n := st.applies.Load(); n >= submitters*each {
		t.Errorf("%d commits for %d submissions: nothing gathered while a commit was under way", n, submitters*each)
	}
}

// TestSnapshotAbandoned: a caller that gives up on Snapshot (its context
// ends while the loop waits on a slow commit) may read what its function
// writes at once: the function then never runs, or has run to its end.
// Under -race (as make test runs it) a function the loop runs while the
// caller reads is a reported race.
func TestSnapshotAbandoned(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	bst, err := store.Open(filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	st := &slowStore{Store: bst, delay: 30 * time.Millisecond, durable: map[string][]byte{}}
	d, err := orchestrator.Start(orchestrator.Options{Addr: "127.0.0.1:0", Store: st, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	spec := core.RunSpec{Name: "s", Steps: []core.StepSpec{{Name: "a", Command: "true"}}}
	gaveUp := 0
	for range 20 {
		go d.Submit(ctx, spec) // a commit in flight: the query waits for it
		qctx, qcancel := context.WithTimeout(ctx, time.Millisecond)
		n := -1
		err := d.Snapshot(qctx, func(o *core.Orchestrator) { n = len(o.RunIDs()) })
		qcancel()
		if err != nil {
			gaveUp++
			if n != -1 {
				t.Fatalf("Snapshot gave up (%v) but its function ran", err)
			}
		} else if n < 0 {
			t.Fatal("Snapshot succeeded without running its function")
		}
	}
	if gaveUp == 0 {
		t.Fatal("no Snapshot gave up: the test did not reach the case it is for")
	}
}

// pipeStore is a store.Pipeline of depth 3 over the bbolt store that keeps
// none of the pipeline's order itself: each place commits on its own, the
// odd places 40 ms late, so the even place after one is durable first.
// What it shows is the driver's half of SPEC §11: a group leaves only once
// it and every group before it are durable, whatever order the store's
// answers come in.
type pipeStore struct {
	*store.Store
	mu                sync.Mutex
	next              int            // places reserved
	placeOf           map[string]int // a run record's key → the place that first wrote it
	durable           map[int]bool   // places whose batch is durable
	active, maxActive int            // places running at once
	failAt            int            // this place fails (0: none)
}

func (s *pipeStore) PipelineDepth() int { return 3 }

func (s *pipeStore) Reserve() func([]core.Record) error {
	s.mu.Lock()
	s.next++
	p := s.next
	s.mu.Unlock()
	return func(recs []core.Record) error {
		s.mu.Lock()
		s.active++
		s.maxActive = max(s.maxActive, s.active)
		for _, r := range recs {
			if _, ok := s.placeOf[r.Key]; !ok && strings.HasPrefix(r.Key, core.KindRun+"/") {
				s.placeOf[r.Key] = p
			}
		}
		fail := p == s.failAt
		s.mu.Unlock()
		if p%2 == 1 {
			time.Sleep(40 * time.Millisecond)
		}
		err := errInjected
		if !fail {
			err = s.Store.Apply(recs)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.active--
		s.durable[p] = err == nil
		return err
	}
}

// check says what is wrong with run's Submit having been answered: its
// place, or one before it, not durable.
func (s *pipeStore) check(run core.RunID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.placeOf["run/"+string(run)]
	if !ok {
		return fmt.Errorf("Submit answered %s, which no place wrote", run)
	}
	for q := 1; q <= p; q++ {
		if !s.durable[q] {
			return fmt.Errorf("Submit answered %s (place %d) while place %d was not durable", run, p, q)
		}
	}
	return nil
}

// TestPipelineWriteAhead: on a store.Pipeline, several groups are in flight
// at once (never more than its depth), and a group's answers leave only
// once every group up to it is durable; when a place fails, nothing of it
// or of any later group leaves, even of those the store made durable, and
// the driver stops.
func TestPipelineWriteAhead(t *testing.T) {
	// The case the test is for (a later place durable, with a Submit in
	// it, after the failed one) depends on the goroutines' timing: try a
	// few times, and fail if it is never reached.
	const attempts = 10
	for range attempts {
		if pipelineWriteAhead(t) || t.Failed() {
			return
		}
	}
	t.Fatalf("in %d attempts no place after the failed one was durable with a Submit in it: the test did not reach the case it is for", attempts)
}

// pipelineWriteAhead is one attempt of TestPipelineWriteAhead; it says
// whether the place after the failed one was durable and held a Submit.
func pipelineWriteAhead(t *testing.T) bool {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	bst, err := store.Open(filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	st := &pipeStore{Store: bst, placeOf: map[string]int{}, durable: map[int]bool{}}
	d, err := orchestrator.Start(orchestrator.Options{Addr: "127.0.0.1:0", Store: st, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()

	spec := core.RunSpec{Name: "p", Steps: []core.StepSpec{{Name: "a", Command: "true"}}}
	submit := func(submitters, each int) (answered int, errs []error) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range submitters {
			wg.Go(func() {
				for range each {
					id, err := d.Submit(ctx, spec)
					mu.Lock()
					if err == nil {
						answered++
						err = st.check(id)
					} else if errors.Is(err, orchestrator.ErrClosed) {
						err = nil
					}
					if err != nil {
						errs = append(errs, err)
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		return answered, errs
	}
	if _, errs := submit(8, 10); len(errs) > 0 {
		t.Fatal(errs)
	}
	st.mu.Lock()
	most := st.maxActive
	st.failAt = st.next + 3 // an odd place, whose next one is durable first
	if st.failAt%2 == 0 {
		st.failAt++
	}
	failAt := st.failAt
	st.mu.Unlock()
	if most > 3 || most < 2 {
		t.Errorf("at most %d groups were in flight at once; want 2 or 3 (the store's depth, 3)", most)
	}

	answered, errs := submit(8, 10)
	for _, err := range errs {
		t.Error(err)
	}
	select {
	case <-d.Done():
	case <-ctx.Done():
		t.Fatal("the driver did not stop after a failed place")
	}
	if err := d.Close(); !errors.Is(err, errInjected) {
		t.Fatalf("Close = %v, want the failed place's error", err)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.durable[failAt+1] {
		t.Logf("place %d after the failed one was not made durable by the store (%d answered)", failAt+1, answered)
		return false
	}
	for _, p := range st.placeOf {
		if p == failAt+1 {
			return true
		}
	}
	t.Logf("place %d after the failed one was durable but held no Submit (%d answered)", failAt+1, answered)
	return false
}
