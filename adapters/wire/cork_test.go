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
