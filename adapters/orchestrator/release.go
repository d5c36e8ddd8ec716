package orchestrator

import (
	"time"

	"github.com/tether-run/tether/adapters/store"
)

// releaseEvery is how often the driver lets go of the store's mapped pages:
// the resident set then holds at most the pages read in the last interval,
// not every page of the file ever read (SPEC §7a: memory follows live work).
const releaseEvery = 5 * time.Second

// releaser calls ReleaseMapped every releaseEvery until the driver stops.
func (d *Driver) releaser(r store.Maintenance) {
	d.every(releaseEvery, func() {
		if err := r.ReleaseMapped(); err != nil {
			d.log.Warn("releasing the store's mapped pages", "err", err)
		}
	})
}

// every calls f every period until the driver's loop has stopped, then
// marks its goroutine done (d.wg).
func (d *Driver) every(period time.Duration, f func()) {
	defer d.wg.Done()
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-d.ended:
			return
		case <-t.C:
		}
		f()
	}
}
