package orchestrator

import (
	"sync"
	"testing"
	"time"

	"github.com/tether-run/tether/core"
)

// TestBeatsKeepEachConnectionsOrder: heartbeats wait to be handed over
// together, yet each connection's inputs reach the loop in the order its
// read loop passed them, heartbeats included, and none is lost. Eight
// connections pass heartbeats, other frames and at last their drop, each
// numbered, at once, while a hand-over is due every microsecond.
func TestBeatsKeepEachConnectionsOrder(t *testing.T) {
	const conns, each = 8, 400
	var mu sync.Mutex
	got := map[core.ConnID][]uint64{}
	record := func(f frame) {
		var n uint64
		switch m := f.msg.(type) {
		case core.Heartbeat:
			n = uint64(m.InFlight[0].Lease)
		case core.Held:
			n = uint64(m.Lease)
		}
		got[f.conn] = append(got[f.conn], n)
	}
	b := newBeats(time.Microsecond, func(in input) error {
		mu.Lock()
		defer mu.Unlock()
		switch in := in.(type) {
		case heartbeats:
			for _, f := range in.frames {
				record(f)
			}
		case frame:
			record(in)
		case dropped:
			got[in.conn] = append(got[in.conn], each)
		}
		return nil
	})
	var wg sync.WaitGroup
	for i := range conns {
		c := &conn{id: core.ConnID(i + 1)}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range uint64(each) {
				var m core.Msg = core.Held{Lease: core.LeaseID(n)}
				if n%3 != 2 {
					m = core.Heartbeat{InFlight: []core.LeaseRef{{Lease: core.LeaseID(n)}}}
				}
				b.pass(c, frame{conn: c.id, msg: m, from: c})
			}
			b.pass(c, dropped{conn: c.id})
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for i := range conns {
		seq := got[core.ConnID(i+1)]
		if len(seq) != each+1 {
			t.Fatalf("connection %d: %d inputs reached the loop, want %d", i+1, len(seq), each+1)
		}
		for n, x := range seq {
			if x != uint64(n) {
				t.Fatalf("connection %d: input %d reached the loop in place %d: %v…", i+1, x, n, seq[max(0, n-3):n+1])
			}
		}
	}
}
