package main

// Hostile clients at the control plane (issue 11; SPEC §9, §12): each attack
// speaks Tether's protocol to the real socket of an orchestrator driver, from
// 127.0.0.2, while a genuine worker binary (through the proxy, from
// 127.0.0.1) runs a small workflow to success and an operator call is
// answered. The attacks are helpers of one shape,
//
//	attackXxx(ctx, t, addr, ...) attackXxxResult
//
// so that one test can run several at once against one orchestrator.

import (
	"context"
	"errors"
	"fmt"
	flag "github.com/spf13/pflag"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/adapters/wire"
	"github.com/tether-run/tether/core"
)

// hostileCtlOptions are the control plane's admission limits for these
// tests: small, so that attacks of a few dozen connections reach them.
func hostileCtlOptions() orchestrator.Options {
	return orchestrator.Options{MaxConns: 32, MaxUnauthConns: 48, MaxUnauthConnsPerAddr: 8, HelloTimeout: 2 * time.Second}
}

// startHostileRig is startBinRig with the given control-plane options.
func startHostileRig(t *testing.T, opts orchestrator.Options) *binRig {
	t.Helper()
	return startBinRigWith(t, faultTimeout, opts)
}

// underAttack runs attack until a genuine worker binary has run a workflow
// of five steps to success and an operator call has been answered, both
// while the attack is in progress (it starts first and runs at least
// minAttack); then it stops the attack and returns.
func underAttack(r *binRig, minAttack time.Duration, attack func(ctx context.Context)) {
	r.t.Helper()
	ctx, cancel := context.WithCancel(r.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		attack(ctx)
	}()
	start := time.Now()
	time.Sleep(300 * time.Millisecond) // the attack is under way
	r.startWorker("genuine", "--tags", "genuine")
	spec := core.RunSpec{Name: "genuine"}
	for i := range 5 { // only for the genuine worker: the attackers enroll too
		spec.Steps = append(spec.Steps, core.StepSpec{Name: fmt.Sprintf("s%d", i), Command: "echo ok", Tags: []string{"genuine"}})
	}
	run := r.submit(spec)
	r.waitFor("the genuine run to finish", runFinished(run))
	callCtx, callCancel := context.WithTimeout(r.ctx, 5*time.Second)
	_, err := r.d.CreateToken(callCtx, "operator-call", time.Minute)
	callCancel()
	if err != nil {
		r.t.Errorf("an operator call during the attack: %v", err)
	}
	if v := r.view(run); v.status != "success" {
		r.t.Errorf("the genuine run during the attack: %s\n%s", v.status, v)
	}
	if rest := minAttack - time.Since(start); rest > 0 {
		time.Sleep(rest)
	}
	cancel()
	<-done
}

// Attackers dial the control plane from 127.0.0.2, another source address
// than the genuine clients (127.0.0.1); attackHelloless from 127.0.0.3, so
// that the per-address cap it fills is its own and not the other attacks'
// (which run beside it in TestHostileAllAtOnce).
// attackStalledPuts and attackBigSubmit have addresses of their own too
// (127.0.0.4, 127.0.0.5): each is a client the server throttles on its own
// (SPEC §12's work and refusal budgets are per source address).
var (
	attackerIP  = net.IPv4(127, 0, 0, 2)
	hellolessIP = net.IPv4(127, 0, 0, 3)
	stalledIP   = net.IPv4(127, 0, 0, 4)
	submitterIP = net.IPv4(127, 0, 0, 5)
)

// dialAttacker opens one control connection from 127.0.0.2. A refused
// upgrade returns its status and body.
func dialAttacker(ctx context.Context, addr string) (*websocket.Conn, int, string, error) {
	return dialAttackerFrom(ctx, addr, attackerIP)
}

