package wire

import (
	"bytes"
	"io"
	"time"

	"github.com/gorilla/websocket"
)

// keepBuffer is the largest read buffer a connection keeps between frames;
// a rare larger frame's buffer is let go.
const keepBuffer = 64 << 10

// FrameBuffer reads the frames of one control connection into a buffer it
// reuses (SPEC §9): decoding copies what it keeps, so a connection holds one
// buffer rather than allocating one a frame. Both ends' read loops use one.
type FrameBuffer struct{ buf bytes.Buffer }

// Read reads one message's bytes from r (a websocket.Conn's NextReader),
// valid until the next Read. It reads at most MaxFrame+1 bytes: a longer
// message is ErrFrameTooLarge, and the rest of it is not read. Any other
// error is the connection's.
func (f *FrameBuffer) Read(r io.Reader) ([]byte, error) {
	if f.buf.Cap() > keepBuffer {
		f.buf = bytes.Buffer{}
	}
	f.buf.Reset()
	if _, err := f.buf.ReadFrom(io.LimitReader(r, MaxFrame+1)); err != nil {
		return nil, err
	}
	if f.buf.Len() > MaxFrame {
		return nil, ErrFrameTooLarge
	}
	return f.buf.Bytes(), nil
}

// WriteText writes one text frame to ws, which must be written within wait.
func WriteText(ws *websocket.Conn, b []byte, wait time.Duration) error {
	ws.SetWriteDeadline(time.Now().Add(wait))
	return ws.WriteMessage(websocket.TextMessage, b)
}
