package store_test

import (
	"path/filepath"
	"sync"
	"testing"

	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/adapters/store/storetest"
)

// TestContractBbolt runs the store contract (store.Backend) on bbolt: a
// new file per case, reopened by closing it and opening the same path
// (remembered: a closed Store no longer knows it).
func TestContractBbolt(t *testing.T) { contractBbolt(t, store.Options{}) }

// TestContractBboltNoLog runs it without the log in front of the file (each
// Apply a synced bbolt transaction of its own).
func TestContractBboltNoLog(t *testing.T) { contractBbolt(t, store.Options{NoLog: true}) }

func contractBbolt(t *testing.T, opts store.Options) {
	var paths sync.Map // store.Backend → its path
	open := func(t *testing.T) store.Backend {
		path := filepath.Join(t.TempDir(), "tether.db")
		s, err := store.OpenWith(path, opts)
		if err != nil {
			t.Fatal(err)
		}
		paths.Store(store.Backend(s), path)
		return s
	}
	reopen := func(t *testing.T, b store.Backend) store.Backend {
		p, _ := paths.Load(b)
		path := p.(string)
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		s, err := store.OpenWith(path, opts)
		if err != nil {
			t.Fatal(err)
		}
		paths.Store(store.Backend(s), path)
		return s
	}
	storetest.Run(t, open, reopen)
}
