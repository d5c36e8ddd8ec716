package pgstore

// Secrets at rest (SPEC §14a), sealed as the bbolt store seals them: a
// value is AES-256-GCM under the secrets key, its first byte the format
// (1), then a random 12-byte nonce and the ciphertext; the secret's name
// (or the record's key) is the additional data, so a value moved under
// another name does not open. A run's record and its history carry its
// env: and are sealed whole once the store has a key. The key is never in
// the database: every orchestrator that may lead is given the same key
// file (--secrets-key-file).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/tether-run/tether/adapters/store"
)

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// SetSecretsKey gives the store its secrets key (store.SecretsKeySize
// bytes), once, before it serves secrets.
func (s *Store) SetSecretsKey(key []byte) error { return s.keys.SetKey(key) }

// HoldsSealed says whether the database holds a value sealed with a key:
// a secret, or a run's record or history (the first of each tells: all are
// sealed once a key was given).
func (s *Store) HoldsSealed() (bool, error) {
	var found bool
	err := s.read(func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM tether_secret)
			OR coalesce((SELECT substr(value, 1, 1) = '\x01'::bytea FROM tether_record WHERE key >= 'run/' AND key < 'run0' ORDER BY key LIMIT 1), false)
			OR coalesce((SELECT substr(value, 1, 1) = '\x01'::bytea FROM tether_history ORDER BY run LIMIT 1), false)`).Scan(&found)
	})
	if err != nil {
		return false, fmt.Errorf("pgstore: does the database hold sealed values: %w", err)
	}
	return found, nil
}

// Secret returns the value of secret name: store.ErrNotFound if there is
// none, store.ErrSecretsKey if the store's key does not open it.
func (s *Store) Secret(name string) ([]byte, error) {
	var v []byte
	err := s.readData(func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, "SELECT value FROM tether_secret WHERE name = $1", name).Scan(&v)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: secret %q", store.ErrNotFound, name)
	}
	if err != nil {
		return nil, err
	}
	return s.keys.Open(name, v)
}
