package wire

import (
	"bytes"
	"errors"
	"net"
	"testing"
)

// recConn records each Write it gets.
type recConn struct {
	net.Conn
	writes [][]byte
	err    error
}

func (r *recConn) Write(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	r.writes = append(r.writes, append([]byte(nil), p...))
	return len(p), nil
}

func TestCorkConnGathersWrites(t *testing.T) {
	rc := &recConn{}
	c := NewCorkConn(rc)
	c.Write([]byte("a"))
	c.Cork()
	c.Write([]byte("b"))
	c.Write([]byte("cd"))
	if len(rc.writes) != 1 {
		t.Fatalf("corked writes went through: %q", rc.writes)
	}
	if err := c.Uncork(); err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("e"))
	want := [][]byte{[]byte("a"), []byte("bcd"), []byte("e")}
	if len(rc.writes) != len(want) {
		t.Fatalf("writes %q, want %q", rc.writes, want)
	}
	for i := range want {
		if !bytes.Equal(rc.writes[i], want[i]) {
			t.Fatalf("writes %q, want %q", rc.writes, want)
		}
	}
	if err := c.Uncork(); err != nil || len(rc.writes) != 3 {
		t.Fatalf("an empty uncork wrote or failed: %v %q", err, rc.writes)
	}
}

func TestCorkConnLimitAndErrors(t *testing.T) {
	rc := &recConn{}
	c := NewCorkConn(rc)
	c.Cork()
	big := bytes.Repeat([]byte("x"), corkLimit/2+1)
	c.Write(big)
	c.Write(big) // over the limit: written while still corked
	if len(rc.writes) != 1 || len(rc.writes[0]) != 2*len(big) {
		t.Fatalf("%d writes; want one of %d bytes", len(rc.writes), 2*len(big))
	}
	rc.err = errors.New("broken")
	c.Write(big)
	c.Write(big) // the flush fails: the error is kept for Uncork
	if _, err := c.Write([]byte("y")); err == nil {
		t.Error("a write after a failed flush succeeded")
	}
	if err := c.Uncork(); err == nil {
		t.Error("Uncork hid the failed write")
	}
	var nilConn *CorkConn
	nilConn.Cork()
	if err := nilConn.Uncork(); err != nil {
		t.Error(err)
	}
}

// TestWriteQueued: the first frame and every frame already queued leave in
// one write; a closed queue is reported after what came before it; a frame
// write error stops at once.
func TestWriteQueued(t *testing.T) {
	rc := &recConn{}
	c := NewCorkConn(rc)
	frame := func(b []byte) error { _, err := c.Write(b); return err }
	out := make(chan []byte, 4)
	out <- []byte("2")
	out <- []byte("3")
	open, err := c.WriteQueued([]byte("1"), out, frame)
	if err != nil || !open || len(rc.writes) != 1 || string(rc.writes[0]) != "123" {
		t.Fatalf("open=%v err=%v writes %q; want one write of 123", open, err, rc.writes)
	}
	out <- []byte("5")
	close(out)
	open, err = c.WriteQueued([]byte("4"), out, frame)
	if err != nil || open || len(rc.writes) != 2 || string(rc.writes[1]) != "45" {
		t.Fatalf("open=%v err=%v writes %q; want closed after one write of 45", open, err, rc.writes)
	}
	boom := errors.New("boom")
	open, err = c.WriteQueued([]byte("6"), make(chan []byte), func([]byte) error { return boom })
	if !errors.Is(err, boom) || !open {
		t.Fatalf("open=%v err=%v; want the frame's error", open, err)
	}
}
