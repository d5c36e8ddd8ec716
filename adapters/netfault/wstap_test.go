package netfault

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// wsEcho serves a WebSocket echo at /ws (each message back with its type)
// and "plain" at every other path.
func wsEcho(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := websocket.Upgrader{ReadBufferSize: 1024, WriteBufferSize: 1024} // small: long messages go out fragmented
	mux := http.NewServeMux()
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		ws, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer ws.Close()
		for {
			typ, b, err := ws.ReadMessage()
			if err != nil {
				return
			}
			if ws.WriteMessage(typ, b) != nil {
				return
			}
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "plain") })
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

type messageLog struct {
	mu   sync.Mutex
	msgs []Message
}

func (l *messageLog) add(m Message) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, m)
}

func (l *messageLog) get() []Message {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Message(nil), l.msgs...)
}

// TestMessageTapGorilla: real gorilla peers through a Proxy. The tap sees
// every message both ways, unmasked, a long one reassembled from its
// fragments, pings among them; plain HTTP through the same proxy is
// ignored without an error.
func TestMessageTapGorilla(t *testing.T) {
	var log messageLog
	tap := &MessageTap{OnMessage: log.add}
	p, err := Listen(wsEcho(t), tap)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	resp, err := http.Get("http://" + p.Addr() + "/other")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "plain" {
		t.Fatalf("plain HTTP through the proxy: %q", body)
	}

	d := websocket.Dialer{ReadBufferSize: 1024, WriteBufferSize: 1024}
	ws, _, err := d.Dial("ws://"+p.Addr()+"/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	long := strings.Repeat("0123456789abcdef", 1024) // 16 KiB: fragmented both ways
	sent := []struct {
		op   int
		data string
	}{{OpText, `{"hello":1}`}, {OpText, long}, {OpBinary, "\x00\x01\x02"}, {OpText, ""}}
	ws.SetReadDeadline(time.Now().Add(testTimeout))
	for i, m := range sent {
		if i == 1 {
			if err := ws.WriteControl(websocket.PingMessage, []byte("ping!"), time.Now().Add(testTimeout)); err != nil {
				t.Fatal(err)
			}
		}
		if err := ws.WriteMessage(m.op, []byte(m.data)); err != nil {
			t.Fatal(err)
		}
		typ, b, err := ws.ReadMessage()
		if err != nil || typ != m.op || string(b) != m.data {
			t.Fatalf("echo %d: type %d, %d bytes, %v", i, typ, len(b), err)
		}
	}
	var up, down []Message
	for _, m := range log.get() {
		switch {
		case m.Op == OpPing || m.Op == OpPong:
			if string(m.Data) != "ping!" {
				t.Errorf("%s %#x carried %q", m.Dir, m.Op, m.Data)
			}
		case m.Dir == Up:
			up = append(up, m)
		default:
			down = append(down, m)
		}
	}
	for _, got := range [][]Message{up, down} {
		if len(got) != len(sent) {
			t.Fatalf("tap saw %d messages one way, want %d", len(got), len(sent))
		}
		for i, m := range sent {
			if got[i].Op != m.op || string(got[i].Data) != m.data || got[i].At.IsZero() {
				t.Errorf("%s message %d: op %#x, %d bytes; want op %#x, %d bytes", got[i].Dir, i, got[i].Op, len(got[i].Data), m.op, len(m.data))
			}
		}
	}
	if err := tap.Err(); err != nil {
		t.Errorf("tap errors: %v", err)
	}
}

// frameBytes encodes one frame by hand.
func frameBytes(fin bool, rsv byte, op int, mask []byte, payload []byte) []byte {
	b0 := byte(op) | rsv
	if fin {
		b0 |= 0x80
	}
	out := []byte{b0}
	m := byte(0)
	if mask != nil {
		m = 0x80
	}
	switch n := len(payload); {
	case n < 126:
		out = append(out, m|byte(n))
	case n < 1<<16:
		out = append(out, m|126)
		out = binary.BigEndian.AppendUint16(out, uint16(n))
	default:
		out = append(out, m|127)
		out = binary.BigEndian.AppendUint64(out, uint64(n))
	}
	if mask != nil {
		out = append(out, mask...)
		for i, c := range payload {
			out = append(out, c^mask[i%4])
		}
		return out
	}
	return append(out, payload...)
}

const upgradeHead = "GET /control HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"

// TestMessageTapFrames feeds hand-made frames one byte at a time: masked,
// 16- and 64-bit lengths, a fragmented message with a ping inside; and the
// errors: a reserved bit, a stray continuation, an oversize message.
func TestMessageTapFrames(t *testing.T) {
	mask := []byte{1, 2, 3, 4}
	mid := bytes.Repeat([]byte("m"), 300)
	big := bytes.Repeat([]byte("b"), 70000)
	var stream []byte
	stream = append(stream, upgradeHead...)
	stream = append(stream, frameBytes(true, 0, OpText, mask, []byte("small"))...)
	stream = append(stream, frameBytes(true, 0, OpText, mask, mid)...)
	stream = append(stream, frameBytes(false, 0, OpText, mask, big[:40000])...)
	stream = append(stream, frameBytes(true, 0, OpPing, mask, []byte("p"))...)
	stream = append(stream, frameBytes(true, 0, OpContinuation, mask, big[40000:])...)

	var log messageLog
	tap := &MessageTap{OnMessage: log.add}
	for i := range stream {
		tap.Read(7, Up, stream[i:i+1], time.Now())
	}
	got := log.get()
	want := []struct {
		op   int
		data []byte
	}{{OpText, []byte("small")}, {OpText, mid}, {OpPing, []byte("p")}, {OpText, big}}
	if len(got) != len(want) {
		t.Fatalf("%d messages, want %d", len(got), len(want))
	}
	for i, w := range want {
		if got[i].Op != w.op || !bytes.Equal(got[i].Data, w.data) || got[i].Link != 7 || got[i].Dir != Up {
			t.Errorf("message %d: op %#x, %d bytes, link %d %s", i, got[i].Op, len(got[i].Data), got[i].Link, got[i].Dir)
		}
	}
	if err := tap.Err(); err != nil {
		t.Fatalf("tap errors: %v", err)
	}

	// A refused upgrade is not parsed; an accepted one is.
	tap.Read(8, Down, []byte("HTTP/1.1 503 Service Unavailable\r\n\r\n"+string(frameBytes(true, 0, OpText, nil, []byte("x")))), time.Now())
	tap.Read(9, Down, []byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"+string(frameBytes(true, 0, OpText, nil, []byte("y")))), time.Now())
	if got := log.get(); len(got) != len(want)+1 || string(got[len(got)-1].Data) != "y" || got[len(got)-1].Link != 9 {
		t.Errorf("after a refused and an accepted upgrade: %d messages", len(got))
	}

	bad := map[string][]byte{
		"reserved":     frameBytes(true, 0x40, OpText, nil, []byte("z")),
		"continuation": frameBytes(true, 0, OpContinuation, nil, []byte("z")),
		"opcode":       frameBytes(true, 0, 0x3, nil, []byte("z")),
		"oversize":     {0x81, 127, 0x7f, 0, 0, 0, 0, 0, 0, 0},
	}
	link := uint64(100)
	for name, b := range bad {
		link++
		tap := &MessageTap{OnMessage: log.add}
		tap.Read(link, Up, append([]byte(upgradeHead), b...), time.Now())
		tap.Read(link, Up, frameBytes(true, 0, OpText, mask, []byte("after")), time.Now())
		if err := tap.Err(); err == nil {
			t.Errorf("%s: no error", name)
		}
		tap.Closed(link)
	}
	if got := log.get(); len(got) != len(want)+1 {
		t.Errorf("a stream kept being parsed after an error: %d messages", len(got))
	}
}
