package store

import bolt "go.etcd.io/bbolt"

// ReleaseMapped lets go of the pages of the store file that reads have
// brought into this process's address space. bbolt reads through a shared,
// read-only memory map of the whole file, and every page a read touches
// (an archived run served by the API, a history page, a backup, a check,
// the pruner's scan) stays in the process's resident set until the map is
// next remapped: over a long life the resident set would grow to the size
// of the file. Released pages stay in the kernel's page cache and come back
// on the next read that needs them, by a minor page fault; nothing is
// written and nothing is lost (the map is read-only and shared).
//
// It holds a read transaction, during which bbolt never remaps the file.
// On systems without madvise it does nothing.
func (s *Store) ReleaseMapped() error {
	return s.db.View(func(tx *bolt.Tx) error {
		return releaseMapped(s.db.Info().Data, tx.Size())
	})
}
