package store_test

import (
	"path/filepath"
	"testing"

	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/adapters/store/storetest"
)

// TestContractBbolt runs the store contract (store.Backend) on bbolt: a
// new file per case, reopened by closing it and opening the same path.
func TestContractBbolt(t *testing.T) {
	open := func(t *testing.T) store.Backend {
		s, err := store.Open(filepath.Join(t.TempDir(), "tether.db"))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	reopen := func(t *testing.T, b store.Backend) store.Backend {
		path := b.(*store.Store).Path()
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		s, err := store.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	storetest.Run(t, open, reopen)
}
