package store

// Secrets at rest (SPEC §14a). A secret's value is kept in the bucket
// "secret", keyed by its name, sealed with AES-256-GCM: a random 96-bit
// nonce per value (crypto/rand) and the secret's name as additional data,
// so a value moved under another name does not open. The key is 32 bytes
// the store never writes into its own file: it lives in a file of its own
// (LoadOrCreateKey), so a copy of the store file (a backup, SPEC §12)
// carries ciphertext only.

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/tether-run/tether/core"
)

// SecretsKeySize is the size of the secrets key: AES-256.
const SecretsKeySize = 32

// sealVersion is the first byte of a sealed value: the format (AES-256-GCM,
// a 12-byte nonce, then the ciphertext and its tag).
const sealVersion = 1

var bktSecret = []byte("secret")

var (
	// ErrNoSecretsKey is returned when a secret is read or written on a
	// store that was given no key (SetSecretsKey).
	ErrNoSecretsKey = errors.New("store: no secrets key (secrets, and a sealed store's runs, need the key file the store was written with: <store>.secrets-key or --secrets-key-file)")
	// ErrSecretsKey is returned when a sealed value does not open: the
	// store was opened with another key than the one that sealed it (or the
	// value was altered).
	ErrSecretsKey = errors.New("store: the secrets key does not open this store's secrets (another key sealed them: start with the key file they were stored with, --secrets-key-file)")
	// ErrBadKeyFile is returned when a key file does not hold 64 hex digits.
	ErrBadKeyFile = errors.New("store: malformed secrets key file")
)

// LoadOrCreateKey returns the secrets key kept in path: 64 hex digits (a
// final newline allowed). If the file does not exist it is created, mode
// 0600, with 32 bytes from crypto/rand; created says so. Creation is
// exclusive: a temporary file is linked into place, so two starts never
// make two keys.
func LoadOrCreateKey(path string) (key []byte, created bool, err error) {
	key, err = ReadKeyFile(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return key, false, err
	}
	key = make([]byte, SecretsKeySize)
	if _, err := rand.Read(key); err != nil {
		return nil, false, fmt.Errorf("store: secrets key: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".secrets-key-*")
	if err != nil {
		return nil, false, fmt.Errorf("store: secrets key: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err == nil {
		_, err = tmp.WriteString(hex.EncodeToString(key) + "\n")
		if err == nil {
			err = tmp.Sync()
		}
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		err = os.Link(tmp.Name(), path)
	}
	if errors.Is(err, fs.ErrExist) { // another start made it first: use its key
		key, err = ReadKeyFile(path)
		return key, false, err
	}
	if err != nil {
		return nil, false, fmt.Errorf("store: secrets key: %w", err)
	}
	// The key's name must be durable before anything is sealed with it: a
	// crash that lost it would leave every sealed value unreadable.
	if err := syncDir(filepath.Dir(path)); err != nil {
		return nil, false, fmt.Errorf("store: secrets key: sync its directory: %w", err)
	}
	return key, true, nil
}

// ReadKeyFile reads a secrets key file (64 hex digits).
func ReadKeyFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("store: secrets key file: %w", err)
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(key) != SecretsKeySize {
		return nil, fmt.Errorf("%w %s: want %d hex digits", ErrBadKeyFile, path, 2*SecretsKeySize)
	}
	return key, nil
}

// SetSecretsKey gives the store its secrets key (SecretsKeySize bytes).
// Call it once, before the store serves secrets.
func (s *Store) SetSecretsKey(key []byte) error { return s.keys.SetKey(key) }

// putSecret seals op.Body under op.ID in tx.
func (s *Store) putSecret(tx *bolt.Tx, op DataOp) error {
	b, err := tx.CreateBucketIfNotExists(bktSecret)
	if err != nil {
		return err
	}
	sealed, err := s.keys.Seal(op.ID, op.Body)
	if err != nil {
		return err
	}
	return b.Put([]byte(op.ID), sealed)
}

func deleteSecret(tx *bolt.Tx, name string) error {
	if b := tx.Bucket(bktSecret); b != nil {
		return b.Delete([]byte(name))
	}
	return nil
}

// Secret returns the value of secret name: ErrNotFound if there is none,
// ErrSecretsKey if the store's key does not open it.
func (s *Store) Secret(name string) ([]byte, error) {
	var sealed []byte
	err := s.view(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bktSecret); b != nil {
			sealed = append([]byte(nil), b.Get([]byte(name))...)
		}
		return nil
	})
	if err != nil {
		return nil, s.mapErr(err)
	}
	if len(sealed) == 0 {
		return nil, fmt.Errorf("%w: secret %q", ErrNotFound, name)
	}
	return s.keys.Open(name, sealed)
}

