package orchestrator_test

import (
	"bytes"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/core"
)

// pipedAppend starts an append of n declared bytes to /data/<id>/append
// whose body is written by the caller through the returned pipe; the
// answer arrives on the channel.
func (r *dataRig) pipedAppend(cred string, lease core.LeaseID, id string, n int64) (*io.PipeWriter, <-chan answer) {
	r.t.Helper()
	pr, pw := io.Pipe()
	req, err := http.NewRequestWithContext(r.ctx, http.MethodPost, r.d.DataURL()+"/data/"+id+"/append", pr)
	if err != nil {
		r.t.Fatal(err)
	}
	req.ContentLength = n
	req.Header.Set("Authorization", "Bearer "+cred)
	req.Header.Set(orchestrator.LeaseHeader, strconv.FormatUint(uint64(lease), 10))
	out := make(chan answer, 1)
	go func() {
		resp, err := r.hc.Do(req)
		if err != nil {
			out <- answer{status: 0, body: []byte(err.Error())}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		out <- answer{status: resp.StatusCode, header: resp.Header, body: b, proto: resp.ProtoMajor}
	}()
	return pw, out
}

// An append waiting for room in the memory budget (SPEC §14) waits within
// its own deadline, not the 30-s one every request's body starts with
// (BodyTimeout, SPEC §12): here 1 s, and the second append waits 2.5 s.
func TestAppendWaitsForRoomPastTheBodyTimeout(t *testing.T) {
	t.Parallel()
	r := startData(t, orchestrator.Options{BodyTimeout: time.Second, MaxAppendBody: 64 << 10, MaxDataInFlight: 64 << 10, BodyIdleTimeout: 5 * time.Second})
	w := r.enroll("w1")
	dm := r.lease(w, "logger")

	// A takes the whole budget and sends its body slowly.
	big := bytes.Repeat([]byte("a"), 64<<10)
	pa, outA := r.pipedAppend(w.cred, dm.Lease, "a", int64(len(big)))
	if _, err := pa.Write(big[:1024]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // A holds the budget
	pb, outB := r.pipedAppend(w.cred, dm.Lease, "b", 10)
	go func() {
		pb.Write([]byte("hello"))
		time.Sleep(1500 * time.Millisecond)
		pb.Write([]byte("world"))
		pb.Close()
	}()
	time.Sleep(2200 * time.Millisecond)
	if _, err := pa.Write(big[1024:]); err != nil {
		t.Fatal(err)
	}
	pa.Close()
	if a := <-outA; a.status != http.StatusOK {
		t.Fatalf("append A: HTTP %d %s, want 200", a.status, a.body)
	}
	if b := <-outB; b.status != http.StatusOK {
		t.Fatalf("append B, which waited 2.5 s for room past the 1 s body timeout: HTTP %d %s, want 200", b.status, b.body)
	}
	got := r.expect(http.MethodGet, "/data/b/append?offset=0", nil, w.cred, 0, http.StatusOK).body
	if string(got) != "helloworld" {
		t.Fatalf("stream b holds %q, want helloworld", got)
	}
}

// Appends waiting for room hold no memory for their bodies (SPEC §14: the
// bodies held at once are bounded): 48 appends declaring 256 KiB each
// behind a full budget of 256 KiB would hold 12 MiB if each made its
// buffer before it got room. The heap is read from the allocation profile,
// counting only what the data plane's handler holds (the HTTP/2 client in
// this process keeps a buffer of its own for each request).
func TestWaitingAppendsHoldNoBuffer(t *testing.T) {
	const each = 256 << 10
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 1
	r := startData(t, orchestrator.Options{MaxAppendBody: each, MaxDataInFlight: each})
	w := r.enroll("w1")
	dm := r.lease(w, "logger")

	pa, outA := r.pipedAppend(w.cred, dm.Lease, "a", each)
	if _, err := pa.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // A holds the budget
	const waiting = 48
	var pipes []*io.PipeWriter
	var outs []<-chan answer
	for i := range waiting {
		p, out := r.pipedAppend(w.cred, dm.Lease, "w"+strconv.Itoa(i), each)
		pipes, outs = append(pipes, p), append(outs, out)
	}
	time.Sleep(time.Second) // every one has reached the budget
	held := handlerHeap(t)
	for _, p := range pipes {
		p.CloseWithError(io.ErrUnexpectedEOF)
	}
	pa.CloseWithError(io.ErrUnexpectedEOF)
	<-outA
	for _, out := range outs {
		<-out
	}
	// A's own buffer (256 KiB) is held; a buffer made before the budget
	// would add 256 KiB for each of the others.
	if limit := int64(2 * each); held > limit {
		t.Fatalf("with %d appends waiting for room the data plane's handler holds %d KiB, want at most %d KiB (A's body only)", waiting, held>>10, limit>>10)
	}
}

// handlerHeap returns the bytes in use that the data plane's handler
// allocated, as of a collection made now (MemProfileRate 1).
func handlerHeap(t *testing.T) int64 {
	t.Helper()
	runtime.GC()
	runtime.GC() // the profile is as of the last completed cycle
	n, _ := runtime.MemProfile(nil, true)
	recs := make([]runtime.MemProfileRecord, n+64)
	n, ok := runtime.MemProfile(recs, true)
	if !ok {
		t.Fatal("the allocation profile grew while read")
	}
	var held int64
	for _, rec := range recs[:n] {
		frames := runtime.CallersFrames(rec.Stack())
		for {
			f, more := frames.Next()
			if strings.Contains(f.Function, "adapters/orchestrator.(*dataPlane)") {
				held += rec.InUseBytes()
				break
			}
			if !more {
				break
			}
		}
	}
	return held
}

// POST /token is a write (SPEC §14a): its credential and lease are checked
// on the headers, before a byte of its body is read (SPEC §12), so an
// unknown credential is refused at once however slowly the body comes; and
// a body that stalls is answered 408, as any write's.
func TestTokenChecksTheCredentialBeforeTheBody(t *testing.T) {
	t.Parallel()
	r := startData(t, orchestrator.Options{BodyIdleTimeout: 2 * time.Second})
	pr, pw := io.Pipe()
	defer pw.Close()
	req, _ := http.NewRequestWithContext(r.ctx, http.MethodPost, r.d.DataURL()+"/token", pr)
	req.Header.Set("Authorization", "Bearer nobody.nothing")
	req.Header.Set(orchestrator.LeaseHeader, "1")
	start := time.Now()
	resp, err := r.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp.Body)
	if took := time.Since(start); resp.StatusCode != http.StatusUnauthorized || took > time.Second {
		t.Fatalf("POST /token with an unknown credential and a body never sent: HTTP %d %s after %v, want 401 at once", resp.StatusCode, body, took.Round(time.Millisecond))
	}

	w := r.enroll("w1")
	dm := r.lease(w, "minter")
	pr2, pw2 := io.Pipe()
	var once sync.Once
	defer once.Do(func() { pw2.Close() })
	req, _ = http.NewRequestWithContext(r.ctx, http.MethodPost, r.d.DataURL()+"/token", pr2)
	req.Header.Set("Authorization", "Bearer "+w.cred)
	req.Header.Set(orchestrator.LeaseHeader, strconv.FormatUint(uint64(dm.Lease), 10))
	go pw2.Write([]byte(`{"name": "w`))
	resp, err = r.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body = readAll(t, resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(body), "stalled") {
		t.Fatalf("POST /token whose body stalls: HTTP %d %s, want 408 naming the stall", resp.StatusCode, body)
	}
}

// An append whose declared length would pass its stream's bound is refused
// on its headers (SPEC §14: "as soon as the declared Content-Length says
// so"), not after its body is read: here the body never comes.
func TestAppendPastTheStreamRefusedOnItsHeaders(t *testing.T) {
	t.Parallel()
	r := startData(t, orchestrator.Options{MaxAppendBody: 100, MaxStream: 250, BodyIdleTimeout: 5 * time.Second})
	w := r.enroll("w1")
	dm := r.lease(w, "s")
	for range 2 {
		r.expect(http.MethodPost, "/data/log/append", bytes.Repeat([]byte("x"), 100), w.cred, dm.Lease, http.StatusOK)
	}
	start := time.Now()
	pw, out := r.pipedAppend(w.cred, dm.Lease, "log", 100) // 300 > 250
	defer pw.Close()
	a := <-out
	if took := time.Since(start); a.status != http.StatusRequestEntityTooLarge || !strings.Contains(string(a.body), "stream") || took > 2*time.Second {
		t.Fatalf("an append of 100 declared bytes onto 200 of 250, its body never sent: HTTP %d %s after %v, want 413 naming the stream at once", a.status, a.body, took.Round(time.Millisecond))
	}
	pw2, out2 := r.pipedAppend(w.cred, dm.Lease, "log", 50) // 250: room
	pw2.Write(bytes.Repeat([]byte("y"), 50))
	pw2.Close()
	if a := <-out2; a.status != http.StatusOK {
		t.Fatalf("an append that fills the stream exactly: HTTP %d %s, want 200", a.status, a.body)
	}
}

// A secret's value (PUT /secret/NAME, at most 64 KiB) is held within the
// data plane's memory budget, as an append's body is (SPEC §14): a secret
// whose body stalls holding the whole budget makes an append wait for it.
func TestSecretPutHeldWithinTheBudget(t *testing.T) {
	t.Parallel()
	r := startData(t, orchestrator.Options{MaxAppendBody: 64 << 10, MaxDataInFlight: 64 << 10, BodyIdleTimeout: 10 * time.Second})
	w := r.enroll("w1")
	dm := r.leaseFor(w, core.StepSpec{Name: "minter", PutSecrets: []string{"MINTED"}})
	pr, pw := io.Pipe()
	req, _ := http.NewRequestWithContext(r.ctx, http.MethodPut, r.d.DataURL()+"/secret/MINTED", pr)
	req.ContentLength = core.MaxSecretBytes
	req.Header.Set("Authorization", "Bearer "+w.cred)
	req.Header.Set(orchestrator.LeaseHeader, strconv.FormatUint(uint64(dm.Lease), 10))
	secretDone := make(chan int, 1)
	go func() {
		resp, err := r.hc.Do(req)
		if err != nil {
			secretDone <- 0
			return
		}
		resp.Body.Close()
		secretDone <- resp.StatusCode
	}()
	if _, err := pw.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the secret holds the budget
	pa, outA := r.pipedAppend(w.cred, dm.Lease, "log", 5)
	pa.Write([]byte("hello"))
	pa.Close()
	select {
	case a := <-outA:
		t.Fatalf("an append answered HTTP %d while a stalled secret held the whole budget; want it to wait", a.status)
	case <-time.After(time.Second):
	}
	pw.Write(bytes.Repeat([]byte("y"), core.MaxSecretBytes-1))
	pw.Close()
	if code := <-secretDone; code != http.StatusCreated {
		t.Fatalf("the secret: HTTP %d, want 201", code)
	}
	if a := <-outA; a.status != http.StatusOK {
		t.Fatalf("the append after the secret: HTTP %d %s, want 200", a.status, a.body)
	}
}
