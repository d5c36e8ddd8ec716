package orchestrator

// The data plane's verbs beyond put, append and read (SPEC §14):
// idempotent writes (Tether-Request-Id), attributes (Tether-Attribute),
// queries, and what a step reads of the orchestrator — its definition,
// another step's output, the pool.

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/tether-run/tether/adapters/dataplane"
	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/core"
)

// requestKey names a write's first answer: its lease and request id.
type requestKey struct {
	lease core.LeaseID
	id    string
}

// pendingRequest counts the ops of a request key admitted into groups not
// yet durable, and the worker that wrote them.
type pendingRequest struct {
	worker core.WorkerID
	n      int
}

// released forgets the request keys of a group that landed (or failed).
func (d *Driver) released(ops []store.DataOp) {
	for _, op := range ops {
		if op.Request == "" {
			continue
		}
		k := requestKey{lease: core.LeaseID(op.Lease), id: op.Request}
		if pr := d.pendingReq[k]; pr.n > 1 {
			pr.n--
			d.pendingReq[k] = pr
		} else {
			delete(d.pendingReq, k)
		}
	}
}

// credWorker is the worker a session credential names ("<worker>.<secret>");
// only meaningful once the credential was accepted.
func credWorker(cred string) core.WorkerID {
	w, _, _ := strings.Cut(cred, ".")
	return core.WorkerID(w)
}

// requestID reads a write's Tether-Request-Id ("" when it sends none: the
// write is made, but not idempotent).
func requestID(r *http.Request) (string, error) {
	vs := r.Header.Values(dataplane.RequestIDHeader)
	switch len(vs) {
	case 0:
		return "", nil
	case 1:
		if err := store.ValidateRequestID(vs[0]); err != nil {
			return "", err
		}
		return vs[0], nil
	}
	return "", &httpError{code: http.StatusBadRequest, msg: fmt.Sprintf("%d %s headers: send one", len(vs), dataplane.RequestIDHeader)}
}

// attributes reads a PUT's Tether-Attribute headers (k=v each), within the
// store's bounds.
func attributes(r *http.Request) (map[string]string, error) {
	vs := r.Header.Values(dataplane.AttributeHeader)
	if len(vs) == 0 {
		return nil, nil
	}
	if len(vs) > store.MaxAttributes {
		return nil, fmt.Errorf("%w: %d %s headers, at most %d", store.ErrBadAttribute, len(vs), dataplane.AttributeHeader, store.MaxAttributes)
	}
	out := make(map[string]string, len(vs))
	for _, v := range vs {
		k, val, ok := strings.Cut(v, "=")
		if !ok {
			return nil, fmt.Errorf("%w: %s %s: want key=value", store.ErrBadAttribute, dataplane.AttributeHeader, core.Quote(v))
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("%w: key %s given twice", store.ErrBadAttribute, core.Quote(k))
		}
		out[k] = val
	}
	return out, store.ValidateAttributes(out)
}

// repeat answers a write whose (lease, request id) already has a durable
// first answer: that answer, whatever became of the lease since, without
// reading the body. done is false when there is none (the write goes on).
// The credential must be accepted and the first write its worker's.
func (p *dataPlane) repeat(w http.ResponseWriter, r *http.Request, cred string, lease core.LeaseID, req string, kind store.DataOpKind, id string) (bool, error) {
	e, ok, err := p.d.st.Request(uint64(lease), req) // a read of the store, off the loop
	if err != nil || !ok {
		return false, err
	}
	// Only a repeat asks the loop about the credential here: a first
	// write's early check does, once.
	if err := p.d.authenticate(r.Context(), cred, 0); err != nil {
		return true, err
	}
	if core.WorkerID(e.Worker) != credWorker(cred) {
		return false, nil // another worker's key: the fence refuses it
	}
	if e.Kind != kind || e.ID != id {
		return true, fmt.Errorf("%w: request %q of lease %d was %s", store.ErrRequestReused, req, lease, describeEntry(e))
	}
	answerWrite(w, kind, e.Result())
	return true, nil
}

func describeEntry(e store.RequestEntry) string {
	switch e.Kind {
	case store.OpPut:
		return "a put of " + core.Quote(e.ID)
	case store.OpAppend:
		return "an append to " + core.Quote(e.ID)
	}
	return "a delete of " + core.Quote(e.ID)
}

// answerWrite answers a write (or its repeat: the same bytes): 201 and the
// version for a put or a delete, 200 and where the bytes landed for an
// append.
func answerWrite(w http.ResponseWriter, kind store.DataOpKind, res store.DataResult) {
	if res.Repeated {
		w.Header().Set("Tether-Repeated", "true")
	}
	switch kind {
	case store.OpAppend:
		writeJSON(w, http.StatusOK, res.Append)
	default:
		w.Header().Set("Location", fmt.Sprintf("/data/%s/%d", res.Data.ID, res.Data.Version))
		writeJSON(w, http.StatusCreated, res.Data)
	}
}

