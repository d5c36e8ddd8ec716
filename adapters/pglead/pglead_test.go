package pglead_test

// The election on a real PostgreSQL (SPEC §11): one of two electors wins;
// the other takes over only once the winner's lease lapsed by the
// database's clock, with the next epoch; the deposed one's renewal fails
// with store.ErrDeposed; a resignation lets the standby win at once.

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tether-run/tether/adapters/pglead"
	"github.com/tether-run/tether/adapters/pgstore"
	"github.com/tether-run/tether/adapters/pgtest"
	"github.com/tether-run/tether/adapters/store"
)

// newPool opens a fresh database of c, migrated by the store (its leader
// table), and returns the store's pool.
func newPool(t *testing.T, c *pgtest.Cluster) *pgxpool.Pool {
	t.Helper()
	st, err := pgstore.Open(t.Context(), c.NewDatabase(t), pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st.Pool()
}

// expiresAt reads the lease's end and the database's now.
func expiresAt(t *testing.T, pool *pgxpool.Pool) (expires, now time.Time) {
	t.Helper()
	if err := pool.QueryRow(t.Context(), `SELECT expires_at, now() FROM tether_leader WHERE id = 1`).Scan(&expires, &now); err != nil {
		t.Fatal(err)
	}
	return expires, now
}

func TestElection(t *testing.T) {
	c := pgtest.Start(t)

	t.Run("one of two wins at once", func(t *testing.T) {
		pool := newPool(t, c)
		if url, epoch, live, err := pglead.New(pool, pglead.Config{}).Leader(t.Context()); err != nil || url != "" || epoch != 0 || live {
			t.Fatalf("a new table's leader: %q epoch %d live %v, %v; want none", url, epoch, live, err)
		}
		var wg sync.WaitGroup
		var won [2]bool
		var epochs [2]uint64
		for i := range 2 {
			e := pglead.New(pool, pglead.Config{Holder: "h", URL: "u", Lease: time.Hour})
			wg.Go(func() {
				var err error
				if epochs[i], won[i], err = e.TryTakeOver(t.Context()); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if won[0] == won[1] {
			t.Fatalf("two electors at once on a free lease: won %v (epochs %v); want exactly one", won, epochs)
		}
		if epochs[0]+epochs[1] != 1 {
			t.Errorf("the winner's epoch %v; want 1", epochs)
		}
	})

	t.Run("standby waits for the lease to lapse", func(t *testing.T) {
		pool := newPool(t, c)
		a := pglead.New(pool, pglead.Config{Holder: "a", URL: "http://a", Lease: 2 * time.Second, Renew: 100 * time.Millisecond})
		b := pglead.New(pool, pglead.Config{Holder: "b", URL: "http://b", Lease: 2 * time.Second, Poll: 50 * time.Millisecond})
		ea, err := a.Campaign(t.Context())
		if err != nil || ea != 1 {
			t.Fatalf("a's campaign: epoch %d, %v; want 1", ea, err)
		}
		first, _ := expiresAt(t, pool)
		if _, ok, err := b.TryTakeOver(t.Context()); ok || err != nil {
			t.Fatalf("b took over a running lease (ok %v, %v)", ok, err)
		}
		// a holds: once the database's clock is past a's first lease, the
		// lease still runs, renewed.
		hctx, stopHolding := context.WithCancel(t.Context())
		held := make(chan error, 1)
		go func() { held <- a.Hold(hctx, ea) }()
		for {
			if _, now := expiresAt(t, pool); now.After(first) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if _, ok, err := b.TryTakeOver(t.Context()); ok || err != nil {
			t.Fatalf("b took over while a renewed (ok %v, %v)", ok, err)
		}
		if url, epoch, live, err := b.Leader(t.Context()); err != nil || url != "http://a" || epoch != 1 || !live {
			t.Fatalf("leader %q epoch %d live %v, %v; want http://a, 1, live", url, epoch, live, err)
		}
		// a stops renewing; b's campaign wins once a's last lease lapsed.
		stopHolding()
		if err := <-held; err != nil {
			t.Fatalf("a's Hold, ended by its context: %v", err)
		}
		last, _ := expiresAt(t, pool)
		eb, err := b.Campaign(t.Context())
		if err != nil || eb != 2 {
			t.Fatalf("b's campaign: epoch %d, %v; want 2", eb, err)
		}
		took, _ := expiresAt(t, pool)
		if took = took.Add(-2 * time.Second); took.Before(last) {
			t.Errorf("b took over at %s, before a's lease ended at %s", took, last)
		}
		if url, epoch, live, err := a.Leader(t.Context()); err != nil || url != "http://b" || epoch != 2 || !live {
			t.Errorf("leader %q epoch %d live %v, %v; want http://b, 2, live", url, epoch, live, err)
		}
		// a's renewals now find another epoch.
		if err := a.Renew(t.Context(), ea); !errors.Is(err, store.ErrDeposed) {
			t.Errorf("a's renewal after the take-over: %v; want ErrDeposed", err)
		}
		// Hold's first renewal finds it (the bound only turns a Hold that
		// never notices into a failure rather than a hang).
		bounded, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		if err := a.Hold(bounded, ea); !errors.Is(err, store.ErrDeposed) {
			t.Errorf("a's Hold after the take-over: %v; want ErrDeposed", err)
		}
		if err := b.Renew(t.Context(), eb); err != nil {
			t.Errorf("b's renewal: %v", err)
		}
	})

	t.Run("resign lets the standby win at once", func(t *testing.T) {
		pool := newPool(t, c)
		a := pglead.New(pool, pglead.Config{Holder: "a", URL: "http://a", Lease: time.Hour})
		b := pglead.New(pool, pglead.Config{Holder: "b", URL: "http://b", Lease: time.Hour})
		ea, err := a.Campaign(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if _, ok, err := b.TryTakeOver(t.Context()); ok || err != nil {
			t.Fatalf("b took over an hour's lease (ok %v, %v)", ok, err)
		}
		if err := b.Resign(t.Context(), 7); err != nil { // not b's to resign: nothing happens
			t.Fatal(err)
		}
		if _, ok, _ := b.TryTakeOver(t.Context()); ok {
			t.Fatal("a resignation of another epoch ended a's lease")
		}
		if err := a.Resign(t.Context(), ea); err != nil {
			t.Fatal(err)
		}
		if url, _, live, err := b.Leader(t.Context()); err != nil || url != "http://a" || live {
			t.Errorf("after a resigned: leader %q live %v, %v; want http://a, not live", url, live, err)
		}
		eb, ok, err := b.TryTakeOver(t.Context())
		if !ok || err != nil || eb != ea+1 {
			t.Fatalf("b after a resigned: ok %v epoch %d, %v; want epoch %d", ok, eb, err, ea+1)
		}
		if err := a.Renew(t.Context(), ea); !errors.Is(err, store.ErrDeposed) {
			t.Errorf("a's renewal after it resigned and b took over: %v; want ErrDeposed", err)
		}
	})
}
