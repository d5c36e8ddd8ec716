//go:build !linux

package store

import "os"

// fdatasync syncs f; elsewhere than Linux, as File.Sync does.
func fdatasync(f *os.File) error { return f.Sync() }
