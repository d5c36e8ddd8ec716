package main

// Hostile input at the data plane (SPEC §14, §12's limits): attacks that
// speak Tether's data-plane protocol to a real listener, written as helpers
// another test can run side by side, and tests that run each one while a
// genuine worker is served.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	flag "github.com/spf13/pflag"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/dataplane"
	"github.com/tether-run/tether/adapters/netfault"
	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/client"
	"github.com/tether-run/tether/core"
)

// h2cClient is an HTTP client that speaks only cleartext HTTP/2 (prior
// knowledge), as workers do, dialing from the source address from (nil:
// any).
func h2cClient(from net.IP) *http.Client {
	d := &net.Dialer{Timeout: 10 * time.Second}
	if from != nil {
		d.LocalAddr = &net.TCPAddr{IP: from}
	}
	tr := &http.Transport{DialContext: d.DialContext, Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: tr}
}

// stallBody sends its first bytes, then stalls until closed (the transport
// closes it when the server answers, or the test ends).
type stallBody struct {
	r    io.Reader
	once sync.Once
	stop chan struct{}
}

func newStallBody(n int) *stallBody {
	return &stallBody{r: bytes.NewReader(make([]byte, n)), stop: make(chan struct{})}
}

func (s *stallBody) Read(p []byte) (int, error) {
	if n, _ := s.r.Read(p); n > 0 {
		return n, nil
	}
	<-s.stop
	return 0, io.ErrUnexpectedEOF
}

func (s *stallBody) Close() error { s.once.Do(func() { close(s.stop) }); return nil }

// attackStalledPutsResult is what attackStalledPuts saw.
type attackStalledPutsResult struct {
	Sent     int         // PUTs started
	Answered map[int]int // answers by HTTP status (a refusal is 401)
	Failed   int         // requests that ended without an answer before ctx did
	Hanging  int         // requests still unanswered when ctx ended
}

func (r attackStalledPutsResult) String() string {
	return fmt.Sprintf("sent %d, answered %v, failed %d, unanswered at the end %d", r.Sent, r.Answered, r.Failed, r.Hanging)
}

// attackStalledPuts runs the attack against the orchestrator at addr
// (host:port) until ctx is done and returns what it observed: from
// 127.0.0.4, over h2c, it keeps n unauthenticated PUTs in flight at once
// (a made-up credential), each declaring size bytes, sending sent of them
// and then stalling; each one answered is replaced after a pause of 20 ms.
// Before SPEC §14 read a write's body before checking its credential, a
// few such PUTs reserved the whole write budget and a genuine PUT hung.
func attackStalledPuts(ctx context.Context, t *testing.T, addr string, n, size, sent int) attackStalledPutsResult {
	hc := h2cClient(stalledIP)
	defer hc.CloseIdleConnections()
	var (
		mu  sync.Mutex
		res = attackStalledPutsResult{Answered: map[int]int{}}
		wg  sync.WaitGroup
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				body := newStallBody(sent)
				req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://"+addr+"/data/stalled-"+strconv.Itoa(i), body)
				if err != nil {
					t.Error(err)
					return
				}
				req.ContentLength = int64(size)
				req.Header.Set("Authorization", "Bearer w-attacker.00000000000000000000000000000000")
				req.Header.Set(orchestrator.LeaseHeader, "1")
				mu.Lock()
				res.Sent++
				mu.Unlock()
				resp, err := hc.Do(req)
				body.Close()
				mu.Lock()
				switch {
				case err == nil:
					res.Answered[resp.StatusCode]++
				case ctx.Err() != nil:
					res.Hanging++
				default:
					res.Failed++
				}
				mu.Unlock()
				if err == nil {
					io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
					resp.Body.Close()
				}
				select {
				case <-ctx.Done():
				case <-time.After(20 * time.Millisecond):
				}
			}
		}()
	}
	wg.Wait()
	return res
}

// patternReader yields n bytes of a pattern that depends on seed, without
// holding them.
type patternReader struct {
	seed byte
	n    int64
	buf  []byte
}

