package netfault

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// WebSocket opcodes (RFC 6455 §5.2).
const (
	OpContinuation = 0x0
	OpText         = 0x1
	OpBinary       = 0x2
	OpClose        = 0x8
	OpPing         = 0x9
	OpPong         = 0xA
)

// Parser limits: traffic beyond them is reported as an error, not parsed.
const (
	maxHandshake = 64 << 10 // HTTP upgrade request or response head
	maxMessage   = 64 << 20 // one (reassembled) message
)

// Message is one WebSocket message a MessageTap saw pass.
type Message struct {
	Link uint64
	Dir  Dir
	Op   int       // OpText, OpBinary, OpClose, OpPing or OpPong
	Data []byte    // the unmasked payload; a fragmented message reassembled
	At   time.Time // when its last byte was read, before it was forwarded
}

// MessageTap is a Tap that parses the WebSocket connections a Proxy
// forwards (the HTTP upgrade, then RFC 6455 frames, masked or not, fragmented
// or not, with control frames in between) and hands every complete message
// to OnMessage, synchronously, before the message's last chunk is forwarded.
// A link that is not a WebSocket upgrade (a plain HTTP request) is ignored.
// Extensions (compression) are not supported: a frame with a reserved bit
// set is recorded as an error and its stream is no longer parsed.
type MessageTap struct {
	// OnMessage receives each message; it is called concurrently for
	// different links and directions.
	OnMessage func(Message)

	mu      sync.Mutex
	streams map[streamKey]*stream
	errs    []error
}

type streamKey struct {
	link uint64
	dir  Dir
}

// Read implements Tap.
func (t *MessageTap) Read(link uint64, dir Dir, p []byte, at time.Time) {
	k := streamKey{link, dir}
	t.mu.Lock()
	if t.streams == nil {
		t.streams = map[streamKey]*stream{}
	}
	s := t.streams[k]
	if s == nil {
		s = &stream{dir: dir}
		t.streams[k] = s
	}
	t.mu.Unlock()
	// One goroutine per link and direction: s needs no lock of its own.
	err := s.feed(p, func(op int, data []byte) {
		if t.OnMessage != nil {
			t.OnMessage(Message{Link: link, Dir: dir, Op: op, Data: data, At: at})
		}
	})
	if err != nil {
		t.mu.Lock()
		t.errs = append(t.errs, fmt.Errorf("link %d %s: %w", link, dir, err))
		t.mu.Unlock()
	}
}

// Closed implements Tap: a message cut off mid-way is dropped.
func (t *MessageTap) Closed(link uint64) {
	t.mu.Lock()
	delete(t.streams, streamKey{link, Up})
	delete(t.streams, streamKey{link, Down})
	t.mu.Unlock()
}

// Err returns what could not be parsed, or nil.
func (t *MessageTap) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return errors.Join(t.errs...)
}

// stream parses one direction of one link.
type stream struct {
	dir     Dir
	buf     []byte
	upgrade bool // the HTTP head is behind us and was an upgrade
	ignored bool // not a WebSocket, or a parse error: drop everything
	msgOp   int  // opcode of the fragmented message being reassembled, 0 if none
	msg     []byte
}

func (s *stream) feed(p []byte, emit func(op int, data []byte)) error {
	if s.ignored {
		return nil
	}
	s.buf = append(s.buf, p...)
	if !s.upgrade {
		end := bytes.Index(s.buf, []byte("\r\n\r\n"))
		if end < 0 {
			if len(s.buf) > maxHandshake {
				s.ignored = true
				return fmt.Errorf("HTTP head longer than %d bytes", maxHandshake)
			}
			return nil
		}
		head := strings.ToLower(string(s.buf[:end]))
		first, _, _ := strings.Cut(head, "\r\n")
		switch {
		case s.dir == Up && strings.Contains(head, "\r\nupgrade: websocket"):
		case s.dir == Down && strings.HasPrefix(first, "http/1.1 101 "):
		default:
			s.ignored = true // plain HTTP, or a refused upgrade
			s.buf = nil
			return nil
		}
		s.upgrade = true
		s.buf = s.buf[end+4:]
	}
	for {
		n, err := s.frame(emit)
		if err != nil {
			s.ignored, s.buf = true, nil
			return err
		}
		if n == 0 {
			break
		}
		s.buf = s.buf[n:]
	}
	if len(s.buf) == 0 {
		s.buf = nil // do not keep a large array alive between frames
	}
	return nil
}

// frame parses one frame at the start of s.buf; it returns 0 if the frame is
// not complete yet, else the frame's length.
func (s *stream) frame(emit func(op int, data []byte)) (int, error) {
	b := s.buf
	if len(b) < 2 {
		return 0, nil
	}
	fin, rsv, op := b[0]&0x80 != 0, b[0]&0x70, int(b[0]&0x0f)
	masked, n := b[1]&0x80 != 0, uint64(b[1]&0x7f)
	if rsv != 0 {
		return 0, fmt.Errorf("frame with reserved bits %#x (extensions are not supported)", rsv)
	}
	hl := 2
	switch n {
	case 126:
		if len(b) < 4 {
			return 0, nil
		}
		n, hl = uint64(binary.BigEndian.Uint16(b[2:4])), 4
	case 127:
		if len(b) < 10 {
			return 0, nil
		}
		n, hl = binary.BigEndian.Uint64(b[2:10]), 10
	}
	if n > maxMessage || uint64(len(s.msg))+n > maxMessage {
		return 0, fmt.Errorf("message longer than %d bytes", maxMessage)
	}
	var key []byte
	if masked {
		if len(b) < hl+4 {
			return 0, nil
		}
		key, hl = b[hl:hl+4], hl+4
	}
	total := hl + int(n)
	if len(b) < total {
		return 0, nil
	}
	payload := append([]byte(nil), b[hl:total]...)
	for i := range payload {
		if key != nil {
			payload[i] ^= key[i%4]
		}
	}
	switch op {
	case OpClose, OpPing, OpPong:
		if !fin || n > 125 {
			return 0, fmt.Errorf("control frame %#x fragmented or longer than 125 bytes", op)
		}
		emit(op, payload)
	case OpText, OpBinary:
		if s.msgOp != 0 {
			return 0, fmt.Errorf("new message (opcode %#x) inside a fragmented one", op)
		}
		if fin {
			emit(op, payload)
		} else {
			s.msgOp, s.msg = op, payload
		}
	case OpContinuation:
		if s.msgOp == 0 {
			return 0, errors.New("continuation frame outside a fragmented message")
		}
		s.msg = append(s.msg, payload...)
		if fin {
			emit(s.msgOp, s.msg)
			s.msgOp, s.msg = 0, nil
		}
	default:
		return 0, fmt.Errorf("unknown opcode %#x", op)
	}
	return total, nil
}
