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
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/core"
)

const sealVersion = 1

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// SetSecretsKey gives the store its secrets key (store.SecretsKeySize
// bytes), once, before it serves secrets.
func (s *Store) SetSecretsKey(key []byte) error {
	if len(key) != store.SecretsKeySize {
		return fmt.Errorf("pgstore: a secrets key is %d bytes, not %d", store.SecretsKeySize, len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return err
	}
	g, err := cipher.NewGCM(block)
	if err != nil {
		return err
	}
	s.aead.Store(&g)
	return nil
}

func (s *Store) gcm() (cipher.AEAD, error) {
	g := s.aead.Load()
	if g == nil {
		return nil, store.ErrNoSecretsKey
	}
	return *g, nil
}

func (s *Store) seal(name string, plain []byte) ([]byte, error) {
	g, err := s.gcm()
	if err != nil {
		return nil, err
	}
	out := make([]byte, 1+g.NonceSize(), 1+g.NonceSize()+len(plain)+g.Overhead())
	out[0] = sealVersion
	if _, err := rand.Read(out[1:]); err != nil {
		return nil, fmt.Errorf("pgstore: nonce: %w", err)
	}
	return g.Seal(out, out[1:], plain, []byte(name)), nil
}

func (s *Store) open(name string, sealed []byte) ([]byte, error) {
	g, err := s.gcm()
	if err != nil {
		return nil, err
	}
	if len(sealed) < 1+g.NonceSize() || sealed[0] != sealVersion {
		return nil, fmt.Errorf("%w: %q is not a sealed value", store.ErrSecretsKey, name)
	}
	n := 1 + g.NonceSize()
	plain, err := g.Open(nil, sealed[1:n], sealed[n:], []byte(name))
	if err != nil {
		return nil, fmt.Errorf("%w (%q)", store.ErrSecretsKey, name)
	}
	return plain, nil
}

// sealsRecord says whether a record of this key is sealed: a run's record
// or history, once the store has a key.
func (s *Store) sealsRecord(key string) bool {
	if s.aead.Load() == nil {
		return false
	}
	return strings.HasPrefix(key, core.KindRun+"/") || strings.HasPrefix(key, core.KindHistory+"/")
}

// sealed says whether a run's record or history value is sealed (a plain
// one is JSON, starting with '{').
func sealed(v []byte) bool { return len(v) > 0 && v[0] == sealVersion }

// HoldsSealed says whether the database holds a value sealed with a key:
// a secret, or a run's record or history (the first of each tells: all are
// sealed once a key was given).
func (s *Store) HoldsSealed() bool {
	var found bool
	err := s.read(func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM tether_secret)
			OR coalesce((SELECT substr(value, 1, 1) = '\x01'::bytea FROM tether_record WHERE key >= 'run/' AND key < 'run0' ORDER BY key LIMIT 1), false)
			OR coalesce((SELECT substr(value, 1, 1) = '\x01'::bytea FROM tether_history ORDER BY run LIMIT 1), false)`).Scan(&found)
	})
	return err == nil && found
}

// Secret returns the value of secret name: store.ErrNotFound if there is
// none, store.ErrSecretsKey if the store's key does not open it.
func (s *Store) Secret(name string) ([]byte, error) {
	var v []byte
	err := s.read(func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, "SELECT value FROM tether_secret WHERE name = $1", name).Scan(&v)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: secret %q", store.ErrNotFound, name)
	}
	if err != nil {
		return nil, err
	}
	return s.open(name, v)
}