func newPatternReader(seed byte, n int64) *patternReader {
	b := make([]byte, 32<<10)
	for i := range b {
		b[i] = byte(i) ^ seed
	}
	return &patternReader{seed: seed, n: n, buf: b}
}

func (p *patternReader) Read(b []byte) (int, error) {
	if p.n <= 0 {
		return 0, io.EOF
	}
	n := copy(b, p.buf[:min(int64(len(p.buf)), p.n)])
	p.n -= int64(n)
	return n, nil
}

// attackBigPutsResult is what attackBigPuts saw.
type attackBigPutsResult struct {
	Over  map[int]int // answers to the PUTs over the limit, by HTTP status (want 413)
	Exact map[int]int // answers to the PUTs of exactly the limit (want 201)
	Errs  []string    // requests that got no answer
}

// attackBigPuts runs the attack against the orchestrator at addr
// (host:port) until ctx is done or every request was answered, and returns
// what it observed: from 127.0.0.2, over h2c, with a genuine credential and
// lease (a worker gone rogue), each on its own connection, it sends at
// once over PUTs of limit + 1
// bytes (every other one without a Content-Length, so that only the
// streamed bytes show it) and exact PUTs of exactly limit bytes, each of
// its own bytes. Before SPEC §14 streamed bodies into blobs, the
// orchestrator held every body in memory and wrote it inside the loop's
// commit.
func attackBigPuts(ctx context.Context, t *testing.T, addr, cred string, lease uint64, limit int64, over, exact int) attackBigPutsResult {
	var (
		mu  sync.Mutex
		res = attackBigPutsResult{Over: map[int]int{}, Exact: map[int]int{}}
		wg  sync.WaitGroup
	)
	put := func(i int, size int64, declare bool, into map[int]int) {
		defer wg.Done()
		hc := h2cClient(attackerIP) // a connection each, as separate workers would have
		defer hc.CloseIdleConnections()
		var body io.Reader = newPatternReader(byte(i), size)
		if !declare {
			body = io.MultiReader(body) // hides the length: sent without Content-Length
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://"+addr+"/data/big-"+strconv.Itoa(i), body)
		if err != nil {
			t.Error(err)
			return
		}
		if declare {
			req.ContentLength = size
		}
		req.Header.Set("Authorization", "Bearer "+cred)
		req.Header.Set(orchestrator.LeaseHeader, strconv.FormatUint(lease, 10))
		resp, err := hc.Do(req)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			res.Errs = append(res.Errs, fmt.Sprintf("PUT of %d bytes: %v", size, err))
			return
		}
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		into[resp.StatusCode]++
	}
	for i := range over {
		wg.Add(1)
		go put(i, limit+1, i%2 == 0, res.Over)
	}
	for i := range exact {
		wg.Add(1)
		go put(over+i, limit, true, res.Exact)
	}
	wg.Wait()
	return res
}

// genuinePut is a worker's own PUT, with its credential and lease, from
// 127.0.0.1; it returns the status and the answer's text.
func genuinePut(ctx context.Context, addr, cred string, lease uint64, id string, body []byte) (int, string, error) {
	hc := h2cClient(nil)
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://"+addr+"/data/"+id, bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer "+cred)
	req.Header.Set(orchestrator.LeaseHeader, strconv.FormatUint(lease, 10))
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(b), nil
}

// savedCredential reads the session credential a worker saved in its
// state directory (SPEC §9).
func savedCredential(t *testing.T, ctx context.Context, dir string) string {
	t.Helper()
	var cred string
	poll(t, ctx, "the worker to save its credential", func() bool {
		b, err := os.ReadFile(filepath.Join(dir, "worker.json"))
		var st struct {
			Credential string `json:"credential"`
		}
		if err == nil && json.Unmarshal(b, &st) == nil && st.Credential != "" {
			cred = st.Credential
			return true
		}
		return false
	})
	return cred
}