// parseQuery reads GET /data's parameters.
func parseQuery(v url.Values) (store.DataQuery, error) {
	var q store.DataQuery
	bad := func(name, val, want string) error {
		return &httpError{code: http.StatusBadRequest, msg: fmt.Sprintf("bad %s %s: want %s", name, core.Quote(val), want)}
	}
	for k, vs := range v {
		if len(vs) != 1 {
			return q, &httpError{code: http.StatusBadRequest, msg: fmt.Sprintf("parameter %s given %d times: give it once", core.Quote(k), len(vs))}
		}
		val := vs[0]
		switch {
		case k == "prefix":
			if val != "" && store.ValidateID(val) != nil {
				return q, bad(k, val, "the start of a data id ([A-Za-z0-9._-], the first a letter or digit)")
			}
			q.Prefix = val
		case k == "run":
			q.Run = val
		case k == "step":
			q.Step = val
		case k == "since", k == "until":
			t, err := time.Parse(time.RFC3339Nano, val)
			if err != nil {
				return q, bad(k, val, "an RFC 3339 time")
			}
			if k == "since" {
				q.Since = t
			} else {
				q.Until = t
			}
		case k == "limit":
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 || n > store.MaxQueryLimit {
				return q, bad(k, val, fmt.Sprintf("a number from 1 to %d", store.MaxQueryLimit))
			}
			q.Limit = n
		case k == "after":
			q.After = val
		case strings.HasPrefix(k, "attr."):
			if q.Attrs == nil {
				q.Attrs = map[string]string{}
			}
			q.Attrs[strings.TrimPrefix(k, "attr.")] = val
		case k == "lease":
		default:
			return q, &httpError{code: http.StatusBadRequest, msg: fmt.Sprintf("unknown parameter %s (known: prefix, run, step, since, until, attr.KEY, limit, after)", core.Quote(k))}
		}
	}
	if len(q.Attrs) > store.MaxAttributes {
		return q, &httpError{code: http.StatusBadRequest, msg: fmt.Sprintf("%d attr. parameters, at most %d", len(q.Attrs), store.MaxAttributes)}
	}
	return q, nil
}

// The answers of the step's reads (SPEC §14).
type (
	// StepDefinitionAnswer answers GET /step/definition.
	StepDefinitionAnswer struct {
		Run        string        `json:"run"`
		Step       string        `json:"step"`
		Workflow   core.RunSpec  `json:"workflow"`
		Definition core.StepSpec `json:"definition"`
		Item       string        `json:"item,omitempty"`
	}
	// StepOutputAnswer answers GET /step/output/{step}.
	StepOutputAnswer struct {
		Step    string           `json:"step"`
		State   string           `json:"state"`
		Exit    *int             `json:"exit"`
		Writes  []store.DataMeta `json:"writes"`
		More    string           `json:"more,omitempty"` // a query cursor when writes were cut at a page
		Outputs []string         `json:"outputs"`
	}
	// PoolAnswer answers GET /pool.
	PoolAnswer struct {
		Workers []PoolWorker `json:"workers"`
	}
	// PoolWorker is one worker of GET /pool.
	PoolWorker struct {
		ID     string            `json:"id"`
		Name   string            `json:"name"`
		State  string            `json:"state"`
		Labels map[string]string `json:"labels"`
		Tags   []string          `json:"tags"`
		Slots  int               `json:"slots"`
		Busy   int               `json:"busy"`
	}
)

// serveStep answers a step's reads of the orchestrator, asked of the core
// on the loop: the definition and outputs need the request's lease (the
// credential's, current or ended while its run is live).
func (p *dataPlane) serveStep(w http.ResponseWriter, r *http.Request, rt dataRoute, worker core.WorkerID) error {
	var lease core.LeaseID
	if rt.kind != routePool {
		l, err := parseLease(r)
		if err != nil {
			return &httpError{code: http.StatusBadRequest, msg: strings.Replace(err.Error(), "a write needs its lease", "this read needs its lease", 1)}
		}
		lease = l
	}
	var out any
	var qerr error
	err := p.d.Snapshot(r.Context(), func(o *core.Orchestrator) {
		switch rt.kind {
		case routePool:
			a := PoolAnswer{Workers: []PoolWorker{}}
			for _, pw := range o.Pool() {
				a.Workers = append(a.Workers, PoolWorker{ID: string(pw.ID), Name: pw.Name, State: pw.State, Labels: pw.Labels, Tags: pw.Tags, Slots: pw.Slots, Busy: pw.Busy})
			}
			out = a
		case routeDefinition:
			def, err := o.Definition(worker, lease)
			if err != nil {
				qerr = err
				return
			}
			out = StepDefinitionAnswer{Run: string(def.Run), Step: string(def.Step), Workflow: def.Workflow, Definition: def.Definition, Item: def.Item}
		case routeOutput:
			so, err := o.Output(worker, lease, rt.step)
			if err != nil {
				qerr = err
				return
			}
			out = StepOutputAnswer{Step: string(so.Step), State: so.State.String(), Exit: so.Exit, Outputs: so.Outputs}
		}
	})
	if err != nil {
		return err
	}
	if qerr != nil {
		return qerr
	}
	if a, ok := out.(StepOutputAnswer); ok { // its writes: the versions made under its leases
		run, _, _ := strings.Cut(a.Step, "/")
		items, next, err := p.d.st.QueryData(store.DataQuery{Run: run, Step: a.Step, Limit: store.MaxQueryLimit})
		if err != nil {
			return err
		}
		a.Writes, a.More = items, next
		if a.Outputs == nil {
			a.Outputs = []string{}
		}
		out = a
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
