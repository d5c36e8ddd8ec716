package store

import (
	"os"
	"syscall"
)

// fdatasync syncs f's bytes, and its size if it changed, but not its times.
func fdatasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			return err
		}
	}
}