// holdStep is a write-bearing step that runs until the file go exists.
func holdStep(name, goFile string) string {
	return fmt.Sprintf("while [ ! -e %s ]; do sleep 0.05; done; echo released", goFile)
}

// TestHostileStalledPuts: 256 unauthenticated PUTs, each declaring 60 KiB
// and stalling after 16 KiB, kept in flight from 127.0.0.2, against an
// in-process orchestrator on a real loopback listener whose append budget
// is 1 MiB. Each is refused 401 on its headers, before a byte of its body
// is read, so none holds anything; meanwhile a real worker binary runs a
// write-bearing step and a 100 KiB PUT made with its own saved credential
// and lease is stored, and the run succeeds. Before, bodies of 64 KiB or
// less were read before the credential was checked, each reserving its
// Content-Length of the budget until its 5-minute deadline: 18 such PUTs
// fill 1 MiB, so 256 of them (15 MiB reserved) leave the genuine PUT
// waiting for room (with the default 256 MiB budget, 4,200 do the same).
func TestHostileStalledPuts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the worker binary")
	}
	ctx, cancel := context.WithTimeout(t.Context(), faultTimeout)
	defer cancel()
	_, workerBin := buildBinaries(t, ctx)
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})).With("side", "orchestrator")
	d, err := orchestrator.Start(orchestrator.Options{Addr: "127.0.0.1:0", StorePath: filepath.Join(t.TempDir(), "tether.db"), Logger: log,
		MaxPutBody: 1 << 20, MaxBundleBody: 1 << 20, MaxAppendBody: 64 << 10, MaxDataInFlight: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	rec := netfault.NewRecorder()
	p, err := netfault.Listen(d.Addr(), rec.Tap())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	r := &binRig{t: t, ctx: ctx, d: d, p: p, rec: rec, workerBin: workerBin, workers: map[string]*proc{}}
	stateDir := t.TempDir()
	r.startWorker("w1", "--state-dir", stateDir)
	cred := savedCredential(t, ctx, stateDir)
	goFile := filepath.Join(t.TempDir(), "go")
	run := r.submit(core.RunSpec{Name: "genuine", Steps: []core.StepSpec{{Name: "hold", Command: holdStep("hold", goFile), Writes: true}}})
	step := stepID(run, "hold")
	r.waitFor("the step to run", stepIs(step, core.StateRunning))
	var lease core.LeaseID
	if err := (coreViewer{d}).Snapshot(ctx, func(o coreView) { s, _ := o.StepByID(step); lease = s.Lease }); err != nil {
		t.Fatal(err)
	}

	actx, stop := context.WithCancel(ctx)
	attacked := make(chan attackStalledPutsResult, 1)
	go func() { attacked <- attackStalledPuts(actx, t, d.Addr(), 256, 60<<10, 16<<10) }()
	time.Sleep(time.Second) // let the attack fill whatever it can

	body := bytes.Repeat([]byte("genuine "), 100<<10/8)
	pctx, pcancel := context.WithTimeout(ctx, 20*time.Second)
	begin := time.Now()
	status, text, err := genuinePut(pctx, d.Addr(), cred, uint64(lease), "genuine.out", body)
	took := time.Since(begin)
	pcancel()
	stop()
	res := <-attacked
	t.Logf("attack: %s; the genuine PUT took %s", res, took.Round(time.Millisecond))
	if err != nil || status != http.StatusCreated {
		t.Fatalf("the genuine PUT during the attack: HTTP %d %s %v, want 201", status, text, err)
	}
	if res.Sent < 256 || res.Answered[http.StatusUnauthorized] == 0 || len(res.Answered) != 1 {
		t.Errorf("attack: %s; want at least 256 stalled PUTs sent and every answer a 401", res)
	}
	if res.Failed != 0 {
		t.Errorf("%d attack PUTs failed without an answer", res.Failed)
	}
	if err := os.WriteFile(goFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r.waitFor("the run to finish", runFinished(run))
	if v := r.view(run); v.status != "success" {
		t.Fatalf("the genuine run ended %s:\n%s", v.status, v)
	}
	if vs := dataVersionsOf(t, ctx, d.Addr(), cred, "genuine.out"); len(vs.Versions) != 1 || vs.Versions[0].Size != int64(len(body)) {
		t.Fatalf("genuine.out versions %+v", vs)
	}
}

// dataVersionsOf lists an id's versions through the data plane.
func dataVersionsOf(t *testing.T, ctx context.Context, addr, cred, id string) dataplane.Versions {
	t.Helper()
	hc := h2cClient(nil)
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/data/"+id, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+cred)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out dataplane.Versions
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /data/%s: HTTP %d %v", id, resp.StatusCode, err)
	}
	return out
}

// bigPutsPeakRSSBytes bounds the peak resident memory (VmHWM) of an
// orchestrator serving attackBigPuts' four PUTs of 64 MiB + 1 byte and four
// of exactly 64 MiB at once, plus a genuine worker (SPEC §14): a Go runtime
// and its heap (~20 MiB), bbolt's map of a small file, and per connection
// an HTTP/2 receive window (1 MiB) plus a 64 KiB copy buffer per streamed
// body; no body is held whole. Holding the four accepted bodies alone
// (256 MiB) is twice the bound.
const bigPutsPeakRSSBytes = 48 << 20

// TestHostileBigPuts runs attackBigPuts against a real `orchestrator serve`
// built without -race, whose peak RSS is then read from
// /proc/PID/status: over-limit bodies are refused 413 (declared: at once;
// streamed: when the bytes pass the limit) and write nothing, the four of
// exactly the limit are stored, the peak stays within bigPutsPeakRSSBytes,
// and meanwhile a real worker's write-bearing step gets a PUT with its own
// credential stored and its run succeeds.
func TestHostileBigPuts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/PID/status")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*faultTimeout)
	defer cancel()
	_, workerBin := buildBinaries(t, ctx)
	orchBin := buildNoRaceOrchestrator(t, ctx)
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	r := serveRig(t, ctx, orchBin, workerBin, dataDir, "--log-level", "info")
	stateDir := t.TempDir()
	r.worker("w1", "--state-dir", stateDir)
	cred := savedCredential(t, ctx, stateDir)
	goFile := filepath.Join(dir, "go")
	run := r.submit(fmt.Sprintf("name: genuine\nsteps:\n  - name: hold\n    writes: true\n    run: %s\n", holdStep("hold", goFile)))
	var lease uint64
	poll(t, ctx, "the step to run", func() bool {
		s := apiStep(r.api.run(run), "hold")
		lease = s.Lease
		return s.State == "running"
	})

	const limit = orchestrator.DefaultMaxPutBody
	attacked := make(chan attackBigPutsResult, 1)
	go func() { attacked <- attackBigPuts(ctx, t, r.addr, cred, lease, limit, 4, 4) }()
	time.Sleep(300 * time.Millisecond) // the big bodies are on their way
	pctx, pcancel := context.WithTimeout(ctx, 20*time.Second)
	status, text, err := genuinePut(pctx, r.addr, cred, lease, "genuine.out", []byte("genuine bytes"))
	pcancel()
	if err != nil || status != http.StatusCreated {
		t.Errorf("the genuine PUT during the attack: HTTP %d %s %v, want 201", status, text, err)
	}
	res := <-attacked
	t.Logf("attack: over the limit %v, exactly the limit %v, errors %v", res.Over, res.Exact, res.Errs)
	if res.Over[http.StatusRequestEntityTooLarge] != 4 || res.Exact[http.StatusCreated] != 4 || len(res.Errs) != 0 {
		t.Errorf("answers: over the limit %v (want 4 × 413), exactly the limit %v (want 4 × 201), errors %v", res.Over, res.Exact, res.Errs)
	}
	peak := peakRSS(t, r.serve.cmd.Process.Pid)
	t.Logf("orchestrator peak RSS (VmHWM): %d MiB (bound %d MiB)", peak>>20, bigPutsPeakRSSBytes>>20)
	if peak > bigPutsPeakRSSBytes {
		t.Errorf("orchestrator peak RSS %d MiB, over the bound of %d MiB", peak>>20, bigPutsPeakRSSBytes>>20)
	}
	for i := range 4 {
		if _, err := r.api.client().DataVersions(ctx, "big-"+strconv.Itoa(i)); client.ErrorCode(err) != client.CodeNotFound {
			t.Errorf("big-%d, over the limit: %v, want nothing written (not_found)", i, err)
		}
		list, err := r.api.client().DataVersions(ctx, "big-"+strconv.Itoa(4+i))
		r.api.check("data versions", err)
		if len(list.Versions) != 1 || list.Versions[0].Size != limit {
			t.Errorf("big-%d: versions %+v, want one of %d bytes", 4+i, list.Versions, limit)
		}
	}
	if err := os.WriteFile(goFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if det := r.waitFinished(run); det.Status != "success" {
		t.Fatalf("the genuine run ended %s", det.Status)
	}
}

// buildNoRaceOrchestrator builds cmd/orchestrator without -race (the race
// detector's shadow memory would swamp the measurement).
func buildNoRaceOrchestrator(t *testing.T, ctx context.Context) string {
	t.Helper()
	return buildNoRace(t, ctx, "orchestrator")
}

// buildNoRace builds ./cmd/NAME without -race.
func buildNoRace(t *testing.T, ctx context.Context, name string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), name)
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", out, "./cmd/"+name)
	cmd.Dir = filepath.Join("..", "..") // the module root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	return out
}

