package pgstore

// The schema, versioned (SPEC §11). Open takes a session advisory lock
// (migrationLock) on one connection, creates tether_schema if it is not
// there, and runs every migration past the database's version in order,
// each in one transaction that also records its version: two processes
// starting at once take turns, and the second finds nothing to do. A
// database of a newer version than the binary knows is refused.
//
// Text keys are COLLATE "C" (byte order), so what is read in key order is
// in Go's string order, as bbolt's.

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// migrationLock is the advisory lock key the migrations run under.
const migrationLock int64 = 0x7465746865720001 // "tether" 0001

// ErrSchemaTooNew is returned by Open when the database was migrated by a
// newer binary than this one.
var ErrSchemaTooNew = errors.New("pgstore: the database's schema is newer than this binary knows")

// fenceCode is the SQLSTATE tether_fence raises when the epoch is not the
// caller's; orderCode, tether_order's when the place before is not the last
// committed.
const (
	fenceCode = "TR001"
	orderCode = "TR002"
)

// migrations are the schema's versions, in order: migrations[i] makes
// version i+1. Append only; never edit one that has shipped.
var migrations = []string{
	// 1: everything.
	`
CREATE TABLE tether_leader (id int PRIMARY KEY CHECK (id = 1), epoch bigint NOT NULL, holder text NOT NULL, url text NOT NULL, expires_at timestamptz NOT NULL);
INSERT INTO tether_leader VALUES (1, 0, '', '', '-infinity');

CREATE FUNCTION tether_fence(want bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE have bigint;
BEGIN
	SELECT epoch INTO have FROM tether_leader WHERE id = 1 FOR SHARE;
	IF have IS DISTINCT FROM want THEN
		RAISE EXCEPTION 'the leader epoch is %, this orchestrator''s is %', have, want USING ERRCODE = 'TR001';
	END IF;
END $$;

CREATE TABLE tether_record (key text COLLATE "C" PRIMARY KEY, value bytea NOT NULL);
CREATE TABLE tether_log (key text COLLATE "C" PRIMARY KEY, value bytea NOT NULL);
CREATE TABLE tether_audit (key text COLLATE "C" PRIMARY KEY, at_ns bigint NOT NULL, actor text NOT NULL, action text NOT NULL, value bytea NOT NULL);
CREATE TABLE tether_history (run text COLLATE "C" PRIMARY KEY, seq bigint NOT NULL UNIQUE, finished_ns bigint NOT NULL,
	submitted_ns bigint NOT NULL, status text NOT NULL, name text NOT NULL, summary bytea NOT NULL, value bytea NOT NULL);
CREATE INDEX tether_history_finished ON tether_history (finished_ns, run);
CREATE TABLE tether_pruning (run text COLLATE "C" PRIMARY KEY, leases text[] NOT NULL);
CREATE TABLE tether_secret (name text COLLATE "C" PRIMARY KEY, value bytea NOT NULL);

CREATE TABLE tether_blob (sha text COLLATE "C" PRIMARY KEY, size bigint NOT NULL, chunks text COLLATE "C" NOT NULL UNIQUE);
CREATE TABLE tether_blob_chunk (chunks text COLLATE "C", n int, bytes bytea NOT NULL, PRIMARY KEY (chunks, n));
CREATE TABLE tether_data (id text COLLATE "C", version bigint, created_ns bigint NOT NULL, sha text COLLATE "C", meta bytea NOT NULL, PRIMARY KEY (id, version));
CREATE INDEX tether_data_sha ON tether_data (sha) WHERE sha IS NOT NULL;
CREATE TABLE tether_stream (id text COLLATE "C" PRIMARY KEY, updated_ns bigint NOT NULL, meta bytea NOT NULL);
CREATE TABLE tether_stream_chunk (id text COLLATE "C", off bigint, bytes bytea NOT NULL, PRIMARY KEY (id, off));
CREATE TABLE tether_bundle (fp text COLLATE "C" PRIMARY KEY, created_ns bigint NOT NULL, meta bytea NOT NULL);
CREATE TABLE tether_bundle_file (fp text COLLATE "C", path text COLLATE "C", off bigint NOT NULL, size bigint NOT NULL, PRIMARY KEY (fp, path));
CREATE TABLE tether_request (lease bigint, id text COLLATE "C", at_ns bigint NOT NULL, entry bytea NOT NULL, PRIMARY KEY (lease, id));
CREATE INDEX tether_request_at ON tether_request (at_ns);
CREATE TABLE tether_request_count (lease bigint PRIMARY KEY, n bigint NOT NULL);
`,
	// 2: the commit order of the pipeline (pipeline.go).
	`
CREATE TABLE tether_order (id int PRIMARY KEY CHECK (id = 1), n bigint NOT NULL);
INSERT INTO tether_order VALUES (1, 0);

CREATE FUNCTION tether_order(want bigint, place bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE have bigint;
BEGIN
	IF want <> 0 THEN
		PERFORM tether_fence(want);
	END IF;
	SELECT n INTO have FROM tether_order WHERE id = 1 FOR UPDATE;
	IF have <> place - 1 THEN
		RAISE EXCEPTION 'commit % of the pipeline is out of order: the last committed is %', place, have USING ERRCODE = 'TR002';
	END IF;
	UPDATE tether_order SET n = place WHERE id = 1;
END $$;
`,
	// 3: the journal in front of the tables of records (journal.go): a
	// commit's batch, encoded, folded into the tables later. Its bytes are
	// stored as they are, never compressed (they are written once and read
	// at most once), and in the row itself up to a page (a small commit's
	// row is one heap tuple, not chunks in the TOAST table).
	`
CREATE TABLE tether_journal (seq bigint PRIMARY KEY, batch bytea NOT NULL) WITH (toast_tuple_target = 8160);
ALTER TABLE tether_journal ALTER COLUMN batch SET STORAGE EXTERNAL;
`,
	// 4: the journal's rows compressed by the server, with lz4 where it
	// was built with it (else its default method, pglz): a batch's
	// records are JSON, seven or eight times smaller under lz4, and the
	// flush of each commit's WAL is what a commit waits for, its time
	// growing with its bytes. Rows up to a page stay as they are.
	`
ALTER TABLE tether_journal ALTER COLUMN batch SET STORAGE EXTENDED;
DO $$
BEGIN
	EXECUTE 'ALTER TABLE tether_journal ALTER COLUMN batch SET COMPRESSION lz4';
EXCEPTION WHEN feature_not_supported THEN
	NULL; -- a server built without lz4 keeps default_toast_compression
END $$;
`,
	// 5: the tables' large values compressed with lz4 too, where the
	// server has it: an archived run's history (about 130 KB of JSON for
	// 200 steps), a run's record, its closed record. The fold writes them
	// and pglz, the default, costs the server several times lz4's CPU.
	// Values already stored keep their method.
	`
DO $$
BEGIN
	EXECUTE 'ALTER TABLE tether_history ALTER COLUMN value SET COMPRESSION lz4, ALTER COLUMN summary SET COMPRESSION lz4';
	EXECUTE 'ALTER TABLE tether_record ALTER COLUMN value SET COMPRESSION lz4';
	EXECUTE 'ALTER TABLE tether_log ALTER COLUMN value SET COMPRESSION lz4';
EXCEPTION WHEN feature_not_supported THEN
	NULL; -- a server built without lz4 keeps default_toast_compression
END $$;
`,
	// 6: the fence takes the leader's row FOR KEY SHARE, not FOR SHARE,
	// and the epoch is a key (a unique index): a take-over changes the
	// epoch, so it still waits for every fenced transaction of the epoch
	// before and fences out every one after; the leader's renewal changes
	// only expires_at, so it no longer waits behind the fenced
	// transactions (one per blob chunk, commit, fold), which PostgreSQL
	// lets overtake a waiting updater: under uploads a leader could lose
	// its own lease.
	`
CREATE UNIQUE INDEX tether_leader_epoch ON tether_leader (epoch);
CREATE OR REPLACE FUNCTION tether_fence(want bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE have bigint;
BEGIN
	SELECT epoch INTO have FROM tether_leader WHERE id = 1 FOR KEY SHARE;
	IF have IS DISTINCT FROM want THEN
		RAISE EXCEPTION 'the leader epoch is %, this orchestrator''s is %', have, want USING ERRCODE = 'TR001';
	END IF;
END $$;
`,
}