// dialAttackerFrom opens one control connection from the source address ip.
func dialAttackerFrom(ctx context.Context, addr string, ip net.IP) (*websocket.Conn, int, string, error) {
	d := &websocket.Dialer{HandshakeTimeout: 5 * time.Second,
		NetDialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}}).DialContext}
	ws, resp, err := d.DialContext(ctx, "ws://"+addr+"/control", nil)
	if err != nil {
		if resp != nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
			resp.Body.Close()
			return nil, resp.StatusCode, strings.TrimSpace(string(body)), err
		}
		return nil, 0, "", err
	}
	return ws, http.StatusSwitchingProtocols, "", nil
}

// ended is how a connection ended, as its client saw it: the close frame's
// code and reason (code 0: no close frame, the connection was reset or hung
// up), and the protocol messages received before.
type ended struct {
	code   int
	reason string
	msgs   []core.Msg
	err    error
}

// readToEnd reads ws until it ends or wait passes (then code is -1).
func readToEnd(ws *websocket.Conn, wait time.Duration) ended {
	var e ended
	ws.SetReadDeadline(time.Now().Add(wait))
	for {
		typ, b, err := ws.ReadMessage()
		if err != nil {
			var ce *websocket.CloseError
			var ne net.Error
			switch {
			case errors.As(err, &ce) && ce.Code == websocket.CloseAbnormalClosure:
				// gorilla's name for a connection that ended without a close frame
			case errors.As(err, &ce):
				e.code, e.reason = ce.Code, ce.Text
			case errors.As(err, &ne) && ne.Timeout():
				e.code = -1
			}
			e.err = err
			return e
		}
		if typ == websocket.TextMessage {
			if m, err := wire.Decode(b); err == nil {
				e.msgs = append(e.msgs, m)
			}
		}
	}
}

func send(ws *websocket.Conn, m core.Msg) error {
	b, err := wire.Encode(m)
	if err != nil {
		return err
	}
	ws.SetWriteDeadline(time.Now().Add(5 * time.Second))
	return ws.WriteMessage(websocket.TextMessage, b)
}

// ---- attackHelloless ----

// attackHellolessResult is what attackHelloless observed.
type attackHellolessResult struct {
	Upgraded    int            // connections upgraded (each then never said hello)
	Refused     int            // upgrades refused with 503
	RefusedWhy  map[string]int // their bodies
	Closed      map[int]int    // close frames received, by code
	ClosedWhy   map[string]int // their reasons
	Reset       int            // connections that ended without a close frame
	LongestHeld time.Duration  // the longest an upgraded connection stayed open
}

