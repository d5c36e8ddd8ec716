// Package wire is the control-plane codec: every core.Msg, in both
// directions, as one versioned JSON frame
//
//	{"v":1,"type":"<Msg.Kind()>","body":{...}}
//
// The body is an explicit wire struct with snake_case fields, so renaming a
// field in core cannot silently change the protocol. Durations travel as Go
// duration strings ("30s"), times as RFC 3339 with nanoseconds, enums as
// their names. Unknown body fields are ignored (a newer peer may add optional
// ones) and, as with encoding/json, keys match case-insensitively. Decode
// never panics: anything malformed is an error wrapping
// one of the named errors below.
package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/tether-run/tether/core"
)

// Version is the frame format version this package speaks.
const Version = 1

// MaxFrame bounds one encoded frame, in bytes.
const MaxFrame = 1 << 20

var (
	// ErrFrameTooLarge is returned when a frame, to encode or to decode, is
	// longer than MaxFrame.
	ErrFrameTooLarge = errors.New("wire: frame larger than MaxFrame")
	// ErrVersion is returned when a frame's "v" is missing or not Version.
	ErrVersion = errors.New("wire: unsupported frame version")
	// ErrUnknownType is returned when a frame's "type" names no message, or
	// when Encode is given a message type it does not know.
	ErrUnknownType = errors.New("wire: unknown message type")
	// ErrMalformed is returned when a frame is not valid JSON, lacks a body,
	// or its body does not fit its type (wrong field types, unknown enum
	// values, bad durations or times).
	ErrMalformed = errors.New("wire: malformed frame")
)

type frame struct {
	V    int             `json:"v"`
	Type string          `json:"type"`
	Body json.RawMessage `json:"body"`
}

// codec converts one message kind between core and its wire body.
type codec struct {
	encode func(core.Msg) (any, bool)     // core message → wire body; false: not this type
	decode func([]byte) (core.Msg, error) // wire body → core message
}

// codecs maps every core.Msg kind to its codec.
var codecs = map[string]codec{}

// register adds the codec of message type M with wire body W.
func register[M core.Msg, W any](to func(M) W, from func(W) (M, error)) {
	var zero M
	codecs[zero.Kind()] = codec{
		encode: func(m core.Msg) (any, bool) {
			v, ok := m.(M)
			if !ok {
				return nil, false
			}
			return to(v), true
		},
		decode: func(b []byte) (core.Msg, error) {
			var w W
			if err := json.Unmarshal(b, &w); err != nil {
				return nil, err
			}
			return from(w)
		},
	}
}

// Kinds lists every message kind the codec knows, sorted.
func Kinds() []string {
	ks := make([]string, 0, len(codecs))
	for k := range codecs {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// Encode renders m as one frame.
func Encode(m core.Msg) ([]byte, error) {
	if b, ok := fastEncode(m); ok && len(b) <= MaxFrame {
		return b, nil
	}
	return encodeReflect(m)
}

// encodeReflect is Encode through encoding/json, for every kind.
func encodeReflect(m core.Msg) ([]byte, error) {
	if m == nil {
		return nil, fmt.Errorf("%w: nil message", ErrUnknownType)
	}
	c, ok := codecs[m.Kind()]
	if !ok {
		return nil, fmt.Errorf("%w: %q (%T)", ErrUnknownType, m.Kind(), m)
	}
	w, ok := c.encode(m)
	if !ok {
		// A pointer to a message, or a foreign type borrowing a kind.
		return nil, fmt.Errorf("%w: %T", ErrUnknownType, m)
	}
	body, err := json.Marshal(w)
	if err != nil {
		return nil, fmt.Errorf("wire: encode %s: %w", m.Kind(), err)
	}
	b, err := json.Marshal(frame{V: Version, Type: m.Kind(), Body: body})
	if err != nil {
		return nil, fmt.Errorf("wire: encode %s frame: %w", m.Kind(), err)
	}
	if len(b) > MaxFrame {
		return nil, fmt.Errorf("%w: %s frame of %d bytes (limit %d)", ErrFrameTooLarge, m.Kind(), len(b), MaxFrame)
	}
	return b, nil
}

// Decode parses one frame.
func Decode(b []byte) (core.Msg, error) {
	if len(b) > MaxFrame {
		return nil, fmt.Errorf("%w: %d bytes (limit %d)", ErrFrameTooLarge, len(b), MaxFrame)
	}
	if m, ok := fastDecode(b); ok {
		return m, nil
	}
	return decodeReflect(b)
}

// decodeReflect is Decode through encoding/json, for every frame.
func decodeReflect(b []byte) (core.Msg, error) {
	var f frame
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if f.V != Version {
		return nil, fmt.Errorf("%w: v=%d (want %d)", ErrVersion, f.V, Version)
	}
	c, ok := codecs[f.Type]
	if !ok {
		return nil, fmt.Errorf("%w: %.64q", ErrUnknownType, f.Type)
	}
	if body := bytes.TrimSpace(f.Body); len(body) == 0 || body[0] != '{' {
		return nil, fmt.Errorf("%w: %s frame without an object body", ErrMalformed, f.Type)
	}
	m, err := c.decode(f.Body)
	if err != nil {
		return nil, fmt.Errorf("%w: %s body: %v", ErrMalformed, f.Type, err)
	}
	return m, nil
}

// Duration is a time.Duration as a Go duration string ("1m30s").
type Duration time.Duration

// MarshalJSON renders the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON parses a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string like \"30s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}
