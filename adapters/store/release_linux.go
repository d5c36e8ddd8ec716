package store

import "syscall"

// releaseMapped tells the kernel (madvise MADV_DONTNEED) that the n bytes
// mapped at addr are not needed: for a shared file mapping it only drops
// the pages from this process's page tables.
func releaseMapped(addr uintptr, n int64) error {
	if addr == 0 || n <= 0 {
		return nil
	}
	if _, _, e := syscall.Syscall(syscall.SYS_MADVISE, addr, uintptr(n), syscall.MADV_DONTNEED); e != 0 {
		return e
	}
	return nil
}
