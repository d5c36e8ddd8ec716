package orchestrator

import (
	"bytes"
	"context"
	"crypto/subtle"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tether-run/tether/core"
)

// The metrics endpoint's limits (SPEC §16).
const (
	// metricsInFlight bounds concurrent scrapes; one more is answered 503.
	metricsInFlight = 4
	// metricsTimeout bounds one scrape, the loop query included.
	metricsTimeout = 10 * time.Second
)

// metrics are the driver's Prometheus metrics, on a registry of their own
// (never the process-global default). Counters and histograms are fed from
// groups after they are durable (land), and from the data plane's
// answers; the gauges of the core's state are read at scrape time on the
// loop (stateCollector). No label takes a run id, a step id or a worker
// name: every label set is bounded.
type metrics struct {
	reg *prometheus.Registry

	grants          prometheus.Counter
	dispatchLatency prometheus.Histogram
	submitToStart   prometheus.Histogram
	commitRecords   prometheus.Histogram
	commitDuration  prometheus.Histogram
	linesDropped    *prometheus.CounterVec // by reason
	bytesDropped    *prometheus.CounterVec // by reason
	dataBytes       *prometheus.CounterVec // by direction
	dataRefusals    *prometheus.CounterVec // by reason
}

// Reasons of dropped log lines (SPEC §16): a worker dropped them over its
// output cap, or beyond its bound of unacknowledged output (its drop
// marker counts them), or the orchestrator refused them (a lease without
// authority).
const (
	dropOutputCap    = "output_cap"
	dropUnackedBound = "unacked_bound"
	dropRefused      = "refused"
)

func newMetrics(d *Driver) *metrics {
	latency := prometheus.ExponentialBuckets(0.005, 2, 16) // 5 ms to ~164 s
	m := &metrics{
		reg: prometheus.NewRegistry(),
		grants: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_lease_grants_total", Help: "Leases granted (steps dispatched to a worker), counted once durable.",
		}),
		dispatchLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tether_dispatch_latency_seconds", Help: "Time from a step being queued to its lease being granted.", Buckets: latency,
		}),
		submitToStart: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tether_submit_to_start_seconds", Help: "Time from a run's submission to the start of each of its steps' attempts.", Buckets: latency,
		}),
		commitRecords: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tether_commit_batch_records", Help: "Records written by one group commit.", Buckets: prometheus.ExponentialBuckets(1, 2, 14),
		}),
		commitDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tether_commit_duration_seconds", Help: "Time one group commit took in the store (the write and its fsync).", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		linesDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_log_lines_dropped_total", Help: "Step log lines dropped: by a worker (output_cap, unacked_bound) or refused by the orchestrator (refused).",
		}, []string{"reason"}),
		bytesDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_log_bytes_dropped_total", Help: "Bytes of the dropped step log lines (text plus newline), by the same reasons.",
		}, []string{"reason"}),
		dataBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_data_plane_bytes_total", Help: "Data-plane body bytes received (in) and sent (out).",
		}, []string{"direction"}),
		dataRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_data_plane_refusals_total", Help: "Data-plane requests refused, by reason.",
		}, []string{"reason"}),
	}
	for _, r := range []string{dropOutputCap, dropUnackedBound, dropRefused} {
		m.linesDropped.WithLabelValues(r)
		m.bytesDropped.WithLabelValues(r)
	}
	m.dataBytes.WithLabelValues("in")
	m.dataBytes.WithLabelValues("out")
	for _, code := range []int{400, 401, 403, 404, 405, 408, 409, 413, 416, 429, 503, 500, 418} {
		m.dataRefusals.WithLabelValues(refusalReason(code)) // every reason has a series from the start
	}
	m.reg.MustRegister(m.grants, m.dispatchLatency, m.submitToStart, m.commitRecords, m.commitDuration,
		m.linesDropped, m.bytesDropped, m.dataBytes, m.dataRefusals,
		&stateCollector{d: d},
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tether_connections_refused_total", Help: "TCP connections the listener refused over its caps (SPEC §12).",
		}, func() float64 {
			if d.ln == nil {
				return 0
			}
			total, perAddr := d.ln.Refused()
			return float64(total + perAddr)
		}),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	// A running driver leads (SPEC §11).
	m.reg.MustRegister(LeaderGauges(true, func() uint64 { return d.opts.Epoch })...)
	return m
}

