package dataplane

import (
	"encoding/json"
	"testing"
	"time"
)

// The field names are the protocol and the store's record format (SPEC
// §14): a store written before keeps these keys, and a worker or client
// built before reads them. Renaming a tag must fail here.
func TestJSONNames(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	v := Version{ID: "i", Version: 1, Size: 2, SHA256: "s", Created: at, Worker: "w", Lease: 3}
	s := Stream{ID: "i", Length: 1, Appends: 2, Updated: at}
	for _, c := range []struct {
		v    any
		want string
	}{
		{v, `{"id":"i","version":1,"size":2,"sha256":"s","created":"2026-01-02T03:04:05Z","worker":"w","lease":3}`},
		{Version{ID: "i"}, `{"id":"i","version":0,"size":0,"sha256":"","created":"0001-01-01T00:00:00Z"}`},
		{s, `{"id":"i","length":1,"appends":2,"updated":"2026-01-02T03:04:05Z"}`},
		{Appended{ID: "i", Offset: 1, Size: 2, Length: 3}, `{"id":"i","offset":1,"size":2,"length":3}`},
		{Versions{ID: "i", Versions: []Version{}, Stream: &s},
			`{"id":"i","versions":[],"stream":{"id":"i","length":1,"appends":2,"updated":"2026-01-02T03:04:05Z"}}`},
		{Versions{ID: "i", Versions: []Version{}}, `{"id":"i","versions":[]}`},
		{Bundle{Fingerprint: "f", Size: 1, Created: at, Tar: true, Files: 2, Existed: true},
			`{"fingerprint":"f","size":1,"created":"2026-01-02T03:04:05Z","tar":true,"files":2,"existed":true}`},
		{Bundle{Fingerprint: "f"}, `{"fingerprint":"f","size":0,"created":"0001-01-01T00:00:00Z","tar":false}`},
	} {
		b, err := json.Marshal(c.v)
		if err != nil || string(b) != c.want {
			t.Errorf("%T encodes as %s (%v), want %s", c.v, b, err, c.want)
		}
	}
}
