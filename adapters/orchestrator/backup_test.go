package orchestrator_test

import (
	"net/http"
	"path/filepath"
	"testing"

	"github.com/tether-run/tether/adapters/store"
)

// GET /api/store/backup streams a backup that unpacks to a sound store
// holding what the orchestrator committed; it needs the admin token and
// takes only GET.
func TestAPIStoreBackup(t *testing.T) {
	r := startAPI(t)
	r.expect("POST", "/tokens", []byte(`{"name": "w1"}`), http.StatusCreated, nil)
	none := ""
	if code, _ := r.do("GET", "/store/backup", nil, &none); code != http.StatusUnauthorized {
		t.Fatalf("a backup without the admin token: HTTP %d, want 401", code)
	}
	r.expect("POST", "/store/backup", nil, http.StatusMethodNotAllowed, nil)

	req, _ := http.NewRequestWithContext(r.ctx, "GET", r.d.APIURL()+"/store/backup", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/x-tar" {
		t.Fatalf("backup: HTTP %d, %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	dst := filepath.Join(t.TempDir(), "backup.db")
	if err := store.Unpack(resp.Body, dst); err != nil {
		t.Fatal(err)
	}
	rep, err := store.Check(dst)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Sound() {
		t.Fatalf("the backup: %s %v", rep.Summary(), rep.Findings)
	}
	s, err := store.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	recs, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, rec := range recs {
		found = found || rec.Key == "token/w1"
	}
	if !found {
		t.Fatalf("the backup lacks the token created before it (%d records)", len(recs))
	}
}
