package orchestrator_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/core"
)

// stallingBody sends its bytes, then blocks until closed: an upload that
// stops arriving.
type stallingBody struct {
	r    io.Reader
	once sync.Once
	stop chan struct{}
}

func newStallingBody(b []byte) *stallingBody {
	return &stallingBody{r: bytes.NewReader(b), stop: make(chan struct{})}
}

func (s *stallingBody) Read(p []byte) (int, error) {
	if n, _ := s.r.Read(p); n > 0 {
		return n, nil
	}
	<-s.stop
	return 0, io.ErrUnexpectedEOF
}

func (s *stallingBody) Close() error { s.once.Do(func() { close(s.stop) }); return nil }

// stalledPut sends a PUT declaring size bytes that sends only sent of them.
func (r *dataRig) stalledPut(path, cred string, lease core.LeaseID, size, sent int) answer {
	r.t.Helper()
	body := newStallingBody(make([]byte, sent))
	defer body.Close()
	req, err := http.NewRequestWithContext(r.ctx, "PUT", r.d.DataURL()+path, body)
	if err != nil {
		r.t.Fatal(err)
	}
	req.ContentLength = int64(size)
	req.Header.Set("Authorization", "Bearer "+cred)
	req.Header.Set(orchestrator.LeaseHeader, strconv.FormatUint(uint64(lease), 10))
	resp, err := r.hc.Do(req)
	if err != nil {
		r.t.Fatalf("PUT %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b, proto: resp.ProtoMajor}
}

// blobDir lists the rig's blob files.
func (r *dataRig) blobDir() []string {
	r.t.Helper()
	ents, err := os.ReadDir(r.opts.StorePath + ".blobs")
	if err != nil {
		r.t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// TestDataStalledBodyIsCut: a write's body that stops arriving is answered
// 408 after the idle timeout, writes nothing and leaves no blob; an
// unauthenticated one is refused on its headers, before any body byte
// (SPEC §14).
func TestDataStalledBodyIsCut(t *testing.T) {
	const idle = 300 * time.Millisecond
	r := startData(t, orchestrator.Options{BodyIdleTimeout: idle})
	w := r.enroll("w1")
	dm := r.lease(w, "s")

	begin := time.Now()
	a := r.stalledPut("/data/slow", w.cred, dm.Lease, 64<<10, 20<<10)
	took := time.Since(begin)
	if a.status != http.StatusRequestTimeout || !strings.Contains(a.errorText(t), "stalled") {
		t.Fatalf("stalled PUT: HTTP %d %s, want 408 naming the stall", a.status, a.body)
	}
	if took < idle || took > 20*idle {
		t.Fatalf("stalled PUT answered after %s, want about the idle timeout of %s", took, idle)
	}
	if vs := storedVersions(t, r, "slow"); len(vs) != 0 {
		t.Fatalf("a stalled PUT stored %d versions", len(vs))
	}
	if files := r.blobDir(); len(files) != 0 {
		t.Fatalf("a stalled PUT left blob files %v", files)
	}

	// Refused on the headers: at once, whatever the body does.
	begin = time.Now()
	a = r.stalledPut("/data/slow", "w1-id.not-the-secret", dm.Lease, 64<<10, 1<<10)
	if a.status != http.StatusUnauthorized || time.Since(begin) >= idle {
		t.Fatalf("unauthenticated stalled PUT: HTTP %d after %s, want 401 before the idle timeout", a.status, time.Since(begin))
	}
	a = r.stalledPut("/data/slow", w.cred, dm.Lease+100, 64<<10, 1<<10)
	if a.status != http.StatusConflict || time.Since(begin) >= idle {
		t.Fatalf("stalled PUT under an unknown lease: HTTP %d after %s, want 409 at once", a.status, time.Since(begin))
	}

	// A body that keeps coming, slowly, is not cut: each byte moves the
	// deadline on.
	pr, pw := io.Pipe()
	go func() {
		for i := 0; i < 6; i++ {
			time.Sleep(idle / 3)
			pw.Write([]byte("slow but steady\n"))
		}
		pw.Close()
	}()
	a = r.do("PUT", "/data/steady", pr, w.cred, dm.Lease)
	if a.status != http.StatusCreated {
		t.Fatalf("a slow, steady PUT taking %s > the idle timeout: HTTP %d %s, want 201", 2*idle, a.status, a.body)
	}
	if files := r.blobDir(); len(files) != 1 {
		t.Fatalf("blob files %v, want the steady PUT's one", files)
	}
}

// TestDataRefusedWritesLeaveNoBlob: a write refused by the loop's fence
// (the decisive check, after the body was streamed into a blob), or over
// the limit as it streams, leaves no blob behind; committed ones stay.
func TestDataRefusedWritesLeaveNoBlob(t *testing.T) {
	r := startData(t, orchestrator.Options{MaxPutBody: 1 << 20})
	w := r.enroll("w1")
	dm := r.lease(w, "s")
	if _, err := r.d.PutData(r.ctx, w.cred, dm.Lease, "out", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	over := io.MultiReader(bytes.NewReader(make([]byte, 1<<20)), strings.NewReader("!")) // no Content-Length
	if a := r.do("PUT", "/data/big", over, w.cred, dm.Lease); a.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("a streamed PUT of the limit + 1 byte: HTTP %d %s, want 413", a.status, a.body)
	}
	w.finish(dm)
	if _, err := r.d.PutData(r.ctx, w.cred, dm.Lease, "out", []byte("zombie")); !errors.Is(err, orchestrator.ErrFenced) {
		t.Fatalf("PutData under an ended lease: %v, want ErrFenced", err)
	}
	if files := r.blobDir(); len(files) != 1 || files[0] != sha([]byte("kept")) {
		t.Fatalf("blob files %v, want only the committed version's", files)
	}
	r.restart()
	if files := r.blobDir(); len(files) != 1 {
		t.Fatalf("blob files after restart %v", files)
	}
	if a := r.expect("GET", "/data/out/1", nil, w.cred, 0, http.StatusOK); string(a.body) != "kept" {
		t.Fatalf("read back %q", a.body)
	}
}

// TestDataUnauthenticatedHTTP1WriteReadsNoBody: over HTTP/1.1 too, a write
// whose credential is refused is answered on its headers and its
// connection closed, without waiting for (or reading) the stalled body.
func TestDataUnauthenticatedHTTP1WriteReadsNoBody(t *testing.T) {
	r := startData(t, orchestrator.Options{BodyIdleTimeout: time.Minute})
	conn, err := net.Dial("tcp", r.d.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "PUT /data/x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer w1-id.nope\r\n%s: 1\r\nContent-Length: 60000\r\n\r\n", orchestrator.LeaseHeader)
	conn.Write(make([]byte, 1000)) // then nothing more
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled unauthenticated HTTP/1.1 PUT: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
		t.Fatalf("HTTP %d (close %v) %s, want 401 closing the connection", resp.StatusCode, resp.Close, b)
	}
}
