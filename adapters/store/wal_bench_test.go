package store

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tether-run/tether/core"
)

// benchBatch is a commit of the end-to-end benchmark's size at 64 slots
// (adapters/orchestrator/PERFORMANCE.md): about 200 records of 300 bytes,
// a quarter of them new keys.
func benchBatch(i int) []core.Record {
	recs := make([]core.Record, 200)
	for j := range recs {
		k := fmt.Sprintf("step/run-%d/s%03d", j%7, j)
		if j%4 == 0 {
			k = fmt.Sprintf("lease/%020d", i*50+j/4)
		}
		recs[j] = put(k, fmt.Sprintf(`{"i":%d,"pad":%q}`, i, strings.Repeat("p", 280)))
	}
	return recs
}

// BenchmarkCommit is one Apply of a batch, fsync'd: with the log (one
// fdatasync of an append; the applier's bbolt commits run beside) and
// without (a bbolt transaction: its pages, a sync, its meta page, a sync).
// size: 1 record (the 1-slot shape's commit is ~8) or 200 (64 slots).
func BenchmarkCommit(b *testing.B) {
	for _, c := range []struct {
		name string
		opts Options
	}{{"log", Options{}}, {"bbolt", Options{NoLog: true}}} {
		for _, size := range []int{1, 200} {
			b.Run(fmt.Sprintf("%s/records=%d", c.name, size), func(b *testing.B) {
				s, err := OpenWith(filepath.Join(b.TempDir(), "tether.db"), c.opts)
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				i := 0
				for b.Loop() {
					i++
					if err := s.Apply(benchBatch(i)[:size]); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkFdatasync is the file system's cost of one durable append of
// 4 KiB: in place over blocks already written (the log's preallocated
// ring), and at the end of a growing file (each sync also journals the new
// size and blocks).
func BenchmarkFdatasync(b *testing.B) {
	buf := make([]byte, 4096)
	for _, inPlace := range []bool{true, false} {
		name := "append-in-place"
		if !inPlace {
			name = "append-growing"
		}
		b.Run(name, func(b *testing.B) {
			f, err := os.Create(filepath.Join(b.TempDir(), "f"))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			const size = 64 << 20
			if inPlace {
				for off := int64(0); off < size; off += walChunk {
					f.WriteAt(walZeros, off)
				}
				fdatasync(f)
			}
			var off int64
			for b.Loop() {
				if inPlace && off+4096 > size {
					off = 0
				}
				if _, err := f.WriteAt(buf, off); err != nil {
					b.Fatal(err)
				}
				if err := fdatasync(f); err != nil {
					b.Fatal(err)
				}
				off += 4096
			}
		})
	}
}
