package orchestrator

import (
	"errors"
	"io"
	"net/http"
)

// backup answers GET /api/store/backup (SPEC §7): the store's backup as
// application/x-tar; 501 if the backend's snapshots are taken by other
// means (store.Maintenance). It has no answer deadline (a large store takes as
// long as it takes; the per-write timeout still cuts a reader that stops
// reading). An error before the first byte is a JSON error; after it, the
// stream is cut, so the client never mistakes it for a whole backup.
func (a *api) backup(w http.ResponseWriter, r *http.Request) {
	cw := &countingWriter{w: w}
	w.Header().Set("Content-Type", "application/x-tar")
	w.Header().Set("Cache-Control", "no-store")
	if err := a.d.st.Backup(cw); err != nil {
		if cw.n == 0 && errors.Is(err, errors.ErrUnsupported) {
			a.fail(w, r, errorf(http.StatusNotImplemented, "this orchestrator's store cannot be backed up while it serves"))
			return
		}
		a.d.log.Warn("store backup failed", "err", err, "bytes_sent", cw.n)
		if cw.n == 0 {
			a.fail(w, r, errorf(http.StatusInternalServerError, "%v", err))
			return
		}
		panic(http.ErrAbortHandler)
	}
	a.d.log.Info("store backup sent", "bytes", cw.n)
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
