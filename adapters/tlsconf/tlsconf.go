// Package tlsconf holds the TLS helpers both binaries share: reading the CA
// file an operator or a worker trusts (--ca, SPEC §12).
package tlsconf

import (
	"crypto/x509"
	"fmt"
	"os"
)

// LoadCA reads a PEM file of CA certificates into a pool. A file with no
// PEM certificate in it is an error, not an empty pool that trusts nothing.
func LoadCA(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}
