package main

import (
	"os"
	"testing"
)

// TestMain removes the binaries built for the end-to-end tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}
