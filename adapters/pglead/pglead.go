// Package pglead elects one leader among the orchestrators that share a
// PostgreSQL store (SPEC §11). Leadership is a lease in the row
// tether_leader (id 1), judged only by the database's clock (now()), never
// a host's: a standby takes over only once the lease has lapsed, and each
// take-over bumps the epoch. The epoch is the fence — the store checks it in
// every write transaction (adapters/pgstore, Options.Epoch) — and the lease
// only decides when a standby may take over, so a leader that is paused or
// cut off past its lease can never commit again, whatever it believes.
//
// The table is created by the store's first migration (pgstore.Open).
package pglead

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tether-run/tether/adapters/store"
)

// Defaults of Config.
const (
	DefaultLease = 10 * time.Second
	maxPoll      = time.Second
)

// The statements of the leader row (SPEC §11). Each takes the lease from
// the database's clock.
const (
	// takeOver succeeds only when the lease has lapsed: epoch+1.
	takeOver = `UPDATE tether_leader SET epoch = epoch + 1, holder = $1, url = $2, expires_at = now() + $3::interval
		WHERE id = 1 AND expires_at <= now() RETURNING epoch`
	// renew extends the lease of epoch; no row means another took over.
	renew = `UPDATE tether_leader SET expires_at = now() + $2::interval WHERE id = 1 AND epoch = $1`
	// resign lets the lease lapse now, so a standby takes over at its next
	// poll.
	resign = `UPDATE tether_leader SET expires_at = now() WHERE id = 1 AND epoch = $1`
	// leader reads who leads, and whether its lease still runs.
	leader = `SELECT url, epoch, expires_at > now() FROM tether_leader WHERE id = 1`
)

// Config configures an Elector.
type Config struct {
	// Holder names this process in the row (for operators: host and pid).
	Holder string
	// URL is the base URL other processes reach this one at (serve
	// --advertise); a standby sends workers and operators there.
	URL string
	// Lease is how long a take-over or a renewal holds the lead without
	// another renewal; zero means DefaultLease.
	Lease time.Duration
	// Renew is how often the leader renews; zero means Lease/4.
	Renew time.Duration
	// Poll is how often a standby tries to take over; zero means
	// min(1 s, Lease/4).
	Poll time.Duration
	// Logger receives the errors a campaign or a renewal retries past; nil
	// means slog.Default().
	Logger *slog.Logger
}

// Elector campaigns for, holds and gives up the lead of one database.
type Elector struct {
	pool *pgxpool.Pool
	c    Config
}

// New returns an Elector over pool, with c's zero durations defaulted.
func New(pool *pgxpool.Pool, c Config) *Elector {
	if c.Lease <= 0 {
		c.Lease = DefaultLease
	}
	if c.Renew <= 0 {
		c.Renew = c.Lease / 4
	}
	if c.Poll <= 0 {
		c.Poll = min(maxPoll, c.Lease/4)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return &Elector{pool: pool, c: c}
}

// Config returns the configuration in force, defaults filled in.
func (e *Elector) Config() Config { return e.c }

// TryTakeOver takes the lead if the lease has lapsed: ok says whether it
// did, with the new epoch.
func (e *Elector) TryTakeOver(ctx context.Context) (epoch uint64, ok bool, err error) {
	var n int64
	err = e.bounded(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, takeOver, e.c.Holder, e.c.URL, e.c.Lease).Scan(&n)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("pglead: take over: %w", err)
	}
	return uint64(n), true, nil
}

// bounded runs f in a transaction whose statements the server gives up by
// itself at ctx's deadline (statement_timeout, lock waits included): the
// client gives up at the deadline too, and a statement it stopped waiting
// for must not land later (a take-over while a paused leader's fenced
// transaction held the row would name this elector, with a new epoch, for
// a whole lease, after it was told it did not lead).
func (e *Elector) bounded(ctx context.Context, f func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		if dl, ok := ctx.Deadline(); ok {
			ms := max(time.Until(dl).Milliseconds(), 1)
			if _, err := tx.Exec(ctx, "SELECT set_config('statement_timeout', $1, true)", strconv.FormatInt(ms, 10)); err != nil {
				return err
			}
		}
		return f(tx)
	})
}

// Campaign blocks, trying to take over every Poll, until it takes the lead
// (and returns its epoch) or ctx ends. A failed attempt (the database
// unreachable, restarting) is logged and tried again at the next poll.
func (e *Elector) Campaign(ctx context.Context) (uint64, error) {
	t := time.NewTicker(e.c.Poll)
	defer t.Stop()
	for {
		actx, cancel := context.WithTimeout(ctx, max(e.c.Poll, time.Second))
		epoch, ok, err := e.TryTakeOver(actx)
		cancel()
		if ok {
			return epoch, nil
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if err != nil {
			e.c.Logger.Warn("campaign for the lead: the attempt failed; trying again", "err", err)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-t.C:
		}
	}
}

// Renew extends the lease of epoch by Lease from the database's now. It
// returns an error wrapping store.ErrDeposed when epoch no longer leads.
func (e *Elector) Renew(ctx context.Context, epoch uint64) error {
	var tag pgconn.CommandTag
	err := e.bounded(ctx, func(tx pgx.Tx) (err error) {
		tag, err = tx.Exec(ctx, renew, int64(epoch), e.c.Lease)
		return err
	})
	if err != nil {
		return fmt.Errorf("pglead: renew epoch %d: %w", epoch, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pglead: renew epoch %d: %w", epoch, store.ErrDeposed)
	}
	return nil
}

// Hold renews the lease of epoch every Renew until ctx ends (then it
// returns nil). It returns an error wrapping store.ErrDeposed when a
// renewal finds another epoch. A renewal that fails otherwise is tried
// again at the next tick; when none has succeeded for a whole Lease (by
// this host's clock, which decides only when to give up: a standby may
// have taken over by now) Hold returns that error.
func (e *Elector) Hold(ctx context.Context, epoch uint64) error {
	t := time.NewTicker(e.c.Renew)
	defer t.Stop()
	renewed := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		sent := time.Now() // the lease runs from the statement, not its answer: give up early, never late
		rctx, cancel := context.WithTimeout(ctx, e.c.Renew)
		err := e.Renew(rctx, epoch)
		cancel()
		switch {
		case err == nil:
			renewed = sent
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, store.ErrDeposed):
			return err
		case time.Since(renewed) >= e.c.Lease:
			return fmt.Errorf("pglead: the lease of epoch %d was not renewed for %s: %w", epoch, e.c.Lease, err)
		default:
			e.c.Logger.Warn("renewing the lead failed; trying again", "epoch", epoch, "err", err)
		}
	}
}

// Resign ends the lease of epoch now, so a standby takes over at its next
// poll (a clean shutdown). Resigning an epoch that no longer leads does
// nothing.
func (e *Elector) Resign(ctx context.Context, epoch uint64) error {
	if _, err := e.pool.Exec(ctx, resign, int64(epoch)); err != nil {
		return fmt.Errorf("pglead: resign epoch %d: %w", epoch, err)
	}
	return nil
}

// Leader says who leads now: the leader's advertised URL and epoch, and
// whether its lease still runs (by the database's clock). Epoch 0 means
// nobody has ever led.
func (e *Elector) Leader(ctx context.Context) (url string, epoch uint64, live bool, err error) {
	var n int64
	if err := e.pool.QueryRow(ctx, leader).Scan(&url, &n, &live); err != nil {
		return "", 0, false, fmt.Errorf("pglead: read the leader: %w", err)
	}
	return url, uint64(n), live, nil
}
