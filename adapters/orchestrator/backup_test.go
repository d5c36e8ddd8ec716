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

	body, err := r.client().Backup(r.ctx)
	if err != nil {
		t.Fatalf("backup: %v", err)
	}
	defer body.Close()
	dst := filepath.Join(t.TempDir(), "backup.db")
	if err := store.Unpack(body, dst); err != nil {
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