// attackHelloless keeps n connections from 127.0.0.3 upgraded to WebSocket
// that answer pings (gorilla's default handler, while reading) but never
// send a Hello, redialling each as soon as it ends, until ctx is done.
func attackHelloless(ctx context.Context, t *testing.T, addr string, n int) attackHellolessResult {
	res := attackHellolessResult{RefusedWhy: map[string]int{}, Closed: map[int]int{}, ClosedWhy: map[string]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				ws, status, body, err := dialAttackerFrom(ctx, addr, hellolessIP)
				if err != nil {
					mu.Lock()
					if status == http.StatusServiceUnavailable {
						res.Refused++
						res.RefusedWhy[body]++
					}
					mu.Unlock()
					select {
					case <-ctx.Done():
					case <-time.After(100 * time.Millisecond):
					}
					continue
				}
				opened := time.Now()
				stop := context.AfterFunc(ctx, func() { ws.Close() })
				e := readToEnd(ws, time.Hour)
				stop()
				ws.Close()
				mu.Lock()
				res.Upgraded++
				if ctx.Err() == nil {
					res.LongestHeld = max(res.LongestHeld, time.Since(opened))
					if e.code > 0 {
						res.Closed[e.code]++
						res.ClosedWhy[e.reason]++
					} else {
						res.Reset++
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return res
}

// TestHostileHellolessConnections: connections that never say hello are
// closed after the Hello deadline with 1008 and a reason, and beyond the
// per-address cap of unauthenticated connections their upgrades are refused
// with 503 and the reason; a genuine worker connects meanwhile, since those
// connections never hold a place of the authenticated cap. 64 attacking
// connections are twice the authenticated cap (32): on the old code (one
// cap for all, no Hello deadline) they take every place and the genuine
// worker's upgrade is refused for as long as they stay.
func TestHostileHellolessConnections(t *testing.T) {
	opts := hostileCtlOptions()
	r := startHostileRig(t, opts)
	var res attackHellolessResult
	underAttack(r, 2*opts.HelloTimeout+time.Second, func(ctx context.Context) {
		res = attackHelloless(ctx, t, r.d.Addr(), 64)
	})
	t.Logf("helloless attack: %+v", res)
	checkHelloless(t, res, opts.HelloTimeout, opts.MaxUnauthConnsPerAddr)
}

// checkHelloless checks what attackHelloless saw: connections closed with
// 1008 at the Hello deadline, never reset, and upgrades over the per-address
// cap refused with its reason.
func checkHelloless(t *testing.T, res attackHellolessResult, helloTimeout time.Duration, perAddrCap int) {
	t.Helper()
	want := fmt.Sprintf("no hello within %s", helloTimeout)
	if res.Closed[websocket.ClosePolicyViolation] == 0 || res.ClosedWhy[want] == 0 {
		t.Errorf("no connection was closed with 1008 %q: %+v", want, res)
	}
	if len(res.Closed) != 1 || res.Reset > 0 {
		t.Errorf("helloless connections ended otherwise than with 1008: closes %v, resets %d", res.Closed, res.Reset)
	}
	if res.LongestHeld > helloTimeout+2*time.Second {
		t.Errorf("a connection without a hello was held %s, want about the hello timeout %s", res.LongestHeld, helloTimeout)
	}
	perAddr := fmt.Sprintf("too many connections without an accepted hello from 127.0.0.3 (%d); try again later", perAddrCap)
	if res.Refused == 0 || res.RefusedWhy[perAddr] == 0 {
		t.Errorf("no upgrade was refused with the per-address cap's reason %q: %v", perAddr, res.RefusedWhy)
	}
}

// ---- attackBigHello ----

// attackBigHelloResult is what attackBigHello observed, per case.
type attackBigHelloResult struct {
	Rounds  int
	Refusal map[string]string // case → the Refused message's reason
	Fatal   map[string]bool   // case → the refusal was fatal
	Code    map[string]int    // case → the close code
	Reason  map[string]string // case → the close frame's reason
}

// bigHelloCases are Hellos with one field beyond its limit (SPEC §12), each
// with the refusal's expected reason. The frame case is a Hello over
// wire.MaxFrame, encoded by hand: it is refused by the transport (1009).
func bigHelloCases(token string) map[string]core.Hello {
	base := func() core.Hello {
		return core.Hello{Version: core.ProtocolVersion, Token: token, Worker: "big-hello", Name: "big", Slots: 1, MaxDelay: time.Second}
	}
	cases := map[string]core.Hello{}
	h := base()
	h.Name = strings.Repeat("n", 512<<10)
	cases["512 KiB name"] = h
	h = base()
	for i := range 70_000 {
		h.Tags = append(h.Tags, fmt.Sprintf("t%d", i))
	}
	cases["70,000 tags"] = h
	h = base()
	h.Labels = map[string]string{}
	for i := range 40_000 {
		h.Labels[fmt.Sprintf("k%d", i)] = "v"
	}
	cases["40,000 labels"] = h
	h = base()
	h.Slots = 0
	cases["slots 0"] = h
	h = base()
	for i := range 2000 {
		h.InFlight = append(h.InFlight, core.LeaseRef{Step: "run-1/x", Lease: core.LeaseID(i + 1)})
	}
	cases["2,000 in-flight leases"] = h
	h = base()
	h.Tags = []string{"ok", "esc\x1b[2J"}
	cases["control character in a tag"] = h
	h = base()
	h.Platform = strings.Repeat("p", 129)
	cases["129-byte platform"] = h
	return cases
}

var bigHelloWant = map[string]string{
	"512 KiB name":               "worker name is 524288 bytes, at most 128",
	"70,000 tags":                "70000 tags, at most 64",
	"40,000 labels":              "40000 labels, at most 64",
	"slots 0":                    "slots 0 out of range 1..1024",
	"2,000 in-flight leases":     "in-flight list of 2000 leases, at most 1088",
	"control character in a tag": "non-printable character U+001B",
	"129-byte platform":          "platform is 129 bytes, at most 128",
	"frame over 1 MiB":           fmt.Sprintf("frame larger than %d bytes", wire.MaxFrame),
}

// attackBigHello sends each oversized Hello of bigHelloCases (and one frame
// over wire.MaxFrame) on its own connection from 127.0.0.2, round after
// round, until ctx is done, with a valid enrollment token: it records what
// each was answered and how its connection was closed.
func attackBigHello(ctx context.Context, t *testing.T, addr, token string) attackBigHelloResult {
	res := attackBigHelloResult{Refusal: map[string]string{}, Fatal: map[string]bool{}, Code: map[string]int{}, Reason: map[string]string{}}
	frames := map[string][]byte{}
	for name, h := range bigHelloCases(token) {
		b, err := wire.Encode(h)
		if err != nil {
			t.Errorf("encode %s: %v", name, err)
			return res
		}
		frames[name] = b
	}
	frames["frame over 1 MiB"] = []byte(`{"v":1,"type":"hello","body":{"version":2,"worker":"big-hello","name":"` + strings.Repeat("n", wire.MaxFrame) + `"}}`)
	for ctx.Err() == nil {
		for name, b := range frames {
			ws, status, body, err := dialAttacker(ctx, addr)
			if err != nil {
				if ctx.Err() == nil && status != http.StatusServiceUnavailable {
					t.Errorf("%s: dial: %v (%d %s)", name, err, status, body)
				}
				continue
			}
			ws.SetWriteDeadline(time.Now().Add(5 * time.Second))
			ws.WriteMessage(websocket.TextMessage, b)
			e := readToEnd(ws, 10*time.Second)
			ws.Close()
			if ctx.Err() != nil {
				break
			}
			for _, m := range e.msgs {
				if rf, ok := m.(core.Refused); ok {
					res.Refusal[name], res.Fatal[name] = rf.Reason, rf.Fatal
				}
			}
			res.Code[name], res.Reason[name] = e.code, e.reason
		}
		res.Rounds++
	}
	return res
}

// TestHostileBigHello: every field of a Hello is bounded; an oversized one
// is refused, fatally, naming the field, and the connection is closed with
// 1008 and the reason (a frame over the frame limit: 1009). The token the
// attacker holds is not used up by the refusals. On the old code the
// oversized name, tags, labels, platform and slots 0 were accepted.
func TestHostileBigHello(t *testing.T) {
	r := startHostileRig(t, hostileCtlOptions())
	token, err := r.d.CreateToken(r.ctx, "stolen", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var res attackBigHelloResult
	underAttack(r, 0, func(ctx context.Context) { res = attackBigHello(ctx, t, r.d.Addr(), token) })
	t.Logf("big-hello attack: %d rounds", res.Rounds)
	checkBigHello(t, res)
	// The refusals did not use up the token: a well-formed Hello enrolls with it.
	ws, _, _, err := dialAttacker(r.ctx, r.d.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	send(ws, core.Hello{Version: core.ProtocolVersion, Token: token, Worker: "big-hello", Name: "big", Slots: 1, MaxDelay: time.Second})
	if e := readToEnd(ws, 2*time.Second); len(e.msgs) == 0 {
		t.Errorf("the attacker's token after the refusals: nothing received (%v)", e.err)
	} else if _, ok := e.msgs[0].(core.Welcome); !ok {
		t.Errorf("the attacker's token after the refusals: %s, want a Welcome", core.DescribeMsg(e.msgs[0]))
	}
}

// checkBigHello checks what attackBigHello saw: every oversized Hello
// refused, fatally, with its reason, and closed 1008 (the frame over 1 MiB: 1009).
func checkBigHello(t *testing.T, res attackBigHelloResult) {
	t.Helper()
	for name, want := range bigHelloWant {
		code, reason, refusal := res.Code[name], res.Reason[name], res.Refusal[name]
		if name == "frame over 1 MiB" {
			if code != websocket.CloseMessageTooBig || reason != want {
				t.Errorf("%s: closed with %d %q, want 1009 %q", name, code, reason, want)
			}
			continue
		}
		if !strings.Contains(refusal, want) || !res.Fatal[name] {
			t.Errorf("%s: refused with %q (fatal %v), want a fatal refusal containing %q", name, refusal, res.Fatal[name], want)
		}
		if code != websocket.ClosePolicyViolation || !strings.Contains(reason, want) {
			t.Errorf("%s: closed with %d %q, want 1008 with %q", name, code, reason, want)
		}
	}
}

// ---- attackFlood ----

// attackFloodResult is what attackFlood observed.
type attackFloodResult struct {
	Sessions int            // connections that were welcomed
	Sent     int            // frames sent after the Welcomes
	Closed   map[int]int    // close frames received, by code
	Reasons  map[string]int // their reasons
	Reset    int            // sessions that ended without a close frame
}

// attackFlood enrolls one worker instance with token (from 127.0.0.2),
// then, session after session until ctx is done, sends frames as fast as it
// can: heartbeats that each list 1,024 leases it does not hold (each is
// answered with 1,024 cancels, more than a connection's send queue holds)
// interleaved with refreshes (each a durable record and an answer). It reads
// what it is sent, and reconnects with its credential when the server
// closes the session.
func attackFlood(ctx context.Context, t *testing.T, addr, token string) attackFloodResult {
	res := attackFloodResult{Closed: map[int]int{}, Reasons: map[string]int{}}
	var refs []core.LeaseRef
	for i := range core.MaxInFlightLeases {
		refs = append(refs, core.LeaseRef{Step: "run-999/x", Lease: core.LeaseID(1_000_000 + i)})
	}
	hb, _ := wire.Encode(core.Heartbeat{InFlight: refs})
	cred := ""
	for ctx.Err() == nil {
		ws, status, _, err := dialAttacker(ctx, addr)
		if err != nil {
			if ctx.Err() == nil && status != http.StatusServiceUnavailable {
				t.Errorf("flood: dial: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		hello := core.Hello{Version: core.ProtocolVersion, Worker: "flooder", Name: "flooder", Slots: 1, MaxDelay: time.Minute}
		if cred == "" {
			hello.Token = token
		} else {
			hello.Credential = cred
		}
		send(ws, hello)
		ws.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, b, err := ws.ReadMessage()
		m, _ := wire.Decode(b)
		wel, ok := m.(core.Welcome)
		if err != nil || !ok {
			t.Errorf("flood: hello answered %v, %v", m, err)
			ws.Close()
			return res
		}
		if wel.Credential != "" {
			cred = wel.Credential
		}
		res.Sessions++
		stop := context.AfterFunc(ctx, func() { ws.Close() })
		var wg sync.WaitGroup
		var sent int
		wg.Add(1)
		go func() { // the flood
			defer wg.Done()
			rf := 0
			for ctx.Err() == nil {
				ws.SetWriteDeadline(time.Now().Add(5 * time.Second))
				if err := ws.WriteMessage(websocket.TextMessage, hb); err != nil {
					return
				}
				rf++
				b, _ := wire.Encode(core.Refresh{Request: uint64(rf)})
				if err := ws.WriteMessage(websocket.TextMessage, b); err != nil {
					return
				}
				sent += 2
			}
		}()
		e := readToEnd(ws, time.Hour)
		stop()
		ws.Close()
		wg.Wait()
		res.Sent += sent
		if ctx.Err() != nil {
			break
		}
		if e.code > 0 {
			res.Closed[e.code]++
			res.Reasons[e.reason]++
		} else {
			res.Reset++
		}
	}
	return res
}

// TestHostileFlood: one connection sending frames as fast as it can, each
// answered with more than its send queue holds, is closed with 1013 and a
// reason (never reset without a close frame), again after each reconnect;
// its inputs wait at its own reader (at most 64 queued for the loop), so
// the genuine worker and the operator are served throughout. On the old
// code the flooder's connection was reset without a close frame.
func TestHostileFlood(t *testing.T) {
	r := startHostileRig(t, hostileCtlOptions())
	token, err := r.d.CreateToken(r.ctx, "flooder", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var res attackFloodResult
	underAttack(r, 3*time.Second, func(ctx context.Context) { res = attackFlood(ctx, t, r.d.Addr(), token) })
	t.Logf("flood: %+v", res)
	checkFlood(t, res)
}

// checkFlood checks what attackFlood saw: its sessions closed with 1013
// and the send queue's reason, never reset.
func checkFlood(t *testing.T, res attackFloodResult) {
	t.Helper()
	if res.Closed[websocket.CloseTryAgainLater] == 0 || res.Reset > 0 || len(res.Closed) != 1 {
		t.Errorf("flooding sessions ended with closes %v and %d resets, want only 1013 (try again later)", res.Closed, res.Reset)
	}
	for why := range res.Reasons {
		if !strings.Contains(why, "send queue full") {
			t.Errorf("flooding session closed with reason %q, want the send queue's", why)
		}
	}
}

// ---- attackBadFrames ----

// attackBadFramesResult is what attackBadFrames observed, per case: the
// close code (0 when the connection stayed open, as it must for a report
// with an unknown outcome status) and reason, and the answers received.
type attackBadFramesResult struct {
	Rounds int
	Code   map[string]int
	Reason map[string]string
	Answer map[string]string // case → the last answer or close message, described
}

// attackBadFrames enrolls one instance with token (from 127.0.0.2) and then,
// round after round until ctx is done, sends on fresh connections: a report
// with an unknown outcome status (answered REJECTED; the connection stays
// and still answers a refresh), a frame that does not decode, a binary
// frame, a frame over wire.MaxFrame, a message before any Hello, a second
// Hello, and a Hello with a forged credential.
func attackBadFrames(ctx context.Context, t *testing.T, addr, token string) attackBadFramesResult {
	res := attackBadFramesResult{Code: map[string]int{}, Reason: map[string]string{}, Answer: map[string]string{}}
	cred := ""
	hello := func() core.Hello {
		h := core.Hello{Version: core.ProtocolVersion, Worker: "bad-frames", Name: "bad-frames", Slots: 1, MaxDelay: time.Minute}
		if cred == "" {
			h.Token = token
		} else {
			h.Credential = cred
		}
		return h
	}
	// session dials; with a Hello it waits for the Welcome.
	session := func(withHello bool) *websocket.Conn {
		ws, _, _, err := dialAttacker(ctx, addr)
		if err != nil {
			if ctx.Err() == nil {
				t.Errorf("bad frames: dial: %v", err)
			}
			return nil
		}
		if !withHello {
			return ws
		}
		send(ws, hello())
		ws.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, b, err := ws.ReadMessage()
		m, _ := wire.Decode(b)
		wel, ok := m.(core.Welcome)
		if err != nil || !ok {
			if ctx.Err() == nil {
				t.Errorf("bad frames: hello answered %v, %v", m, err)
			}
			ws.Close()
			return nil
		}
		if wel.Credential != "" {
			cred = wel.Credential
		}
		return ws
	}
	raw := func(name string, withHello bool, typ int, frame []byte) {
		ws := session(withHello)
		if ws == nil {
			return
		}
		defer ws.Close()
		ws.SetWriteDeadline(time.Now().Add(5 * time.Second))
		ws.WriteMessage(typ, frame)
		e := readToEnd(ws, 10*time.Second)
		res.Code[name], res.Reason[name] = e.code, e.reason
		if len(e.msgs) > 0 {
			res.Answer[name] = core.DescribeMsg(e.msgs[len(e.msgs)-1])
		}
	}
	for ctx.Err() == nil {
		// A report with an unknown outcome status: REJECTED, connection kept.
		if ws := session(true); ws != nil {
			ws.WriteMessage(websocket.TextMessage, []byte(`{"v":1,"type":"report","body":{"step":"run-1/s","lease":1,"request":1,"outcome":{"status":"exploded","exit_code":0}}}`))
			send(ws, core.Refresh{Request: 9})
			var got []string
			ws.SetReadDeadline(time.Now().Add(10 * time.Second))
			for len(got) < 2 {
				_, b, err := ws.ReadMessage()
				if err != nil {
					var ce *websocket.CloseError
					if errors.As(err, &ce) {
						res.Code["unknown outcome"], res.Reason["unknown outcome"] = ce.Code, ce.Text
					}
					break
				}
				if m, err := wire.Decode(b); err == nil {
					if _, ok := m.(core.LogAck); !ok {
						got = append(got, core.DescribeMsg(m))
					}
				}
			}
			res.Answer["unknown outcome"] = strings.Join(got, "; ")
			if len(got) == 2 {
				res.Code["unknown outcome"], res.Reason["unknown outcome"] = 0, ""
			}
			ws.Close()
		}
		raw("undecodable", true, websocket.TextMessage, []byte(`{"v":1,"type":"report","body":[]}`))
		raw("binary", true, websocket.BinaryMessage, []byte(`{"v":1,"type":"heartbeat","body":{}}`))
		raw("over 1 MiB", true, websocket.TextMessage, []byte(`{"v":1,"type":"logs","body":{"lease":1,"lines":[{"seq":1,"text":"`+strings.Repeat("x", wire.MaxFrame)+`"}]}}`))
		raw("before hello", false, websocket.TextMessage, []byte(`{"v":1,"type":"heartbeat","body":{}}`))
		b, _ := wire.Encode(hello())
		raw("second hello", true, websocket.TextMessage, b)
		forged := core.Hello{Version: core.ProtocolVersion, Worker: "bad-frames", Credential: "bad-frames.00", Slots: 1}
		b, _ = wire.Encode(forged)
		raw("forged credential", false, websocket.TextMessage, b)
		res.Rounds++
	}
	return res
}

// TestHostileBadFrames: each kind of bad frame is answered as SPEC §3 and §9
// say, with its close code and a reason; a report with an unknown outcome
// status is answered REJECTED and the connection stays. On the old code
// that report closed the connection with 1003, and protocol errors closed
// with 1000.
func TestHostileBadFrames(t *testing.T) {
	r := startHostileRig(t, hostileCtlOptions())
	token, err := r.d.CreateToken(r.ctx, "bad-frames", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var res attackBadFramesResult
	underAttack(r, 0, func(ctx context.Context) { res = attackBadFrames(ctx, t, r.d.Addr(), token) })
	t.Logf("bad frames: %d rounds", res.Rounds)
	checkBadFrames(t, res)
}

// checkBadFrames checks what attackBadFrames saw: each bad frame closed
// with its code and reason, and a report with an unknown outcome status
// answered REJECTED on a connection that stays.
func checkBadFrames(t *testing.T, res attackBadFramesResult) {
	t.Helper()
	for name, want := range map[string]struct {
		code   int
		reason string
	}{
		"unknown outcome":   {0, ""},
		"undecodable":       {websocket.CloseProtocolError, "wire: malformed frame"},
		"binary":            {websocket.CloseUnsupportedData, "binary frames are not part of the protocol"},
		"over 1 MiB":        {websocket.CloseMessageTooBig, fmt.Sprintf("frame larger than %d bytes", wire.MaxFrame)},
		"before hello":      {websocket.CloseProtocolError, "protocol error: heartbeat before hello"},
		"second hello":      {websocket.CloseProtocolError, "protocol error: second hello on one connection"},
		"forged credential": {websocket.ClosePolicyViolation, "invalid session credential"},
	} {
		if res.Code[name] != want.code || !strings.Contains(res.Reason[name], want.reason) {
			t.Errorf("%s: closed with %d %q, want %d %q", name, res.Code[name], res.Reason[name], want.code, want.reason)
		}
	}
	if want := `answer lease=1 req=1 REJECTED reason="malformed report"; refreshed req=9`; !strings.HasPrefix(res.Answer["unknown outcome"], want) {
		t.Errorf("a report with an unknown outcome status: got %q, want %q", res.Answer["unknown outcome"], want)
	}
}

// The control plane's admission limits are set by serve's flags and the
// config file's control: section (flags win), and nonsense is refused.
func TestServeControlLimits(t *testing.T) {
	def := defaultServerConfig()
	if def.MaxConns != 1024 || def.MaxUnauthConns != orchestrator.DefaultMaxUnauthConns ||
		def.MaxUnauthConnsPerAddr != orchestrator.DefaultMaxUnauthConnsPerAddr || def.HelloTimeout != orchestrator.DefaultHelloTimeout {
		t.Errorf("defaults %+v are not SPEC §12's", def)
	}
	cfg, err := loadServerConfig("c.yaml", []byte("control:\n  max_conns: 10000\n  max_unauth_conns: 512\n  max_unauth_conns_per_addr: 64\n  hello_timeout_secs: 3\n"))
	if err != nil || cfg.MaxConns != 10000 || cfg.MaxUnauthConns != 512 || cfg.MaxUnauthConnsPerAddr != 64 || cfg.HelloTimeout != 3*time.Second {
		t.Errorf("control section: %+v, %v", cfg, err)
	}
	for src, want := range map[string]string{
		"control:\n  max_conns: 0\n":        "c.yaml:2: max_conns must be a positive whole number",
		"control:\n  hello_timeout: 3\n":    `c.yaml:2: control: unknown key "hello_timeout"`,
		"control:\n  max_unauth_conns: x\n": "max_unauth_conns must be a positive whole number",
	} {
		if _, err := loadServerConfig("c.yaml", []byte(src)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: err = %v, want %q", src, err, want)
		}
	}
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "server-config.yaml")
	if err := os.WriteFile(cfgPath, []byte("control:\n  max_conns: 5000\n  hello_timeout_secs: 9\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	resolve := func(args ...string) (serverConfig, error) {
		o := &options{}
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		serveCmd.flags(fs, o)
		if err := fs.Parse(append([]string{"--config", cfgPath}, args...)); err != nil {
			t.Fatal(err)
		}
		return resolveServeConfig(&env{opts: o, flags: fs})
	}
	cfg, err = resolve("--max-conns", "10000", "--max-unauth-conns-per-addr", "4")
	if err != nil || cfg.MaxConns != 10000 || cfg.MaxUnauthConnsPerAddr != 4 || cfg.HelloTimeout != 9*time.Second || cfg.MaxUnauthConns != 256 {
		t.Errorf("flags over the file: %+v, %v", cfg, err)
	}
	if cfg.MaxEventStreams != orchestrator.DefaultMaxEventStreams {
		t.Errorf("--max-event-streams unset: %d, want the default %d", cfg.MaxEventStreams, orchestrator.DefaultMaxEventStreams)
	}
	if cfg, err = resolve("--max-event-streams", "3"); err != nil || cfg.MaxEventStreams != 3 {
		t.Errorf("--max-event-streams 3: %d, %v", cfg.MaxEventStreams, err)
	}
	for _, args := range [][]string{{"--max-event-streams", "0"}, {"--max-conns", "0"}, {"--max-unauth-conns", "8", "--max-unauth-conns-per-addr", "9"}, {"--hello-timeout", "10ms"}} {
		if _, err := resolve(args...); exitCode(err) != exitUsage {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
}
