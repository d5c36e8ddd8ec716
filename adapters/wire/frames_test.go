package wire

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// A frame of MaxFrame bytes is read whole; one byte more is
// ErrFrameTooLarge without reading the rest; a read error is returned as it
// is; the buffer is reused, a frame's bytes being valid until the next Read.
func TestFrameBufferRead(t *testing.T) {
	var f FrameBuffer
	full := bytes.Repeat([]byte("x"), MaxFrame)
	if b, err := f.Read(bytes.NewReader(full)); err != nil || !bytes.Equal(b, full) {
		t.Fatalf("a frame of MaxFrame bytes: %d bytes, %v", len(b), err)
	}
	over := &countingReader{r: bytes.NewReader(append(full, "yz"...))}
	if _, err := f.Read(over); !errors.Is(err, ErrFrameTooLarge) || over.n != MaxFrame+1 {
		t.Fatalf("a frame over MaxFrame: %v after reading %d bytes", err, over.n)
	}
	if b, err := f.Read(bytes.NewReader([]byte(`{"v":1}`))); err != nil || string(b) != `{"v":1}` {
		t.Fatalf("a small frame after a large one: %q %v", b, err)
	}
	cut := errors.New("cut")
	if _, err := f.Read(io.MultiReader(bytes.NewReader([]byte("ab")), errReader{cut})); err != cut {
		t.Fatalf("a failed read: %v", err)
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// WriteAll gathers its frames into one write, and stops at the first
// failed frame.
func TestCorkConnWriteAll(t *testing.T) {
	rc := &recConn{}
	c := NewCorkConn(rc)
	write := func(b []byte) error { _, err := c.Write(b); return err }
	if err := c.WriteAll([][]byte{[]byte("a"), []byte("b"), []byte("c")}, write); err != nil {
		t.Fatal(err)
	}
	if len(rc.writes) != 1 || string(rc.writes[0]) != "abc" {
		t.Fatalf("writes %q, want one write of abc", rc.writes)
	}
	bad := errors.New("bad frame")
	var wrote []string
	err := c.WriteAll([][]byte{[]byte("d"), []byte("e"), []byte("f")}, func(b []byte) error {
		if string(b) == "e" {
			return bad
		}
		wrote = append(wrote, string(b))
		return write(b)
	})
	if err != bad || len(wrote) != 1 || len(rc.writes) != 2 || string(rc.writes[1]) != "d" {
		t.Fatalf("a failed frame: %v; wrote %q, writes %q", err, wrote, rc.writes)
	}
	c.Write([]byte("g")) // uncorked again
	if len(rc.writes) != 3 {
		t.Fatalf("the connection stayed corked after a failed frame: %q", rc.writes)
	}
}
