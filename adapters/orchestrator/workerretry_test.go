package orchestrator_test

import (
	"bytes"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/netfault"
	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/worker"
)

// cutOnceTap severs every link of the proxy at the first chunk from the
// orchestrator that holds marker, and lets new connections in again at
// once: the answer to a write is lost after the write was made, and the
// next dial succeeds.
type cutOnceTap struct {
	p      atomic.Pointer[netfault.Proxy]
	marker []byte
	cuts   atomic.Int32
}

func (c *cutOnceTap) Read(_ uint64, dir netfault.Dir, p []byte, _ time.Time) {
	if dir == netfault.Down && bytes.Contains(p, c.marker) && c.cuts.CompareAndSwap(0, 1) {
		c.p.Load().Cut()
		c.p.Load().Restore()
	}
}
func (c *cutOnceTap) Closed(uint64) {}

// The worker's own data client, across a connection cut mid-answer (real
// sockets, the cutting proxy): its PUT is sent again by the client, on a new
// connection, with the same Tether-Request-Id, the caller gets the first
// answer (version 1) and the store holds exactly one version (SPEC §10
// Retried writes, §14). Planted: a fresh request id per attempt made
// version 2 and failed this test.
func TestWorkerDataClientRetriesAPutAcrossACut(t *testing.T) {
	r := startData(t, orchestrator.Options{})
	w := r.enroll("w1")
	dm := r.lease(w, "build")
	tap := &cutOnceTap{marker: []byte(`"sha256"`)}
	px, err := netfault.Listen(r.d.Addr(), tap)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	tap.p.Store(px)
	c, err := worker.NewDataClient("http://"+px.Addr(), nil, func() string { return w.cred })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetRetry(worker.Retry{Attempts: 5, First: time.Millisecond, Max: 10 * time.Millisecond})
	v, err := c.Put(r.ctx, dm.Lease, "out", strings.NewReader("hello"), 5)
	if err != nil || v.Version != 1 {
		t.Fatalf("the PUT: version %d, %v; want version 1", v.Version, err)
	}
	if tap.cuts.Load() != 1 {
		t.Fatalf("the proxy cut %d times, want 1: the answer was never lost", tap.cuts.Load())
	}
	if vs := r.versions(w.cred, "out"); len(vs) != 1 {
		t.Fatalf("after the client's retry: %d versions, want exactly 1: %+v", len(vs), vs)
	}
}