// peakRSS reads a process's peak resident set size (VmHWM) in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM %q: %v", rest, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/PID/status")
	return 0
}

// The data plane's limits come from data: config keys and --data-* flags
// (flags win); unset ones stay zero, the driver's defaults.
func TestServeDataLimits(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "server-config.yaml")
	os.WriteFile(cfgPath, []byte("data:\n  max_put_body_bytes: 1000\n  body_idle_timeout_secs: 5\n  max_stream_bytes: 7\n"), 0o600)
	resolve := func(args ...string) (serverConfig, error) {
		o := &options{}
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		serveCmd.flags(fs, o)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return resolveServeConfig(&env{opts: o, flags: fs})
	}
	cfg, err := resolve("--config", cfgPath, "--data-max-stream-bytes", "9000", "--data-max-append-in-flight-bytes", "4096")
	want := dataLimits{MaxPutBodyBytes: 1000, BodyIdleTimeoutSecs: 5, MaxStreamBytes: 9000, MaxAppendInFlightBytes: 4096}
	if err != nil || cfg.Data != want {
		t.Fatalf("data limits %+v, %v; want %+v", cfg.Data, err, want)
	}
	var o orchestrator.Options
	cfg.Data.apply(&o)
	if o.MaxPutBody != 1000 || o.BodyIdleTimeout != 5*time.Second || o.MaxStream != 9000 || o.MaxDataInFlight != 4096 || o.MaxAppendBody != 0 || o.MaxBundleBody != 0 {
		t.Fatalf("options %+v", o)
	}
	if _, err := resolve("--config", cfgPath, "--data-max-put-body-bytes", "-1"); exitCode(err) != exitUsage {
		t.Errorf("a negative flag: %v, want a usage error", err)
	}
	for src, msg := range map[string]string{
		"data:\n  max_put_body_bytes: 0\n":  "c.yaml:2: data: max_put_body_bytes must be a positive whole number",
		"data:\n  max_put_body_bytes: 1M\n": "c.yaml:2: data: max_put_body_bytes must be a positive whole number",
		"data:\n  max_body: 1\n":            `c.yaml:2: data: unknown key "max_body"`,
	} {
		if _, err := loadServerConfig("c.yaml", []byte(src)); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%q: %v, want %q", src, err, msg)
		}
	}
}
