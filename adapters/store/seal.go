package store

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/tether-run/tether/core"
)

// Sealer seals values with the secrets key (SPEC §14a): AES-256-GCM, the
// first byte the format (sealVersion), then a random nonce and the
// ciphertext, the value's name (a secret's, or a record's key) as
// additional data, so a value moved under another name does not open.
// Every backend seals with it, so the format is one. The zero Sealer has
// no key. It is safe for concurrent use.
type Sealer struct {
	aead atomic.Pointer[cipher.AEAD] // nil: no key yet
}

// SetKey gives the sealer its key (SecretsKeySize bytes).
func (k *Sealer) SetKey(key []byte) error {
	if len(key) != SecretsKeySize {
		return fmt.Errorf("store: a secrets key is %d bytes, not %d", SecretsKeySize, len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return err
	}
	g, err := cipher.NewGCM(block)
	if err != nil {
		return err
	}
	k.aead.Store(&g)
	return nil
}

// Keyed is nil once the sealer has its key, else ErrNoSecretsKey.
func (k *Sealer) Keyed() error {
	_, err := k.gcm()
	return err
}

func (k *Sealer) gcm() (cipher.AEAD, error) {
	g := k.aead.Load()
	if g == nil {
		return nil, ErrNoSecretsKey
	}
	return *g, nil
}

// Seal encrypts plain with name as additional data.
func (k *Sealer) Seal(name string, plain []byte) ([]byte, error) {
	g, err := k.gcm()
	if err != nil {
		return nil, err
	}
	out := make([]byte, 1+g.NonceSize(), 1+g.NonceSize()+len(plain)+g.Overhead())
	out[0] = sealVersion
	if _, err := rand.Read(out[1:]); err != nil {
		return nil, fmt.Errorf("store: nonce: %w", err)
	}
	return g.Seal(out, out[1:], plain, []byte(name)), nil
}

// Open decrypts a value sealed under name; ErrSecretsKey if this key does
// not open it.
func (k *Sealer) Open(name string, sealed []byte) ([]byte, error) {
	g, err := k.gcm()
	if err != nil {
		return nil, err
	}
	if len(sealed) < 1+g.NonceSize() || sealed[0] != sealVersion {
		return nil, fmt.Errorf("%w: %q is not a sealed value", ErrSecretsKey, name)
	}
	n := 1 + g.NonceSize()
	plain, err := g.Open(nil, sealed[1:n], sealed[n:], []byte(name))
	if err != nil {
		return nil, fmt.Errorf("%w (%q)", ErrSecretsKey, name)
	}
	return plain, nil
}

// SealsRecord says whether a record of this key is sealed: a run's record
// or history (they carry its env:), once the sealer has its key.
func (k *Sealer) SealsRecord(key string) bool {
	if k == nil || k.aead.Load() == nil {
		return false
	}
	return strings.HasPrefix(key, core.KindRun+"/") || strings.HasPrefix(key, core.KindHistory+"/")
}
