package worker

// Writes that survive a lost answer (SPEC §14 "Request ids"): every write
// the worker makes or forwards carries a request id, and a write whose
// answer did not come back (the connection broke, the orchestrator said 5xx,
// the worker had no credential for a moment) is sent again with the same
// id, a bounded number of times with backoff. The orchestrator answers a
// repeat with the first answer and writes nothing, so a retried write is
// one write.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tether-run/tether/adapters/dataplane"
	"github.com/tether-run/tether/core"
)

// Headers of a write (SPEC §14), named here for the worker's callers.
const (
	// RequestIDHeader names a write's request id: 1–64 of [A-Za-z0-9._-].
	RequestIDHeader = dataplane.RequestIDHeader
	// AttributeHeader sets one attribute (k=v) of a PUT's version; repeatable.
	AttributeHeader = dataplane.AttributeHeader
)

const maxRequestID = 64

// NewRequestID returns a fresh random request id (32 hex digits).
func NewRequestID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ValidRequestID says whether s is a request id: 1–64 of [A-Za-z0-9._-].
func ValidRequestID(s string) bool {
	if s == "" || len(s) > maxRequestID {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Retry bounds how a write is sent again after a lost answer: at most
// Attempts sends in all, waiting First after the first failure and twice as
// long after each next one, up to Max.
type Retry struct {
	Attempts   int
	First, Max time.Duration
}

// DefaultRetry sends a write at most 6 times over about 15 s: long enough to
// ride out a reconnect of the data client or an orchestrator restart's
// first seconds, short enough that a step is not held for long by an
// orchestrator that is gone.
var DefaultRetry = Retry{Attempts: 6, First: 500 * time.Millisecond, Max: 8 * time.Second}

// retryable says whether a write's failure may have lost its answer (so
// sending it again, with the same request id, is right): a transport error,
// a 5xx, or no credential yet. A 4xx is the orchestrator's answer: final.
func retryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var de *DataError
	if errors.As(err, &de) {
		return de.Status >= 500
	}
	return err != nil
}

// WriteOpts are a write's optional headers.
type WriteOpts struct {
	// RequestID names the write; empty: a fresh one (NewRequestID).
	RequestID string
	// Attrs are the version's attributes, "k=v" each (PUT only).
	Attrs []string
}

func (o WriteOpts) header() (http.Header, error) {
	h := http.Header{}
	id := o.RequestID
	if id == "" {
		id = NewRequestID()
	} else if !ValidRequestID(id) {
		return nil, fmt.Errorf("%w: request id %q: want 1–%d of [A-Za-z0-9._-]", ErrDataRefused, id, maxRequestID)
	}
	h.Set(RequestIDHeader, id)
	for _, a := range o.Attrs {
		h.Add(AttributeHeader, a)
	}
	return h, nil
}

// write sends one write with its request id in hdr, again after a failure
// that may have lost its answer (retryable) while c.retry allows, when the
// body can be sent again: body nil, or an io.Seeker rewound to where it
// started. It returns the last answer or error.
func (c *DataClient) write(ctx context.Context, method, path, rawQuery string, lease core.LeaseID, hdr http.Header, body io.Reader, size int64) (*http.Response, error) {
	pol := c.retry
	if pol.Attempts < 1 {
		pol.Attempts = 1
	}
	var start int64
	seeker, _ := body.(io.Seeker)
	if body != nil && seeker == nil {
		pol.Attempts = 1 // the body is a stream: it cannot be sent twice
	} else if seeker != nil {
		var err error
		if start, err = seeker.Seek(0, io.SeekCurrent); err != nil {
			pol.Attempts = 1
		}
	}
	delay := pol.First
	for attempt := 1; ; attempt++ {
		if attempt > 1 && seeker != nil {
			if _, err := seeker.Seek(start, io.SeekStart); err != nil {
				return nil, fmt.Errorf("data plane: rewinding a write's body: %w", err)
			}
		}
		var rd io.Reader
		if body != nil {
			rd = struct{ io.Reader }{body} // the transport closes a body it sent: hide Close, the body may be sent again
		}
		resp, err := c.doHeader(ctx, method, path, rawQuery, lease, hdr, rd, size)
		if err == nil {
			// The answer is lost as surely when its body breaks off as when
			// its headers never come: read it whole here (a write's answer
			// is a small JSON body).
			b, rerr := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBody))
			resp.Body.Close()
			if rerr == nil {
				resp.Body = io.NopCloser(bytes.NewReader(b))
				return resp, nil
			}
			err = fmt.Errorf("data plane: %s %s: reading the answer: %w", method, core.Quote(path), rerr)
		}
		if attempt >= pol.Attempts || !retryable(ctx, err) {
			return nil, err
		}
		if c.onRetry != nil {
			c.onRetry(method, path, hdr.Get(RequestIDHeader), attempt, err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
		delay = min(2*delay, pol.Max)
	}
}

// PutWith is Put with a request id and attributes; a body that is an
// io.Seeker is sent again after a lost answer (same request id).
func (c *DataClient) PutWith(ctx context.Context, lease core.LeaseID, id string, body io.Reader, size int64, o WriteOpts) (dataplane.Version, error) {
	hdr, err := o.header()
	if err != nil {
		return dataplane.Version{}, err
	}
	resp, err := c.write(ctx, http.MethodPut, dataPath(id), "", lease, hdr, body, size)
	if err != nil {
		return dataplane.Version{}, err
	}
	var v dataplane.Version
	return v, decodeAnswer(resp, &v)
}

// Delete makes a tombstone version of id under lease (SPEC §14).
func (c *DataClient) Delete(ctx context.Context, lease core.LeaseID, id string, o WriteOpts) (json.RawMessage, error) {
	hdr, err := o.header()
	if err != nil {
		return nil, err
	}
	resp, err := c.write(ctx, http.MethodDelete, dataPath(id), "", lease, hdr, nil, 0)
	if err != nil {
		return nil, err
	}
	var raw json.RawMessage
	return raw, decodeAnswer(resp, &raw)
}

// GetJSON reads a JSON answer of the data plane (a query, a definition, an
// output, the pool, a version list) as it is.
func (c *DataClient) GetJSON(ctx context.Context, lease core.LeaseID, path string, q url.Values) (json.RawMessage, error) {
	resp, err := c.do(ctx, http.MethodGet, path, q.Encode(), lease, nil, 0)
	if err != nil {
		return nil, err
	}
	var raw json.RawMessage
	return raw, decodeAnswer(resp, &raw)
}

// spooled is a step's write body, held so that it can be sent again: in
// memory up to spoolMemory bytes, beyond that in a file of the worker's
// work directory, removed by close.
type spooled struct {
	f    *os.File
	r    io.ReadSeeker
	size int64
}

const (
	spoolMemory = 1 << 20 // a body this small is held in memory
	// maxSpoolBytes bounds one forwarded write's body on the worker's disk;
	// the orchestrator's own limit (64 MiB for a PUT by default) is lower
	// unless raised.
	maxSpoolBytes = 1 << 30
)

// errSpoolTooLarge: a step's body is over maxSpoolBytes.
var errSpoolTooLarge = errors.New("step endpoint: a write's body over " + strconv.Itoa(maxSpoolBytes>>20) + " MiB")

func spool(r io.Reader, dir string) (*spooled, error) {
	buf := make([]byte, spoolMemory+1)
	n, err := io.ReadFull(r, buf)
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return &spooled{r: strings.NewReader(string(buf[:n])), size: int64(n)}, nil
	case err != nil:
		return nil, err
	}
	f, err := os.CreateTemp(dir, "spool-")
	if err != nil {
		return nil, err
	}
	os.Remove(f.Name()) // the open file lives on until closed
	size, err := f.Write(buf[:n])
	if err == nil {
		var m int64
		m, err = io.Copy(f, io.LimitReader(r, maxSpoolBytes-int64(size)+1))
		if err == nil && int64(size)+m > maxSpoolBytes {
			err = errSpoolTooLarge
		}
		size += int(m)
	}
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return &spooled{f: f, r: f, size: int64(size)}, nil
}

func (s *spooled) close() {
	if s.f != nil {
		s.f.Close()
	}
}
