package orchestrator

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/core"
)

var fp = strings.Repeat("0123456789abcdef", 4)

func TestParseDataPath(t *testing.T) {
	for _, c := range []struct {
		method, path string
		want         dataRoute
		code         int // 0: parsed
	}{
		{"GET", "/data/out", dataRoute{kind: routeVersions, id: "out"}, 0},
		{"HEAD", "/data/out", dataRoute{kind: routeVersions, id: "out"}, 0},
		{"PUT", "/data/out", dataRoute{kind: routeVersions, id: "out", write: true}, 0},
		{"GET", "/data/out/7", dataRoute{kind: routeVersion, id: "out", version: 7}, 0},
		{"GET", "/data/out/latest", dataRoute{kind: routeVersion, id: "out"}, 0},
		{"GET", "/data/out/append", dataRoute{kind: routeStream, id: "out"}, 0},
		{"POST", "/data/out/append", dataRoute{kind: routeStream, id: "out", write: true}, 0},
		{"GET", "/data/a.b-c_d/9223372036854775807", dataRoute{kind: routeVersion, id: "a.b-c_d", version: 1<<63 - 1}, 0},
		{"GET", "/bundle/" + fp, dataRoute{kind: routeBundle, fp: fp}, 0},
		{"GET", "/bundle/" + fp + "/file/lib/x.sh", dataRoute{kind: routeBundleFile, fp: fp, rel: "lib/x.sh"}, 0},

		{"GET", "/data/", dataRoute{}, 400},
		{"GET", "/data/-x", dataRoute{}, 400},
		{"GET", "/data/x/0", dataRoute{}, 400},
		{"GET", "/data/x/007", dataRoute{}, 400},
		{"GET", "/data/x/+7", dataRoute{}, 400},
		{"GET", "/data/x/9223372036854775808", dataRoute{}, 400}, // 2^63
		{"GET", "/data/x/", dataRoute{}, 400},
		{"GET", "/bundle/" + strings.ToUpper(fp), dataRoute{}, 400},
		{"GET", "/bundle/" + fp + "/file/", dataRoute{}, 400},
		{"GET", "/bundle/" + fp + "/file/../x", dataRoute{}, 400},
		{"GET", "/data/x/1/more", dataRoute{}, 404},
		{"GET", "/bundle/" + fp + "/files/x", dataRoute{}, 404},
		{"GET", "/other", dataRoute{}, 404},
		{"PUT", "/data/x/1", dataRoute{}, 405},
		{"POST", "/data/x", dataRoute{}, 405},
		{"DELETE", "/data/x/append", dataRoute{}, 405},
		{"POST", "/bundle/" + fp, dataRoute{}, 405},
	} {
		got, err := parseDataPath(c.method, c.path)
		switch {
		case c.code == 0 && err != nil:
			t.Errorf("%s %s: %v", c.method, c.path, err)
		case c.code == 0 && got != c.want:
			t.Errorf("%s %s = %+v, want %+v", c.method, c.path, got, c.want)
		case c.code != 0 && (err == nil || err.code != c.code):
			t.Errorf("%s %s = %+v, %v; want HTTP %d", c.method, c.path, got, err, c.code)
		case c.code == 405 && err.allow == "":
			t.Errorf("%s %s: 405 without Allow", c.method, c.path)
		}
	}
}

// FuzzParseDataPath: the parser never panics, every refusal is a 400, 404
// or 405 (with Allow), and every accepted path is valid and is exactly the
// path its route prints back.
func FuzzParseDataPath(f *testing.F) {
	for _, p := range []string{"/data/x", "/data/x/1", "/data/x/latest", "/data/x/append", "/bundle/" + fp, "/bundle/" + fp + "/file/a/b",
		"/data/", "/data//", "/data/x/01", "/bundle/" + fp + "/file/../a", "/data/x\x00/1"} {
		for _, m := range []string{"GET", "PUT", "POST", "HEAD", "DELETE"} {
			f.Add(m, p)
		}
	}
	f.Fuzz(func(t *testing.T, method, p string) {
		rt, err := parseDataPath(method, p)
		if err != nil {
			switch {
			case err.code != http.StatusBadRequest && err.code != http.StatusNotFound && err.code != http.StatusMethodNotAllowed:
				t.Fatalf("%s %q: status %d", method, p, err.code)
			case err.code == http.StatusMethodNotAllowed && err.allow == "":
				t.Fatalf("%s %q: 405 without Allow", method, p)
			case err.msg == "":
				t.Fatalf("%s %q: an error without a message", method, p)
			}
			return
		}
		var back string
		switch rt.kind {
		case routeVersions:
			back = "/data/" + rt.id
		case routeVersion:
			v := "latest"
			if rt.version != 0 {
				v = strconv.FormatUint(rt.version, 10)
			}
			back = "/data/" + rt.id + "/" + v
		case routeStream:
			back = "/data/" + rt.id + "/append"
		case routeBundle:
			back = "/bundle/" + rt.fp
		case routeQuery:
			back = "/data"
		case routePool:
			back = "/pool"
		case routeDefinition:
			back = "/step/definition"
		case routeOutput:
			back = "/step/output/" + rt.step
		case routeBundleFile:
			back = "/bundle/" + rt.fp + "/file/" + rt.rel
			if store.ValidateRelPath(rt.rel) != nil {
				t.Fatalf("%q accepted with a bad relative path %q", p, rt.rel)
			}
		default:
			t.Fatalf("%q: route kind %d", p, rt.kind)
		}
		if back != p {
			t.Fatalf("%q parsed as %+v, which prints back as %q", p, rt, back)
		}
		if rt.id != "" && store.ValidateID(rt.id) != nil || rt.fp != "" && store.ValidateFingerprint(rt.fp) != nil {
			t.Fatalf("%q accepted with a bad id or fingerprint: %+v", p, rt)
		}
		if rt.write != (method == http.MethodPut || method == http.MethodPost || method == http.MethodDelete) {
			t.Fatalf("%s %q: write = %v", method, p, rt.write)
		}
	})
}

// TestDataRefusal: the handler only translates the core's typed answer
// (SPEC §14): a refusal of the credential is 401, of the lease 409, and
// an admitted write no error.
func TestDataRefusal(t *testing.T) {
	p := &dataPlane{}
	for _, c := range []struct {
		r    core.WriteRefusal
		code int
	}{
		{core.RefusedUnauthenticated, http.StatusUnauthorized},
		{core.RefusedCredentialExpired, http.StatusUnauthorized},
		{core.RefusedWorkerRevoked, http.StatusUnauthorized},
		{core.RefusedWorkerInactive, http.StatusUnauthorized},
		{core.RefusedUnknownLease, http.StatusConflict},
		{core.RefusedLeaseNotCurrent, http.StatusConflict},
		{core.RefusedUndeclaredOutput, http.StatusForbidden},
	} {
		err := dataRefusal(core.DataAnswer{Worker: "w1", Lease: 3, Refusal: c.r, Detail: "step success"})
		if err == nil {
			t.Fatalf("%s: no error", c.r)
		}
		if got := p.classify(err).code; got != c.code {
			t.Errorf("%s: %v is HTTP %d, want %d", c.r, err, got, c.code)
		}
	}
	if err := dataRefusal(core.DataAnswer{Worker: "w1", Lease: 3}); err != nil {
		t.Errorf("admitted: %v", err)
	}
}
