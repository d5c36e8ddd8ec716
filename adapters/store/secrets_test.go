package store

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/tether-run/tether/core"
)

// TestSecretsSealed: a value is stored sealed (not in the file, not
// twice the same ciphertext), opens only under its own name and key, and
// a key file is made once, mode 0600, and read back as it was.
func TestSecretsSealed(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tether.db")
	kp := filepath.Join(dir, "elsewhere.key") // not next to the store: Open would use it
	key, created, err := LoadOrCreateKey(kp)
	if err != nil || !created || len(key) != SecretsKeySize {
		t.Fatalf("LoadOrCreateKey: %v created=%v len=%d", err, created, len(key))
	}
	if fi, err := os.Stat(kp); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	again, created, err := LoadOrCreateKey(kp)
	if err != nil || created || !bytes.Equal(again, key) {
		t.Fatalf("second LoadOrCreateKey: %v created=%v same=%v", err, created, bytes.Equal(again, key))
	}
	os.WriteFile(filepath.Join(dir, "bad.key"), []byte("not hex"), 0o600)
	if _, _, err := LoadOrCreateKey(filepath.Join(dir, "bad.key")); !errors.Is(err, ErrBadKeyFile) {
		t.Fatalf("a malformed key file: %v", err)
	}

	s := open(t, path)
	value := []byte("plain-secret-value-123")
	if _, err := s.ApplyWithData(nil, []DataOp{{Kind: OpSecretPut, ID: "A", Body: value}}); !errors.Is(err, ErrNoSecretsKey) {
		t.Fatalf("a put without a key: %v", err)
	}
	if err := s.SetSecretsKey(key); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ApplyWithData(nil, []DataOp{{Kind: OpSecretPut, ID: "A", Body: value}, {Kind: OpSecretPut, ID: "B", Body: value}}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Secret("A")
	if err != nil || !bytes.Equal(got, value) {
		t.Fatalf("Secret(A) = %q, %v", got, err)
	}
	var a, b []byte
	s.view(func(tx *bolt.Tx) error {
		a = append(a, tx.Bucket(bktSecret).Get([]byte("A"))...)
		b = append(b, tx.Bucket(bktSecret).Get([]byte("B"))...)
		return nil
	})
	if bytes.Equal(a[1:13], b[1:13]) || bytes.Equal(a, b) {
		t.Fatalf("two values share a nonce or a ciphertext")
	}
	// A value moved under another name does not open.
	s.update(func(tx *bolt.Tx) error { return tx.Bucket(bktSecret).Put([]byte("B"), a) })
	if _, err := s.Secret("B"); !errors.Is(err, ErrSecretsKey) {
		t.Fatalf("A's value under B: %v", err)
	}
	if _, err := s.Secret("NONE"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("an unknown secret: %v", err)
	}
	if _, err := s.ApplyWithData(nil, []DataOp{{Kind: OpSecretDelete, ID: "A"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Secret("A"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a removed secret: %v", err)
	}
	// (B, which holds A's value, store check would find: it is removed.)
	s.ApplyWithData(nil, []DataOp{{Kind: OpSecretDelete, ID: "B"}})
	s.ApplyWithData([]core.Record{{Key: "secret/A", Value: []byte(`{"Name":"A","Size":22}`)}}, []DataOp{{Kind: OpSecretPut, ID: "A", Body: value}})
	s.Close()
	if raw, _ := os.ReadFile(path); bytes.Contains(raw, value) {
		t.Fatal("the store file holds the value in the clear")
	}

	// store check: the values need the key next to the store, and each
	// must be sealed, open, and have its record.
	if _, err := Check(path); !errors.Is(err, ErrNoSecretsKey) {
		t.Fatalf("check without the key: %v", err)
	}
	os.WriteFile(path+".secrets-key", []byte(hex.EncodeToString(key)), 0o600)
	if rep := mustCheck(t, path); !rep.Sound() {
		t.Fatalf("check of a sealed store: %+v", rep.Findings)
	}
	db, _ := bolt.Open(path, 0o600, nil)
	db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bktSecret).Put([]byte("C"), []byte("in the clear")) })
	db.Close()
	rep := mustCheck(t, path)
	if rep.Sound() || !strings.Contains(fmt.Sprint(rep.Findings), "not sealed") || !strings.Contains(fmt.Sprint(rep.Findings), "no record") {
		t.Fatalf("check of a clear value without a record: %+v", rep.Findings)
	}
	os.Remove(path + ".secrets-key")

	// Another key: a clear error naming the key, never other bytes.
	s = open(t, path)
	other := bytes.Repeat([]byte{7}, SecretsKeySize)
	s.SetSecretsKey(other)
	if v, err := s.Secret("A"); !errors.Is(err, ErrSecretsKey) || v != nil || !strings.Contains(err.Error(), "secrets key") {
		t.Fatalf("another key: %q, %v", v, err)
	}
}