// LeaderGauges are tether_leader (1 leading, 0 a standby) and
// tether_leader_epoch (the epoch it leads in, or a standby's last reading
// of the leader's) for /metrics (SPEC §16): the driver's, and a standby's.
func LeaderGauges(leading bool, epoch func() uint64) []prometheus.Collector {
	leads := 0.0
	if leading {
		leads = 1
	}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tether_leader", Help: "1 while this orchestrator leads; a standby reports 0 (SPEC §11).",
		}, func() float64 { return leads }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tether_leader_epoch", Help: "The leadership epoch this orchestrator leads in (0: a store of one orchestrator); on a standby, the leader's.",
		}, func() float64 { return float64(epoch()) }),
	}
}

// handler serves /metrics: open, or behind a bearer token when token is set.
func (m *metrics) handler(d *Driver, token string) http.Handler {
	h := promhttp.HandlerFor(m.reg, MetricsHandlerOpts())
	if token == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The metrics token, or any live operator token, read-only ones
		// included (SPEC §15a, §16).
		got := bearer(r)
		_, operator := d.operator(got)
		if subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 && !operator {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tether-metrics"`)
			http.Error(w, "metrics: missing or wrong bearer token", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// landed counts what a durable group did: its grants, the latencies of its
// grants and starts, the log lines dropped in it, and its commit (loop
// goroutine, from land). Everything read is in the group's own records,
// except a run's submission time, which never changes.
// stepped takes what one batch adds to the latency histograms from the
// core's state right after its Step — map lookups, nothing decoded — and
// keeps it in the batch's group, to be observed once the group landed
// (write-ahead, SPEC §11).
func (m *metrics) stepped(o *core.Orchestrator, rd core.Ready, f *flight) {
	for _, e := range rd.Messages {
		g, ok := e.Msg.(core.Dispatch)
		if !ok {
			continue
		}
		f.grants++
		_, queued, _, ok := o.StepTimes(g.Step)
		granted, gok := o.LeaseGrantedAt(g.Lease)
		if ok && gok && !queued.IsZero() {
			f.dispatchLatency = append(f.dispatchLatency, max(granted.Sub(queued), 0).Seconds())
		}
	}
	for _, t := range rd.Transitions {
		if t.Event != core.EvStart || t.From != core.StateQueued {
			continue
		}
		run, _, started, ok := o.StepTimes(t.Step)
		if !ok || started.IsZero() {
			continue
		}
		if at, ok := o.SubmittedAt(run); ok {
			f.submitToStart = append(f.submitToStart, max(started.Sub(at), 0).Seconds())
		}
	}
}

// landed observes a group that is durable: its commit, what stepped took
// for it, and the log lines it dropped.
func (m *metrics) landed(d *Driver, f *flight) {
	m.commitRecords.Observe(float64(f.records))
	m.commitDuration.Observe(f.took.Seconds())
	m.grants.Add(float64(f.grants))
	for _, v := range f.dispatchLatency {
		m.dispatchLatency.Observe(v)
	}
	for _, v := range f.submitToStart {
		m.submitToStart.Observe(v)
	}
	for _, rd := range f.group.Readys() {
		for _, r := range rd.Records {
			// A drop marker is rare: only its records are decoded.
			if r.Delete || !strings.HasPrefix(r.Key, core.KindLog+"/") || !bytes.Contains(r.Value, []byte("--- Output dropped: ")) {
				continue
			}
			if v, err := core.DecodeRecord(r); err == nil {
				if lines, n, overCap, ok := core.ParseDropMarker(v.(*core.StepLogLine).Line.Text); ok {
					reason := dropUnackedBound
					if overCap {
						reason = dropOutputCap
					}
					m.linesDropped.WithLabelValues(reason).Add(float64(lines))
					m.bytesDropped.WithLabelValues(reason).Add(float64(n))
				}
			}
		}
		for _, e := range rd.Logs {
			if e.Msg != core.LogLinesRefused {
				continue
			}
			for _, fl := range e.Fields {
				switch fl.Key {
				case "lines":
					m.linesDropped.WithLabelValues(dropRefused).Add(count(fl.Value))
				case "bytes":
					m.bytesDropped.WithLabelValues(dropRefused).Add(count(fl.Value))
				}
			}
		}
	}
}

// count reads a core log field that is a count; anything else is 0.
func count(s string) float64 {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0
	}
	return float64(n)
}

// MetricsHandlerOpts are the bounds of a /metrics scrape (SPEC §16): at
// most 4 at once (one more is answered 503), each within 10 s; a standby's
// /metrics has the same.
func MetricsHandlerOpts() promhttp.HandlerOpts {
	return promhttp.HandlerOpts{MaxRequestsInFlight: metricsInFlight, Timeout: metricsTimeout}
}

// refusalReason names a data-plane refusal by its status: a bounded label.
func refusalReason(code int) string {
	switch code {
	case http.StatusBadRequest:
		return "bad_request"
	case http.StatusUnauthorized:
		return "unauthenticated"
	case http.StatusForbidden:
		return "forbidden" // a write outside the step's declared outputs (SPEC §14)
	case http.StatusNotFound:
		return "not_found"
	case http.StatusMethodNotAllowed:
		return "method_not_allowed"
	case http.StatusRequestTimeout:
		return "body_stalled"
	case http.StatusConflict:
		return "fenced"
	case http.StatusRequestEntityTooLarge:
		return "too_large"
	case http.StatusRequestedRangeNotSatisfiable:
		return "out_of_range" // an offset past a stream's end (SPEC §14)
	case http.StatusTooManyRequests:
		return "throttled"
	case http.StatusServiceUnavailable:
		return "unavailable"
	}
	if code >= 500 {
		return "server_error"
	}
	return "other"
}

// stateCollector reads the gauges of the core's live state at scrape time,
// with one query on the loop (Driver.Snapshot): they describe the durable
// state, since a query runs only once everything stepped before it is.
type stateCollector struct{ d *Driver }

var (
	descRuns              = prometheus.NewDesc("tether_runs", "Live (not archived) runs by status.", []string{"state"}, nil)
	descSteps             = prometheus.NewDesc("tether_steps", "Steps of live runs by state.", []string{"state"}, nil)
	descQueueDepth        = prometheus.NewDesc("tether_queue_depth", "Steps queued and not leased: waiting for a worker.", nil, nil)
	descWorkersConnected  = prometheus.NewDesc("tether_workers_connected", "Workers with a control connection.", nil, nil)
	descWorkersRecovering = prometheus.NewDesc("tether_workers_recovering", "Workers disconnected within their grace window.", nil, nil)
	descLeasesInGrace     = prometheus.NewDesc("tether_leases_in_grace", "Current leases of recovering steps, waiting for their worker.", nil, nil)
)

// runStates are the run statuses, so each has a series even at zero.
var runStates = []string{"running", "waiting", "failing", "cancelling", "success", "failed", "cancelled"}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRuns, descSteps, descQueueDepth, descWorkersConnected, descWorkersRecovering, descLeasesInGrace} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), metricsTimeout)
	defer cancel()
	var g core.Gauges
	if err := c.d.Snapshot(ctx, func(o *core.Orchestrator) { g = o.Gauges() }); err != nil {
		ch <- prometheus.NewInvalidMetric(descRuns, err)
		return
	}
	for _, s := range runStates {
		ch <- prometheus.MustNewConstMetric(descRuns, prometheus.GaugeValue, float64(g.Runs[s]), s)
	}
	for _, s := range core.States() {
		ch <- prometheus.MustNewConstMetric(descSteps, prometheus.GaugeValue, float64(g.Steps[s]), s.String())
	}
	ch <- prometheus.MustNewConstMetric(descQueueDepth, prometheus.GaugeValue, float64(g.Queued))
	ch <- prometheus.MustNewConstMetric(descWorkersConnected, prometheus.GaugeValue, float64(g.WorkersConnected))
	ch <- prometheus.MustNewConstMetric(descWorkersRecovering, prometheus.GaugeValue, float64(g.WorkersRecovering))
	ch <- prometheus.MustNewConstMetric(descLeasesInGrace, prometheus.GaugeValue, float64(g.LeasesInGrace))
}

// countedResponse counts the response bytes a data-plane handler writes.
type countedResponse struct {
	http.ResponseWriter
	n int64
}

func (w *countedResponse) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.n += int64(n)
	return n, err
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *countedResponse) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ReadFrom keeps the underlying writer's fast path (io.Copy from a file).
func (w *countedResponse) ReadFrom(r io.Reader) (int64, error) {
	n, err := io.Copy(w.ResponseWriter, r)
	w.n += n
	return n, err
}