// migrate brings the database to the newest version this binary knows.
func migrate(ctx context.Context, conn *pgx.Conn, known []string) error {
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", migrationLock); err != nil {
		return fmt.Errorf("pgstore: migration lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", migrationLock)
	if _, err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS tether_schema (version int NOT NULL)"); err != nil {
		return fmt.Errorf("pgstore: schema table: %w", err)
	}
	var version int
	err := conn.QueryRow(ctx, "SELECT version FROM tether_schema").Scan(&version)
	if errors.Is(err, pgx.ErrNoRows) {
		_, err = conn.Exec(ctx, "INSERT INTO tether_schema VALUES (0)")
	}
	if err != nil {
		return fmt.Errorf("pgstore: schema version: %w", err)
	}
	if version > len(known) {
		return fmt.Errorf("%w: it is at version %d, this binary knows up to %d: run the newer orchestrator (or point this one at another database)",
			ErrSchemaTooNew, version, len(known))
	}
	for v := version + 1; v <= len(known); v++ {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, known[v-1]); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "UPDATE tether_schema SET version = $1", v)
			return err
		})
		if err != nil {
			return fmt.Errorf("pgstore: migration %d: %w", v, err)
		}
	}
	return nil
}

// SchemaVersion is the newest schema version this binary knows.
var SchemaVersion = len(migrations)