// The workflow's env: at rest. A run's record (run/ID) and its history
// (history/ID) carry the run's and its steps' env: values, so a store
// with a secrets key seals both whole with the same AEAD, the record's key
// as additional data: a run record is written at its submission and a few
// state changes, and a history once, so sealing them costs little on the
// commit path (SPEC §14a), while step, lease and log records, the hot
// ones, hold no env and stay as they are. In the buckets of those two
// kinds a value is sealed when its first byte is sealVersion (a run's JSON
// starts with '{', a history with 'F'), so a store written before keeps
// being read.

// sealsRecord says whether a record of this key is sealed by s.
func (s *Store) sealsRecord(key string) bool { return s != nil && s.keys.SealsRecord(key) }

// Sealed says whether a run's record or history value is sealed.
func Sealed(v []byte) bool { return len(v) > 0 && v[0] == sealVersion }

// decodeHistory decodes a history value of run, opening it if sealed.
func (s *Store) decodeHistory(run core.RunID, v []byte) (core.RunHistory, error) {
	if Sealed(v) {
		plain, err := s.keys.Open(core.HistoryKey(run), v)
		if err != nil {
			return core.RunHistory{}, err
		}
		v = plain
	}
	return decodeHistory(v)
}

// useKeyNextTo gives s the key file next to its file, path+".secrets-key",
// if there is one (SetSecretsKey may give it another).
func (s *Store) useKeyNextTo(path string) error {
	key, err := ReadKeyFile(path + ".secrets-key")
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	}
	return s.SetSecretsKey(key)
}

// keyNextTo is the offline tools' key (store check): the key file next to
// the store at path, if there is one. A store holding sealed values without
// it cannot be checked, and says so.
func keyNextTo(path string, db *bolt.DB) (*Store, error) {
	s := &Store{}
	key, err := ReadKeyFile(path + ".secrets-key")
	if err == nil {
		return s, s.SetSecretsKey(key)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if sealed, err := holdsSealed(db); err != nil || sealed {
		if err != nil {
			return nil, fmt.Errorf("store: does %s hold sealed values: %w", path, err)
		}
		return nil, fmt.Errorf("%w: %s holds sealed values; put the key file it was written with at %s.secrets-key (a backup does not carry it, SPEC §14a)", ErrNoSecretsKey, path, path)
	}
	return s, nil
}

// holdsSealed says whether db holds a sealed value: a secret, or a run's
// record or history (the first of each bucket tells: all are sealed once a
// key was given).
func holdsSealed(db *bolt.DB) (bool, error) {
	found := false
	err := db.View(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bktSecret, bktRuns, bktHistory} {
			if b := tx.Bucket(name); b != nil {
				k, v := b.Cursor().First()
				found = found || (k != nil && Sealed(v))
			}
		}
		return nil
	})
	return found, err
}

// HoldsSealed says whether the store holds a value sealed with a secrets
// key: a start without that key must not make a new one.
func (s *Store) HoldsSealed() (bool, error) {
	if s.log != nil {
		s.log.barrier() // an error: the read below says what the file holds
	}
	found, err := holdsSealed(s.db)
	if err != nil {
		return false, fmt.Errorf("store: does the store hold sealed values: %w", s.mapErr(err))
	}
	return found, nil
}

// checkSecrets: every secret's value is sealed and, with the key, opens,
// and it has its record (SPEC §14a).
func checkSecrets(c *checker) {
	names := map[string]bool{}
	c.each(bucket, func(k, _ []byte) {
		if n, ok := strings.CutPrefix(string(k), core.KindSecret+"/"); ok {
			names[n] = true
		}
	})
	c.each(bktSecret, func(k, v []byte) {
		c.count("secrets", 1)
		where := "secret " + core.Quote(string(k))
		switch {
		case !Sealed(v):
			c.problem(where, "its value is not sealed")
		case c.keyed.keys.Keyed() == nil:
			if _, err := c.keyed.keys.Open(string(k), v); err != nil {
				c.problem(where, "does not open: %v", err)
			}
		}
		if !names[string(k)] {
			c.problem(where, "has a value and no record")
		}
	})
}
