package pglead_test

// The election on a real PostgreSQL (SPEC §11): one of two electors wins;
// the other takes over only once the winner's lease lapsed by the
// database's clock, with the next epoch; the deposed one's renewal fails
// with store.ErrDeposed; a resignation lets the standby win at once.

import (
	"context"
	"errors"
	"strings"
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

	// A fenced transaction (the store's writes: one per commit, fold,
	// blob chunk) holds the leader's row while it runs: a take-over must
	// wait for it (the fence), the leader's own renewal must not (under
	// uploads the renewals waited behind them until the lease lapsed).
	t.Run("a fenced transaction holds a take-over, not a renewal", func(t *testing.T) {
		pool := newPool(t, c)
		a := pglead.New(pool, pglead.Config{Holder: "a", URL: "http://a", Lease: 2 * time.Second})
		ea, ok, err := a.TryTakeOver(t.Context())
		if err != nil || !ok {
			t.Fatalf("a's take-over: %v %v", ok, err)
		}
		tx, err := pool.Begin(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(t.Context())
		if _, err := tx.Exec(t.Context(), "SELECT tether_fence($1)", int64(ea)); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
		err = a.Renew(ctx, ea)
		cancel()
		if err != nil {
			t.Fatalf("the leader's renewal with a fenced transaction open: %v; want it renewed at once", err)
		}
		if _, err := pool.Exec(t.Context(), "UPDATE tether_leader SET expires_at = now() WHERE id = 1"); err != nil { // a's lease lapses
			t.Fatal(err)
		}
		b, err := pool.Acquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer b.Release()
		if _, err := b.Exec(t.Context(), "SET lock_timeout = '1s'"); err != nil {
			t.Fatal(err)
		}
		_, err = b.Exec(t.Context(), `UPDATE tether_leader SET epoch = epoch + 1, holder = 'b', url = 'http://b', expires_at = now() + interval '1 hour'
			WHERE id = 1 AND expires_at <= now()`)
		if err == nil || !strings.Contains(err.Error(), "lock timeout") {
			t.Fatalf("a take-over (the elector's statement) while a fenced transaction of the epoch before runs: %v; want it to wait (lock timeout)", err)
		}
	})

	// A take-over the elector gave up on (Campaign bounds each attempt)
	// must not land once the row frees: it was told it did not lead.
	t.Run("a take-over given up on does not land later", func(t *testing.T) {
		pool := newPool(t, c)
		a := pglead.New(pool, pglead.Config{Holder: "a", URL: "http://a", Lease: time.Second})
		ea, ok, err := a.TryTakeOver(t.Context())
		if err != nil || !ok {
			t.Fatalf("a's take-over: %v %v", ok, err)
		}
		tx, err := pool.Begin(t.Context()) // a paused inside a fenced transaction
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(t.Context())
		if _, err := tx.Exec(t.Context(), "SELECT tether_fence($1)", int64(ea)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1100 * time.Millisecond) // a's lease lapses
		b := pglead.New(pool, pglead.Config{Holder: "b", URL: "http://b", Lease: time.Hour})
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		_, ok, err = b.TryTakeOver(ctx)
		cancel()
		if ok || err == nil {
			t.Fatalf("b's take-over while a's fenced transaction holds the row: ok %v, %v; want it to give up", ok, err)
		}
		tx.Rollback(t.Context()) // a's session ends
		time.Sleep(500 * time.Millisecond)
		if url, epoch, _, err := b.Leader(t.Context()); err != nil || url == "http://b" || epoch != ea {
			t.Fatalf("after b gave up: the row names %q at epoch %d (%v); want a's epoch %d, not b", url, epoch, err, ea)
		}
		if eb, ok, err := b.TryTakeOver(t.Context()); err != nil || !ok || eb != ea+1 {
			t.Fatalf("b's next take-over: epoch %d ok %v, %v; want epoch %d", eb, ok, err, ea+1)
		}
	})
}
