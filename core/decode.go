package core

import (
	"encoding/json"
	"strconv"
)

// decodeLogLine decodes a log line's record value exactly as
// json.Unmarshal into a zero StepLogLine does. What logLine (encode.go)
// writes — every field in its order, no space, strings of printable ASCII
// without escapes — is read by hand, its time through the same
// time.Time.UnmarshalJSON encoding/json calls; anything else goes through
// encoding/json. A restore reads every live lease's lines, and a long-lived
// store holds many.
func decodeLogLine(b []byte, v *StepLogLine) error {
	if fastLogLine(b, v) {
		return nil
	}
	*v = StepLogLine{}
	return json.Unmarshal(b, v)
}

func fastLogLine(b []byte, v *StepLogLine) bool {
	p := scan{b: b}
	var step, text string
	ok := p.lit(`{"Step":`) && p.str(&step) &&
		p.lit(`,"Lease":`) && p.uint((*uint64)(&v.Lease)) &&
		p.lit(`,"Index":`) && p.int(&v.Index) &&
		p.lit(`,"Event":`) && p.bool(&v.Event) &&
		p.lit(`,"Line":{"Seq":`) && p.uint(&v.Line.Seq) &&
		p.lit(`,"At":`) && p.time(v) &&
		p.lit(`,"Text":`) && p.str(&text) &&
		p.lit(`}}`) && p.i == len(b)
	v.Step, v.Line.Text = StepID(step), text
	return ok
}

// scan reads a JSON value's canonical form from b at i.
type scan struct {
	b []byte
	i int
}

func (p *scan) lit(s string) bool {
	if len(p.b)-p.i < len(s) || string(p.b[p.i:p.i+len(s)]) != s {
		return false
	}
	p.i += len(s)
	return true
}

// quoted returns the end of a string of printable ASCII without '"' or
// '\\' starting at i (its closing quote's index), or -1.
func (p *scan) quoted() int {
	if p.i >= len(p.b) || p.b[p.i] != '"' {
		return -1
	}
	for j := p.i + 1; j < len(p.b); j++ {
		switch c := p.b[j]; {
		case c == '"':
			return j
		case c < 0x20 || c >= 0x7f || c == '\\':
			return -1
		}
	}
	return -1
}

func (p *scan) str(s *string) bool {
	j := p.quoted()
	if j < 0 {
		return false
	}
	*s = string(p.b[p.i+1 : j])
	p.i = j + 1
	return true
}

// digits returns the end of a JSON number's digits at i (an optional minus
// sign when signed), with no leading zero, or -1.
func (p *scan) digits(signed bool) int {
	j := p.i
	if signed && j < len(p.b) && p.b[j] == '-' {
		j++
	}
	k := j
	for k < len(p.b) && '0' <= p.b[k] && p.b[k] <= '9' {
		k++
	}
	if k == j || (p.b[j] == '0' && k > j+1) {
		return -1
	}
	return k
}

func (p *scan) uint(n *uint64) bool {
	k := p.digits(false)
	if k < 0 {
		return false
	}
	v, err := strconv.ParseUint(string(p.b[p.i:k]), 10, 64)
	if err != nil {
		return false
	}
	*n, p.i = v, k
	return true
}

func (p *scan) int(n *int) bool {
	k := p.digits(true)
	if k < 0 {
		return false
	}
	v, err := strconv.ParseInt(string(p.b[p.i:k]), 10, strconv.IntSize)
	if err != nil {
		return false
	}
	*n, p.i = int(v), k
	return true
}

func (p *scan) bool(v *bool) bool {
	switch {
	case p.lit("true"):
		*v = true
	case p.lit("false"):
		*v = false
	default:
		return false
	}
	return true
}

func (p *scan) time(v *StepLogLine) bool {
	j := p.quoted()
	if j < 0 || v.Line.At.UnmarshalJSON(p.b[p.i:j+1]) != nil {
		return false
	}
	p.i = j + 1
	return true
}
